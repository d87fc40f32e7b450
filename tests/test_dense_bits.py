"""--dense-bits auto|4|8: attention and lm_head in 4- or 8-bit MatMulNBits blocks, never fewer bits than a
quantised source stored them with (``quant.dense``); eval's fake quantisation holds the export's values."""

import json

import numpy as np
import onnx
import pytest
import torch
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.export.bundle import export_model
from dipdeploy.export.config import ExportConfig
from dipdeploy.quant.api import dequantize_rows, quantize_dense
from dipdeploy.quant.bits import pack_bits, unpack_bits
from dipdeploy.quant.config import (Block4QuantConfig, Block8QuantConfig, config_from_dict, config_to_dict,
                                    embedding_config, quant_config_from_name)
from dipdeploy.quant.dense import GGUF_BLOCKS, DenseBits, gguf_bits_per_weight, source_bits


@pytest.mark.parametrize("kind,bits", [
    ("Q4_0", 4), ("Q4_K", 4), ("IQ4_XS", 4), ("IQ4_NL", 4), ("Q3_K", 4), ("Q2_K", 4), ("TQ2_0", 4), ("MXFP4", 4),
    ("Q4_1", 8), ("Q5_0", 8), ("Q5_K", 8), ("Q6_K", 8), ("Q8_0", 8), ("F16", 8), ("BF16", 8), ("F32", 8),
    ("NEW_TYPE", 8)])
def test_the_rule_keeps_a_quantised_source_s_precision(kind, bits):
    assert source_bits(kind) == bits


def test_the_rule_s_block_sizes_are_gguf_s():
    import gguf

    known = {t.name: size for t, size in gguf.GGML_QUANT_SIZES.items()}
    assert {name: known.get(name) for name in GGUF_BLOCKS} == GGUF_BLOCKS  # a type gguf adds later: 8 bits
    assert gguf_bits_per_weight("Q4_1") == 5.0 and gguf_bits_per_weight("Q6_K") == 6.5625
    assert gguf_bits_per_weight("NEW_TYPE") is None


def test_dense_bits_asked_and_auto_over_a_stacked_matrix():
    sources = {"q.weight": "Q4_K", "k.weight": "Q4_K", "v.weight": "Q6_K", "o.weight": "Q4_K"}
    auto = DenseBits("auto", sources)
    assert auto.bits(["q.weight", "k.weight", "v.weight"]) == 8  # the widest of a stacked matrix
    assert auto.bits(["o.weight"]) == 4 and auto.bits(["not.in.the.file"]) == 4
    assert DenseBits("auto").bits(["q.weight"]) == 4  # not a GGUF: as before
    assert DenseBits("8").bits(["o.weight"]) == 8 and DenseBits("4", sources).bits(["v.weight"]) == 4
    with pytest.raises(ValueError, match="--dense-bits '6' unknown"):
        DenseBits("6")


def test_eight_bit_blocks_pack_and_decode_as_matmulnbits_reads_them():
    v = np.arange(256, dtype=np.uint8).reshape(4, 64)
    assert (pack_bits(v, 8) == v).all() and (unpack_bits(pack_bits(v, 8), 8, 64) == v).all()
    w = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32)
    packed = quantize_dense(w, Block4QuantConfig(), 8)
    assert isinstance(packed.config, Block8QuantConfig) and packed.config.block_size == 32
    assert packed.qweight.shape == (6, 96) and packed.scales.shape == (6, 3) and packed.zeros is None
    scales = np.abs(np.repeat(packed.scales.astype(np.float32), 32, axis=1))  # signed: the extreme maps to -128
    # round to nearest, within half a step, plus the fp16 rounding of the scale at the block's extreme (128 steps)
    assert (np.abs(dequantize_rows(packed) - w) <= scales * (0.5 + 128 * 2.0**-11)).all()
    # each block's largest magnitude is the code 0 (zero point 128, MatMulNBits' default at 8 bits)
    blocks = w.reshape(6, 3, 32)
    extreme = np.take_along_axis(packed.qweight.reshape(6, 3, 32), np.abs(blocks).argmax(2)[..., None], 2)
    assert (extreme == 0).all()
    assert config_from_dict(config_to_dict(packed.config)) == packed.config


def _export(tmp_path, name, **kw):
    kw = {"method": "dip", "rho_in": 0.6, "quant": "bq4", "validate_tokens": 6, **kw}
    return export_model(ExportConfig(**kw), tmp_path / name)


def _node_bits(bundle) -> dict[str, int]:
    g = onnx.load(str(bundle / "model.onnx"), load_external_data=False).graph
    return {n.name.rsplit("/", 1)[0]: next(a.i for a in n.attribute if a.name == "bits")
            for n in g.node if n.op_type == "MatMulNBits"}


@pytest.mark.parametrize("model,bits,level", [("tiny-llama", "8", 0), ("tiny-llama", "8", 4), ("tiny-llama", "4", 0),
                                              ("tiny-gemma3", "8", 0), ("tiny-phi3", "8", 0)])
def test_export_stores_the_bits_asked_and_matches_torch(tmp_path, model, bits, level):
    res = _export(tmp_path, "b", model=model, dense_bits=bits, accuracy_level=level)
    v = res.manifest.validation
    assert v["ok"] and v["agrees_stock"] and v["max_abs_diff"] <= v["tolerance"]
    if level == 4:
        assert v["level4"]["tokens"] == 6
    nodes = _node_bits(res.out)
    assert nodes and set(nodes.values()) == {int(bits)}
    q = res.manifest.quant
    assert q["dense_bits"]["asked"] == bits and q["dense_bits"]["lm_head"] == int(bits)
    assert q["attention_and_lm_head"] == f"com.microsoft::MatMulNBits int{bits}"
    assert ("dense_8bit" in q) == (bits == "8")
    # a tied 8-bit lm_head is stored apart from the int4 embedding (GatherBlockQuantized keeps its rows)
    head = res.manifest.tensors.get("lm_head.qweight") or {}
    assert "view_of" not in head or bits == "4"


def test_auto_keeps_each_tensor_s_gguf_precision_and_eval_holds_the_same_values(tmp_path, monkeypatch):
    """A GGUF mixing Q4_0 with wider tensors (as Q4_K_M does): auto gives 8 bits to the layer whose v is
    Q8_0 (q, k and v are one matrix) and to the Q5_0 lm_head, 4 to the rest; the eager export's torch
    reference (the values it wrote back) equals eval's fake quantisation of the same load, weight for weight."""
    from dipdeploy.export.source import ModelSource
    from dipdeploy.loading import SOURCE_RECORD, load_model, source_types
    from dipdeploy.quant.fake import quantize_model_
    from tiny_gguf import write_llama_gguf

    monkeypatch.setenv("DIPDEPLOY_CACHE", str(tmp_path / "cache"))
    gguf = write_llama_gguf(load_model("tiny-llama"), tmp_path / "mixed.gguf", matrices="Q4_0",
                            types={"blk.0.attn_v.weight": "Q8_0", "output.weight": "Q5_0"})
    res = _export(tmp_path, "auto", model=str(gguf), stream=False, dense_bits="auto")
    assert res.manifest.validation["ok"]
    nodes = _node_bits(res.out)
    assert nodes == {"/model/layers.0/attn/qkv_proj": 8, "/model/layers.0/attn/o_proj": 4,
                     "/model/layers.1/attn/qkv_proj": 4, "/model/layers.1/attn/o_proj": 4, "/lm_head": 8}
    assert res.manifest.quant["attention_and_lm_head"] == "com.microsoft::MatMulNBits int4 and int8"
    streamed = _export(tmp_path, "streamed", model=str(gguf), stream=True, dense_bits="auto")
    assert _node_bits(streamed.out) == nodes
    assert (streamed.out / "dense.bin").read_bytes() == (res.out / "dense.bin").read_bytes()

    eager = load_model(str(gguf))
    types = source_types(eager)
    assert types["model.layers.0.self_attn.v_proj.weight"] == "Q8_0" and types["lm_head.weight"] == "Q5_0"
    assert "types" in json.loads((eager.path / SOURCE_RECORD).read_text())  # kept for the next load
    assert source_types(load_model(str(gguf), stream=True)) == types
    from dipdeploy.quant.config import Block4QuantConfig

    rule = DenseBits("auto", types)
    exported = load_model(str(gguf))
    source = ModelSource(exported, Block4QuantConfig(), dense_bits=rule)
    for i in range(source.spec.num_layers):
        source.layer(i)
    source.embedding(), source.lm_head()
    quantize_model_(eager.model, Block4QuantConfig(), "all", progress=False, dense_bits=rule)
    want = exported.model.state_dict()
    for name, value in eager.model.state_dict().items():
        assert torch.equal(value, want[name]), name


@pytest.mark.parametrize("model,bits", [("tiny-llama", "8"), ("tiny-gemma3", "8"), ("tiny-gemma3", "4")])
def test_eval_quantises_as_export_for_each_setting(model, bits):
    """Eval's ``--quant-scope all`` and the export's write-back give every weight the same value (a tied
    model's 8-bit head untied from its int4 table in both)."""
    from dipdeploy.export.source import ModelSource
    from dipdeploy.loading import load_model
    from dipdeploy.quant.config import Block4QuantConfig
    from dipdeploy.quant.fake import quantize_model_

    rule, cfg = DenseBits(bits), Block4QuantConfig()
    exported, evaluated = load_model(model), load_model(model)
    source = ModelSource(exported, cfg, dense_bits=rule)
    for i in range(source.spec.num_layers):
        source.layer(i)
    source.embedding(), source.lm_head()
    report = quantize_model_(evaluated.model, cfg, "all", progress=False, dense_bits=rule)
    want = exported.model.state_dict()
    for name, value in evaluated.model.state_dict().items():
        assert torch.equal(value, want[name]), name
    tied = evaluated.model.lm_head.weight is evaluated.model.get_input_embeddings().weight
    assert tied == (source.tied and bits == "4")
    assert report.n_params > report.n_params_mlp


def test_dense_bits_without_quant_is_refused(tmp_path):
    res = CliRunner().invoke(app, ["export", "--model", "tiny-llama", "--dense-bits", "8", "--out", str(tmp_path / "b")])
    line = res.output.strip()
    assert res.exit_code == 2 and len(line.splitlines()) == 1 and "--dense-bits 8" in line and "--quant" in line
    res = CliRunner().invoke(app, ["export", "--model", "tiny-llama", "--quant", "bq4", "--dense-bits", "6",
                                   "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "dense_bits='6'" in res.output and not (tmp_path / "b").exists()


def test_space_estimate_counts_eight_bit_dense_weights():
    from dipdeploy.export.space import ModelShape, expected_bytes

    shape = ModelShape(params=1_000_000, embedding=200_000, tied=True, layers=2, mlp=600_000)
    size = {b: expected_bytes(shape, ExportConfig(quant="bq4", dense_bits=b)) for b in ("4", "8", "auto")}
    assert size["4"] < size["8"] == size["auto"]


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gemma3"])
def test_asymmetric_mlp_blocks_keep_the_int4_embedding_symmetric(tmp_path, model):
    """GatherBlockQuantized and the host's embedding reader take no zero points: with an asymmetric MLP
    format (bq4-a32) the table (and a 4-bit lm_head tied to it) must still decode as the reference does."""
    res = _export(tmp_path, "a", model=model, quant="bq4-a32", dense_bits="4")
    v = res.manifest.validation
    assert v["ok"] and v["agrees_stock"] and v["max_abs_diff"] <= v["tolerance"]
    assert not any(name.startswith("model.embed") and name.endswith("zeros") for name in res.manifest.tensors)
    cfg = embedding_config(quant_config_from_name("bq4-a32"))
    assert cfg.symmetric and cfg.block_size == 32
