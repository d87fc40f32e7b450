"""Export of every tiny registry architecture, fp32 and BQ4: validated bundle, manifest, layout."""

import json

import onnx
import pytest

from dipdeploy.bundle.manifest import read_manifest, verify
from dipdeploy.export.bundle import export_model
from dipdeploy.export.config import ExportConfig
from tiny_models import EXPORTABLE

# compared across implementations: CI runs these under every kernel set too (Makefile: test-kernel-sets)
pytestmark = pytest.mark.numerics

TINY = EXPORTABLE  # every tiny registry model of a family the export builds


def _export(tmp_path, name="b", **kw):
    kw.setdefault("rho_in", 0.6)
    kw.setdefault("validate_tokens", 8)
    return export_model(ExportConfig(**kw), tmp_path / name)


@pytest.mark.parametrize("quant", ["none", "bq4"])
@pytest.mark.parametrize("model", TINY)
def test_dip_bundle_matches_torch(tmp_path, model, quant):
    res = _export(tmp_path, model=model, method="dip", quant=quant)
    v = res.manifest.validation
    assert v["ok"] and v["agrees_stock"] and v["agrees_native"] in (None, True)
    assert v["max_abs_diff"] <= v["tolerance"]
    m = read_manifest(res.out)
    assert verify(res.out, m) == []
    assert m.method == "dip" and len(m.plan["layers"]) == 2
    # MLP rows in their own file, dense parts in another; every tensor aligned and written once
    mlp = {n: t for n, t in m.tensors.items() if ".mlp." in n}
    assert mlp and all(t["file"] == "mlp.bin" for t in mlp.values())
    assert all(t["file"] == "dense.bin" for n, t in m.tensors.items() if n not in mlp)
    spans = sorted((t["file"], t["offset"], t["length"]) for t in m.tensors.values() if "view_of" not in t)
    assert all(off % 4096 == 0 for _, off, _ in spans)
    assert all(a[0] != b[0] or a[1] + a[2] <= b[1] for a, b in zip(spans, spans[1:]))
    if quant == "bq4":
        assert m.quant["bits_per_weight_mlp"] == pytest.approx(4.25)
        g = onnx.load(str(res.out / "model.onnx"), load_external_data=False)
        assert any(n.op_type == "MatMulNBits" for n in g.graph.node)


def test_dense_fp32_within_1e3_and_genai_names(tmp_path):
    res = _export(tmp_path, model="tiny-llama", method="dense", validate_tokens=32)
    v = res.manifest.validation
    assert v["tolerance"] == 1e-3 and v["max_abs_diff"] <= 1e-3 and v["agrees_stock"]
    g = onnx.load(str(res.out / "model.onnx"), load_external_data=False).graph
    ins, outs = [i.name for i in g.input], [o.name for o in g.output]
    assert ins[:3] == ["input_ids", "attention_mask", "position_ids"] and "past_key_values.1.value" in ins
    assert "logits" in outs and "present.0.key" in outs
    genai = json.loads((res.out / "genai_config.json").read_text())
    assert genai["model"]["decoder"]["filename"] == "model.onnx"
    assert (res.out / "tokenizer.json").is_file()


def test_stable_node_names(tmp_path):
    res = _export(tmp_path, model="tiny-phi3", method="dip", validate_tokens=0)
    names = {n.name for n in onnx.load(str(res.out / "model.onnx"), load_external_data=False).graph.node}
    for op in ("TopKColumnMask", "SparseGatherMatMul"):
        assert f"/model/layers.1/mlp/down_proj/{op}" in names
        assert f"/model/layers.0/mlp/up_gate_proj/{op}" in names


def test_dipca_runs_plain_dip_and_says_so(tmp_path):
    res = _export(tmp_path, model="tiny-llama", method="dip-ca", gamma=0.3)
    m = res.manifest
    assert m.method == "dip-ca" and m.plan["gamma"] == 0.3
    assert "plain DIP" in m.dipca["in_model_onnx"] and m.validation["agrees_stock"]


def test_vq3_bundle(tmp_path):
    """Plain k-means VQ3 (no calibration text); the calibrated default: tests/test_quant_vq_commands.py."""
    res = _export(tmp_path, model="tiny-qwen2", method="dip", quant="vq3", vq_hessian="none")
    assert res.manifest.validation["agrees_stock"]
    assert res.manifest.quant["bits_per_weight_mlp"] < 3.5


def test_wina_score_plan(tmp_path):
    from dipdeploy.loading import load_model
    from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan

    lm = load_model("tiny-llama")
    plan = uniform_plan(SparsityConfig(method="dip", density=0.5, rho_in=0.6, score="wina"), "tiny-llama", 2, 64, 128)
    path = plan.save(tmp_path / "plan.json")
    res = _export(tmp_path, model="tiny-llama", plan=str(path))
    assert res.manifest.plan["score"] == "wina" and res.manifest.validation["agrees_stock"]
    assert "model.layers.0.mlp.colnorm_in" in res.manifest.tensors
    del lm


@pytest.mark.parametrize("model", TINY)
def test_gqa_attention_matches_torch(tmp_path, model):
    res = _export(tmp_path, model=model, method="dip", quant="bq4", attention="gqa")
    v = res.manifest.validation
    assert v["agrees_stock"] and v["max_abs_diff"] <= v["tolerance"]
    g = onnx.load(str(res.out / "model.onnx"), load_external_data=False).graph
    assert sum(n.op_type == "GroupQueryAttention" for n in g.node) == 2


def test_64k_alignment_for_windows_mmap(tmp_path):
    res = _export(tmp_path, model="tiny-llama", method="dip", alignment=65536, validate_tokens=2, per_layer=False)
    m = read_manifest(res.out)
    assert m.alignment == 65536 and verify(res.out, m) == []
    assert all(t["offset"] % 65536 == 0 for t in m.tensors.values())


def test_accuracy_level_4_validates_its_level0_twin_and_reports_itself(tmp_path):
    """Level 4 has no torch twin: the level-0 twin is held to the reference, level 4 is measured."""
    res = _export(tmp_path, model="tiny-llama", method="dip", quant="bq4", accuracy_level=4)
    v = res.manifest.validation
    assert v["agrees_stock"] and v["max_abs_diff"] <= v["tolerance"]
    lv = v["level4"]
    assert lv["tokens"] == 8 and 0 <= lv["tokens_agree"] <= 8 and lv["max_abs_diff"] >= 0
    assert not (res.out / "model.level0.onnx").exists()
    g = onnx.load(str(res.out / "model.onnx"), load_external_data=False).graph
    levels = {(n.op_type, a.i) for n in g.node for a in n.attribute if a.name == "accuracy_level"}
    assert levels == {("MatMulNBits", 4), ("SparseGatherMatMul", 4)}
    assert all(n.overload.endswith("_a4") for n in g.node if n.op_type == "SparseGatherMatMul")


@pytest.mark.parametrize("model,quant", [("tiny-llama", "bq4"), ("tiny-phi3", "none"), ("tiny-qwen2", "bq4"), ("tiny-qwen3", "bq4"),
                                         ("tiny-gemma3", "none"), ("tiny-granite", "bq4")])
def test_streamed_export_writes_the_same_bundle(tmp_path, model, quant):
    """--stream reads one layer at a time from the checkpoint: the same weight files and graphs."""
    eager = _export(tmp_path, "eager", model=model, method="dip", quant=quant, stream=False, validate_tokens=0)
    streamed = _export(tmp_path, "streamed", model=model, method="dip", quant=quant, stream=True)
    for name in ("mlp.bin", "dense.bin", "model.onnx", "layer.0.mlp_up.onnx", "head.onnx"):
        assert (eager.out / name).read_bytes() == (streamed.out / name).read_bytes(), name
    m = read_manifest(streamed.out)
    assert "skipped" in m.validation and m.source["streamed"] is True
    assert verify(streamed.out, m) == []


@pytest.mark.parametrize("fuse", [True, False])
def test_norms_fused_or_in_torch_order_both_validate(tmp_path, fuse):
    res = _export(tmp_path, model="tiny-mistral", method="dip", quant="bq4", fuse_norms=fuse)
    v = res.manifest.validation
    assert v["agrees_stock"] and v["max_abs_diff"] <= v["tolerance"]
    g = onnx.load(str(res.out / "model.onnx"), load_external_data=False).graph
    fused = sum(n.op_type == "SkipSimplifiedLayerNormalization" for n in g.node)
    # 2 layers: post-attention of both, input norm of the second, the final norm
    assert fused == (4 if fuse else 0)
    assert sum(n.op_type == "ReduceMean" for n in g.node) == (1 if fuse else 5)
