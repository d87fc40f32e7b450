"""CLI of ``dipdeploy bench``: one benchmark tool with suites, in llama-bench's style.

Parses the grid flags (``dipdeploy.bench.grid``), runs the suite, presents its rows (``dipdeploy.bench.rows``)
on stdout or in ``--output``; progress goes to stderr. Refusals of bad input are one line and exit 2,
before any export or measurement.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import List, Optional

import typer

from dipdeploy.cli._app import app
from dipdeploy.bench.grid import NO_LIMIT
from dipdeploy.cli.bench_emit import ERRORS, Plan, path_value, run_suite
from dipdeploy.cli.core import fail
from dipdeploy.cli.helpview import ADVANCED, BASIC, IO_PANEL, MEMORY, PanelCommand

#: the suites built, and those planned (listed in ``bench --help`` so a user knows what is coming)
SUITES = {"decode": "prefill (ppN) and decode (tgN) tokens/s of the host runtime over a grid of models, "
                    "methods, densities, DRAM budgets, io modes and threads",
          "memory": "planned residency, peak RSS and cgroup peak of each configuration in a process of its own, "
                    "under cgroup memory limits (--limit)",
          "reads": "rows read from this disk through the runtime's reader (mmap, pread, direct) or from DRAM: "
                   "MB/s, IOPS, bytes read against wanted, over row sizes, gaps, queue depths and readers",
          "kernels": "the SparseGatherMatMul kernel against the dense MatMul, interleaved: µs per call, GFLOP/s "
                     "and × dense over formats, densities, shapes, threads and kernel sets",
          "accuracy": "WikiText-2 perplexity (and HumanEval pass@1) of the sparse methods over models, densities "
                      "and weight formats, × dense, and the iso-accuracy view",
          "simulate": "a trace projected onto phone profiles by the HW simulator: tokens/s over a DRAM sweep "
                      "against dense-static"}
PLANNED = ("recovery", "quant", "export", "profile")
OUTPUT = "Output"

bench_app = typer.Typer(
    name="bench",
    help="Benchmarks in llama-bench's style: comma lists expand to every combination, repetitions run "
         "round-robin, each suite's rows as markdown, CSV or JSON, the machine named in every file.\n\n"
         "Suites: " + "; ".join(f"{name}: {what}" for name, what in SUITES.items()) + ".\n\n"
         "Planned: " + ", ".join(PLANNED) + "; until then the scripts of benchmarks/ "
         "(docs/benchmarks.md).",
    short_help="Benchmarks in llama-bench's style: suites over grids of comma lists (see `dipdeploy bench --help`).",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(bench_app, name="bench")


@bench_app.callback(invoke_without_command=True)
def bench_main(ctx: typer.Context,
               scenario: Optional[Path] = typer.Option(None, "--scenario", help="run a scenario file "
                                                       "(benchmarks/scenarios/): the suite it names with its "
                                                       "flags, the table on stdout")) -> None:
    """Without a suite, ``--scenario FILE`` runs the suite the file names, as ``bench SUITE --scenario FILE``."""
    if ctx.invoked_subcommand is not None:
        if scenario is not None:
            fail(ValueError(f"give --scenario after the suite (`dipdeploy bench {ctx.invoked_subcommand} "
                            f"--scenario {scenario} ...`) or alone (`dipdeploy bench --scenario {scenario}`)"))
        return
    if scenario is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    from dipdeploy.bench.scenario import load

    try:
        suite = load(scenario).suite
    except ERRORS as err:
        fail(err)
    command = ctx.command.get_command(ctx, suite)
    with command.make_context(suite, ["--scenario", str(scenario)], parent=ctx) as sub:
        command.invoke(sub)


def command_line(suite: str, grid) -> str:
    """The command that reruns ``grid``: every list written out, defaults included."""
    words = ["dipdeploy", "bench", suite]
    for m in grid.models:
        words += ["-m", m]
    words += ["--method", ",".join(grid.methods), "--density", ",".join(f"{d:g}" for d in grid.densities),
              "--budget", ",".join(grid.budgets), "--io", ",".join(grid.ios)]
    if suite == "memory" or grid.limits != [NO_LIMIT]:
        words += ["--limit", ",".join(grid.limits)]
    words += ["-t", ",".join(map(str, grid.threads)), "-p", ",".join(map(str, grid.n_prompt)),
              "-n", ",".join(map(str, grid.n_gen)), "-r", str(grid.repetitions), "--quant", grid.quant]
    if grid.cold:
        words.append("--cold")
    if grid.gammas:
        words += ["--gamma", ",".join(f"{v:g}" for v in grid.gammas)]
    if grid.accuracy_levels:
        words += ["--accuracy-level", ",".join(map(str, grid.accuracy_levels))]
    from dipdeploy.bench.peers import flag_words

    return shlex.join(words + flag_words(grid.peers))


# The options both suites take (typer wants each declared in the signature; the objects are shared).
MODEL = typer.Option(None, "--model", "-m", help="registry model (`dipdeploy models`), Hugging Face folder or "
                     "bundle folder; a comma list or repeated", rich_help_panel=BASIC)
METHOD = typer.Option(None, "--method", help="dense (a ρ = 1 bundle, static pinning: dense-static) | dip | "
                      "dip-ca; models only, a bundle runs as exported [default: dip-ca]", rich_help_panel=BASIC)
DENSITY = typer.Option(None, "--density", help="MLP densities ρ in (0, 1] of dip and dip-ca [default: 0.5]",
                       rich_help_panel=BASIC)
QUICK = typer.Option(False, "--quick", help="a smoke run: -p 64 -n 16 -r 1 where not given", rich_help_panel=BASIC)
SCENARIO = typer.Option(None, "--scenario", help="a scenario file (benchmarks/scenarios/): its flags, those "
                        "given here replacing the file's", rich_help_panel=BASIC)
BUDGET = typer.Option(None, "--budget", help="DRAM budgets as `run --dram-budget` takes them: a share of the "
                      "MLP bytes (50%) or a total (120MB) [default: 50%]", rich_help_panel=MEMORY)
IO = typer.Option(None, "--io", help="Flash reads as `run --io`: auto | mmap | pread | direct [default: auto]",
                  rich_help_panel=IO_PANEL)
THREADS = typer.Option(None, "--threads", "-t", help="ORT intra-op threads [default: the physical cores, as "
                       "llama-bench's]", rich_help_panel=ADVANCED)
QUANT = typer.Option(None, "--quant", help="MLP weight format of the bundles exported for a model [default: bq4]",
                     rich_help_panel=ADVANCED)
CACHE = typer.Option(Path("build/bench/bundles"), "--bundle-cache", help="where bundles of models are exported "
                     "once and reused", rich_help_panel=ADVANCED)
FORMAT = typer.Option(None, "--format", "-o", help="md | csv | json [default: md, or the --output file's suffix]",
                      rich_help_panel=OUTPUT)
OUT = typer.Option(None, "--output", help="write the rows to this file (atomically) instead of stdout",
                   rich_help_panel=OUTPUT)
FORCE = typer.Option(False, "--force", help="overwrite an existing --output file", rich_help_panel=OUTPUT)
PEERS_PANEL = "Peers (rows of other engines, in the same run)"


def _grid(suite: str, o: dict):
    """The suite's grid from its parsed options ``o`` (a scenario's flags under those given), every value
    checked."""
    from dipdeploy.bench import grid as g
    from dipdeploy.bench.bundles import METHODS, check_model
    from dipdeploy.export.config import EXPORT_QUANTS
    from dipdeploy.limits import MAX_THREADS
    from dipdeploy.runtime.threadpool import physical_cores
    from dipdeploy.runtime.flash import IO_CHOICES

    quick = o["quick"]
    quant = o["quant"] or "bq4"
    if quant not in EXPORT_QUANTS:
        raise ValueError(f"--quant {quant!r} is not one of {', '.join(EXPORT_QUANTS)}")
    kw = dict(
        models=g.split(o["model"], "-m/--model"),
        methods=g.choices(o["method"], "--method", METHODS) or ["dip-ca"],
        densities=g.densities(o["density"]) or [0.5],
        budgets=g.budgets(o["budget"]) or [g.DEFAULT_BUDGET],
        ios=g.choices(o["io"], "--io", IO_CHOICES) or ["auto"],
        threads=g.ints(o["threads"], "-t/--threads", 1, MAX_THREADS, "threads") or [min(physical_cores(), MAX_THREADS)],
        n_prompt=g.ints(o["n_prompt"], "-p/--n-prompt", 0, g.MAX_PROMPT, "tokens")
        or [g.QUICK_PROMPT if quick else g.DEFAULT_PROMPT],
        n_gen=g.ints(o["n_gen"], "-n/--n-gen", 0, g.MAX_GEN, "tokens") or [g.QUICK_GEN if quick else g.DEFAULT_GEN],
        quant=quant, cache=o["bundle_cache"], cold=bool(o.get("cold")),
        limits=g.split(o["limit"], "--limit") or [NO_LIMIT])
    if o["repetitions"] is not None:
        kw["repetitions"] = o["repetitions"]
    elif quick:
        kw["repetitions"] = g.QUICK_REPETITIONS
    peers = None
    if suite == "memory":
        from dipdeploy.bench.memory import MemoryGrid

        grid = MemoryGrid(**kw)
    else:
        from dipdeploy.bench.peer_child import PEERS
        from dipdeploy.bench.peers import PeerFlags, check

        kw["gammas"] = g.gammas(o.get("gamma"))
        kw["accuracy_levels"] = g.accuracy_levels(o.get("accuracy_level"))
        peers = PeerFlags(tuple(g.choices(o.get("peer"), "--peer", PEERS)), path_value(o.get("gguf")),
                          path_value(o.get("genai_model")), path_value(o.get("llama_python")),
                          path_value(o.get("genai_python")))
        grid = g.DecodeGrid(**kw)
        check(peers, grid.models)  # every peer flag refused before a model is loaded or an interpreter started
    for target in grid.models:
        check_model(target)
    if peers is not None and peers.peers:
        from dipdeploy.bench.peers import resolve

        grid.peers = resolve(peers, grid.models)  # each interpreter asked for its package's version
    return grid


def _plan(suite: str, options: dict) -> Plan:
    """The decode or memory suite's grid, its size and limits refused before any export."""
    from dipdeploy.bench.decode import cases_of

    grid = _grid(suite, options)
    cases_of(grid)  # the grid's size is refused before any export
    if grid.limits != [NO_LIMIT]:
        from dipdeploy.bench.cgroup import require

        require()  # a limit where no group can be made: refused before any export
    if suite == "memory":
        from dipdeploy.bench.memory import MemoryRow, run_memory

        return Plan(grid, command_line(suite, grid), run_memory, MemoryRow)
    from dipdeploy.bench.decode import run_decode
    from dipdeploy.bench.rows import Row

    return Plan(grid, command_line(suite, grid), run_decode, Row)


@bench_app.command("decode", cls=PanelCommand, short_help=SUITES["decode"])
def decode_cmd(
    model: Optional[List[str]] = MODEL, method: Optional[List[str]] = METHOD, density: Optional[List[str]] = DENSITY,
    n_prompt: Optional[List[str]] = typer.Option(None, "--n-prompt", "-p", help="ppN rows: prefill tokens/s of an "
                                                 "N-token prompt; 0 leaves them out [default: 512; --quick: 64]",
                                                 rich_help_panel=BASIC),
    n_gen: Optional[List[str]] = typer.Option(None, "--n-gen", "-n", help="tgN rows: decode tokens/s over N "
                                              "generated tokens; 0 leaves them out [default: 128; --quick: 16]",
                                              rich_help_panel=BASIC),
    repetitions: Optional[int] = typer.Option(None, "--repetitions", "-r", help="repetitions of each "
                                              "configuration, round-robin [default: 5; --quick: 1]",
                                              rich_help_panel=BASIC),
    quick: bool = QUICK, scenario: Optional[Path] = SCENARIO, budget: Optional[List[str]] = BUDGET,
    io: Optional[List[str]] = IO,
    cold: bool = typer.Option(False, "--cold", help="drop the MLP file from the page cache before each test "
                              "(reads from the disk), as `run --cold`", rich_help_panel=IO_PANEL),
    limit: Optional[List[str]] = typer.Option(None, "--limit", help="cgroup memory limits: none (in this "
                                              "process) or a size (300MB): each repetition in a process and a "
                                              "group of that limit, page cache counted [default: none]",
                                              rich_help_panel=MEMORY),
    threads: Optional[List[str]] = THREADS, quant: Optional[str] = QUANT,
    gamma: Optional[List[str]] = typer.Option(None, "--gamma", help="DIP-CA's γ in [0, 1]: each dip-ca "
                                              "configuration once per value (γ 1: DIP's selection) [default: "
                                              "the bundle's]", rich_help_panel=ADVANCED),
    accuracy_level: Optional[List[str]] = typer.Option(None, "--accuracy-level", help="the native kernels' "
                                                       "accuracy levels, as `run --accuracy-level`: each of our "
                                                       "configurations once per level (0: fp32 activations, 4: "
                                                       "int8) [default: the bundle's]", rich_help_panel=ADVANCED),
    peer: Optional[List[str]] = typer.Option(None, "--peer", help="peers run as rows beside ours: llama.cpp | "
                                             "llama.cpp-no-repack | genai, each in its own venv's interpreter",
                                             rich_help_panel=PEERS_PANEL),
    gguf: Optional[Path] = typer.Option(None, "--gguf", help="llama.cpp's model [default: the GGUF of the -m "
                                        "registry model, if already in the cache]", rich_help_panel=PEERS_PANEL),
    genai_model: Optional[Path] = typer.Option(None, "--genai-model", help="onnxruntime-genai's model folder "
                                               "(its builder's output)", rich_help_panel=PEERS_PANEL),
    llama_python: Optional[Path] = typer.Option(None, "--llama-python", help="the Python of the venv with "
                                                "llama-cpp-python", rich_help_panel=PEERS_PANEL),
    genai_python: Optional[Path] = typer.Option(None, "--genai-python", help="the Python of the venv with "
                                                "onnxruntime-genai", rich_help_panel=PEERS_PANEL),
    bundle_cache: Path = CACHE, fmt: Optional[str] = FORMAT, output: Optional[Path] = OUT, force: bool = FORCE,
) -> None:
    """Prefill and decode tokens/s of the host runtime, llama-bench's pp and tg rows: every combination of
    the comma lists, each repeated round-robin, mean ± standard deviation per row. A registry model is
    exported once per method and density into --bundle-cache; --peer adds llama.cpp and onnxruntime-genai
    rows to the same run. The table goes to stdout (or --output), progress to stderr."""
    run_suite("decode", dict(locals()), lambda o: _plan("decode", o))


@bench_app.command("memory", cls=PanelCommand, short_help=SUITES["memory"])
def memory_cmd(
    model: Optional[List[str]] = MODEL, method: Optional[List[str]] = METHOD, density: Optional[List[str]] = DENSITY,
    n_prompt: Optional[List[str]] = typer.Option(None, "--n-prompt", "-p", help="prompt tokens of each run "
                                                 "[default: 512; --quick: 64]", rich_help_panel=BASIC),
    n_gen: Optional[List[str]] = typer.Option(None, "--n-gen", "-n", help="tokens decoded after the prompt "
                                              "[default: 128; --quick: 16]", rich_help_panel=BASIC),
    repetitions: Optional[int] = typer.Option(None, "--repetitions", "-r", help="runs of each configuration, "
                                              "round-robin; the peaks are the largest [default: 1]",
                                              rich_help_panel=BASIC),
    quick: bool = QUICK, scenario: Optional[Path] = SCENARIO, budget: Optional[List[str]] = BUDGET,
    limit: Optional[List[str]] = typer.Option(None, "--limit", help="cgroup memory limits of the runs: none or a "
                                              "size (300MB), page cache counted [default: none]",
                                              rich_help_panel=MEMORY),
    io: Optional[List[str]] = IO, threads: Optional[List[str]] = THREADS, quant: Optional[str] = QUANT,
    bundle_cache: Path = CACHE, fmt: Optional[str] = FORMAT, output: Optional[Path] = OUT, force: bool = FORCE,
) -> None:
    """What each configuration holds against what its budget planned: every run in a process of its own and
    a cgroup memory group of its own (limited by --limit), the bundle dropped from the page cache first.
    Rows: planned residency, peak RSS, the group's peak (page cache included), the times it hit the limit,
    decode tokens/s, and whether the run finished, was refused by the engine or killed by the limit."""
    run_suite("memory", dict(locals()), lambda o: _plan("memory", o))


@bench_app.command("plot", cls=PanelCommand,
                   short_help="tokens/s against the cgroup memory limit from `bench decode` JSON rows, as a PNG")
def plot_cmd(
    rows: List[Path] = typer.Argument(..., help="the JSON of one or more `bench decode --output ROWS.json` runs "
                                      "(e.g. one per --limit)"),
    output: Path = typer.Option(..., "--output", help="the PNG to write (atomically)", rich_help_panel=OUTPUT),
    test: str = typer.Option("tg128", "--test", help="the test whose tok/s is drawn, e.g. tg32 or pp512",
                             rich_help_panel=BASIC),
    title: str = typer.Option("", "--title", help="the plot's title [default: the test's]", rich_help_panel=BASIC),
    force: bool = FORCE,
) -> None:
    """One line per configuration (model, method, ρ, budget, threads): its tok/s at each limit, its unlimited
    speed at the right, the repetitions' standard deviation as error bars."""
    from dipdeploy.bench.plot import load_rows, plot
    from dipdeploy.extras import require

    require("plot")
    try:
        written = plot(load_rows(rows), output, test, title, force)
    except (ValueError, FileExistsError, OSError) as err:
        fail(err)
    typer.echo(f"wrote {written}", err=True)


from dipdeploy.cli import bench_accuracy, bench_hw, bench_simulate  # noqa: E402,F401  (register their suites)
