"""Token ids and bundle files the engine cannot compute with are refused in one line, never a silent
wrong result or a crash: a vocabulary larger than the embedding table is refused when the bundle opens,
and a token id outside the table wherever ids enter the engine (issue 56)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dipdeploy.bundle.manifest import BundleError
from dipdeploy.bundle.names import MANIFEST
from dipdeploy.runtime import Engine
from dipdeploy.runtime.bundle_open import check_vocabulary, open_bundle
from dipdeploy.runtime.embedding import embedding_rows
from dipdeploy.runtime.sampler import Sampler


def _copy(bundle: Path, tmp_path: Path) -> Path:
    out = tmp_path / "bundle"
    shutil.copytree(bundle, out)
    return out


@pytest.mark.parametrize("single_session", [True, False])
def test_a_token_id_beyond_the_embedding_is_refused_on_every_path(tiny_dipca_bundle, single_session):
    eng = Engine(tiny_dipca_bundle(), dram_budget="100%", single_session=single_session, fused=False)
    rows = eng.vocab_rows
    assert rows == embedding_rows(eng.manifest) and rows > 0
    for bad in (rows, rows + 1000, -1):
        with pytest.raises(ValueError, match=f"token id {bad} is outside the embedding table's {rows} rows"):
            eng.generate([3, bad, 5], 2)
    eng.reset()
    with pytest.raises(ValueError, match="outside the embedding table"):
        eng.extend([rows], 1, Sampler())
    assert eng.sequence == []  # refused before anything was fed
    if not single_session:
        with pytest.raises(ValueError, match="outside the embedding table"):
            eng.teacher_forced([3, 4], [5, rows])
    assert len(eng.generate([3, rows - 1, 5], 2, stop_at_eos=False).tokens) == 2  # the last row is valid


def test_a_vocabulary_beyond_the_embedding_is_refused_when_the_bundle_opens(tiny_dipca_bundle, tmp_path):
    bundle = _copy(tiny_dipca_bundle(), tmp_path)
    m = open_bundle(bundle)
    rows = embedding_rows(m)
    check_vocabulary(bundle, m, rows)  # as many tokens as rows: fine
    with pytest.raises(BundleError, match=f"the tokenizer's vocabulary \\({rows + 1} tokens\\) exceeds the "
                                          f"embedding table's {rows} rows"):
        check_vocabulary(bundle, m, rows + 1)
    raw = json.loads((bundle / MANIFEST).read_text())
    raw["source"]["config"]["vocab_size"] = rows * 2
    (bundle / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=f"source.config.vocab_size {rows * 2} exceeds the embedding table's "
                                          f"{rows} rows"):
        Engine(bundle, dram_budget="100%")
    m.source["config"]["vocab_size"] = rows * 2  # past verify (as a caller holding a parsed manifest would)
    with pytest.raises(BundleError, match=f"the config's vocab_size \\({rows * 2} tokens\\) exceeds"):
        check_vocabulary(bundle, m, None)


@pytest.mark.parametrize("edit,problem", [
    (lambda raw: raw["source"]["config"].update(vocab_size=10 ** 6), "source.config.vocab_size 1000000 exceeds"),
    (lambda raw: raw["plan"].update(hidden_size=raw["plan"]["hidden_size"] * 2), "plan.hidden_size is"),
    (lambda raw: raw["source"]["config"].update(intermediate_size=7), "source.config.intermediate_size is 7"),
])
def test_verify_refuses_a_bundle_whose_shapes_disagree_with_its_config(tiny_dipca_bundle, tmp_path, edit, problem):
    """``inspect --verify`` said ok on these: every file intact, but widths or the vocabulary the engine
    cannot run with."""
    from typer.testing import CliRunner

    import dipdeploy.cli.export  # noqa: F401  (registers inspect)
    from dipdeploy.bundle.manifest import parse_manifest, verify
    from dipdeploy.cli._app import app

    bundle = _copy(tiny_dipca_bundle(), tmp_path)
    assert verify(bundle) == []
    raw = json.loads((bundle / MANIFEST).read_text())
    edit(raw)
    (bundle / MANIFEST).write_text(json.dumps(raw))
    assert any(problem in p for p in verify(bundle, parse_manifest(bundle))), verify(bundle)
    res = CliRunner().invoke(app, ["inspect", str(bundle), "--verify"])
    assert res.exit_code != 0 and problem in " ".join(res.output.split())


@pytest.mark.parametrize("io", ["mmap", "pread", "direct"])
def test_a_weight_file_shorter_than_the_manifest_is_refused_before_it_is_mapped(tiny_dipca_bundle, tmp_path, io):
    from dipdeploy.runtime.flash import FlashStore

    src = tiny_dipca_bundle() / "mlp.bin"
    size = src.stat().st_size
    path = tmp_path / "mlp.bin"
    shutil.copyfile(src, path)
    FlashStore(path, io=io, size=size).close()
    os.truncate(path, size // 2)
    with pytest.raises(BundleError, match=f"{size // 2} bytes where the manifest lists {size}") as err:
        FlashStore(path, io=io, size=size)
    assert "\n" not in str(err.value)


_RACE = """
import os, sys
from pathlib import Path
import dipdeploy.runtime.engine as engine
checked = engine.open_bundle

def truncated_after_the_checks(path, full_verify=False):
    m = checked(path, full_verify)
    os.truncate(Path(str(path)) / "mlp.bin", m.files["mlp.bin"]["size"] // 2)  # path: a BundleDir
    return m

engine.open_bundle = truncated_after_the_checks
from dipdeploy.cli import app
sys.argv = ["dipdeploy", "run", *sys.argv[1:], "-p", "hello", "--io", "mmap", "--max-new-tokens", "2"]
app()
"""


@pytest.mark.parametrize("budget", ["100%", "50%"])
def test_a_weight_file_truncated_after_the_checks_is_one_line_under_io_mmap(tiny_dipca_bundle, tmp_path, budget):
    """Truncated between the bundle's checks and the map: one line, exit 2, no SIGBUS (a subprocess, so
    the signal would show as its return code), on the one-session path and on the per-layer path."""
    bundle = _copy(tiny_dipca_bundle(), tmp_path)
    proc = subprocess.run([sys.executable, "-c", _RACE, str(bundle),
                           "--dram-budget", budget], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert [ln for ln in lines if ln.startswith("error:")] and "Traceback" not in proc.stderr
    assert len([ln for ln in lines if not ln.startswith("warning")]) == 1, lines
    if budget != "100%":  # at 100% model.onnx's session (ORT maps mlp.bin itself) refuses first, in one line
        assert "mlp.bin: size" in proc.stderr  # the checked open of the file the rows are read from


@pytest.mark.parametrize("backend", [dict(dram_budget="100%"), dict(dram_budget="50%", fused=False),
                                     dict(dram_budget="50%", fused=None)])
def test_a_stop_during_the_prefill_ends_it_after_the_current_chunk(tiny_dipca_bundle, backend):
    """A host's Ctrl-C (``should_stop``) during a long prefill returns after the chunk that is running,
    with finish "interrupted" and the fed chunks in the sequence, instead of waiting for the whole prompt."""
    eng = Engine(tiny_dipca_bundle(), prefill_chunk=4, **backend)
    prompt = [3, 17, 42, 9, 100, 7, 64, 5, 11, 12, 13]  # three chunks
    done, stop = [], []

    def on_prefill(n, total):
        done.append(n)
        stop.append(True)  # as a Ctrl-C during the first chunk would

    g = eng.generate(prompt, 4, on_prefill=on_prefill, should_stop=lambda: bool(stop))
    assert g.finish == "interrupted" and g.tokens == []
    assert done == [4] and eng.sequence == prompt[:4]
    eng.truncate(0)  # the engine stays usable: a new sequence runs the whole prompt
    g = eng.generate(prompt, 2, stop_at_eos=False, on_prefill=lambda n, t: done.append(n))
    assert g.finish == "length" and done[1:] == [4, 8, 11]
