"""The package's docstrings and comments say why and name the equation or the results file; they quote no
measurement (issue #55): a figure in a docstring is not rerun when the code changes, so it rots, while
the results files under benchmarks/results/ say which machine, which commit and which command.

The check reads every docstring (module, class, function, and any other bare string statement) and
every ``#`` comment (``#:`` attribute docs included) in ``dipdeploy/`` and fails on a line that looks like a measured
figure: a time, a size, a rate or a ratio, a signed or ranged percentage, two figures compared ("29.94
against 32.99"), or "measured here". Definitions that match anyway (the 4 KiB Flash block, a unit in an
example of the syntax a parser takes) are listed in :data:`ALLOWED` by file and text, exactly, so the
list cannot rot: an entry that no longer matches anything fails too. ``python tests/test_docstrings.py``
prints every hit.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dipdeploy"

# a figure: not inside a word, a decimal or a quoted example of a syntax ("120MB")
_NUM = r"(?<![\w.\"'])\d(?:[\d,]*\d)?(?:\.\d+)?"
MEASUREMENT = re.compile(rf"""(?x)
    (?!4\s?KiB)                                                      # the Flash block (dipdeploy.flash.BLOCK)
    {_NUM}\s?(?:tok/s|tokens?/s|[KMGT]i?B/s|[KMGT]i?B|s|ms|µs|us|ns|min)(?![\w/])    # a size, a time, a rate
  | {_NUM}[×x](?![\w(])                                               # a ratio, 2× (not a product, 4 × 256; not 0xFF)
  | [+−-]{_NUM}\s?%                                                   # a signed percentage
  | {_NUM}\s?[–-]\s?{_NUM}\s?%                                        # a range of percentages
  | {_NUM}\s?%\s(?:faster|slower|less|more|fewer|lower|higher|better|worse|of\ the\ largest)
  | {_NUM}(?:\s?[^\s\d,;:()]+)?\s+(?:against|vs\.?|versus|instead\ of)\s+(?:\S+\s){{0,3}}?{_NUM}  # two figures compared
  | \b(?:[Mm]easured\ (?:here|on\ this|when)|took\ {_NUM})
""")

#: (file under dipdeploy/, the exact text of the line): definitions, not measurements.
ALLOWED: set[tuple[str, str]] = set()


def texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring line and ``#`` comment of one module."""
    src = path.read_text()
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(src)):
        body = getattr(node, "body", None)
        for stmt in body if isinstance(body, list) else []:
            if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)):
                out += [(stmt.lineno + i, line) for i, line in enumerate(stmt.value.value.splitlines())]
    return sorted(out)


def hits() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for line, text in texts(path):
            if MEASUREMENT.search(text):
                found.append((rel, line, text.strip()))
    return found


def test_no_docstring_or_comment_quotes_a_measurement():
    bad = [f"dipdeploy/{f}:{n}: {t}" for f, n, t in hits() if (f, t) not in ALLOWED]
    assert not bad, ("these lines quote a measurement: state the rule and cite the results file "
                     "(benchmarks/results/*.md) instead:\n" + "\n".join(bad))


def test_the_allow_list_is_exact():
    seen = {(f, t) for f, _, t in hits()}
    assert ALLOWED <= seen, f"no longer matching, drop from ALLOWED: {sorted(ALLOWED - seen)}"


def test_the_pattern_tells_measurements_from_definitions():
    for text in ("15.6 MB of RSS", "took 387 s", "1.16–1.69× the per-layer path", "prefill 202.5 against 151.0",
                 "0.38 tok/s", "DIP-CA +14 %", "saves 1–4 % of the bytes", "about 20 µs", "measured here",
                 "PPL 44.7 vs 51.6", "47.74 PPL against TEAL uniform's 42.74", "≈6× faster", "8 % slower than"):
        assert MEASUREMENT.search(text), text
    for text in ("4 × 256 tokens", "64 × 2 int8", "2 × kv heads", "0xFF", "a 1.5 B model", "\"120MB\"", "4 KiB blocks", "a 50 % budget", "2-D vectors", "opset 21", "int4 blocks",
                 "ρ = 0.5", "K/rows", "the 95 % interval"):
        assert not MEASUREMENT.search(text), text


if __name__ == "__main__":
    for f, n, t in hits():
        print(f"dipdeploy/{f}:{n}: {t}" + ("   [allowed]" if (f, t) in ALLOWED else ""))
    sys.exit(0)
