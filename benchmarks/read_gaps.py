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

``--dense-bundle`` replays the misses of a dense-static decode of the same model (the ρ = 1 bundle under
``--policy static``, the same budget) in the same loop, at the default gap: where both methods' tokens
wait on the device, DIP-CA / dense-static can approach the ratio of these two read times and no more
(dipdeploy/runtime/DESIGN.md, "What bounds the ratio").

    python benchmarks/read_gaps.py --bundle build/flash-llama-1b-bundle        # runs the decode for its trace
    python benchmarks/read_gaps.py --bundle build/flash-llama-1b-bundle --dense-bundle build/flash-llama-1b-bundle-dense
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

from dipdeploy.flash import plan_reads
from dipdeploy.runtime.blockio import IO_ENGINE, IO_GAP, AlignedBuffer, in_flight, make_reader, open_direct

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The history of the city begins in the early"
GAPS = (0, 1, 2, 4, 8, 16, 32)


def decode_trace(bundle: Path, out: Path, tokens: int, budget: str, policy: str | None = None) -> None:
    argv = [sys.executable, "-c", "from dipdeploy.cli import app; app()", "run", str(bundle.resolve()), "-p", PROMPT,
            "-n", str(tokens), "--io", "direct", "--cold", "--dram-budget", budget, "--trace", str(out.resolve()),
            "--force",
            *(["--policy", policy] if policy else [])]
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


def side_by_side(rows: list[dict], sparse: str, dense: str | None) -> list[str]:
    """Per reader at the default gap: the dense-static misses' read time over the sparse bundle's, the most
    that the sparse method's token can gain on dense-static's where both wait on the device."""
    if dense is None:
        return []
    at = {(r["bundle"], r["io_engine"]): r["s_per_token"] for r in rows if r["io_gap"] == IO_GAP}
    return [f"- {engine}, gap {IO_GAP}: dense-static's reads {at[dense, engine]:.3f} s a token against "
            f"{at[sparse, engine]:.3f} s: {at[dense, engine] / at[sparse, engine]:.2f}× (dense-static / {sparse})"
            for (name, engine) in at if name == dense and (sparse, engine) in at]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "build" / "flash-llama-1b-bundle")
    ap.add_argument("--trace", type=Path, help="a runtime trace of a decode on --bundle (default: run one)")
    ap.add_argument("--tokens", type=int, default=16, help="the decode's -n (tokens generated): of the run made for "
                    "the trace, or of the run that wrote --trace")
    ap.add_argument("--budget", default="50%", help="--dram-budget of that decode")
    ap.add_argument("--dense-bundle", type=Path, help="the same model's ρ = 1 bundle: its dense-static decode's "
                    "misses (--policy static, the same budget and tokens) replayed in the same loop at the default "
                    "gap, for the two read patterns side by side")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="gaps 0 and the default, one repeat")
    ap.add_argument("--json", help="write the rows as JSON")
    ap.add_argument("--name", default="read-gaps", help="results/NAME.md (default: read-gaps; another machine's run "
                    "beside it, e.g. read-gaps-xeon)")
    args = ap.parse_args()
    for b in (args.bundle, args.dense_bundle):
        if b is not None and not (b / "manifest.json").is_file():
            ap.error(f"{b} holds no manifest.json; export a bundle first (benchmarks/flash.py --model llama-1b "
                     "writes build/flash-llama-1b-bundle and build/flash-llama-1b-bundle-dense)")
    if args.dense_bundle is not None and args.dense_bundle.name == args.bundle.name:
        ap.error(f"--dense-bundle {args.dense_bundle} has the name of --bundle; the table tells them apart by name")
    gaps = (0, IO_GAP) if args.quick else GAPS
    repeats = 1 if args.quick else args.repeats
    trace = args.trace
    if trace is None:
        trace = args.bundle.parent / f"{args.bundle.name}.read-gaps-trace.npz"
        decode_trace(args.bundle, trace, args.tokens, args.budget)
    work, tokens = batches(args.bundle, trace, args.tokens)
    sources = {args.bundle.name: (args.bundle, work, gaps)}
    if args.dense_bundle is not None:
        dense_trace = args.dense_bundle.parent / f"{args.dense_bundle.name}.read-gaps-trace.npz"
        decode_trace(args.dense_bundle, dense_trace, args.tokens, args.budget, policy="static")
        dense_work, dense_tokens = batches(args.dense_bundle, dense_trace, args.tokens)
        if dense_tokens != tokens:
            raise SystemExit(f"error: {dense_trace} holds {dense_tokens} decode tokens against {tokens}")
        sources[args.dense_bundle.name] = (args.dense_bundle, dense_work, (IO_GAP,))
    readers = {}  # by the kind that runs, each at its default depth: without the op library the Python pool only
    for e in ("threads", "io_uring"):
        try:
            r = make_reader(None, True, e)
        except ValueError as err:  # no ring here, or no op library
            print(f"note: {err}", file=sys.stderr)
            continue
        readers.setdefault(r.kind, r)
    buf = AlignedBuffer()
    files, plans = {}, {}
    for name, (bundle, batch, at) in sources.items():
        path = str(bundle / "mlp.bin")
        fd, note = open_direct(path)
        if note:
            print(f"note: {note}", file=sys.stderr)
        files[name] = (fd, path)
        for g in at:
            plans[name, g] = [plan_reads(o, r, rows, max_gap=g) for o, r, rows in batch]
    seconds: dict[tuple[str, int, str], list[float]] = {}
    for _ in range(repeats):
        for (name, g), ps in plans.items():
            fd, path = files[name]
            for engine, reader in readers.items():
                t0 = time.perf_counter()
                for p in ps:
                    reader.read(fd, path, p, buf.get(p.total))
                seconds.setdefault((name, g, engine), []).append(time.perf_counter() - t0)
    for fd, _ in files.values():
        os.close(fd)
    rows = []
    for (name, g, engine), s in seconds.items():
        ps = plans[name, g]
        rows.append({"bundle": name, "io_engine": engine, "io_gap": g, "s_per_token": float(np.median(s)) / tokens,
                     "requests_per_token": sum(p.requests for p in ps) / tokens,
                     "device_mb_per_token": sum(p.device_bytes for p in ps) / tokens / 1e6,
                     "max_bounce_mb": max(p.total for p in ps) / 1e6,
                     "repeats_s_per_token": " / ".join(f"{x / tokens:.3f}" for x in s)})
    best = min((r for r in rows if r["bundle"] == args.bundle.name), key=lambda r: r["s_per_token"])
    text = "\n".join([
        "# Read-through gaps and readers (benchmarks/read_gaps.py)", "",
        f"`python benchmarks/read_gaps.py {' '.join(sys.argv[1:])}` · {machine()} · lscpu: {lscpu()}", "",
        f"- bundle `{args.bundle.name}`; trace `{trace.name}`: {tokens} decode tokens, {len(work)} batches (one per "
        f"group with misses); the misses of `dipdeploy run --io direct --cold --dram-budget {args.budget}`",
        *([f"- dense-static: bundle `{args.dense_bundle.name}`, {len(sources[args.dense_bundle.name][1])} batches; "
           f"the same run with `--policy static`, replayed at the default gap only (its misses are the same long "
           f"runs of rows every token)"] if args.dense_bundle else []),
        f"- O_DIRECT, reads in flight: {'; '.join(f'{e} {in_flight(e)}' for e in readers)}; {repeats} repeat(s), "
        f"gaps and readers interleaved; "
        f"`s_per_token`: median seconds of one token's reads; defaults: `--io-gap {IO_GAP}`, `--io-engine {IO_ENGINE}`",
        f"- load (1 min) at the end: {os.getloadavg()[0]:.2f}", "",
        md_table(rows, ["bundle", "io_engine", "io_gap", "s_per_token", "requests_per_token", "device_mb_per_token",
                        "max_bounce_mb", "repeats_s_per_token"]), "",
        f"Fewest seconds: {best['io_engine']}, gap {best['io_gap']} ({best['s_per_token']:.3f} s per token).",
        *side_by_side(rows, args.bundle.name, args.dense_bundle.name if args.dense_bundle else None), ""])
    publish(RESULTS, args.name, args.quick, text, rows, args.json)


if __name__ == "__main__":
    main()
