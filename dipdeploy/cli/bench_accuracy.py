"""CLI of ``dipdeploy bench accuracy``: parses the grid, runs ``dipdeploy.bench.accuracy``, writes its rows and
the iso-accuracy view. Bad input is refused in one line (exit 2) before any model is loaded."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import List, Optional

import typer

from dipdeploy.cli.bench import FORCE, FORMAT, OUT, SCENARIO, SUITES, bench_app
from dipdeploy.cli.bench_emit import Plan, path_value, run_suite
from dipdeploy.cli.core import check_inputs
from dipdeploy.cli.helpview import ADVANCED, BASIC, PanelCommand


def _grid(o: dict):
    from dipdeploy.bench import accuracy as a
    from dipdeploy.bench import grid as g
    from dipdeploy.limits import MAX_THREADS, MAX_TOKENS, MAX_WINDOWS
    from dipdeploy.sparsity.plan import ALLOCATIONS

    def one(name: str, flag: str, low: int, high: int, unit: str) -> Optional[int]:
        values = g.ints(None if o[name] is None else [str(o[name])], flag, low, high, unit)
        return values[0] if values else None

    quick = o["quick"]
    seqlen = one("seqlen", "--seqlen", 2, MAX_TOKENS, "tokens")
    windows = one("windows", "--windows", 1, MAX_WINDOWS, "windows")
    data_dir = path_value(o["data_dir"])
    check_inputs(data_dir=data_dir)
    models = g.split(o["model"], "-m/--model")
    for model in models:
        check_inputs(model=model)
    return a.AccuracyGrid(
        models=models,
        methods=g.choices(o["method"], "--method", a.METHODS) or ["dense", "dip"],
        densities=g.densities(o["density"]) or [0.5],
        allocations=g.choices(o["allocation"], "--allocation", ALLOCATIONS) or ["uniform"],
        quants=g.split(o["quant"], "--quant") or [a.NO_QUANT],
        tasks=g.choices(o["task"], "--task", a.TASKS) or ["wikitext2"],
        seqlen=seqlen or (a.QUICK_SEQLEN if quick else None), windows=windows or (a.QUICK_WINDOWS if quick else None),
        limit=one("limit", "--limit", 1, 10**6, "problems"), data_dir=data_dir,
        device=None if o["device"] in (None, "") else str(o["device"]),
        threads=one("threads", "-t/--threads", 1, MAX_THREADS, "threads"))


def command_line(grid) -> str:
    from dipdeploy.eval import EvalConfig

    base = EvalConfig()
    words = ["dipdeploy", "bench", "accuracy"]
    for m in grid.models:
        words += ["-m", m]
    words += ["--method", ",".join(grid.methods), "--density", ",".join(f"{d:g}" for d in grid.densities),
              "--allocation", ",".join(grid.allocations), "--quant", ",".join(grid.quants),
              "--task", ",".join(grid.tasks), "--seqlen", str(grid.seqlen or base.seqlen),
              "--windows", str(grid.windows or base.max_windows)]
    for flag, value in (("--limit", grid.limit), ("--data-dir", grid.data_dir), ("--device", grid.device),
                        ("-t", grid.threads)):
        if value is not None:
            words += [flag, str(value)]
    return shlex.join(words)


@bench_app.command("accuracy", cls=PanelCommand, short_help=SUITES["accuracy"])
def accuracy_cmd(
    model: Optional[List[str]] = typer.Option(None, "--model", "-m", help="registry model (`dipdeploy models`) or "
                                              "Hugging Face folder; a comma list or repeated", rich_help_panel=BASIC),
    method: Optional[List[str]] = typer.Option(None, "--method", help="dense | dip | dip-ca | teal | cats | "
                                               "predictor, as `eval --method`; dense is measured once per model and "
                                               "format in every run [default: dense,dip]", rich_help_panel=BASIC),
    density: Optional[List[str]] = typer.Option(None, "--density", help="target MLP densities ρ in (0, 1]; a "
                                                "density a method cannot reach is left out [default: 0.5]",
                                                rich_help_panel=BASIC),
    quant: Optional[List[str]] = typer.Option(None, "--quant", help="weight formats as `eval --quant` (none: fp32) "
                                              "[default: none]", rich_help_panel=BASIC),
    task: Optional[List[str]] = typer.Option(None, "--task", help="wikitext2 (perplexity) | humaneval (greedy "
                                             "pass@1, as `eval --task humaneval`) [default: wikitext2]",
                                             rich_help_panel=BASIC),
    seqlen: Optional[int] = typer.Option(None, "--seqlen", help="test window length [default: eval's, 2048; "
                                         "--quick: 512]", rich_help_panel=BASIC),
    windows: Optional[int] = typer.Option(None, "--windows", help="test windows [default: eval's, 16; --quick: 2]",
                                          rich_help_panel=BASIC),
    limit: Optional[int] = typer.Option(None, "--limit", help="humaneval: the first N problems [default: all]",
                                        rich_help_panel=BASIC),
    quick: bool = typer.Option(False, "--quick", help="a smoke run: --seqlen 512 --windows 2 where not given",
                               rich_help_panel=BASIC),
    scenario: Optional[Path] = SCENARIO,
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="folder with wikitext-2-raw/ (default: "
                                            "$DIPDEPLOY_DATA)", rich_help_panel=BASIC),
    allocation: Optional[List[str]] = typer.Option(None, "--allocation", help="per-layer allocations as `eval "
                                                   "--allocation` [default: uniform]", rich_help_panel=ADVANCED),
    device: Optional[str] = typer.Option(None, "--device", help="where torch computes, as `eval --device` "
                                         "[default: auto]", rich_help_panel=ADVANCED),
    threads: Optional[int] = typer.Option(None, "--threads", "-t", help="torch threads [default: torch's]",
                                          rich_help_panel=ADVANCED),
    fmt: Optional[str] = FORMAT, output: Optional[Path] = OUT, force: bool = FORCE,
) -> None:
    """WikiText-2 perplexity (and HumanEval pass@1 with --task humaneval) of each method at each density, as
    `dipdeploy eval` measures them, × dense against the dense row of the same run, and the iso-accuracy
    view: each method's lowest density within eval's iso-accuracy tolerances of dense perplexity. The table goes to stdout
    (or --output), progress to stderr."""
    run_suite("accuracy", dict(locals()), _plan)


def _plan(o: dict) -> Plan:
    from dataclasses import asdict

    from dipdeploy.bench.accuracy import AccuracyRow, iso_markdown, run_accuracy

    grid = _grid(o)
    return Plan(grid, command_line(grid), run_accuracy, AccuracyRow,
                extra=lambda result: {"iso": [asdict(r) for r in result.iso]},
                markdown_tail=lambda result: iso_markdown(result.iso))
