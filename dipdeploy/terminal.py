"""The one gate for text that dipdeploy did not write itself on its way to a terminal.

Why: a bundle's manifest, a model's config or tokenizer, a chat template and the text a model generates are
data from someone else, and a terminal obeys what it is sent. ESC and the C1 CSI (0x9b) start control
sequences (OSC 52 sets the clipboard, OSC 8 makes hyperlinks, others rewrite the screen or the title); a
carriage return overwrites what the line said; bidirectional overrides reorder what is read. Rich adds its
own language on top: ``[link=file:///etc/passwd]`` becomes a hyperlink and a stray ``[/bold]`` a
``MarkupError`` traceback. :func:`shown` turns all of these into visible, inert text, so every command
prints such strings through it (the CLI, the demo, the progress stages). Floor 1: stdlib and rich only.
"""

from __future__ import annotations

import re

#: C0 controls but tab and newline, DEL, C1 controls (0x9b is CSI on its own), lone surrogates (bytes that
#: were not UTF-8, as Python keeps them from argv and file names) and the bidirectional controls
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: what separates lines or columns; kept where the caller prints lines, a space where it prints one line
_BREAKS = re.compile("[\t\n\u2028\u2029]")


def _visible(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: object, *, lines: bool = False, markup: bool = True) -> str:
    """``text`` as it may be printed: every control character that a terminal would act on written out as
    its escape (``\\x1b``, ``\\x9b``, ``\\x0d``, ``\\u202e``), so the bytes never reach the terminal yet the
    reader sees that they were there. ``lines``: keep newlines and tabs (a generated answer, a listing);
    otherwise they become spaces (a table cell, a one-line message). ``markup``: also escape Rich markup,
    for text printed through a Rich console with markup on; pass False for plain streams (``typer.echo``,
    ``sys.stdout.write``, ``console.print(..., markup=False)``)."""
    s = _HIDDEN.sub(_visible, str(text))
    if not lines:
        s = _BREAKS.sub(" ", s)
    if markup:
        from rich.markup import escape

        s = escape(s)
    return s
