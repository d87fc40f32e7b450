"""Real reads from storage: SmolLM2 DIP-CA BQ4 and dense-static with ``--io mmap | pread | direct``, cold,
each run in its own cgroup v1 memory group so the OS page cache cannot keep the MLP file.

Every configuration runs in a child process moved into a fresh memory group under this process's own
(``/sys/fs/cgroup/memory/<own group>/dipdeploy-flash-<pid>``, removed afterwards). The child builds the
engine, warms it up (a few tokens), touches every page of its slabs (so the row caches are counted
full), drops the MLP file from the page cache, and only then limits its group to its anonymous and
mapped pages (``memory.stat`` ``rss`` + ``mapped_file``) plus ``--slack``: v1 counts the page
cache in the group, so the kernel has to drop the MLP file's pages and every row the row cache does
not hold comes from the disk again, in every io mode (without the limit ``mmap`` and ``pread`` re-read
evicted rows from the page cache). The "unlimited" rows skip the limit. Each run starts cold (the
file dropped from the page cache, ``Engine(cold=True)``).

Columns: decode tok/s; per decode token: the rows' bytes the caches asked for (``wanted_mb``), the bytes
the process read from the block device (``device_mb``, ``/proc/self/io`` ``read_bytes``: measured,
every mode; for ``direct`` it matches the store's own block count) and the store's requests; hit rate;
peak RSS (VmHWM); the limit. ``waste`` = device / wanted.

    python benchmarks/flash.py            # 2 methods × 3 io × budgets 25/50/75 % + unlimited, 64 tokens,
                                          # and DIP-CA direct at 1/4/16/32 reads in flight (~10 min at 32 tokens)
    python benchmarks/flash.py --quick    # DIP-CA and dense-static, 50 % + unlimited, 16 tokens; 1 and 16 in flight
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import lscpu, machine, md_table, memory_group, write_rows_json

from dipdeploy.runtime.blockio import IO_THREADS

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The history of the city begins in the early"
BUNDLES = {  # method → (folder under build/, export options); dip-ca is `dipdeploy export --method dip-ca
    #           --quant bq4 --rho-in 0.55 --out build/flash-bundle`
    "dip-ca": ("flash-bundle", dict(method="dip-ca", rho_in=0.55)),
    "dense-static": ("flash-bundle-dense", dict(method="dip", density=1.0, rho_in=1.0)),
}
POLICY = {"dip-ca": "lfu", "dense-static": "static"}
THREADS = (1, 4, 16, 32)  # the reads-in-flight sweep
COLS = ["method", "io", "budget", "tok_s", "wanted_mb", "device_mb", "waste", "requests", "hit_rate", "peak_rss_mb",
        "peak_group_mb", "limit_mb", "load_1min"]


def storage(path: Path) -> str:
    """The block device and filesystem holding ``path`` (from /proc/mounts and /sys/block)."""
    path = path.resolve()
    best = ("?", "?", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, mnt, fs = line.split()[:3]
        if str(path).startswith(mnt.rstrip("/") + "/") and len(mnt) > len(best[2]):
            best = (dev, fs, mnt)
    dev, fs, _ = best
    name = Path(dev).name
    rot = Path(f"/sys/block/{name}/queue/rotational")
    flag = rot.read_text().strip() if rot.is_file() else "?"
    return f"{dev} ({fs}; {rot} = {flag})"


def ensure_bundles(model: str) -> dict[str, Path]:
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = {}
    for method, (folder, kw) in BUNDLES.items():
        path = ROOT / "build" / folder
        if not (path / "manifest.json").is_file():
            print(f"exporting {path} …", flush=True)
            export_model(ExportConfig(model=model, quant="bq4", validate_tokens=4, **kw), path, force=True)
        out[method] = path
    return out


def _io_read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def child(spec: dict) -> dict:
    """One configuration, inside the memory group ``spec['group']`` (see the module docstring)."""
    import numpy as np

    from dipdeploy.runtime import Engine
    from dipdeploy.runtime.stats import memory_now

    group = Path(spec["group"])
    eng = Engine(spec["bundle"], dram_budget=spec["budget"], policy=spec["policy"], io=spec["io"], cold=True,
                 native=True, context=256, io_threads=spec["io_threads"])
    eng.generate(PROMPT, 4, stop_at_eos=False)  # warm up the sessions and the caches
    for pair in eng.slabs:
        for s in pair:
            for slab in s.slabs:
                flat = slab.reshape(-1).view(np.uint8)
                flat[::4096] |= 0  # a write per page: the slab counted in RSS, values unchanged
    eng.flash.drop_page_cache()
    limit = None
    if spec["limited"]:
        # The group's anonymous and mapped pages (VmRSS would also count shared library pages charged to
        # other groups); the page cache of files read once at load (graphs, dense weights) is left out, or
        # the kernel would evict it to make room for MLP pages and the limit would leak.
        stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
        limit = int(stat["rss"]) + int(stat["mapped_file"]) + spec["slack"]
        (group / "memory.limit_in_bytes").write_text(str(limit))
    (group / "memory.max_usage_in_bytes").write_text("0")
    start = []  # read_bytes when the first token is out: the decode steps begin

    def on_text(piece: str) -> None:
        if not start:
            start.append(_io_read_bytes())

    s = eng.generate(PROMPT, spec["tokens"], stop_at_eos=False, on_text=on_text).stats
    device = _io_read_bytes() - start[0]
    row = {"tok_s": s.decode_tok_s, "wanted_mb": s.flash_mb_per_token, "device_mb": device / (s.new_tokens - 1) / 1e6,
           "store_device_mb": s.flash_device_mb_per_token, "requests": s.flash_requests_per_token,
           "hit_rate": s.hit_rate, "peak_rss_mb": memory_now().get("VmHWM", 0) / 1e6,
           "peak_group_mb": int((group / "memory.max_usage_in_bytes").read_text()) / 1e6,
           "limit_mb": limit / 1e6 if limit else None, "flash_io_s": s.seconds["flash_io"], "note": eng.flash.note}
    eng.close()
    return row


def run_in_group(spec: dict, timeout: float) -> dict:
    with memory_group("dipdeploy-flash") as (group, enter):
        spec = {**spec, "group": str(group)}
        done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                              text=True, timeout=timeout, preexec_fn=enter, cwd=ROOT / "benchmarks")
        if done.returncode != 0:
            oom = (group / "memory.failcnt").read_text().strip()
            return {"error": f"exit {done.returncode} (memory.failcnt {oom}): {done.stderr.strip()[-300:]}"}
        return json.loads(done.stdout.strip().splitlines()[-1])


def configs(quick: bool) -> list[dict]:
    budgets = ("50%",) if quick else ("25%", "50%", "75%")
    out = []
    for method in BUNDLES:
        for io in ("mmap", "pread", "direct"):
            for b in budgets:
                out.append(dict(method=method, io=io, budget=b, limited=True, io_threads=IO_THREADS))
            out.append(dict(method=method, io=io, budget=budgets[len(budgets) // 2], limited=False,
                            io_threads=IO_THREADS))
    return out


def thread_configs(quick: bool) -> list[dict]:
    """DIP-CA, --io direct at 50 %, limited: how much the reads in flight pay."""
    return [dict(method="dip-ca", io="direct", budget="50%", limited=True, io_threads=t)
            for t in ((1,) if quick else THREADS) if t != IO_THREADS]  # the default's row is the main table's


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method, style in (("dip-ca", "-o"), ("dense-static", "--s")):
        for io in ("mmap", "pread", "direct"):
            pts = [r for r in rows if r["method"] == method and r["io"] == io and r.get("limit_mb") and "tok_s" in r]
            if not pts:
                continue
            x = [float(r["budget"].rstrip("%")) for r in pts]
            axes[0].plot(x, [r["tok_s"] for r in pts], style, label=f"{method} {io}")
            axes[1].plot(x, [r["device_mb"] for r in pts], style, label=f"{method} {io}")
    axes[0].set(xlabel="row-cache budget (% of MLP bytes), cgroup-limited", ylabel="decode tok/s")
    axes[1].set(xlabel="row-cache budget (% of MLP bytes), cgroup-limited", ylabel="MB read from the device / token")
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50 %% + unlimited, 16 tokens")
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--slack", type=int, default=4 << 20, help="bytes above the group's warmed-up charge in the limit")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    tokens = 16 if args.quick else args.tokens
    paths = ensure_bundles(args.model)
    info, cpu, disk = machine(), lscpu(), storage(paths["dip-ca"])
    rows = []
    for c in configs(args.quick) + thread_configs(args.quick):
        t = time.time()
        spec = {**c, "bundle": str(paths[c["method"]]), "policy": POLICY[c["method"]], "tokens": tokens,
                "slack": args.slack}
        res = run_in_group(spec, args.timeout)
        row = {**c, "budget": c["budget"] if c["limited"] else f"{c['budget']}, unlimited", **res,
               "load_1min": round(os.getloadavg()[0], 2)}
        if "wanted_mb" in row and row["wanted_mb"]:
            row["waste"] = row["device_mb"] / row["wanted_mb"]
        rows.append(row)
        print(f"{c['method']:12s} {c['io']:6s} {row['budget']:16s} "
              + (res.get("error") or f"{res['tok_s']:.1f} tok/s, wanted {res['wanted_mb']:.2f} MB, device "
                 f"{res['device_mb']:.2f} MB, {res['requests']:.0f} req/token") + f" ({time.time() - t:.0f} s)",
              flush=True)
    name = "flash" + ("-quick" if args.quick else "")
    sweep = [r for r in rows if r["method"] == "dip-ca" and r["io"] == "direct" and r["budget"] == "50%"]
    sweep.sort(key=lambda r: r["io_threads"])
    main_rows = [r for r in rows if r["io_threads"] == IO_THREADS]
    notes = sorted({r["note"] for r in rows if r.get("note")})
    errors = [f"- {r['method']} {r['io']} {r['budget']}: {r['error']}" for r in rows if r.get("error")]
    text = "\n".join([
        "# Real reads from storage (benchmarks/flash.py)", "",
        f"`python benchmarks/flash.py{' --quick' if args.quick else ''}` · {info} · {tokens} greedy tokens after "
        f"\"{PROMPT}\", cold, native kernels, 1 ORT thread", "",
        f"- machine (lscpu): {cpu}",
        f"- storage: {disk}",
        f"- cgroup v1 memory limit (`limit_mb`): the child group's anonymous + mapped pages after warm-up, its slabs "
        f"touched and the MLP file dropped from the page cache, + {args.slack >> 20} MiB; empty = unlimited (the page cache may "
        "keep the file). `peak_group_mb`: the group's peak charge (anonymous + page cache) while decoding",
        "- dip-ca: LFU, the bundle's γ; dense-static: a ρ = 1 bundle, its most used rows pinned", "",
        "Per decode token: `wanted_mb` the rows the caches missed; `device_mb` bytes read from the block device "
        "(/proc/self/io read_bytes from the first generated token on); `requests` the store's reads; `waste` = "
        "device / wanted.", "",
        md_table(main_rows, COLS), "",
        f"Reads in flight (`Engine(io_threads=…)`, default {IO_THREADS}): DIP-CA, `--io direct`, 50 %, limited. "
        "`flash_io_s`: seconds inside the reads over the whole call.", "",
        md_table(sweep, ["io_threads", "tok_s", "flash_io_s", "device_mb", "requests", "load_1min"]), "",
        *notes, *errors, ""])
    (RESULTS / f"{name}.md").write_text(text)
    write_rows_json(rows, args.json)
    plot(main_rows, RESULTS / f"{name}.png")
    print(text)


if __name__ == "__main__":
    main()
