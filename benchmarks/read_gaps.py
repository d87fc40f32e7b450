"""What a request costs against a block: the decode's own Flash reads replayed at several ``--io-gap``s
and by both readers (``--io-engine``), side by side in one process.

A DIP-CA decode under a budget misses scattered rows; ``--io direct`` reads the blocks holding them
(``dipdeploy/runtime/blockio.py``). Rows a few blocks apart can be read as one request, the blocks
between them read and dropped: fewer requests, more bytes. This script takes the misses of a real decode
(the runtime's trace: ``dipdeploy run --trace``, selections and hits per layer and token), plans every
group's batch at each gap, and times the reads of all batches with O_DIRECT (no page cache), the gaps
and readers interleaved, ``--repeats`` times; the table gives the median seconds per decode token.
The first repeat reads cold, later ones may find the host's cache of the virtual disk warm: compare
within a repeat order, and read the median.

    python benchmarks/read_gaps.py --bundle build/flash-llama-1b-bundle        # runs the decode for its trace
    python benchmarks/read_gaps.py --bundle B --trace run.npz --quick --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _common import lscpu, machine, md_table, publish

from dipdeploy.runtime.blockio import (IO_ENGINE, IO_GAP, AlignedBuffer, in_flight, make_reader, open_direct,
                                       plan_reads)

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The history of the city begins in the early"
GAPS = (0, 1, 2, 4, 8, 16, 32)


def decode_trace(bundle: Path, out: Path, tokens: int, budget: str) -> None:
    argv = [sys.executable, "-c", "from dipdeploy.cli import app; app()", "run", str(bundle), "-p", PROMPT, "-n",
            str(tokens), "--io", "direct", "--cold", "--dram-budget", budget, "--trace", str(out), "--force"]
    subprocess.run(argv, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)


def batches(bundle: Path, trace: Path, new_tokens: int) -> tuple[list[tuple[list[int], list[int], np.ndarray]], int]:
    """The batches of the trace's last ``new_tokens`` - 1 tokens, the decode steps of a run of
    ``-n new_tokens`` (per layer and group: the arrays' offsets and row bytes, the rows missed), and
    their number."""
    z = np.load(trace)
    head = json.loads(str(z["header"]))
    tensors = json.loads((bundle / "manifest.json").read_text())["tensors"]
    first = len(z["sel_in.0"]) - (new_tokens - 1)
    if new_tokens < 2 or first < 1:
        raise SystemExit(f"error: {trace} holds {len(z['sel_in.0'])} tokens; give the -n of its run as --tokens (>= 2)")
    out = []
    for t in range(first, len(z["sel_in.0"])):
        for layer in range(head["num_layers"]):
            for group, key in (("up_gate", "in"), ("down", "glu")):
                sel, hits = z[f"sel_{key}.{layer}"][t], z[f"hits_{key}.{layer}"][t].astype(bool)
                rows = np.unique(sel[~hits]).astype(np.int64)
                if not len(rows):
                    continue
                names = [n for n in tensors if n.startswith(f"model.layers.{layer}.mlp.{group}.")
                         and tensors[n]["file"] == "mlp.bin"]
                offsets = [tensors[n]["offset"] for n in names]
                row_bytes = [int(np.prod(tensors[n]["shape"][1:])) * np.dtype(tensors[n]["dtype"]).itemsize for n in names]
                out.append((offsets, row_bytes, rows))
    return out, len(z["sel_in.0"]) - first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "build" / "flash-llama-1b-bundle")
    ap.add_argument("--trace", type=Path, help="a runtime trace of a decode on --bundle (default: run one)")
    ap.add_argument("--tokens", type=int, default=16, help="the decode's -n (tokens generated): of the run made for "
                    "the trace, or of the run that wrote --trace")
    ap.add_argument("--budget", default="50%", help="--dram-budget of that decode")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="gaps 0 and the default, one repeat")
    ap.add_argument("--json", help="write the rows as JSON")
    ap.add_argument("--name", default="read-gaps", help="results/NAME.md (default: read-gaps; another machine's run "
                    "beside it, e.g. read-gaps-xeon)")
    args = ap.parse_args()
    if not (args.bundle / "manifest.json").is_file():
        ap.error(f"{args.bundle} holds no manifest.json; export a bundle first (benchmarks/flash.py --model llama-1b "
                 "writes build/flash-llama-1b-bundle)")
    gaps = (0, IO_GAP) if args.quick else GAPS
    repeats = 1 if args.quick else args.repeats
    trace = args.trace
    if trace is None:
        trace = args.bundle.parent / f"{args.bundle.name}.read-gaps-trace.npz"
        decode_trace(args.bundle, trace, args.tokens, args.budget)
    work, tokens = batches(args.bundle, trace, args.tokens)
    path = str(args.bundle / "mlp.bin")
    fd, note = open_direct(path)
    if note:
        print(f"note: {note}", file=sys.stderr)
    readers = {}  # by the kind that runs, each at its default depth: without the op library the Python pool only
    for e in ("threads", "io_uring"):
        try:
            r = make_reader(None, True, e)
        except ValueError as err:  # no ring here, or no op library
            print(f"note: {err}", file=sys.stderr)
            continue
        readers.setdefault(r.kind, r)
    buf = AlignedBuffer()
    plans = {g: [plan_reads(o, r, rows, max_gap=g) for o, r, rows in work] for g in gaps}
    seconds: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for g in gaps:
            for engine, reader in readers.items():
                t0 = time.perf_counter()
                for p in plans[g]:
                    reader.read(fd, path, p, buf.get(p.total))
                seconds.setdefault((engine, g), []).append(time.perf_counter() - t0)
    os.close(fd)
    rows = []
    for (engine, g), s in seconds.items():
        ps = plans[g]
        rows.append({"io_engine": engine, "io_gap": g, "s_per_token": float(np.median(s)) / tokens,
                     "requests_per_token": sum(p.requests for p in ps) / tokens,
                     "device_mb_per_token": sum(p.device_bytes for p in ps) / tokens / 1e6,
                     "max_bounce_mb": max(p.total for p in ps) / 1e6,
                     "repeats_s_per_token": " / ".join(f"{x / tokens:.3f}" for x in s)})
    best = min(rows, key=lambda r: r["s_per_token"])
    text = "\n".join([
        "# Read-through gaps and readers (benchmarks/read_gaps.py)", "",
        f"`python benchmarks/read_gaps.py {' '.join(sys.argv[1:])}` · {machine()} · lscpu: {lscpu()}", "",
        f"- bundle `{args.bundle.name}`; trace `{trace.name}`: {tokens} decode tokens, {len(work)} batches (one per "
        f"group with misses); the misses of `dipdeploy run --io direct --cold --dram-budget {args.budget}`",
        f"- O_DIRECT, reads in flight: {'; '.join(f'{e} {in_flight(e)}' for e in readers)}; {repeats} repeat(s), "
        f"gaps and readers interleaved; "
        f"`s_per_token`: median seconds of one token's reads; defaults: `--io-gap {IO_GAP}`, `--io-engine {IO_ENGINE}`",
        f"- load (1 min) at the end: {os.getloadavg()[0]:.2f}", "",
        md_table(rows, ["io_engine", "io_gap", "s_per_token", "requests_per_token", "device_mb_per_token",
                        "max_bounce_mb", "repeats_s_per_token"]), "",
        f"Fewest seconds: {best['io_engine']}, gap {best['io_gap']} ({best['s_per_token']:.3f} s per token).", ""])
    publish(RESULTS, args.name, args.quick, text, rows, args.json)


if __name__ == "__main__":
    main()
