"""Prefill throughput of the host runtime: ``--prefill batch`` against ``--prefill token``, side by side.

One SmolLM2-135M DIP-CA BQ4 bundle (``dipdeploy export --method dip-ca --quant bq4 --rho-in 0.55``,
exported once under build/ unless ``--bundle`` names one), one prompt: the first N tokens of WikiText-2
test (300; ``--quick`` 100), a DRAM budget of 50 % of the MLP bytes, LFU, the bundle's γ, Flash
unthrottled (page cache). Each ORT thread setting (``--threads 1,2``: 1 thread, then each count above
1 with each ``--thread-pool``, dipdeploy/runtime/threadpool.py) runs in its own process, as a shared
pool is its process's for good; in it each mode gets a fresh engine and runs the prompt (once to warm
up), then the prompt and 16 greedy tokens, then the prompt alone for its time breakdown; ``--paths
per-layer,fused`` measures each mode on the per-layer graphs and on the joined decoder
(``dipdeploy.runtime.backends.joined``: its batched prefill runs each chunk through the one graph); the rows say
prefill and decode tokens/s, the process's CPU seconds per wall second over the prompt and tokens
(spinning workers show there), its RSS and OS threads after them, the Flash MB the prompt read, and,
for the batch, the share of each group's rows the prompt's tokens selected (the union the batch reads once: why a union read, not a
dense one, README "The host runtime"). The resident plan is compared with what ``model.onnx`` (the whole
decoder, any sequence length) would hold: all its weights.

    python benchmarks/prefill.py --quick --json rows.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import lscpu, machine, md_table, write_rows_json

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
COLS = ["path", "prefill", "threads", "thread_pool", "prompt_tokens", "prefill_tok_s", "decode_tok_s", "cpu_per_wall",
        "rss_mb", "os_threads", "prompt_flash_mb", "union_in", "union_glu", "first_token", "resident_mb"]


def bundle(path: Path | None) -> Path:
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = path or ROOT / "build" / "pf-bundle"
    if not (out / "manifest.json").is_file():
        export_model(ExportConfig(method="dip-ca", quant="bq4", rho_in=0.55), out)
    return out


def prompt_ids(engine, n: int) -> list[int]:
    from dipdeploy.data import wikitext_text

    text = wikitext_text("test")[: 40 * n]
    ids = engine.encode(text)
    if len(ids) < n:
        raise SystemExit(f"only {len(ids)} prompt tokens; lower --tokens")
    return ids[:n]


def measure(path: Path, mode: str, n: int, new: int, threads: int, pool: str, graphs: str = "per-layer") -> dict:
    from dipdeploy.runtime import Engine, Sampler

    fused = graphs == "fused"
    eng = Engine(path, dram_budget="50%", policy="lfu", prefill=mode, threads=threads, thread_pool=pool, fused=fused,
                 io="mmap")
    ids = prompt_ids(eng, n)
    sel: dict[tuple[int, int], set] = {}

    def keep(i, s_in, s_glu, _h1, _h2):
        sel.setdefault((i, 0), set()).update(s_in.tolist())
        sel.setdefault((i, 1), set()).update(s_glu.tolist())

    eng.reset()
    before = eng.flash.counters.snapshot()
    eng.extend(ids, 0, Sampler(), record=None if fused else keep)  # the joined graph records no selections
    flash = eng.flash.counters - before
    cpu0, t0 = os.times(), time.perf_counter()
    g = eng.generate(ids, new, stop_at_eos=False)
    cpu1, wall = os.times(), time.perf_counter() - t0
    eng.reset()
    again = eng.extend(ids, 0, Sampler())  # the prompt alone, warm: its time breakdown
    union = [np.mean([len(sel[(i, grp)]) / rows for i in range(eng.num_layers)]) if sel else None
             for grp, rows in ((0, eng.d), (1, eng.f))]
    row = {"path": graphs, "prefill": mode, "threads": threads, "thread_pool": pool if threads > 1 else "-", "prompt_tokens": n,
           "prefill_tok_s": g.stats.prefill_tok_s, "decode_tok_s": g.stats.decode_tok_s,
           "cpu_per_wall": (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall,
           "rss_mb": g.stats.memory.get("VmRSS", 0) / 1e6, "os_threads": len(os.listdir("/proc/self/task")),
           "prompt_flash_mb": flash.bytes / 1e6,
           "union_in": union[0], "union_glu": union[1], "first_token": g.tokens[0],
           "resident_mb": eng.residency.total / 1e6, "prefill_seconds": again.stats.seconds}
    m = eng.manifest.sizes
    row["model_onnx_weights_mb"] = (m.get("bytes_dense", 0) + m.get("bytes_mlp", 0)) / 1e6
    eng.close()
    return row


def settings(threads: list[int]) -> list[tuple[int, str]]:
    """(threads, thread_pool) to measure: 1 thread once (it needs no pool), each count above with each pool."""
    from dipdeploy.runtime.threadpool import THREAD_POOLS

    return [(t, pool) for t in threads for pool in (THREAD_POOLS if t > 1 else THREAD_POOLS[:1])]


def in_child(path: Path, n: int, threads: int, pool: str, graphs: str) -> list[dict]:
    """Both modes at one thread setting on one path, measured in a fresh process (a shared pool is its
    process's)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, __file__, "--bundle", str(path), "--tokens", str(n), "--child", f"{threads}:{pool}",
               "--paths", graphs, "--json", str(out)]
        subprocess.run(cmd, check=True)
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 100-token prompt")
    ap.add_argument("--tokens", type=int, default=None, help="prompt tokens (default 300; --quick 100)")
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--threads", default="1,2", help="ORT intra-op thread counts, comma-separated")
    ap.add_argument("--paths", default="per-layer", help="per-layer and/or fused (the joined decoder), comma-separated")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # THREADS:POOL, one setting (in_child)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    n = args.tokens or (100 if args.quick else 300)
    path = bundle(args.bundle)
    if args.child:
        threads, pool = args.child.split(":")
        write_rows_json([measure(path, mode, n, 16, int(threads), pool, args.paths) for mode in ("token", "batch")],
                        args.json)
        return
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or any(p not in ("per-layer", "fused") for p in paths):
        ap.error(f"--paths {args.paths!r}: choose per-layer and/or fused")
    rows = [r for t, pool in settings([int(t) for t in args.threads.split(",")]) for graphs in paths
            for r in in_child(path, n, t, pool, graphs)]
    info = {**machine(), "lscpu": lscpu()}
    print(json.dumps(info, indent=1))
    print(md_table(rows, COLS))
    token = rows[0]["prefill_tok_s"]
    for r in rows:
        if r["prefill"] == "batch":
            print(f"batch, {r['path']}, {r['threads']} thread(s) {r['thread_pool']}: {r['prefill_tok_s'] / token:.1f}x "
                  f"the first row's ({rows[0]['path']}, 1 thread) token mode's prefill")
    print(f"resident plan {rows[1]['resident_mb']:.1f} MB (batch) vs {rows[0]['resident_mb']:.1f} MB (token); "
          f"model.onnx would hold {rows[0]['model_onnx_weights_mb']:.1f} MB of weights")
    write_rows_json([{**r, "machine": info} for r in rows], args.json)


if __name__ == "__main__":
    main()
