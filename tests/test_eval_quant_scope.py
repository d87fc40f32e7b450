"""`eval --quant` holds the weights `export --quant` ships: attention and lm_head equal, bit for bit, the
dequantised MatMulNBits blocks of the bundle (one quantiser: quant.api.quantize_dense); `--weights` reads
a `dipdeploy quantize` file."""

import numpy as np
import pytest

from dipdeploy.bundle.manifest import open_tensor
from dipdeploy.eval import EvalConfig, _quantize, combinations
from dipdeploy.export.bundle import export_model
from dipdeploy.export.config import ExportConfig
from dipdeploy.loading import load_model
from dipdeploy.quant.config import quant_config_from_name
from dipdeploy.quant.fake import load_mlp_weights_, mlp_weights, quantize_model_, write_packed_mlp


def _matmulnbits_weight(bundle, manifest, name: str, in_features: int) -> np.ndarray:
    """W [out, in] as MatMulNBits decodes it (symmetric: zero point 8; low nibble = even element),
    written out here rather than through the quantiser under test."""
    q = np.asarray(open_tensor(bundle, manifest, f"{name}.qweight"))  # [out, nb, B/2]
    s = np.asarray(open_tensor(bundle, manifest, f"{name}.scales")).reshape(q.shape[0], q.shape[1])
    codes = np.stack([q & 0x0F, q >> 4], axis=-1).reshape(q.shape[0], q.shape[1], -1).astype(np.float32)
    return ((codes - 8) * s[:, :, None]).reshape(q.shape[0], -1)[:, :in_features]


def _w(linear) -> np.ndarray:
    return linear.weight.detach().float().numpy()


@pytest.mark.parametrize("quant", ["bq4", "vq3"])
def test_eval_attention_and_head_equal_the_exported_blocks(tmp_path, quant):
    plain = {"vq_hessian": "none"} if quant == "vq3" else {}  # attention and head do not depend on the MLP's fit
    res = export_model(ExportConfig(model="tiny-llama", quant=quant, rho_in=0.6, validate_tokens=0,
                                    per_layer=False, **plain), tmp_path / "b")
    bundle, m = tmp_path / "b", res.manifest
    lm = load_model("tiny-llama")
    info = _quantize(lm, EvalConfig(model="tiny-llama", quant=quant, **plain))  # the default scope
    assert info["quant_scope"] == "all"
    d = lm.model.config.hidden_size
    for i, layer in enumerate(lm.model.model.layers):
        a = layer.self_attn
        qkv = np.concatenate([_w(a.q_proj), _w(a.k_proj), _w(a.v_proj)])
        assert np.array_equal(qkv, _matmulnbits_weight(bundle, m, f"model.layers.{i}.attn.qkv_proj", d))
        assert np.array_equal(_w(a.o_proj), _matmulnbits_weight(bundle, m, f"model.layers.{i}.attn.o_proj",
                                                                a.o_proj.in_features))
    assert np.array_equal(_w(lm.model.lm_head), _matmulnbits_weight(bundle, m, "lm_head", d))


def test_mlp_scope_leaves_attention_fp32():
    lm, ref = load_model("tiny-llama"), load_model("tiny-llama")
    _quantize(lm, EvalConfig(model="tiny-llama", quant="bq4", quant_scope="mlp"))
    a, b = lm.model.model.layers[0], ref.model.model.layers[0]
    assert np.array_equal(_w(a.self_attn.q_proj), _w(b.self_attn.q_proj))
    assert not np.array_equal(_w(a.mlp.up_proj), _w(b.mlp.up_proj))


def test_weights_file_gives_the_same_model_as_quantising(tmp_path):
    cfg = quant_config_from_name("vq3")
    src = load_model("tiny-llama")
    path = write_packed_mlp(src.model, cfg, tmp_path / "w.npz", model_name=src.name, progress=False)
    fresh, direct = load_model("tiny-llama"), load_model("tiny-llama")
    load_mlp_weights_(fresh.model, path, scope="all", model_name=fresh.name)
    quantize_model_(direct.model, cfg, scope="all", progress=False)
    for x, y in zip(fresh.model.model.layers, direct.model.model.layers):
        for u, v in zip(mlp_weights(x.mlp, fresh.arch), mlp_weights(y.mlp, direct.arch)):
            assert np.array_equal(u, v)
        assert np.array_equal(_w(x.self_attn.k_proj), _w(y.self_attn.k_proj))
    with pytest.raises(ValueError, match="tiny-mistral"):
        load_mlp_weights_(load_model("tiny-mistral").model, path, model_name="tiny-mistral")
    with pytest.raises(ValueError, match="--weights"):
        EvalConfig(quant="bq4", weights=str(path))


def test_dense_is_evaluated_once_at_full_density():
    cfg = EvalConfig(method="dense,dip,glu", density="0.4,0.5,0.75")
    assert combinations(cfg) == [("dense", 1.0), ("dip", 0.4), ("dip", 0.5), ("dip", 0.75), ("glu", 0.75)]
