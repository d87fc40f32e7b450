"""The joint allocation (per-layer density and split under the global ρ), the realised density of threshold
methods, and the calibration's data split."""

import numpy as np
import pytest
import torch

from dipdeploy.sparsity.allocate import GRID, ErrorCurves, allocate_joint, error_curves
from dipdeploy.sparsity.calibrate import calibrate
from dipdeploy.sparsity.plan import SparsityConfig, density


def _bytes_per_token(layers, d, f):
    """MLP weights one token reads: K_in columns of W_u and W_g (F each), K_glu columns of W_d (d each)."""
    return sum(2 * lp.k_in * f + lp.k_glu * d for lp in layers)


def _synthetic_curves(L=6, scales=None, glu_weight=1.0):
    """E_i = scale_i · ((1 − ρ_in)² + glu_weight·(1 − ρ_glu)²): convex, zero when dense."""
    g = np.array(GRID)
    scales = np.ones(L) if scales is None else np.asarray(scales)
    base = (1 - g[:, None]) ** 2 + glu_weight * (1 - g[None, :]) ** 2
    return ErrorCurves(g, g, scales[:, None, None] * base[None], tokens=64, score="abs")


@pytest.mark.parametrize("rho", [0.3, 0.4, 0.5, 0.6, 0.75, 0.9])
def test_joint_allocation_reads_exactly_the_global_budget(rho):
    d, f = 64, 192
    curves = _synthetic_curves(scales=[1, 30, 0.2, 3, 1, 8], glu_weight=0.3)
    layers = allocate_joint(curves, rho, d, f)
    budget = 3 * d * f * len(layers) * rho  # weights a token reads at the global ρ
    assert abs(_bytes_per_token(layers, d, f) - budget) <= d / 2  # within half a W_d row
    assert all(1 <= lp.k_in <= d and 1 <= lp.k_glu <= f for lp in layers)


def test_joint_allocation_follows_the_curves():
    """A layer whose error costs 100× more gets more density; a model whose GLU pruning is cheap gets a
    smaller GLU share than its input share (the split is chosen per layer, not fixed)."""
    d, f = 64, 192
    layers = allocate_joint(_synthetic_curves(scales=[1, 1, 100, 1, 1, 1]), 0.5, d, f)
    dens = [density(lp.k_in, lp.k_glu, d, f) for lp in layers]
    assert dens[2] == max(dens) and dens[2] > dens[0] + 0.1
    cheap_glu = allocate_joint(_synthetic_curves(glu_weight=0.1), 0.5, d, f)
    assert all(lp.k_glu / f < lp.k_in / d for lp in cheap_glu)
    with pytest.raises(ValueError, match="lowest point"):
        allocate_joint(_synthetic_curves(), 0.05, d, f)


@pytest.mark.parametrize("rho", [0.4, 0.55, 0.8])
def test_split_per_layer_keeps_each_layer_density_and_picks_its_cheap_group(rho):
    from dipdeploy.sparsity.allocate import split_per_layer

    d, f = 64, 192
    layers = split_per_layer(_synthetic_curves(glu_weight=0.1), np.full(6, rho), d, f)
    assert abs(_bytes_per_token(layers, d, f) - 3 * d * f * 6 * rho) <= d / 2
    assert all(abs(density(lp.k_in, lp.k_glu, d, f) - rho) < 0.02 for lp in layers)
    assert all(lp.k_glu / f < lp.k_in / d for lp in layers)  # GLU pruning is the cheap one here


def _calib():
    return torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))


def test_error_curves_of_a_model_are_monotone_and_zero_when_dense(tiny_llama):
    curves = error_curves(tiny_llama, _calib(), tokens=32)
    L = tiny_llama.model.config.num_hidden_layers
    assert curves.cost.shape == (L, len(GRID), len(GRID)) and curves.tokens == 32
    assert np.all(curves.cost >= 0)
    assert np.allclose(curves.cost[:, -1, -1], 0, atol=1e-6 * curves.cost.max())  # ρ_in = ρ_glu = 1
    # keeping fewer rows costs more (a trend, not a law: one extra GLU column can move ŷ away from y)
    assert np.all(curves.cost[:, 0, 0] > curves.cost[:, 4, 4]) and np.all(curves.cost[:, 4, 4] > 0)


@pytest.mark.parametrize("method", ["dip", "teal"])
def test_joint_calibration_gives_valid_per_layer_splits(tiny_llama, method):
    c = tiny_llama.model.config
    d, f, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    plan = calibrate(tiny_llama, SparsityConfig(method=method, density=0.5, allocation="joint"), _calib(), curves={})
    assert plan.allocation in ("joint", "uniform")  # uniform when the joint plan loses on held-out tokens
    assert set(plan.calibration["joint_held_kl"]) == {"uniform", "split", "lagrange"}
    assert (plan.allocation == "uniform") == (plan.calibration["joint_choice"] == "uniform")
    kls = plan.calibration["joint_held_kl"]  # every candidate is really run (distinct plans, distinct KLs)
    assert len(set(kls.values())) == len(kls)
    assert all(1 <= lp.k_in <= d and 1 <= lp.k_glu <= f for lp in plan.layers)
    assert abs(_bytes_per_token(plan.layers, d, f) - 3 * d * f * L * 0.5) <= d / 2 + 2 * f
    if method == "teal":  # per-layer thresholds exist for every layer, from that layer's own shares
        assert all(lp.thr_in is not None and lp.thr_glu is not None for lp in plan.layers)
    with pytest.raises(ValueError, match="joint"):
        calibrate(tiny_llama, SparsityConfig(method="cats", density=0.5, allocation="joint"), _calib())


def test_joint_calibration_reuses_its_curves(tiny_llama, monkeypatch):
    import dipdeploy.sparsity.calibrate as cal

    calls = []
    real = cal.error_curves
    monkeypatch.setattr(cal, "error_curves", lambda *a, **k: calls.append(1) or real(*a, **k))
    memo = {}
    for rho in (0.4, 0.6):
        calibrate(tiny_llama, SparsityConfig(method="dip", density=rho, allocation="joint"), _calib(), curves=memo)
    assert len(calls) == 1


def test_teal_realised_density_is_measured_on_the_scored_tokens(tiny_llama):
    """On its own calibration text TEAL's thresholds realise their target density (in expectation)."""
    from dipdeploy.eval.meter import DensityMeter
    from dipdeploy.sparsity.methods import sparsify_, unsparsify_

    w = _calib()
    plan = calibrate(tiny_llama, SparsityConfig(method="teal", density=0.5, rho_in=0.55), w)
    sparsify_(tiny_llama.model, plan)
    try:
        with DensityMeter(tiny_llama.model, plan) as meter, torch.no_grad():
            tiny_llama.model(w, use_cache=False)
    finally:
        unsparsify_(tiny_llama.model)
    assert meter.density() == pytest.approx(0.5, abs=0.03)
    with DensityMeter(tiny_llama.model, plan) as empty:  # no sparse MLP ran: nothing read is pruned
        pass
    assert empty.density() == pytest.approx(1.0)


def test_calibration_never_reads_the_test_split(data_dir, monkeypatch):
    """Every text the Evaluator loads for a plan (calibration, allocation, thresholds) is the validation
    split, the test split is read once, when a row first needs its windows (a task evaluation never
    does), and the allocation's curves see only calibration tokens."""
    import dipdeploy.data as data
    import dipdeploy.sparsity.calibrate as cal
    from dipdeploy.eval import EvalConfig, Evaluator

    splits = []
    real_load = data.load_text
    monkeypatch.setattr(data, "load_text", lambda ds="wikitext2", split="test", *a, **k: splits.append(split)
                        or real_load(ds, split, *a, **k))
    seen = []
    real_curves = cal.error_curves
    monkeypatch.setattr(cal, "error_curves", lambda lm, w, *a, **k: seen.append(w) or real_curves(lm, w, *a, **k))
    ev = Evaluator(EvalConfig(model="tiny-llama", seqlen=64, max_windows=2, data_dir=str(data_dir),
                              calib_windows=2, calib_seqlen=64, progress=False))
    assert splits == []
    for method in ("dip", "teal"):
        ev.row(method, 0.5, allocation="joint")
    ev.row("cats", 0.6)
    assert splits == ["validation", "test"]
    calib = ev.calib
    assert len(seen) == 1 and torch.equal(seen[0], calib[:, :seen[0].shape[1]])
    test_rows = {tuple(r.tolist()) for r in ev.test}
    assert not any(tuple(r.tolist()) in test_rows for r in calib)


def test_greedy_split_keeps_each_greedy_density_and_the_budget(tiny_llama):
    """`greedy-split` re-splits each layer of the greedy plan at that layer's own density (the budget of
    every layer and of the model stays), and keeps the re-split only when it wins on held-out tokens."""
    c = tiny_llama.model.config
    d, f, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    w = _calib()
    greedy = calibrate(tiny_llama, SparsityConfig(method="dip", density=0.5, allocation="greedy"), w)
    plan = calibrate(tiny_llama, SparsityConfig(method="dip", density=0.5, allocation="greedy-split"), w, curves={})
    kls = plan.calibration["split_held_kl"]
    assert set(kls) == {"as-given", "split"} and kls["as-given"] != kls["split"]
    assert plan.calibration["greedy_strength"] == greedy.calibration["greedy_strength"]
    won = kls["split"] < kls["as-given"]
    assert plan.allocation == ("greedy-split" if won else "greedy")
    assert (plan.calibration["split_choice"] == "split") == won
    assert abs(_bytes_per_token(plan.layers, d, f) - 3 * d * f * L * 0.5) <= d / 2 + 2 * f
    for i, lp in enumerate(plan.layers):  # each layer's density is the greedy one within a row per group
        assert abs(density(lp.k_in, lp.k_glu, d, f) - greedy.layer_density(i)) <= 0.02
        assert 1 <= lp.k_in <= d and 1 <= lp.k_glu <= f
    if not won:
        assert [(lp.k_in, lp.k_glu) for lp in plan.layers] == [(lp.k_in, lp.k_glu) for lp in greedy.layers]
    with pytest.raises(ValueError, match="greedy-split"):
        calibrate(tiny_llama, SparsityConfig(method="teal", density=0.5, allocation="greedy-split"), w)


def test_the_joint_fallback_is_the_searched_split(tiny_llama, monkeypatch):
    """The ``uniform`` candidate of the joint allocation is the uniform plan at the searched split, as
    the uniform allocation calibrates it, not the default split."""
    import dipdeploy.sparsity.calibrate as cal

    w = _calib()
    seen = {}
    real = cal._held_kl
    monkeypatch.setattr(cal, "_held_kl", lambda lm, plan, cands, held: seen.update(cands) or real(lm, plan, cands, held))
    splits = {(0.5, "abs"): (0.7, {"split_nll": {"0.700": 1.0}})}  # a split the default (1.1 ρ = 0.55) is not
    calibrate(tiny_llama, SparsityConfig(method="dip", density=0.5, allocation="joint"), w, splits=splits, curves={})
    uniform = calibrate(tiny_llama, SparsityConfig(method="dip", density=0.5), w, splits=splits)
    assert [(lp.k_in, lp.k_glu) for lp in seen["uniform"]] == [(lp.k_in, lp.k_glu) for lp in uniform.layers]
    assert uniform.rho_in == pytest.approx(0.7, abs=0.01)
