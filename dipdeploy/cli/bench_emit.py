"""What the suites outside ``dipdeploy.cli.bench``'s own path share: a scenario's flags under those given,
and the run's header and rows written as ``bench decode`` writes them (markdown, CSV or JSON; stdout or
``--output``, atomically, never over a file without ``--force``; an interrupt exits 130 after the rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import typer

from dipdeploy.cli.bench import _format, _say
from dipdeploy.cli.core import check_inputs, kept, write_output
from dipdeploy.cli.errors import INTERRUPTED


def scenario_flags(suite: str, options: dict) -> tuple[dict, Optional[dict]]:
    """``options`` with a ``--scenario`` file's flags under those given, and the header's scenario entry."""
    if options.get("scenario") is None:
        return options, None
    from dipdeploy.bench.scenario import FLAGS, load

    sc = load(options["scenario"], suite)
    merged = {**options, **{name: sc.value(name, options.get(name)) for name in FLAGS[suite]}}
    return merged, {"path": str(options["scenario"]), "title": sc.title, "published": sc.published}


def begin(options: dict) -> str:
    """The checks every suite makes first: ``-o`` and ``--output`` (refused where it exists without
    ``--force``); the format."""
    out_format = _format(options["fmt"], options["output"])
    check_inputs(outputs={"--output": options["output"]}, force=options["force"])
    return out_format


def emit(suite: str, result, kind: type, command: str, options: dict, out_format: str, scenario, here,
         extra: dict | None = None, markdown_tail: Callable[[], str] = lambda: "") -> None:
    """The run's header and rows in ``out_format`` on stdout or in ``--output``; ``extra``: more header
    keys (the JSON carries them), ``markdown_tail``: what follows the markdown table."""
    from dipdeploy.bench.machine import load_now
    from dipdeploy.bench.rows import render
    from dipdeploy.paths import write_atomic

    if result.interrupted and not result.rows:
        typer.echo("interrupted", err=True)
        raise typer.Exit(INTERRUPTED)
    header = {"suite": suite, "command": command, "quick": options.get("quick", False), "scenario": scenario,
              "seconds": round(result.seconds, 1), "interrupted": result.interrupted,
              "machine": {**here.as_dict(), "line": here.line()}, "load_1min_end": load_now(),
              "notes": list(result.notes), **(extra or {})}
    text = render(result.rows, header, out_format, kind) + (markdown_tail() if out_format == "md" else "")
    _say(f"{'interrupted' if result.interrupted else 'done'} in {result.seconds:.1f} s")
    output: Optional[Path] = options["output"]
    if output is None:
        typer.echo(text, nl=False)
    else:
        kept(write_output(lambda p, f: write_atomic(p, text, force=f), output, options["force"], "--output",
                          text=text, said=False))
        _say(f"wrote {output}")
    if result.interrupted:
        raise typer.Exit(INTERRUPTED)
