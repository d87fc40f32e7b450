"""CLI of ``dipdeploy bench reads`` and ``bench kernels``: the suites that time the hardware paths under the
runtime (rows read from the disk, the MLP kernel), without a model run.

Each parses its grid flags (a scenario file's under those given), refuses bad input in one line before any
file is written or session built, runs its suite (``dipdeploy.bench.reads``, ``dipdeploy.bench.kernels``)
and writes its rows as ``bench decode`` does: markdown, CSV or JSON naming the machine, on stdout or in
``--output``; progress on stderr.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import List, Optional

import typer

from dipdeploy.cli.bench import FORCE, FORMAT, OUT, QUICK, SCENARIO, SUITES, bench_app
from dipdeploy.cli.bench_emit import Plan, run_suite
from dipdeploy.cli.helpview import ADVANCED, BASIC, IO_PANEL, PanelCommand

REPS = typer.Option(None, "--repetitions", "-r", help="repetitions of each configuration, round-robin "
                    "[default: 3 (reads), 5 (kernels); --quick: 1]", rich_help_panel=BASIC)
DENSITY = typer.Option(None, "--density", help="the share of rows read or selected, in (0, 1] [default: 0.5]",
                       rich_help_panel=BASIC)


def _count(value, flag: str, low: int, high: int, unit: str) -> int:
    from dipdeploy.limits import check_count

    return check_count(int(value) if isinstance(value, str) and value.isdigit() else value, flag, low, high, unit)


def reads_plan(o: dict) -> Plan:
    """The reads suite's grid from its options (a scenario's merged in), every value checked."""
    from dipdeploy.bench import grid as g
    from dipdeploy.bench import reads as r
    from dipdeploy.bench.bundles import is_bundle
    from dipdeploy.runtime.budget import parse_bytes
    from dipdeploy.runtime.config import MAX_IO_GAP, MAX_IO_THREADS

    quick = o["quick"]
    bundles = g.split(o["model"], "-m/--model")
    for b in bundles:
        if not is_bundle(b):
            raise ValueError(f"-m {b} is not a bundle folder (from `dipdeploy export`); the reads suite replays a "
                             f"bundle's misses, or reads a scratch file without -m")
    size = r.QUICK_SIZE if quick else r.DEFAULT_SIZE
    if o["size"] is not None:
        size = parse_bytes(str(o["size"]), "--size")
    kw = dict(bundles=bundles, ios=g.choices(o["io"], "--io", r.IOS) or ["direct"],
              row_bytes=g.ints(o["row_bytes"], "--row-bytes", 1, r.MAX_ROW_BYTES, "bytes") or [r.DEFAULT_ROW_BYTES],
              densities=g.densities(o["density"]) or [0.5], orders=g.choices(o["order"], "--order", r.ORDERS)
              or ["sorted"], prefetch=g.ints(o["prefetch"], "--prefetch", 0, r.MAX_PREFETCH, "rows") or [0],
              engines=g.choices(o["io_engine"], "--io-engine", r.ENGINES) or ["auto"],
              gaps=g.ints(o["gap"], "--gap", 0, MAX_IO_GAP, "blocks"),
              depths=g.ints(o["depth"], "--depth", 1, MAX_IO_THREADS, "reads in flight"),
              caches=g.choices(o["cache"], "--cache", r.CACHES) or ["cold"],
              budgets=g.budgets(o["budget"]) or ["50%"], size=size, folder=Path(str(o["dir"] or r.DIR)).expanduser(),
              tokens=_count(o["tokens"], "--tokens", 2, r.MAX_TOKENS, "tokens") if o["tokens"] is not None
              else (r.QUICK_TOKENS if quick else r.DEFAULT_TOKENS),
              repetitions=o["repetitions"] if o["repetitions"] is not None
              else (r.QUICK_REPETITIONS if quick else r.DEFAULT_REPETITIONS))
    grid = r.ReadGrid(**kw)
    words = ["dipdeploy", "bench", "reads"]
    for b in grid.bundles:
        words += ["-m", b]
    words += ["--io", ",".join(grid.ios), "--row-bytes", ",".join(map(str, grid.row_bytes)),
              "--density", ",".join(f"{d:g}" for d in grid.densities), "--order", ",".join(grid.orders),
              "--prefetch", ",".join(map(str, grid.prefetch)), "--io-engine", ",".join(grid.engines)]
    words += ["--gap", ",".join(map(str, grid.gaps))] if grid.gaps else []
    words += ["--depth", ",".join(map(str, grid.depths))] if grid.depths else []
    words += ["--cache", ",".join(grid.caches), "--size", str(grid.size), "-r", str(grid.repetitions)]
    words += ["--budget", ",".join(grid.budgets), "--tokens", str(grid.tokens)] if grid.bundles else []
    grid.cases()  # the grid's size, refused before any file is written
    return Plan(grid, shlex.join(words + ["--dir", str(grid.folder)]), r.run_reads, r.ReadRow)


def kernels_plan(o: dict) -> Plan:
    """The kernels suite's grid from its options (a scenario's merged in), every value checked, and the op
    library found, before any session is built."""
    from dipdeploy.bench import grid as g
    from dipdeploy.bench import kernels as k
    from dipdeploy.limits import MAX_THREADS
    from dipdeploy.ops.native import require_library

    quick = o["quick"]
    shapes = []
    for name in g.split(o["model"], "-m/--model"):
        from dipdeploy.registry import is_registered

        if not is_registered(name):
            raise ValueError(f"-m {name} is not a model of the registry (`dipdeploy models`); give a registry "
                             f"name or --shape RxO")
        shapes += k.model_shapes(name)
    shapes += [k.parse_shape(s) for s in g.split(o["shape"], "--shape")]
    levels = [int(v) for v in g.choices(o["accuracy_level"], "--accuracy-level", tuple(map(str, k.LEVELS)))] or [0]
    kw = dict(shapes=shapes, formats=g.choices(o["quant"], "--quant", k.FORMATS) or ["bq4"],
              densities=g.densities(o["density"]) or [0.5],
              threads=g.ints(o["threads"], "-t/--threads", 1, MAX_THREADS, "threads") or [1],
              impls=g.choices(o["impl"], "--impl", k.IMPLS) or ["native"], levels=levels,
              caches=g.choices(o["cache"], "--cache", k.CACHES) or ["warm"],
              kernel_sets=g.choices(o["kernel_set"], "--kernel-set", k.KERNEL_SETS) or ["best"],
              calls=_count(o["calls"], "--calls", 1, k.MAX_CALLS, "calls") if o["calls"] is not None
              else (k.QUICK_CALLS if quick else k.DEFAULT_CALLS),
              repetitions=o["repetitions"] if o["repetitions"] is not None
              else (k.QUICK_REPETITIONS if quick else k.DEFAULT_REPETITIONS))
    grid = k.KernelGrid(**kw)
    words = ["dipdeploy", "bench", "kernels"]
    for m in g.split(o["model"], "-m/--model"):
        words += ["-m", m]
    explicit = g.split(o["shape"], "--shape")
    words += ["--shape", ",".join(explicit)] if explicit else []
    words += ["--quant", ",".join(grid.formats), "--density", ",".join(f"{d:g}" for d in grid.densities),
              "-t", ",".join(map(str, grid.threads)), "--impl", ",".join(grid.impls),
              "--accuracy-level", ",".join(map(str, grid.levels)), "--cache", ",".join(grid.caches),
              "--kernel-set", ",".join(grid.kernel_sets), "--calls", str(grid.calls), "-r", str(grid.repetitions)]
    require_library()
    grid.cases()  # the grid's size, refused before any session is built
    return Plan(grid, shlex.join(words), k.run_kernels, k.KernelRow)


@bench_app.command("reads", cls=PanelCommand, short_help=SUITES["reads"])
def reads_cmd(
    model: Optional[List[str]] = typer.Option(None, "--model", "-m", help="bundle folders whose decode misses are "
                                              "replayed [default: a scratch file of --size in --dir]",
                                              rich_help_panel=BASIC),
    io: Optional[List[str]] = typer.Option(None, "--io", help="dram (an AVX2 load loop over a resident buffer) | "
                                           "mmap | pread | direct (the runtime's readers) [default: direct]",
                                           rich_help_panel=BASIC),
    row_bytes: Optional[List[str]] = typer.Option(None, "--row-bytes", help="bytes of a scratch row [default: "
                                                  "1536]", rich_help_panel=BASIC),
    density: Optional[List[str]] = DENSITY,
    repetitions: Optional[int] = REPS, quick: bool = QUICK, scenario: Optional[Path] = SCENARIO,
    io_engine: Optional[List[str]] = typer.Option(None, "--io-engine", help="direct: auto | threads | io_uring, "
                                                  "as `run --io-engine` [default: auto]", rich_help_panel=IO_PANEL),
    gap: Optional[List[str]] = typer.Option(None, "--gap", help="direct: blocks read through between wanted "
                                            "rows to save a request, as `run --io-gap` [default: the runtime's]",
                                            rich_help_panel=IO_PANEL),
    depth: Optional[List[str]] = typer.Option(None, "--depth", help="direct: reads in flight (ring entries or "
                                              "pread threads), as `run --io-threads` [default: the reader's]",
                                              rich_help_panel=IO_PANEL),
    cache: Optional[List[str]] = typer.Option(None, "--cache", help="mmap, pread: cold (the file dropped from "
                                              "the page cache first) | warm [default: cold]", rich_help_panel=IO_PANEL),
    order: Optional[List[str]] = typer.Option(None, "--order", help="dram: sorted | shuffled rows [default: "
                                              "sorted]", rich_help_panel=IO_PANEL),
    prefetch: Optional[List[str]] = typer.Option(None, "--prefetch", help="dram: rows of software prefetch "
                                                 "ahead [default: 0]", rich_help_panel=IO_PANEL),
    budget: Optional[List[str]] = typer.Option(None, "--budget", help="-m: the DRAM budget of the decode whose "
                                               "misses are replayed [default: 50%]", rich_help_panel=ADVANCED),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="-m: tokens that decode generates [default: 16; "
                                         "--quick: 4]", rich_help_panel=ADVANCED),
    size: Optional[str] = typer.Option(None, "--size", help="bytes of the scratch file and the DRAM buffer "
                                       "[default: 256MiB; --quick: 64MiB]", rich_help_panel=ADVANCED),
    dir: Optional[Path] = typer.Option(None, "--dir", help="where the scratch file, the traces and the DRAM "
                                       "probe are kept, on the disk to measure [default: build/bench/reads]",
                                       rich_help_panel=ADVANCED),
    fmt: Optional[str] = FORMAT, output: Optional[Path] = OUT, force: bool = FORCE,
) -> None:
    """Rows read from this disk through the runtime's reader (--io mmap, pread, direct) or from DRAM: MB/s of
    the rows wanted and of the bytes read, IOPS, requests, bytes read against bytes wanted, over a grid of
    row sizes, densities, gaps, queue depths and readers; or, with -m, a bundle's own decode misses."""
    run_suite("reads", dict(locals()), reads_plan)


@bench_app.command("kernels", cls=PanelCommand, short_help=SUITES["kernels"])
def kernels_cmd(
    model: Optional[List[str]] = typer.Option(None, "--model", "-m", help="registry models: their MLP matrices "
                                              "(up+gate [d, 2F], down [F, d])", rich_help_panel=BASIC),
    shape: Optional[List[str]] = typer.Option(None, "--shape", help="explicit matrices RxO (rows selected from × "
                                              "outputs), e.g. 576x3072", rich_help_panel=BASIC),
    quant: Optional[List[str]] = typer.Option(None, "--quant", help="weight formats: fp32 | fp16 | bq4 | vq3 "
                                              "[default: bq4]", rich_help_panel=BASIC),
    density: Optional[List[str]] = DENSITY,
    threads: Optional[List[str]] = typer.Option(None, "--threads", "-t", help="ORT intra-op threads [default: 1]",
                                                rich_help_panel=BASIC),
    repetitions: Optional[int] = REPS, quick: bool = QUICK, scenario: Optional[Path] = SCENARIO,
    impl: Optional[List[str]] = typer.Option(None, "--impl", help="native (the op library) | fallback (stock "
                                             "onnxruntime) | matmulnbits (int4 baseline); the dense fp32 MatMul "
                                             "always runs beside [default: native]", rich_help_panel=ADVANCED),
    accuracy_level: Optional[List[str]] = typer.Option(None, "--accuracy-level", help="0 | 4 (int8: BQ4 native and "
                                                       "MatMulNBits) [default: 0]", rich_help_panel=ADVANCED),
    cache: Optional[List[str]] = typer.Option(None, "--cache", help="warm (one matrix, cache-resident where it "
                                              "fits) | cold (copies side by side, weights from DRAM) [default: "
                                              "warm]", rich_help_panel=ADVANCED),
    kernel_set: Optional[List[str]] = typer.Option(None, "--kernel-set", help="best (this CPU's) | avx2 | "
                                                   "portable, each capped set in a process of its own [default: "
                                                   "best]", rich_help_panel=ADVANCED),
    calls: Optional[str] = typer.Option(None, "--calls", help="calls of each case per repetition, interleaved "
                                        "[default: 50; --quick: 10]", rich_help_panel=ADVANCED),
    fmt: Optional[str] = FORMAT, output: Optional[Path] = OUT, force: bool = FORCE,
) -> None:
    """The SparseGatherMatMul kernel at N = 1 token against the dense fp32 MatMul of the same shape, timed
    interleaved: µs per call, GB/s of the weights read, GFLOP/s and the ratio to dense, over a grid of
    formats, densities, threads, implementations and kernel sets."""
    run_suite("kernels", dict(locals()), kernels_plan)
