"""The int4 token embedding of a quantised bundle: GatherBlockQuantized rows in embed.onnx and
model.onnx, the host runtime's own row reads bit-equal to them, a tied lm_head reading the same blocks."""

import json

import numpy as np
import onnxruntime as ort
import pytest

from dipdeploy.bundle.manifest import read_manifest, verify
from dipdeploy.export.bundle import export_model
from dipdeploy.export.config import ExportConfig
from dipdeploy.runtime.embedding import EmbeddingRows, embedding_table_bytes


def _export(tmp_path, model, name="b", **kw):
    kw.setdefault("validate_tokens", 4)
    return export_model(ExportConfig(model=model, method="dip", rho_in=0.6, quant="bq4", **kw), tmp_path / name).out


def test_runtime_rows_equal_embed_onnx_bit_for_bit(tmp_path):
    """Gemma: a tied head and the √d multiplier on top of the int4 rows."""
    out = _export(tmp_path, "tiny-gemma3")
    m = read_manifest(out)
    assert m.quant["embedding"].startswith("com.microsoft::GatherBlockQuantized")
    assert "model.embed_tokens.weight" not in m.tensors and m.tensors["model.embed_tokens.qweight"]["dtype"] == "uint8"
    d, vocab = m.source["config"]["hidden_size"], m.source["config"]["vocab_size"]
    sess = ort.InferenceSession(str(out / "embed.onnx"), providers=["CPUExecutionProvider"])
    tokens = np.array([[0, 1, 7, vocab // 2, vocab - 1]], np.int64)
    want = sess.run(None, {"input_ids": tokens})[0]
    from dipdeploy.arch import arch_of

    rows = EmbeddingRows(out, m, arch_of(m.source["config"]).embedding_multiplier(m.source["config"]))
    got = np.empty((tokens.shape[1], d), np.float32)
    for j, t in enumerate(tokens[0]):
        rows.read(int(t), got[j])
    rows.close()
    np.testing.assert_array_equal(got, want[0])  # the same (q − 8)·s in float32, by contract
    with pytest.raises(ValueError, match="outside the vocabulary"):
        rows.read(vocab, got[0])


def test_tied_head_reads_the_embedding_blocks_stored_once(tmp_path):
    int4 = _export(tmp_path, "tiny-gemma3", "int4")
    fp32 = _export(tmp_path, "tiny-gemma3", "fp32", embedding="fp32")
    m = read_manifest(int4)
    head, table = m.tensors["lm_head.qweight"], m.tensors["model.embed_tokens.qweight"]
    assert head["view_of"] == "model.embed_tokens.qweight"
    assert (head["file"], head["offset"], head["length"]) == (table["file"], table["offset"], table["length"])
    assert m.tensors["lm_head.scales"]["view_of"] == "model.embed_tokens.scales"
    assert verify(int4, m) == [] and m.validation["ok"]
    assert embedding_table_bytes(m) == 0  # the head keeps those bytes resident anyway
    f = read_manifest(fp32)
    assert f.quant["embedding"] == "fp32" and f.tensors["model.embed_tokens.weight"]["dtype"] == "float32"
    assert embedding_table_bytes(f) == f.tensors["model.embed_tokens.weight"]["length"]
    assert f.validation["ok"]
    assert (int4 / "dense.bin").stat().st_size < (fp32 / "dense.bin").stat().st_size


def test_untied_embedding_is_excluded_from_the_resident_plan(tmp_path):
    m = read_manifest(_export(tmp_path, "tiny-llama"))
    assert not any("view_of" in t for t in m.tensors.values())
    assert embedding_table_bytes(m) == sum(m.tensors[f"model.embed_tokens.{k}"]["length"] for k in ("qweight", "scales"))


def test_a_view_that_does_not_cover_its_tensor_is_damage(tmp_path):
    out = _export(tmp_path, "tiny-gemma3", validate_tokens=0)
    path = out / "manifest.json"
    raw = json.loads(path.read_text())
    raw["tensors"]["lm_head.qweight"]["offset"] += 4096
    path.write_text(json.dumps(raw))
    problems = verify(out, checksums="none")
    assert any("lm_head.qweight" in p and "view_of" in p for p in problems)
    raw["tensors"]["lm_head.qweight"]["offset"] -= 4096
    raw["tensors"]["lm_head.qweight"]["view_of"] = "model.layers.0.self_attn.o_proj.qweight"
    path.write_text(json.dumps(raw))
    assert any("view_of" in p for p in verify(out, checksums="none"))
