"""``--cache-split even`` against ``reads``, paired: DIP-CA and dense-static, ``--io direct``, cgroup-limited.

The same children as ``flash.py`` (each configuration in its own cgroup v1 memory group, the MLP file
dropped from the page cache, the limit set after warm-up), the two splits of one method and budget run
back to back and the whole sweep repeated, so that the split's effect is read within a pair rather than
across a load that moves: SmolLM2 BQ4 at 25 / 50 / 75 %, the ≈1 B random Llama of flash.py's last
section at 50 %. Results in ``results/cache-split.md``.

    python benchmarks/cache_split.py            # 2 repeats, 64 tokens (SmolLM2), 16 (1 B); ~12 min
    python benchmarks/cache_split.py --quick    # SmolLM2 at 50 % only, 1 repeat, 16 tokens
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _common import lscpu, machine, md_table, write_rows_json
from flash import LLAMA_1B, POLICY, RESULTS, ROOT, ensure_bundles, run_in_group, storage

from dipdeploy.cache.split import CACHE_SPLITS
from dipdeploy.paths import write_atomic
from dipdeploy.runtime.blockio import IO_ENGINE

SLACK = {"smollm2-135m": 4 << 20, LLAMA_1B: 64 << 20}  # flash.py's --slack for each (its docstring says why)


def sweep(model: str, budgets: tuple[str, ...], tokens: int, repeats: int, timeout: float) -> list[dict]:
    paths = ensure_bundles(model)
    rows = []
    for rep in range(repeats):
        for budget in budgets:
            for method in ("dip-ca", "dense-static"):
                for split in CACHE_SPLITS:
                    t = time.time()
                    spec = dict(method=method, io="direct", budget=budget, limited=True, io_threads=None,
                                io_engine=IO_ENGINE, cache_split=split, bundle=str(paths[method, "natural"]),
                                policy=POLICY[method], tokens=tokens, slack=SLACK[model])
                    res = run_in_group(spec, timeout)
                    rows.append({"model": model, "repeat": rep, "method": method, "budget": budget, "split": split,
                                 **res, "load_1min": round(os.getloadavg()[0], 2)})
                    print(f"{model} {rep} {method:12s} {budget:4s} {split:5s} "
                          + (res.get("error") or f"{res['tok_s']:.2f} tok/s, device {res['device_mb']:.1f} MB, "
                             f"{res['requests']:.0f} req/token, hit {res['hit_rate']:.3f}")
                          + f" ({time.time() - t:.0f} s)", flush=True)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per model, method, budget and split: the median tok/s over the repeats, the (load-free) counts, and
    the reads split's tok/s over the even split's within each repeat."""
    out = []
    keys = sorted({(r["model"], r["method"], r["budget"]) for r in rows}, key=str)
    for model, method, budget in keys:
        pair = {s: [r for r in rows if (r["model"], r["method"], r["budget"], r["split"]) == (model, method, budget, s)
                    and r.get("tok_s")] for s in CACHE_SPLITS}
        ratios = [b["tok_s"] / a["tok_s"] for a, b in zip(pair["even"], pair["reads"]) if a["repeat"] == b["repeat"]]
        for split in CACHE_SPLITS:
            got = pair[split]
            if not got:
                continue
            out.append({"model": model, "method": method, "budget": budget, "split": split,
                        "tok_s": statistics.median(r["tok_s"] for r in got),
                        "device_mb": got[0]["device_mb"], "requests": got[0]["requests"], "hit_rate": got[0]["hit_rate"],
                        "peak_group_mb": max(r["peak_group_mb"] for r in got),
                        "limit_mb": max(r["limit_mb"] for r in got),
                        "reads_over_even": statistics.median(ratios) if split == "reads" and ratios else None,
                        "load_1min": f"{min(r['load_1min'] for r in got)}–{max(r['load_1min'] for r in got)}"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="SmolLM2 at 50 %% only, 1 repeat, 16 tokens")
    ap.add_argument("--json", help="write every run's row as a JSON list")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    ap.add_argument("--no-1b", action="store_true", help="SmolLM2 only")
    args = ap.parse_args()
    if args.repeats < 1:
        sys.exit("error: --repeats must be >= 1")
    info, cpu = machine(), lscpu()
    if args.quick:
        rows = sweep("smollm2-135m", ("50%",), 16, 1, args.timeout)
    else:
        rows = sweep("smollm2-135m", ("25%", "50%", "75%"), 64, args.repeats, args.timeout)
        if not args.no_1b:
            rows += sweep(LLAMA_1B, ("50%",), 16, args.repeats, args.timeout)
    disk = storage(ROOT / "build")  # where the bundles are read from
    errors = [f"- {r['model']} {r['method']} {r['budget']} {r['split']}: {r['error']}" for r in rows if r.get("error")]
    text = "\n".join([
        "# Cache split: even against reads (benchmarks/cache_split.py)", "",
        f"`python benchmarks/cache_split.py {' '.join(sys.argv[1:])}` · {info} · greedy tokens after flash.py's "
        "prompt, cold, native kernels, 1 ORT thread, `--io direct`, gap 4, the two splits of each method and budget "
        "run back to back, the sweep repeated", "",
        f"- machine (lscpu): {cpu}",
        f"- storage: {disk}",
        "- limits as in flash.md (the group's pages after warm-up + 4 MiB for SmolLM2, + 64 MiB for the 1 B model); "
        "SmolLM2: flash.py's bundles (DIP-CA ρ_in 0.55, γ 0.5, LFU; dense-static ρ = 1, static pinning); 1 B: "
        "the random-weight Llama of flash.md's last section", "",
        "`tok_s`: median over the repeats; `reads_over_even`: the median over repeats of reads' tok/s / even's in "
        "the same repeat; bytes, requests and hit rate are per decode token and do not depend on the load.", "",
        md_table(summary(rows), ["model", "method", "budget", "split", "tok_s", "reads_over_even", "device_mb",
                                 "requests", "hit_rate", "peak_group_mb", "limit_mb", "load_1min"]), "",
        *errors, ""])
    name = "cache-split" + ("-quick" if args.quick else "")
    write_atomic(RESULTS / f"{name}.md", text, force=True)
    write_rows_json(rows, args.json)
    print(text)


if __name__ == "__main__":
    main()
