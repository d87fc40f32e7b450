"""``--help`` of the commands with many options (``run``, ``chat``): options grouped in panels, names whole.

Why not typer's own rich help: its option table shrinks the name column together with the help column
in a narrow terminal, which cuts a long name ("--repetition-pena…") where a user needs to copy it. Here
the names column never wraps; the help text beside it wraps (and folds a long word) in the room left. Each option names its panel with typer's ``rich_help_panel=``; panels
appear in the order of :data:`PANELS`, options in their declaration order.
"""

from __future__ import annotations

import inspect

from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument, TyperCommand

#: the panels, in the order printed; an option without one lands in "Options"
BASIC, SAMPLING, MEMORY, IO_PANEL, ADVANCED = "Basic", "Sampling", "Memory", "I/O", "Advanced"
PANELS = (BASIC, SAMPLING, MEMORY, IO_PANEL, ADVANCED, "Options")
_TYPES = {"str": "TEXT", "int": "INT", "float": "FLOAT", "Path": "PATH"}


def names(param) -> str:
    """An option's spellings as typed (short ones first), its value's type, and its negative form."""
    spelled = ", ".join(sorted(param.opts, key=lambda o: (o.startswith("--"), param.opts.index(o))))
    if param.secondary_opts:
        spelled += " / " + ", ".join(param.secondary_opts)
    if not getattr(param, "is_flag", False):
        kind = str(param.bare_type())
        kind = kind[kind.rfind("[") + 1:].rstrip("]")  # a repeatable option: its items' type
        spelled += " " + _TYPES.get(kind, kind.upper())
    return spelled


def _default(param) -> str:
    if param.required:
        return "[required]"
    if param.show_default is False or param.default is None or getattr(param, "is_flag", False) and \
            not param.secondary_opts:
        return ""
    if getattr(param, "is_flag", False):
        return f"[default: {(param.opts if param.default else param.secondary_opts)[-1]}]"
    if isinstance(param.default, (list, tuple)):
        return ""
    return f"[default: {param.default}]"


def _grid() -> Table:
    grid = Table.grid(padding=(0, 2), pad_edge=True)
    grid.add_column(no_wrap=True)  # a name is never cut
    grid.add_column(overflow="fold", ratio=1)
    return grid


def render(command, ctx, console: Console | None = None) -> None:
    console = console or Console(highlight=False)  # width: the terminal's, else $COLUMNS, else 80
    arguments = [p.name.upper() for p in command.get_params(ctx) if isinstance(p, TyperArgument)]
    usage = " ".join([ctx.command_path, "[OPTIONS]", *arguments])
    paragraphs = [" ".join(p.split()) for p in inspect.cleandoc(command.help or "").split("\n\n")]
    console.print(Text(f"Usage: {usage}"), *(Text("\n" + p) for p in paragraphs), sep="\n")
    groups: dict[str, list] = {}
    for param in command.get_params(ctx):
        if isinstance(param, TyperArgument):
            groups.setdefault("Arguments", []).append(
                (param.name.upper(), param.help or "", _default(param)))
        elif param.opts:
            panel = getattr(param, "rich_help_panel", None) or "Options"
            groups.setdefault(panel, []).append((names(param), param.help or "", _default(param)))
    for panel in ("Arguments", *PANELS, *sorted(set(groups) - set(PANELS) - {"Arguments"})):
        if panel not in groups:
            continue
        grid = _grid()
        for name, text, default in groups[panel]:
            grid.add_row(Text(name, style="bold"), Text(" ".join(filter(None, (text, default)))))
        console.print(Text(""), Text(f"{panel}:", style="bold underline"), grid, sep="\n")


class PanelCommand(TyperCommand):
    """A typer command whose ``--help`` is :func:`render`'s."""

    def format_help(self, ctx, formatter) -> None:
        render(self, ctx)
