"""No code shipped with a model runs: the family is checked from the raw ``config.json`` before
transformers reads the folder, and every transformers call passes ``trust_remote_code=False``.

The hostile folder's ``evil.py`` writes a marker file when imported; each refusal must be one line, never
show transformers' "run the custom code? [y/N]" prompt (stdin answers "y" to be sure), and leave no marker.
A folder of a supported architecture whose ``config.json`` carries an ``auto_map`` is refused too, with the
fix (delete the entry) that then loads it with transformers' own class.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dipdeploy.arch import ArchitectureError
from dipdeploy.loading import load_model, resolve

ROOT = Path(__file__).resolve().parents[1]
EVIL = 'import os\nopen(os.environ["DIPDEPLOY_TEST_MARKER"], "w").write("imported")\n'
AUTO_MAP = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.Model"}


def _cli(args: list[str], marker: Path) -> subprocess.CompletedProcess:
    """The CLI in a child process whose stdin says "y" to any prompt."""
    code = "import sys; from dipdeploy.cli import app; sys.argv[0] = 'dipdeploy'; app()"
    env = {**os.environ, "DIPDEPLOY_TEST_MARKER": str(marker), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], input="y\n", capture_output=True, text=True,
                          env=env, timeout=300)


def _refused_in_one_line(done: subprocess.CompletedProcess, message: str, marker: Path) -> None:
    out = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, out
    assert len(out.splitlines()) == 1 and out.startswith("error:") and message in out, out
    assert "[y/N]" not in out and "Traceback" not in out, out
    assert not marker.exists()


@pytest.fixture
def evil(tmp_path) -> Path:
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["EvilForCausalLM"], "model_type": "evil",
                                                    "auto_map": AUTO_MAP}))
    (folder / "evil.py").write_text(EVIL)
    return folder


@pytest.fixture
def llama_with_auto_map(tmp_path) -> Path:
    """The tiny Llama's real folder, plus an auto_map pointing at code of its own."""
    folder = tmp_path / "llama"
    shutil.copytree(resolve("tiny-llama")[0], folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil.Model"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(EVIL)
    return folder


def test_control_importing_the_evil_module_leaves_the_marker(evil, tmp_path):
    """The marker can appear: what the refusals below must prevent is observable."""
    marker = tmp_path / "marker"
    subprocess.run([sys.executable, "-c", "import evil"], cwd=evil, check=True,
                   env={**os.environ, "DIPDEPLOY_TEST_MARKER": str(marker)})
    assert marker.exists()


def test_unknown_architecture_with_auto_map_is_refused_without_a_prompt(evil, tmp_path):
    marker = tmp_path / "marker"
    _refused_in_one_line(_cli(["eval", "--model", str(evil)], marker), "'EvilForCausalLM' has no family record",
                         marker)


def test_known_architecture_with_auto_map_is_refused_and_the_fix_loads_it(llama_with_auto_map, tmp_path,
                                                                          monkeypatch):
    marker = tmp_path / "marker"
    _refused_in_one_line(_cli(["eval", "--model", str(llama_with_auto_map)], marker),
                         "delete the auto_map entry from config.json", marker)
    monkeypatch.setenv("DIPDEPLOY_TEST_MARKER", str(marker))
    with pytest.raises(ArchitectureError, match="auto_map"):
        load_model(str(llama_with_auto_map))
    config = json.loads((llama_with_auto_map / "config.json").read_text())
    del config["auto_map"]
    (llama_with_auto_map / "config.json").write_text(json.dumps(config))
    lm = load_model(str(llama_with_auto_map))
    assert type(lm.model).__module__.startswith("transformers.") and not marker.exists()


def test_tokenizer_auto_map_is_not_imported(llama_with_auto_map, tmp_path, monkeypatch):
    """A tokenizer class of the folder's own code: transformers refuses it (trust_remote_code=False)."""
    marker = tmp_path / "marker"
    monkeypatch.setenv("DIPDEPLOY_TEST_MARKER", str(marker))
    config = json.loads((llama_with_auto_map / "config.json").read_text())
    del config["auto_map"]
    (llama_with_auto_map / "config.json").write_text(json.dumps(config))
    tok = json.loads((llama_with_auto_map / "tokenizer_config.json").read_text())
    tok.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
    (llama_with_auto_map / "tokenizer_config.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="the tokenizer cannot be loaded") as err:
        load_model(str(llama_with_auto_map))
    assert "\n" not in str(err.value) and not marker.exists()


@pytest.mark.parametrize("config, message", [
    ({"model_type": "llama"}, "names no architectures"),
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "GPT2LMHeadModel"),
    ([1, 2], "not a JSON table"),
], ids=["no architectures", "not a GLU family", "not a table"])
def test_raw_config_refusals(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message) as err:
        load_model(str(tmp_path))
    assert "\n" not in str(err.value)


def _transformers_calls(tree: ast.AST):
    """Every ``Auto*.from_pretrained``/``Auto*.from_config`` call in a module."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("from_pretrained", "from_config")
                and isinstance(node.func.value, ast.Name) and node.func.value.id.startswith("Auto")):
            yield node


def test_every_transformers_load_refuses_remote_code():
    """``trust_remote_code=False`` is explicit at every call, so no prompt and no import can happen."""
    calls, missing = 0, []
    for path in sorted((ROOT / "dipdeploy").rglob("*.py")):
        for call in _transformers_calls(ast.parse(path.read_text(encoding="utf-8"))):
            calls += 1
            kw = {k.arg: k.value for k in call.keywords}
            value = kw.get("trust_remote_code")
            if not (isinstance(value, ast.Constant) and value.value is False):
                missing.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert calls >= 8 and missing == []
