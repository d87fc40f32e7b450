"""What checking a bundle costs when it is opened: the default check against the full hash of ``--verify``.

Every command that opens a bundle runs ``read_manifest`` (structure, and the sha256 of every file but the
tensor data files); ``--verify`` also hashes ``mlp.bin`` and ``dense.bin``. This times both on the SmolLM2
DIP-CA BQ4 bundle and (full mode) on a random-weight Llama-shaped model of ≈1 B parameters (d 2048,
F 5632, 16 layers, streamed export, BQ4), with the files in the page cache and after dropping them
from it (``posix_fadvise(DONTNEED)``, so the next read comes from the disk). Median of ``--repeat``.
Then what ``Engine`` costs to open at a 50 % budget on the per-layer sessions and on the joined decoder
(the default below 100 %, which joins the per-layer graphs at load): sessions created, slabs built,
caches reset; warm page cache, native kernels, 1 thread.

    python benchmarks/bundle_open.py --quick        # SmolLM2 only
    python benchmarks/bundle_open.py [--json OUT]   # and the 1 B model (about 3 min to export)

Writes benchmarks/results/bundle_open.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _common import machine, md_table, write_rows_json
from export import _RANDOM_1B, PY, RESULTS


def _drop(bundle: Path) -> None:
    for p in bundle.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _time(fn, bundle: Path, cold: bool, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        if cold:
            _drop(bundle)
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def measure(name: str, bundle: Path, repeat: int) -> list[dict]:
    from dipdeploy.bundle.manifest import parse_manifest, read_manifest, verify

    size = sum(p.stat().st_size for p in bundle.iterdir())
    data = sum((bundle / f).stat().st_size for f in ("mlp.bin", "dense.bin"))
    checks = {"structure only": lambda: verify(bundle, parse_manifest(bundle), "none"),
              "default open (read_manifest)": lambda: read_manifest(bundle),
              "--verify (every sha256)": lambda: verify(bundle, parse_manifest(bundle), "all")}
    rows = []
    for check, fn in checks.items():
        for cold in (False, True):
            rows.append({"bundle": name, "bundle_mb": round(size / 1e6, 1), "data_files_mb": round(data / 1e6, 1),
                         "check": check, "page_cache": "dropped" if cold else "warm",
                         "ms": round(1e3 * _time(fn, bundle, cold, repeat), 2)})
    return rows


def measure_engine(name: str, bundle: Path, repeat: int) -> list[dict]:
    """Milliseconds to open an Engine and reset it, per path."""
    from dipdeploy.runtime import Engine

    rows = []
    for path, fused in (("per-layer sessions", False), ("joined decoder", True)):
        def open_engine():
            Engine(bundle, dram_budget="50%", fused=fused, native=True, io="mmap").reset()

        open_engine()  # the first open pays the library's and ORT's one-time set-up
        rows.append({"bundle": name, "check": f"Engine open at 50 %: {path}", "page_cache": "warm",
                     "ms": round(1e3 * _time(open_engine, bundle, False, repeat), 2)})
    return rows


def export(cfg: list[str], out: Path) -> None:
    subprocess.run([str(Path(PY).parent / "dipdeploy"), *cfg, "--out", str(out), "--force"], check=True,
                   stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="SmolLM2 only")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dd-open-") as tmp:
        work = Path(tmp)
        smol = work / "smollm2"
        print("export SmolLM2 DIP-CA BQ4 ...", flush=True)
        export(["export", "--method", "dip-ca", "--quant", "bq4", "--rho-in", "0.55", "--validate-tokens", "0"], smol)
        rows += measure("smollm2-135m dip-ca bq4", smol, a.repeat)
        rows += measure_engine("smollm2-135m dip-ca bq4", smol, a.repeat)
        if not a.quick:
            hf = work / "llama-1b-random-hf"
            print("build and export the random 1 B model (streamed) ...", flush=True)
            subprocess.run([PY, "-c", _RANDOM_1B, str(hf)], check=True)
            big = work / "llama-1b"
            export(["export", "--model", str(hf), "--method", "dip", "--rho-in", "0.5", "--quant", "bq4",
                    "--stream", "--validate-tokens", "0"], big)
            rows += measure("random llama 1 B dip bq4 (streamed)", big, a.repeat)
            rows += measure_engine("random llama 1 B dip bq4 (streamed)", big, a.repeat)
    env = machine()
    text = [f"# Opening a bundle: the default check and --verify\n\n{env['cpu']}, {env['cores']} cores, load "
            f"{env['load_1min']} · `python benchmarks/bundle_open.py{' --quick' if a.quick else ''}` · "
            f"median of {a.repeat} · `/tmp` on the project's reference machine\n",
            "`structure only`: paths, ranges, overlaps, plan (no hashing); `default open`: what every command "
            "runs (`read_manifest`: JSON, structure, sha256 of every file but `mlp.bin`/`dense.bin`); "
            "`--verify`: every file's sha256. `dropped`: the bundle's pages dropped from the page cache first. "
            "`Engine open`: `Engine(bundle, dram_budget=\"50%\", fused=...)` and its first `reset()`, native "
            "kernels, 1 thread; the joined decoder joins the per-layer graphs at load.\n",
            md_table(rows, ["bundle", "bundle_mb", "data_files_mb", "check", "page_cache", "ms"])]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bundle_open.md").write_text("\n".join(text) + "\n")
    write_rows_json(rows, a.json)
    print("\n".join(text))


if __name__ == "__main__":
    main()
