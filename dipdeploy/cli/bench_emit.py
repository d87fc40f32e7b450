"""The one path of every ``dipdeploy bench`` suite: a scenario file's flags under those given, every input
checked before any work (``-o``; ``--output``, refused where it exists without ``--force``; the suite's own
grid), the machine named, the suite run with its progress on stderr, and the run's header and rows written
(markdown, CSV or JSON; stdout or ``--output``, atomically; an interrupt exits 130 after the rows). A suite
gives only what is its own: how its options become a grid and a command line, and how the grid runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import typer

from dipdeploy.cli.core import check_inputs, fail, kept, write_output
from dipdeploy.cli.errors import INTERRUPTED
from dipdeploy.terminal import shown

#: what a suite's checks and runs raise for bad input or a failed run: one line, exit 2
ERRORS = (ValueError, FileNotFoundError, FileExistsError, KeyError, PermissionError, RuntimeError, OSError)


@dataclass(frozen=True)
class Plan:
    """A suite's run, its input checked: the grid, the command line that reruns it (every list written
    out), the function that runs it (``run(grid, notice)`` gives a ``dipdeploy.bench.rows.SuiteResult``),
    its row class, and what the suite adds to the header (``extra``, from the result: the JSON carries
    it) and under the markdown table (``markdown_tail``)."""

    grid: object
    command: str
    run: Callable
    kind: type
    extra: Callable[[object], dict] = field(default=lambda result: {})
    markdown_tail: Callable[[object], str] = field(default=lambda result: "")


def say(line: str) -> None:
    """A progress line on stderr."""
    typer.echo(shown(line, markup=False), err=True)


def path_value(value) -> Optional[Path]:
    """A path flag's value, from the command line (a Path) or a scenario file (a string, ~ allowed)."""
    return None if value in (None, "") else Path(str(value)).expanduser()


def out_format(fmt: Optional[str], output: Optional[Path]) -> str:
    """``-o`` as given, else the ``--output`` file's suffix (.md, .csv, .json), else markdown."""
    from dipdeploy.bench.rows import FORMATS

    if fmt is None and output is not None and output.suffix.lstrip(".").lower() in FORMATS:
        return output.suffix.lstrip(".").lower()
    fmt = (fmt or "md").lower()
    if fmt not in FORMATS:
        raise ValueError(f"-o {fmt!r} is not one of {', '.join(FORMATS)}")
    return fmt


def scenario_flags(suite: str, options: dict) -> tuple[dict, Optional[dict]]:
    """``options`` with a ``--scenario`` file's flags under those given, and the header's scenario entry."""
    if options.get("scenario") is None:
        return options, None
    from dipdeploy.bench.scenario import FLAGS, load

    sc = load(options["scenario"], suite)
    merged = {**options, **{name: sc.value(name, options.get(name)) for name in FLAGS[suite]}}
    return merged, {"path": str(options["scenario"]), "title": sc.title, "published": sc.published}


def run_suite(suite: str, given: dict, prepare: Callable[[dict], Plan]) -> None:
    """Check everything, run the suite, write its rows: ``given``, the command's options as parsed;
    ``prepare``, the suite's options (a scenario's merged in) to its checked ``Plan``."""
    from dipdeploy.bench.machine import machine

    try:
        fmt = out_format(given["fmt"], given["output"])
        check_inputs(outputs={"--output": given["output"]}, force=given["force"])
        options, scenario = scenario_flags(suite, given)
        plan = prepare(options)
        here = machine()
        say(f"machine: {here.line()}")
        result = plan.run(plan.grid, say)
    except ERRORS as err:
        fail(err)
    emit(suite, result, plan, options, fmt, scenario, here)


def emit(suite: str, result, plan: Plan, options: dict, fmt: str, scenario: Optional[dict], here) -> None:
    """The run's header and rows in ``fmt`` on stdout or in ``--output``; the exit status 130 where the run
    was interrupted (after the rows it measured)."""
    from dipdeploy.bench.machine import load_now
    from dipdeploy.bench.rows import render
    from dipdeploy.paths import write_atomic

    if result.interrupted and not result.rows:
        typer.echo("interrupted", err=True)
        raise typer.Exit(INTERRUPTED)
    header = {"suite": suite, "command": plan.command, "quick": options.get("quick", False), "scenario": scenario,
              "seconds": round(result.seconds, 1), "interrupted": result.interrupted,
              "machine": {**here.as_dict(), "line": here.line()}, "load_1min_end": load_now(),
              "notes": list(result.notes), **plan.extra(result)}
    text = render(result.rows, header, fmt, plan.kind) + (plan.markdown_tail(result) if fmt == "md" else "")
    say(f"{'interrupted' if result.interrupted else 'done'} in {result.seconds:.1f} s")
    output: Optional[Path] = options["output"]
    if output is None:
        typer.echo(text, nl=False)
    else:
        kept(write_output(lambda p, f: write_atomic(p, text, force=f), output, options["force"], "--output",
                          text=text, said=False))
        say(f"wrote {output}")
    if result.interrupted:  # the partial rows are out; the exit status still says the run did not finish
        raise typer.Exit(INTERRUPTED)
