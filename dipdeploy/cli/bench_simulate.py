"""CLI of ``dipdeploy bench simulate``: parses the grid, runs ``dipdeploy.bench.simulate``, writes its rows.
Bad input is refused in one line (exit 2) before any trace is recorded or simulated."""

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
    from dipdeploy.bench import grid as g
    from dipdeploy.bench import simulate as s
    from dipdeploy.limits import MAX_TOKENS

    quick = o["quick"]

    def one(name: str, flag: str, low: int, high: int, unit: str, default: int, fast: int) -> int:
        values = g.ints(None if o[name] is None else [str(o[name])], flag, low, high, unit)
        return values[0] if values else fast if quick else default

    traces = g.split(o["trace"], "--trace")
    for t in traces:
        if t != s.SYNTHETIC:
            check_inputs(files={"--trace": Path(t).expanduser()})
    data_dir = path_value(o["data_dir"])
    check_inputs(data_dir=data_dir)
    if traces and o["density"]:
        raise ValueError("--density picks the traces recorded of --source; a --trace has its own density: give "
                         "one or the other")
    return s.SimulateGrid(
        traces=[t if t == s.SYNTHETIC else str(Path(t).expanduser()) for t in traces],
        source=str(o["source"] or s.SOURCE), densities=g.densities(o["density"]) or [0.5],
        models=g.split(o["model"], "-m/--model"), devices=g.split(o["device"], "--device") or ["a18"],
        methods=g.choices(o["method"], "--method", s.METHODS) or list(s.METHODS),
        policies=g.split(o["policy"], "--policy") or ["lfu"], gammas=g.gammas(o["gamma"]),
        precisions=g.split(o["precision"], "--precision") or ["bq4"],
        steps=one("steps", "--steps", 2, s.MAX_STEPS, "budgets", s.DEFAULT_STEPS, s.QUICK_STEPS),
        tokens=one("tokens", "--tokens", 1, MAX_TOKENS, "tokens", s.DEFAULT_TOKENS, s.QUICK_TOKENS),
        proj_tokens=one("proj_tokens", "--proj-tokens", 1, MAX_TOKENS, "tokens", s.DEFAULT_PROJ_TOKENS,
                        s.QUICK_PROJ_TOKENS),
        warmup=one("warmup", "--warmup", 0, MAX_TOKENS, "tokens", s.DEFAULT_WARMUP, s.QUICK_WARMUP),
        trace_cache=path_value(o["trace_cache"]), data_dir=data_dir)


def command_line(grid) -> str:
    words = ["dipdeploy", "bench", "simulate"]
    if grid.traces:
        words += ["--trace", ",".join(grid.traces)]
    else:
        words += ["--source", grid.source, "--density", ",".join(f"{d:g}" for d in grid.densities)]
    for m in grid.models:
        words += ["-m", m]
    words += ["--device", ",".join(grid.devices), "--method", ",".join(grid.methods), "--policy",
              ",".join(grid.policies)]
    if grid.gammas:
        words += ["--gamma", ",".join(f"{v:g}" for v in grid.gammas)]
    words += ["--precision", ",".join(grid.precisions), "--steps", str(grid.steps), "--tokens", str(grid.tokens),
              "--proj-tokens", str(grid.proj_tokens), "--warmup", str(grid.warmup)]
    return shlex.join(words)


@bench_app.command("simulate", cls=PanelCommand, short_help=SUITES["simulate"])
def simulate_cmd(
    trace: Optional[List[str]] = typer.Option(None, "--trace", help="trace files (.npz, from `dipdeploy trace`) or "
                                              "synthetic [default: --source's DIP traces, recorded once]",
                                              rich_help_panel=BASIC),
    source: Optional[str] = typer.Option(None, "--source", help="the registry model whose DIP traces are recorded "
                                         "without --trace [default: smollm2-135m]", rich_help_panel=BASIC),
    density: Optional[List[str]] = typer.Option(None, "--density", help="MLP densities ρ of the recorded traces, "
                                                "one each [default: 0.5]", rich_help_panel=BASIC),
    model: Optional[List[str]] = typer.Option(None, "--model", "-m", help="registry models whose shape is simulated; "
                                              "a larger one than the trace's is an extrapolation [default: the "
                                              "trace's]", rich_help_panel=BASIC),
    device: Optional[List[str]] = typer.Option(None, "--device", help="device profiles (`dipdeploy devices`) "
                                               "[default: a18]", rich_help_panel=BASIC),
    method: Optional[List[str]] = typer.Option(None, "--method", help="dense (dense-static, the baseline; "
                                               "required) | dip (the trace's selections) | dip-ca (re-masked) "
                                               "[default: all three]", rich_help_panel=BASIC),
    policy: Optional[List[str]] = typer.Option(None, "--policy", help="cache policies of dip and dip-ca, as "
                                               "`simulate --policy` [default: lfu]", rich_help_panel=BASIC),
    quick: bool = typer.Option(False, "--quick", help="a smoke run: --steps 5 --tokens 64 --proj-tokens 32 "
                               "--warmup 8 where not given", rich_help_panel=BASIC),
    scenario: Optional[Path] = SCENARIO,
    gamma: Optional[List[str]] = typer.Option(None, "--gamma", help="DIP-CA's γ values in [0, 1] [default: "
                                              "`simulate`'s]", rich_help_panel=ADVANCED),
    precision: Optional[List[str]] = typer.Option(None, "--precision", help="weight formats, as `simulate "
                                                  "--precision` [default: bq4]", rich_help_panel=ADVANCED),
    steps: Optional[int] = typer.Option(None, "--steps", help="DRAM budgets of each sweep, from the smallest that "
                                        "fits to the whole model [default: 9]", rich_help_panel=ADVANCED),
    tokens: Optional[int] = typer.Option(None, "--tokens", help="trace tokens replayed on the trace's own shape "
                                         "[default: 256]", rich_help_panel=ADVANCED),
    proj_tokens: Optional[int] = typer.Option(None, "--proj-tokens", help="trace tokens replayed on another shape "
                                              "[default: 64]", rich_help_panel=ADVANCED),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="first tokens replayed but not measured "
                                         "[default: 16]", rich_help_panel=ADVANCED),
    trace_cache: Optional[Path] = typer.Option(None, "--trace-cache", help="where recorded traces are kept and "
                                               "reused [default: the dipdeploy cache's traces/]",
                                               rich_help_panel=ADVANCED),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="folder with wikitext-2-raw/, to record "
                                            "traces (default: $DIPDEPLOY_DATA)", rich_help_panel=ADVANCED),
    fmt: Optional[str] = FORMAT, output: Optional[Path] = OUT, force: bool = FORCE,
) -> None:
    """Simulated tokens/s of dense-static, DIP and DIP-CA over a DRAM sweep on phone profiles (the HW simulator
    replaying a trace, `dipdeploy simulate`), each row's gain and DRAM cut against dense-static at its budget.
    Simulated, not measured on a device. The table goes to stdout (or --output), progress to stderr."""
    run_suite("simulate", dict(locals()), _plan)


def _plan(o: dict) -> Plan:
    from dipdeploy.bench.simulate import SimRow, run_simulate

    grid = _grid(o)
    return Plan(grid, command_line(grid), run_simulate, SimRow)
