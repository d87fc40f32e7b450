"""Benchmark: SparseGatherMatMul kernels vs stock-ORT fallback, dense fp32 MatMul and MatMulNBits, and
TopKColumnMask native vs fallback.

The SparseGatherMatMul tables are `dipdeploy bench kernels --scenario benchmarks/scenarios/kernels.toml`
(dipdeploy/bench/kernels.py); this script runs that suite and adds the one table the suite has no
configuration for: TopKColumnMask (DIP-CA, γ = 0.2, K as an input, per-row residency, k = D/2) at the
hidden and intermediate widths, native against fallback, timed interleaved as the suite times its cases.

    python benchmarks/gather_kernels.py --quick            # SmolLM2 shapes, one repetition
    python benchmarks/gather_kernels.py --json out.json    # full; the suite's JSON document too

Writes benchmarks/results/kernels.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from dipdeploy.paths import write_atomic

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SCENARIO = ROOT / "benchmarks" / "scenarios" / "kernels.toml"
TOPK_DIMS = (576, 1536, 4096, 14336)
QUICK = ["--shape", "576x3072", "--shape", "1536x576", "-r", "1", "--calls", "10"]


def suite(quick: bool, fmt: str) -> str:
    """The suite's table (or JSON) for the scenario, --quick on SmolLM2's shapes once."""
    cmd = [sys.executable, "-c", "from dipdeploy.cli import app; app()", "bench", "kernels", "--scenario",
           str(SCENARIO), "-o", fmt, *(QUICK if quick else [])]
    return subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout


def topk(threads: list[int], calls: int) -> list[str]:
    """The TopKColumnMask table's lines: median wall µs of ``calls`` interleaved calls per case."""
    from dipdeploy.bench.kernel_models import Bound, session
    from dipdeploy.ops.nodes import make_topk_model

    rng = np.random.default_rng(0)
    lines = ["| D | threads | impl | median µs (wall) | CPU µs | runs |", "|---|---|---|---|---|---|"]
    for d in TOPK_DIMS:
        model = make_topk_model(d, cache=True, gamma=0.2, fixed_top_n=4).SerializeToString()
        feeds = {"X": rng.standard_normal((1, d)).astype(np.float32), "K": np.array([d // 2], dtype=np.int64),
                 "C": rng.random((1, d)) < 0.5}
        cases = {(t, impl): Bound(session(model, t, impl == "native"), feeds)
                 for t in threads for impl in ("native", "fallback")}
        times = {key: [] for key in cases}
        for _ in range(calls):
            for key, bound in cases.items():
                times[key].append(bound.call_us())
        for (t, impl), got in times.items():
            wall, cpu = np.median([w for w, _ in got]), np.median([c for _, c in got])
            lines.append(f"| {d} | {t} | {impl} | {wall:.1f} | {f'{cpu:.1f}' if t == 1 else '–'} | {calls} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="SmolLM2 shapes, one repetition, fewer TopK calls")
    ap.add_argument("--json", type=Path, help="also write the suite's rows (its JSON document) here")
    ap.add_argument("--out", type=Path, default=RESULTS / "kernels.md")
    args = ap.parse_args()
    doc = suite(args.quick, "json")
    body = json.loads(doc)
    from dipdeploy.bench.kernels import KernelRow
    from dipdeploy.bench.rows import render

    table = render([KernelRow(**r) for r in body["rows"]], body["header"], "md", KernelRow)
    text = "\n".join(["# SparseGatherMatMul kernels (dipdeploy bench kernels; benchmarks/gather_kernels.py)", "",
                      table, "## TopKColumnMask (DIP-CA, γ = 0.2, fixed_top_n = 4, k = D/2, N = 1)", "",
                      *topk([1, 2], 50 if args.quick else 500), ""])
    write_atomic(args.out, text, force=True)
    if args.json:
        write_atomic(args.json, doc, force=True)
    print(text)


if __name__ == "__main__":
    main()
