"""Foreign text reaches the terminal inert (dipdeploy.terminal.shown): a manifest's or a model's strings
can neither send control sequences (OSC 52 to the clipboard, screen rewrites) nor Rich markup (hyperlinks,
a stray closing tag that raised ``MarkupError``), whether a command prints them in a table, a line or a
one-line refusal."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import dipdeploy.cli.export  # noqa: F401  (registers inspect)
import dipdeploy.cli.run  # noqa: F401  (registers run)
from dipdeploy.bundle.names import MANIFEST
from dipdeploy.cli._app import app
from dipdeploy.terminal import shown

OSC52 = "\x1b]52;c;ZXZpbA==\x07"  # "set the clipboard to 'evil'"
LINK = "[link=file:///etc/passwd]x[/link]"
CLOSING = "[/bold]"


def _rendered(text: str) -> str:
    """What a Rich console on a terminal sends for ``text`` printed with markup on."""
    out = io.StringIO()
    Console(file=out, force_terminal=True, width=200, highlight=False).print(text)
    return out.getvalue()


@pytest.mark.parametrize("raw, visible", [
    (OSC52, "\\x1b]52;c;ZXZpbA==\\x07"),
    ("a\x9b31mb", "a\\x9b31mb"),  # the one-byte CSI
    ("over\rwrite", "over\\x0dwrite"),
    ("\x00\x08\x7f", "\\x00\\x08\\x7f"),
    ("abc\u202edef", "abc\\u202edef"),  # a right-to-left override
    ("\udcff", "\\udcff"),  # a byte that was not UTF-8, as argv keeps it
])
def test_controls_become_their_visible_escapes(raw, visible):
    assert shown(raw, markup=False) == visible
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in shown(raw))


def test_lines_and_tabs_are_kept_only_when_asked():
    assert shown("a\nb\tc", lines=True, markup=False) == "a\nb\tc"
    assert shown("a\nb\tc", markup=False) == "a b c"


@pytest.mark.parametrize("text", [LINK, CLOSING, "[bold red]x", "tail\\"])
def test_markup_is_printed_as_text(text):
    assert shown(text) != text or "[" not in text  # escaped
    out = _rendered(shown(text))
    assert text in out and "\x1b]8;" not in out  # the literal text, no OSC 8 hyperlink


def test_plain_text_is_unchanged():
    text = "model.onnx: ρ 0.5, γ 1 — ok (dipdeploy export) [1/2] 50%"
    assert shown(text, markup=False) == text and _rendered(shown(text)).strip() == text


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = tmp_path_factory.mktemp("terminal") / "bundle"
    export_model(ExportConfig(model="tiny-llama", method="dip", rho_in=0.6, validate_tokens=0), out)
    return out


@pytest.fixture
def hostile(tiny, tmp_path) -> Path:
    """A copy of the tiny bundle whose manifest strings that `inspect` prints carry the attacks (fields
    it shows without a checksum over them: the manifest is the record of the others' sha256)."""
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny, bundle)
    raw = json.loads((bundle / MANIFEST).read_text())
    raw["source"].update(model=OSC52 + "model", architecture=LINK)
    raw["onnxruntime"]["exported_with"] = CLOSING + "\x9b2J"
    raw["validation"] = {"skipped": "\x1b[2J\rcleared " + CLOSING}
    (bundle / MANIFEST).write_text(json.dumps(raw))
    return bundle


def _no_sequences(out: str) -> None:
    assert "\x1b]" not in out and "\x9b" not in out and "\x07" not in out and "\r" not in out, repr(out)
    assert "\x1b]8;" not in out  # no hyperlink


def test_inspect_prints_hostile_manifest_strings_inert(hostile, monkeypatch):
    res = CliRunner().invoke(app, ["inspect", str(hostile)])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output and "\x1b" not in res.output
    _no_sequences(res.output)
    for text in ("\\x1b]52;c;ZXZpbA==\\x07model", LINK, CLOSING, "\\x9b2J", "\\x1b[2J\\x0dcleared"):
        assert text in res.output, text  # shown, as text
    # on a terminal Rich writes its own styles (ESC [ … m) but none of the bundle's sequences
    term = io.StringIO()
    monkeypatch.setattr(dipdeploy.cli.export, "console", Console(file=term, force_terminal=True, width=300))
    res = CliRunner().invoke(app, ["inspect", str(hostile), "--files"])
    assert res.exit_code == 0, res.output
    _no_sequences(term.getvalue())
    assert LINK in term.getvalue()


def test_a_refusal_quoting_the_manifest_is_one_inert_line(tiny, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny, bundle)
    raw = json.loads((bundle / MANIFEST).read_text())
    next(iter(raw["tensors"].values()))["file"] = OSC52 + CLOSING
    (bundle / MANIFEST).write_text(json.dumps(raw))
    res = CliRunner().invoke(app, ["inspect", str(bundle)])
    out = res.output.strip()
    assert res.exit_code == 2 and len(out.splitlines()) == 1 and out.startswith("error:"), out
    assert "\x1b" not in out and "Traceback" not in out


def test_run_streams_generated_text_inert(tiny, monkeypatch):
    """A model's text can hold ESC too: run's streamed pieces are printed through shown as well."""
    from dipdeploy.runtime.engine import Engine

    real = Engine.generate

    def generate(self, *args, on_text=None, **kwargs):
        on_text(OSC52 + CLOSING + "\x9b2J")  # as if the model had generated it
        return real(self, *args, on_text=on_text, **kwargs)

    monkeypatch.setattr(Engine, "generate", generate)
    res = CliRunner().invoke(app, ["run", str(tiny), "-p", "Hi", "-n", "2", "--no-native"])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\x9b" not in res.output and "\x07" not in res.output
    assert "\\x1b]52;c;ZXZpbA==\\x07" + CLOSING + "\\x9b2J" in res.output


def test_shown_is_the_only_escaping():
    """One function, so a new print site has one thing to call: no module escapes Rich markup itself."""
    package = Path(__file__).resolve().parents[1] / "dipdeploy"
    escaping = [str(p.relative_to(package)) for p in sorted(package.rglob("*.py"))
                if "markup import escape" in p.read_text() and p.name != "terminal.py"]
    assert escaping == []
