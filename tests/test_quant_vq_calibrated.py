"""Tests of the calibrated VQ3 quantiser (Hessian-weighted k-means, DIP-masked statistics, GPTVQ-style
error feedback): same packed format, measurable gains on synthetic problems, determinism, defaults."""

import dataclasses

import numpy as np
import pytest

from dipdeploy.quant import VQ3QuantConfig, VQTensor, config_to_dict, dequantize_rows, quant_config_from_name, quantize
from dipdeploy.quant.bits import unpack_bits
from dipdeploy.quant.io import load_packed, save_packed


def _problem(seed=0, T=4000, R=128, C=256):
    """Correlated activations with skewed E[x²] (a few outlier features), and a weight matrix."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((T, R)) @ (rng.standard_normal((R, R)) * 0.3 + np.eye(R))
    X *= np.exp(rng.normal(0, 1.0, R))  # per-feature scales spanning ~e^±2
    X[:, :4] *= 10
    W = (rng.standard_normal((R, C)) * 0.02).astype(np.float32)
    return X, W


def _masked(X: np.ndarray, keep: float) -> np.ndarray:
    """X with each token's (1 − keep) smallest-|x| features zeroed: DIP's input selection."""
    k = int(round(keep * X.shape[1]))
    kth = -np.sort(-np.abs(X), axis=1)[:, k - 1 : k]
    return X * (np.abs(X) >= kth)


CFG = VQ3QuantConfig(group_size=2048)


@pytest.mark.parametrize("variant", [dict(hessian="none"), dict(hessian="dense"),
                                     dict(hessian="dense", error_feedback=True)])
def test_calibrated_output_decodes_through_the_plain_format(tmp_path, variant):
    X, W = _problem()
    cfg = dataclasses.replace(CFG, **variant)
    H = X.T @ X / len(X)
    packed = quantize(W, cfg, row_weight=np.diag(H), hessian=H if cfg.error_feedback else None)
    plain = quantize(W, dataclasses.replace(CFG, hessian="none"))
    assert type(packed) is VQTensor
    for name, a in plain.arrays().items():  # same arrays, shapes and dtypes as the uncalibrated format
        assert packed.arrays()[name].shape == a.shape and packed.arrays()[name].dtype == a.dtype
    assert packed.bits_per_weight == plain.bits_per_weight
    # decode by hand from the documented layout (vq.py): w[r, 2p:2p+2] = codebooks[r // gr, 2p // gc, k]·scale
    P = W.shape[1] // 2
    k = unpack_bits(packed.codes, 6, P)
    cb = packed.codebooks.astype(np.float32) * packed.codebook_scales.astype(np.float32)[:, :, None, None]
    r = np.arange(W.shape[0])[:, None]
    by_hand = cb[r // packed.group_rows, (2 * np.arange(P) // packed.group_cols)[None, :], k].reshape(W.shape)
    np.testing.assert_array_equal(dequantize_rows(packed), by_hand)
    save_packed(tmp_path / "w.npz", cfg, [("t", packed)])
    loaded_cfg, tensors, _ = load_packed(tmp_path / "w.npz")
    assert loaded_cfg == cfg
    np.testing.assert_array_equal(dequantize_rows(tensors["t"], np.array([3, 0, 77])), by_hand[[3, 0, 77]])


def test_hessian_weighting_reduces_weighted_error():
    X, W = _problem(seed=1)
    h = (X * X).mean(axis=0)
    assert h.max() / np.median(h) > 50  # skewed, as real activations are
    werr = lambda d: float((h[:, None] * (d - W) ** 2).sum())
    plain = dequantize_rows(quantize(W, dataclasses.replace(CFG, hessian="none")))
    weighted = dequantize_rows(quantize(W, CFG, row_weight=h))
    assert werr(weighted) < 0.9 * werr(plain)


@pytest.mark.parametrize("keep", [1.0, 0.55])
def test_error_feedback_reduces_layer_output_error(keep):
    """Feedback through H = E[x xᵀ] of the activations the layer sees (all features, or DIP's masked
    ones) lowers ‖X Ŵ − X W‖ on those activations, against the same weighting without feedback."""
    X, W = _problem(seed=2)
    Xs = _masked(X, keep)
    H = Xs.T @ Xs / len(Xs)
    out_err = lambda d: float(((Xs @ (d - W)) ** 2).sum())
    no_fb = dequantize_rows(quantize(W, CFG, row_weight=np.diag(H)))
    fb = dequantize_rows(quantize(W, dataclasses.replace(CFG, error_feedback=True), hessian=H))
    assert out_err(fb) < 0.8 * out_err(no_fb)


def test_seed_determines_the_codes():
    _, W = _problem(seed=3)
    a, b = quantize(W, CFG), quantize(W, CFG)
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(a.codebooks, b.codebooks)
    c = quantize(W, dataclasses.replace(CFG, seed=1))
    assert not np.array_equal(a.codebooks, c.codebooks)


def test_defaults_come_from_the_config_dataclass():
    from typer.main import get_command

    from dipdeploy.cli import app

    assert quant_config_from_name("vq3") == VQ3QuantConfig()
    assert config_to_dict(quant_config_from_name("vq3"))["hessian"] == VQ3QuantConfig.hessian
    params = {p.name: p for p in get_command(app).commands["quantize"].params}
    for opt in ("vq_hessian", "vq_feedback", "vq_density"):
        assert params[opt].default is None  # unset: the dataclass default applies
    assert VQ3QuantConfig.hessian in params["vq_hessian"].help
    assert str(VQ3QuantConfig.hessian_density) in params["vq_density"].help


def test_bad_vq_settings_are_rejected():
    with pytest.raises(ValueError, match="hessian"):
        VQ3QuantConfig(hessian="full")
    with pytest.raises(ValueError, match="error_feedback"):
        VQ3QuantConfig(hessian="none", error_feedback=True)
    with pytest.raises(ValueError, match="hessian_density"):
        VQ3QuantConfig(hessian_density=0.0)


def test_dip_statistics_count_only_the_selected_rows(tiny_llama):
    """Layer 0's MLP input does not depend on any MLP, so under DIP its up|gate statistics are exactly
    E[x_i² · 1(i among the top-K_in of |x|)] of the dense pass's inputs."""
    torch = pytest.importorskip("torch")
    from dipdeploy.quant.calib import row_statistics
    from dipdeploy.sparsity.methods import SparseMLP, topk_mask, uniform_dip
    from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan

    model = tiny_llama.model
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    seen = []
    h = model.model.layers[0].mlp.register_forward_pre_hook(lambda _m, a: seen.append(a[0].reshape(-1, a[0].shape[-1])))
    try:
        dense = row_statistics(model, ids, full=False, kind="dense")
    finally:
        h.remove()
    dip = row_statistics(model, ids, full=True, kind="dip", density=0.6, under_dip=uniform_dip)
    with pytest.raises(ValueError, match="under_dip"):  # quant cannot sparsify the model itself (a lower floor)
        row_statistics(model, ids, full=False, kind="dip", density=0.6)
    c = model.config
    k_in = uniform_plan(SparsityConfig(method="dip", density=0.6), "t", c.num_hidden_layers, c.hidden_size,
                        c.intermediate_size).layers[0].k_in
    x = seen[0]
    xm = x * topk_mask(x.abs(), k_in)
    np.testing.assert_allclose(dense[0]["up_gate"], (x * x).mean(0).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dip[0]["up_gate"], (xm.T @ xm / len(x)).numpy(), rtol=1e-4, atol=1e-6)
    assert dip[0]["down"].shape == (c.intermediate_size,) * 2
    assert not any(isinstance(layer.mlp, SparseMLP) for layer in model.model.layers)  # model left as it was


def test_cli_vq_options(tmp_path):
    from typer.testing import CliRunner

    from dipdeploy.cli import app

    out = tmp_path / "w.npz"
    res = CliRunner().invoke(app, ["quantize", "--model", "tiny-llama", "--quant", "vq3", "--vq-hessian", "none",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert load_packed(out)[0] == VQ3QuantConfig(hessian="none")
    res = CliRunner().invoke(app, ["quantize", "--model", "tiny-llama", "--quant", "bq4", "--vq-feedback",
                                   "--out", str(tmp_path / "b.npz")])
    assert res.exit_code == 2 and "vq3" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["quantize", "--model", "tiny-llama", "--quant", "vq3", "--vq-hessian", "full",
                                   "--out", str(tmp_path / "c.npz")])
    assert res.exit_code == 2 and "hessian" in res.output and not (tmp_path / "c.npz").exists()
