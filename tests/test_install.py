"""The pip user's path (docs/install.md): the runtime installs without torch or plotting, a missing extra is
one line naming it, the op library is found in a wheel as in a checkout, and a warning is one ``note:`` line.
The wheel itself is built and installed into a fresh venv by ``make wheel-check`` (scripts/wheel_check.sh)."""

import re
import tomllib
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dipdeploy import extras
from dipdeploy.cli import app
from dipdeploy.cli.errors import describe
from dipdeploy.ops import native

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower().replace("-", "_") for r in requirements}


def test_extras_table_is_pyprojects():
    optional = _project()["optional-dependencies"]
    for extra, modules in extras.EXTRAS.items():
        assert _names(optional[extra]) == set(modules), extra  # each distribution imports under its own name
    assert set(extras.PURPOSE) == set(extras.INSTALL) == set(extras.EXTRAS)


def test_runtime_install_is_light():
    core = _names(_project()["dependencies"])
    assert not core & {"torch", "transformers", "matplotlib", "onnxscript", "tqdm", "sympy"}, core
    assert {"numpy", "onnxruntime", "tokenizers"} <= core


@pytest.mark.parametrize("module, extra", [("torch", "torch"), ("transformers.models", "torch"),
                                           ("matplotlib", "plot"), ("matplotlib.pyplot", "plot")])
def test_a_missing_extra_is_one_line_naming_it(module, extra):
    text, code = describe(ModuleNotFoundError(f"No module named '{module}'", name=module))
    assert code == 1 and f"dipdeploy[{extra}]" in text and module in text and "\n" not in text
    assert extras.extra_of(module) == extra


def test_an_unrelated_missing_module_stays_an_internal_error():
    text, code = describe(ModuleNotFoundError("No module named 'nosuch'", name="nosuch"))
    assert code == 1 and text.startswith("internal error") and extras.extra_of("nosuch") is None


def test_require_names_the_first_missing_module(monkeypatch):
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda name: None if name == "matplotlib" else object())
    with pytest.raises(extras.MissingExtra, match=r"matplotlib is not installed.*dipdeploy\[plot\]"):
        extras.require("plot")
    extras.require("torch")


def test_a_plot_without_matplotlib_is_refused_before_the_work(monkeypatch, tmp_path):
    real = extras.importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    rows = tmp_path / "rows.json"
    rows.write_text("[]")
    for argv in (["simulate", "--model", "tiny-llama", "--plot", str(tmp_path / "s.png")],
                 ["bench", "plot", str(rows), "--output", str(tmp_path / "b.png")]):
        res = runner.invoke(app, argv)
        assert res.exit_code == 1, res.output
        assert res.output.count("\n") == 1 and "dipdeploy[plot]" in res.output, res.output
    assert not list(tmp_path.glob("*.png"))


def _libraries(monkeypatch, tmp_path, *, env=False, build=False, packaged=False):
    paths = {}
    for name, present in (("env", env), ("build", build), ("packaged", packaged)):
        paths[name] = tmp_path / name / native.LIB_NAME
        if present:
            paths[name].parent.mkdir(parents=True)
            paths[name].write_bytes(name.encode())
    monkeypatch.setattr(native, "built_library", lambda arch=None: paths["build"])
    monkeypatch.setattr(native, "packaged_library", lambda arch=None: paths["packaged"])
    if env:
        monkeypatch.setenv(native.ENV_LIB, str(paths["env"]))
    else:
        monkeypatch.delenv(native.ENV_LIB, raising=False)
    return paths


def test_library_search_order(monkeypatch, tmp_path):
    paths = _libraries(monkeypatch, tmp_path / "a", packaged=True)
    assert native.library_path() == paths["packaged"]  # a wheel install
    paths = _libraries(monkeypatch, tmp_path / "b", build=True, packaged=True)
    assert native.library_path() == paths["build"]  # a checkout's build before the wheel's copy
    paths = _libraries(monkeypatch, tmp_path / "c", env=True, build=True, packaged=True)
    assert native.library_path() == paths["env"]
    _libraries(monkeypatch, tmp_path / "d")
    assert native.library_path() is None


def test_the_wheels_library_is_a_known_one(monkeypatch, tmp_path):
    from dipdeploy.bundle.manifest import file_record

    paths = _libraries(monkeypatch, tmp_path, packaged=True)
    assert file_record(paths["packaged"])["sha256"] in native.known_library_hashes()


def test_the_hint_fits_where_dipdeploy_came_from(monkeypatch, tmp_path):
    assert "make ops" in native.missing_library_hint()  # this checkout
    monkeypatch.setattr(native, "BUILD_SCRIPT", tmp_path / "absent.sh")
    hint = native.missing_library_hint()
    assert "make ops" not in hint.split("after")[0] and native.ENV_LIB in hint and "wheel" in hint


def test_build_ops_in_a_wheel_with_its_library(monkeypatch, tmp_path):
    paths = _libraries(monkeypatch, tmp_path, packaged=True)
    monkeypatch.setattr(native, "BUILD_SCRIPT", tmp_path / "absent.sh")
    res = runner.invoke(app, ["build-ops"])
    assert res.exit_code == 0 and "nothing to build" in res.output and paths["packaged"].name in res.output
    paths["packaged"].unlink()
    res = runner.invoke(app, ["build-ops"])
    assert res.exit_code == 2 and "source checkout" in res.output and native.ENV_LIB in res.output, res.output


def test_a_warning_is_one_note_line(monkeypatch, tiny_dipca_bundle):
    """The engine's fallback warning, as a user without the library sees it: ``note:``, no source line."""
    monkeypatch.setattr(native, "library_path", lambda arch=None: None)
    res = runner.invoke(app, ["run", str(tiny_dipca_bundle()), "-p", "hi", "-n", "2"])
    assert res.exit_code == 0, res.output
    notes = [line for line in res.stderr.splitlines() if "native op library" in line]
    assert notes == [f"note: no native op library: running the ONNX fallback functions (slower, and holding "
                     f"more than the plan); {native.missing_library_hint()}"], res.stderr
    assert "UserWarning" not in res.stderr and "warnings.warn" not in res.stderr
    with warnings.catch_warnings():  # the CLI put Python's own display back
        assert warnings.showwarning.__module__ == "warnings"


def test_run_and_chat_close_their_engine(monkeypatch, tiny_dipca_bundle, chat_bundle):
    """A caller that lives on (a library user, CliRunner) keeps no descriptor of the bundle after `run`."""
    from dipdeploy.runtime import engine as engine_module

    closed = []
    real = engine_module.Engine.close
    monkeypatch.setattr(engine_module.Engine, "close", lambda self: (closed.append(self.path), real(self)))
    res = runner.invoke(app, ["run", str(tiny_dipca_bundle()), "-p", "hi", "-n", "2"])
    assert res.exit_code == 0, res.output
    assert closed == [tiny_dipca_bundle()]
    res = runner.invoke(app, ["chat", str(tiny_dipca_bundle()), "-n", "2"], input="/exit\n")
    assert res.exit_code == 2 and closed[1:] == [tiny_dipca_bundle()], res.output  # no template: refused
    res = runner.invoke(app, ["chat", str(chat_bundle), "-n", "2"], input="hello\n/exit\n")
    assert res.exit_code == 0 and closed[2:] == [chat_bundle], res.output


def test_the_docs_state_no_bundle_version_of_their_own():
    """The bundle version is defined once, in the code; a page that wrote a number went stale before.
    (A decision record may name the version a change came with: that is its history, not the current one.)"""
    pages = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "decisions" not in p.parts)]
    stated = [(page.name, m.group(0)) for page in pages
              for m in re.finditer(r"(?i)bundle[^.\n]{0,40}\bversion \d+", page.read_text())]
    assert not stated, stated
