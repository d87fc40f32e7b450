"""Benchmark: reading a subset of weight rows from DRAM, in order or scattered (why sparse decode is not
free on a desktop; benchmarks/results/export.md, "Reading").

DIP reads the selected rows of each MLP matrix: half of them at ρ = 0.5, in score order, i.e. scattered.
This measures, with a plain C++ read loop (benchmarks/row_reads.cc, built here with g++ -O2 -mavx2), what
one core achieves over a DRAM-resident buffer (200 MB, far above the LLC) for SmolLM2's row sizes (288 B:
a down row of BQ4 codes; 1536 B: an up|gate row) and a Mistral-7B up|gate row (14336 B):

- all:       every row in order (a dense MatMul's pattern): the sequential bandwidth;
- sorted:    one row in ``keep`` (random), in address order;
- shuffled:  the same rows in random order (DIP's pattern), without and with software prefetch.

GB/s counts only the bytes of the rows read. A sparse read pays off only when
``GB/s(shuffled) / GB/s(all) > ρ``: reading ρ of the bytes must take less time than reading them all.

    python benchmarks/row_reads.py [--quick] [--json OUT]

Writes benchmarks/results/row_reads.md. x86-64 with AVX2 only.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from _common import machine, md_table, write_rows_json

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def build(work: Path) -> Path:
    exe = work / "row_reads"
    subprocess.run(["g++", "-O2", "-mavx2", "-o", str(exe), str(HERE / "row_reads.cc")], check=True)
    return exe


def gbps(exe: Path, mb: int, row: int, keep: int, ahead: int, order: str, reps: int) -> float:
    out = subprocess.run([str(exe), str(mb), str(row), str(keep), str(ahead), order, str(reps)],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 repeats, fewer cases (< 1 min)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    reps = 3 if args.quick else 5
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        sizes = (288, 1536) if args.quick else (288, 1536, 14336)
        for row in sizes:
            full = gbps(exe, 200, row, 1, 0, "all", reps)
            rows.append({"row_bytes": row, "rows_read": "all", "order": "in order", "prefetch_rows_ahead": 0,
                         "gb_per_s": full, "time_vs_all_rows": 1.0})
            for order, ahead in (("sorted", 0), ("shuffled", 0), ("shuffled", 16)):
                g = gbps(exe, 200, row, 2, ahead, order, reps)
                rows.append({"row_bytes": row, "rows_read": "1 in 2", "order": order, "prefetch_rows_ahead": ahead,
                             "gb_per_s": g, "time_vs_all_rows": round(0.5 * full / g, 3)})
                print(rows[-1], flush=True)
    env = machine()
    text = [f"# Reading rows from DRAM (benchmarks/row_reads.py)\n\n{env} · "
            f"`python benchmarks/row_reads.py{' --quick' if args.quick else ''}` · 200 MB buffer, best of {reps}\n",
            "`time_vs_all_rows` = time to read the half of the rows / time to read every row in order "
            "(< 1: the sparse read is faster).\n",
            md_table(rows, ["row_bytes", "rows_read", "order", "prefetch_rows_ahead", "gb_per_s", "time_vs_all_rows"])]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "row_reads.md").write_text("\n".join(text) + "\n")
    write_rows_json([{"machine": env}, *rows], args.json)
    print("\n".join(text))


if __name__ == "__main__":
    main()
