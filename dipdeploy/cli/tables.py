"""Tables of the CLI, built to fit an 80-column terminal: cells wrap instead of being cut to "…".

Rich's default column truncates a cell that does not fit with an ellipsis, so a figure in a narrow terminal
(or a pipe, which rich treats as 80 columns) read "0.2…". Every command's table comes from :func:`table`:
cells fold onto more lines when they must, and the light box without outer padding leaves the most room.
"""

from __future__ import annotations

from rich import box
from rich.table import Table


def table(*headers: str, title: str | None = None, wrap: tuple[str, ...] = ()) -> Table:
    """A table with these column headers. Columns named in ``wrap`` (text) take the squeeze first and wrap
    at spaces; the others (names, figures) stay on one line while the table fits, and fold only if not."""
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for h in headers:
        t.add_column(h, overflow="fold", no_wrap=h not in wrap)
    return t
