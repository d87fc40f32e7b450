"""Tests of the numpy quant formats (dipdeploy/quant): packing, error bounds, exact bits, subsets."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from dipdeploy.quant import (
    QUANT_PRESETS,
    Block4QuantConfig,
    RTN3QuantConfig,
    VQ3QuantConfig,
    config_from_dict,
    config_to_dict,
    dequantize_rows,
    fake_quantize,
    mlp_to_rows,
    quant_config_from_name,
    quantize,
    rows_to_mlp,
)
from dipdeploy.quant.bits import pack_bits, packed_row_bytes, unpack_bits
from dipdeploy.quant.vq import group_shape


PLAIN = [n for n in QUANT_PRESETS if not quant_config_from_name(n).error_feedback]


def _sqnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10((a**2).sum() / ((a - b) ** 2).sum()))


@pytest.fixture
def weights() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((96, 256)).astype(np.float32) * 0.02


@pytest.mark.parametrize("bits", [3, 4, 6])
@pytest.mark.parametrize("n", [1, 7, 8, 13, 64])
def test_pack_roundtrip(bits, n):
    v = np.random.default_rng(bits * 100 + n).integers(0, 1 << bits, size=(5, n)).astype(np.uint8)
    p = pack_bits(v, bits)
    assert p.shape == (5, packed_row_bytes(n, bits)) and p.dtype == np.uint8
    np.testing.assert_array_equal(unpack_bits(p, bits, n), v)


def test_pack_bit_order_is_documented():
    # 4 bits: low nibble = even element.
    assert pack_bits(np.array([[0x3, 0xA]]), 4).tolist() == [[0xA3]]
    # 6 bits: 4 values -> 3 bytes, LSB-first stream.
    v = np.array([[0b000001, 0b100010, 0b000111, 0b111000]])
    b0 = (1 | (0b100010 << 6)) & 0xFF
    b1 = ((0b100010 >> 2) | (0b000111 << 4)) & 0xFF
    b2 = ((0b000111 >> 4) | (0b111000 << 2)) & 0xFF
    assert pack_bits(v, 6).tolist() == [[b0, b1, b2]]


def test_pack_rejects_bad_input():
    with pytest.raises(ValueError, match="bits=5"):
        pack_bits(np.zeros((1, 4), np.uint8), 5)
    with pytest.raises(ValueError, match="out of range"):
        pack_bits(np.array([[16]]), 4)


@pytest.mark.parametrize("cfg", [
    Block4QuantConfig(block_size=32), Block4QuantConfig(block_size=64, symmetric=False),
    Block4QuantConfig(block_size=128), RTN3QuantConfig(), RTN3QuantConfig(block_size=64, symmetric=False),
])
def test_block_error_within_one_step(cfg, weights):
    packed = quantize(weights, cfg)
    deq = dequantize_rows(packed)
    B = cfg.block_size
    step = np.repeat(packed.scales.astype(np.float32), B, axis=1)[:, : weights.shape[1]]
    # Nearest rounding gives |err| <= step/2; clipping the far side of the extreme costs up to one step.
    assert np.all(np.abs(deq - weights) <= np.abs(step) * 1.001 + 1e-8)
    assert np.mean(np.abs(deq - weights) <= np.abs(step) / 2 * 1.001 + 1e-8) > 0.95


def test_scale_search_never_worse(weights):
    for base in (Block4QuantConfig(), Block4QuantConfig(symmetric=False), RTN3QuantConfig()):
        plain = dequantize_rows(quantize(weights, base))
        searched = dequantize_rows(quantize(weights, dataclasses.replace(base, scale_search=True)))
        per_block = lambda d: ((d - weights) ** 2).reshape(weights.shape[0], -1, base.block_size).sum(-1)
        assert np.all(per_block(searched) <= per_block(plain) * (1 + 1e-5) + 1e-12)
        assert per_block(searched).sum() < per_block(plain).sum()


@pytest.mark.parametrize("name", PLAIN)
def test_bits_per_weight_exact(name, weights):
    cfg = quant_config_from_name(name)
    rows = np.tile(weights, (1, 3))  # 96 x 768: whole blocks of 32 ... 256
    if name == "vq3":
        rows = np.concatenate([np.tile(weights, (1, 4))] * 3, axis=0)[:256]  # 256 x 1024: groups of 32 x 256
    packed = quantize(rows, cfg)
    assert packed.bits_per_weight == pytest.approx(cfg.bits_per_weight(), abs=1e-12)
    assert packed.nbytes * 8 == pytest.approx(cfg.bits_per_weight() * rows.size)


def test_nominal_bits_match_the_table():
    assert Block4QuantConfig(block_size=32).bits_per_weight() == 4.5
    assert Block4QuantConfig(block_size=64).bits_per_weight() == 4.25
    assert Block4QuantConfig(block_size=64, symmetric=False).bits_per_weight() == 4.3125
    assert RTN3QuantConfig().bits_per_weight() == 3.125
    assert VQ3QuantConfig().bits_per_weight() == 3 + 1040 / 8192


def test_block_padding_is_documented_and_exact():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((10, 100)).astype(np.float32)  # 100 = 64 + 36: last block padded
    packed = quantize(w, Block4QuantConfig(block_size=64, symmetric=False))
    deq = dequantize_rows(packed)
    assert deq.shape == (10, 100)
    assert packed.qweight.shape == (10, 64) and packed.scales.shape == (10, 2) and packed.zeros.shape == (10, 1)
    assert packed.bits_per_weight == pytest.approx(8 * (64 + 4 + 1) / 100)
    assert _sqnr(w, deq) > 17


@pytest.mark.parametrize("name", PLAIN)
def test_subset_rows_equal_full_rows(name, weights):
    packed = quantize(weights, quant_config_from_name(name, **({"group_size": 1024} if name == "vq3" else {})))
    full = dequantize_rows(packed)
    idx = np.random.default_rng(3).integers(0, weights.shape[0], size=40)  # unsorted, with repeats
    np.testing.assert_array_equal(dequantize_rows(packed, idx), full[idx])
    assert dequantize_rows(packed, np.array([], dtype=np.int64)).shape == (0, weights.shape[1])


def test_vq_values_are_codebook_entries_and_partial_groups():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((70, 300)).astype(np.float32)
    cfg = VQ3QuantConfig(group_size=2048, max_group_cols=128)
    packed = quantize(w, cfg)
    gr, gc = group_shape(70, 300, cfg)
    assert (packed.group_rows, packed.group_cols) == (gr, gc) and gc % 2 == 0
    ngr, ngc = -(-70 // gr), -(-300 // gc)
    assert packed.codebooks.shape == (ngr, ngc, 64, 2) and packed.codebooks.dtype == np.int8
    assert packed.codes.shape == (70, packed_row_bytes(150, 6))
    deq = dequantize_rows(packed)
    cents = packed.centroids()
    # every decoded pair of row 69, strip 0 is one of that group's centroids
    pairs = deq[69, :gc].reshape(-1, 2)
    cb = cents[69 // gr, 0]
    assert np.all(np.min(np.abs(pairs[:, None, :] - cb[None]).sum(-1), axis=1) == 0)
    expected_bits = 8 * (packed.codes.size + packed.codebooks.size + 2 * packed.codebook_scales.size)
    assert packed.bits_per_weight == pytest.approx(expected_bits / w.size)


def test_vq3_beats_rtn3_at_equal_bits():
    w = np.random.default_rng(4).standard_normal((128, 512)).astype(np.float32)
    vq, pv = fake_quantize(w, VQ3QuantConfig())
    rtn, pr = fake_quantize(w, RTN3QuantConfig())
    assert abs(pv.bits_per_weight - pr.bits_per_weight) < 0.01
    assert _sqnr(w, vq) > _sqnr(w, rtn) + 1.0


@pytest.mark.parametrize("init,cb", [("kmeans++", "int8"), ("grid", "float16")])
def test_vq_variants(init, cb):
    w = np.random.default_rng(5).standard_normal((64, 128)).astype(np.float32)
    packed = quantize(w, VQ3QuantConfig(init=init, codebook_dtype=cb, group_size=1024))
    assert (packed.codebook_scales is None) == (cb == "float16")
    assert _sqnr(w, dequantize_rows(packed)) > 14.5


def test_vq_row_weight_changes_fit():
    w = np.random.default_rng(6).standard_normal((64, 128)).astype(np.float32)
    cfg = VQ3QuantConfig(group_size=8192)
    rw = np.ones(64)
    rw[:8] = 100.0
    a = dequantize_rows(quantize(w, cfg))
    b = dequantize_rows(quantize(w, cfg, row_weight=rw))
    err = lambda d: ((d - w) ** 2).sum(axis=1)
    assert err(b)[:8].sum() < err(a)[:8].sum()


def test_bad_inputs_give_clear_errors(weights):
    with pytest.raises(ValueError, match=r"block_size=48.*\(32, 64, 128\)"):
        Block4QuantConfig(block_size=48)
    with pytest.raises(ValueError, match="init"):
        VQ3QuantConfig(init="random")
    with pytest.raises(ValueError, match="max_group_cols"):
        VQ3QuantConfig(max_group_cols=7)
    with pytest.raises(ValueError, match="even row length"):
        quantize(weights[:, :255], VQ3QuantConfig())
    with pytest.raises(ValueError, match="NaN"):
        quantize(np.full((2, 64), np.nan, np.float32), Block4QuantConfig())
    with pytest.raises(ValueError, match="2-D"):
        quantize(weights[0], Block4QuantConfig())
    with pytest.raises(ValueError, match="out of range"):
        dequantize_rows(quantize(weights, Block4QuantConfig()), np.array([96]))
    with pytest.raises(ValueError, match="unknown"):
        quant_config_from_name("q2")


def test_config_json_roundtrip_and_versioning():
    for name in QUANT_PRESETS:
        cfg = quant_config_from_name(name)
        d = json.loads(json.dumps(config_to_dict(cfg)))
        assert d["type"] == type(cfg).__name__ and d["version"] == 1
        assert config_from_dict(d) == cfg
    d = config_to_dict(VQ3QuantConfig())
    with pytest.raises(ValueError, match="version"):
        config_from_dict({**d, "version": 99})
    with pytest.raises(ValueError, match="unknown fields"):
        config_from_dict({**d, "bogus": 1})
    assert quant_config_from_name("bq4", block_size=32) == Block4QuantConfig(block_size=32)


def test_mlp_row_layout_roundtrip():
    rng = np.random.default_rng(7)
    F, d = 12, 8
    wu, wg, wd = (rng.standard_normal(s).astype(np.float32) for s in ((F, d), (F, d), (d, F)))
    ug, down = mlp_to_rows(wu, wg, wd)
    assert ug.shape == (d, 2 * F) and down.shape == (F, d)
    np.testing.assert_array_equal(ug[3], np.concatenate([wu[:, 3], wg[:, 3]]))
    np.testing.assert_array_equal(down[5], wd[:, 5])
    for a, b in zip(rows_to_mlp(ug, down), (wu, wg, wd)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="gated MLP shapes"):
        mlp_to_rows(wu, wg, wd.T)


def test_quant_formats_import_no_torch():
    code = "import sys, dipdeploy.quant; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _correlated_problem(R=128, C=256, T=2048, seed=8):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((T, R)) @ (rng.standard_normal((R, R)) * 0.3 + np.eye(R))
    X[:, :3] *= 10  # a few outlier features, as in real LLM activations
    W = rng.standard_normal((R, C)).astype(np.float32)
    return X, W, X.T @ X


@pytest.mark.parametrize("cfg", [Block4QuantConfig(), RTN3QuantConfig(), VQ3QuantConfig(group_size=2048)])
def test_error_feedback_reduces_output_error(cfg):
    X, W, H = _correlated_problem()
    plain = dequantize_rows(quantize(W, cfg))
    fb_cfg = dataclasses.replace(cfg, error_feedback=True)
    packed = quantize(W, fb_cfg, hessian=H)
    fb = dequantize_rows(packed)
    assert type(packed) is type(quantize(W, cfg)) and packed.bits_per_weight == quantize(W, cfg).bits_per_weight
    out_err = lambda d: float(((X @ (d - W)) ** 2).sum())
    assert out_err(fb) < 0.6 * out_err(plain)
    idx = np.array([5, 0, 127, 5])
    np.testing.assert_array_equal(dequantize_rows(packed, idx), fb[idx])
    with pytest.raises(ValueError, match="needs a Hessian"):
        quantize(W, fb_cfg)
    with pytest.raises(ValueError, match="hessian must have shape"):
        quantize(W, fb_cfg, hessian=H[:5, :5])


def test_vq3_beats_rtn3_with_error_feedback_too():
    X, W, H = _correlated_problem(seed=9)
    err = lambda cfg: float(((X @ (dequantize_rows(quantize(W, cfg, hessian=H)) - W)) ** 2).sum())
    assert err(VQ3QuantConfig(group_size=2048, error_feedback=True)) < err(RTN3QuantConfig(error_feedback=True))


@pytest.mark.parametrize("cfg", [Block4QuantConfig(), Block4QuantConfig(block_size=32, symmetric=False, scale_search=True,
                                                                         search_grid=4), RTN3QuantConfig()],
                         ids=["bq4", "bq4-asym-search", "rtn3"])
def test_block_quantiser_in_row_chunks_gives_the_same_bytes(cfg, monkeypatch):
    """Large matrices are quantised a few rows at a time (bounded temporaries, export of 7B layers): every
    step is per row, so chunks of 7 rows give exactly the bytes of one pass."""
    import dipdeploy.quant.block as block

    w = np.random.default_rng(0).standard_normal((300, 200)).astype(np.float32)
    whole = quantize(w, cfg)
    monkeypatch.setattr(block, "CHUNK_BYTES", 4 * 200 * 7)
    chunked = quantize(w, cfg)
    assert whole.arrays().keys() == chunked.arrays().keys()
    for name, arr in whole.arrays().items():
        assert np.array_equal(arr, chunked.arrays()[name]), name


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_weight_is_found_in_any_row_block(bad, monkeypatch):
    """The finiteness check runs a few rows at a time (no whole-matrix mask): a bad value in the last
    block, in a middle one or in the first is refused all the same."""
    import dipdeploy.quant.api as api

    monkeypatch.setattr(api, "CHECK_BYTES", 4 * 64 * 5)  # 5 rows a block
    w = np.random.default_rng(0).standard_normal((23, 64)).astype(np.float32)
    assert np.array_equal(api.check_rows(w), w)
    for row in (0, 11, 22):
        x = w.copy()
        x[row, 63] = bad
        with pytest.raises(ValueError, match="NaN or Inf"):
            api.check_rows(x)
