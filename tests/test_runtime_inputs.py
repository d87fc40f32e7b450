"""Token ids and bundle files the engine cannot compute with are refused in one line, never a silent
wrong result or a crash: a vocabulary larger than the embedding table is refused when the bundle opens,
and a token id outside the table wherever ids enter the engine (issue 56)."""

from __future__ import annotations

import json
import shutil
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
    with pytest.raises(BundleError, match=f"the config's vocab_size \\({rows * 2} tokens\\) exceeds"):
        Engine(bundle, dram_budget="100%")
