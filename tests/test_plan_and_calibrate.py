import json

import pytest
import torch

from dipdeploy.sparsity.calibrate import allocate_greedy, calibrate
from dipdeploy.sparsity.methods import sparsify_, unsparsify_
from dipdeploy.sparsity.plan import SparsityConfig, SparsityPlan, density, split_for, uniform_plan


@pytest.mark.parametrize("bad,match", [({"density": 0.0}, "density"), ({"density": 1.2}, "density"),
                                       ({"method": "relu"}, "method"), ({"method": "glu", "density": 0.5}, "unreachable"),
                                       ({"gamma": 2.0}, "gamma"), ({"policy": "belady"}, "policy"),
                                       ({"score": "l2"}, "score"), ({"allocation": "ilp"}, "allocation"),
                                       ({"cache_frac": -0.1}, "cache_frac"), ({"rho_in": 0.0}, "rho_in")])
def test_config_rejects_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        SparsityConfig(**bad)


@pytest.mark.parametrize("rho", [0.1, 0.4, 0.5, 0.6, 0.75, 0.95])
def test_split_realises_density(rho):
    r_in, r_glu = split_for("dip", rho, None)
    assert 0 < r_in <= 1 and 0 < r_glu <= 1
    assert (2 * r_in + r_glu) / 3 == pytest.approx(rho)


def test_plan_round_trip_and_version(tmp_path):
    plan = uniform_plan(SparsityConfig(density=0.5), "m", 3, 64, 128)
    path = plan.save(tmp_path / "plan.json")
    back = SparsityPlan.load(path)
    assert back == plan
    assert back.mean_density() == pytest.approx(density(plan.layers[0].k_in, plan.layers[0].k_glu, 64, 128))
    with pytest.raises(FileExistsError, match="--force"):
        plan.save(path)
    raw = json.loads(path.read_text())
    raw["version"] = 99
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="dipdeploy calibrate"):
        SparsityPlan.load(path)


def calib(lm):
    return torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))


def test_cats_and_teal_thresholds_hit_density(tiny_llama):
    w = calib(tiny_llama)
    plan = calibrate(tiny_llama, SparsityConfig(method="teal", density=0.5, rho_in=0.55), w)
    seen = {}
    sparsify_(tiny_llama.model, plan)
    try:
        mlp = tiny_llama.model.model.layers[0].mlp
        h = mlp.base.down_proj.register_forward_pre_hook(lambda m, a: seen.setdefault("h", a[0]))
        with torch.no_grad():
            tiny_llama.model(w, use_cache=False)
        h.remove()
    finally:
        unsparsify_(tiny_llama.model)
    kept = (seen["h"] != 0).float().mean().item()
    assert kept == pytest.approx(3 * 0.5 - 2 * 0.55, abs=0.05)  # ρ_glu on the calibration text
    cats = calibrate(tiny_llama, SparsityConfig(method="cats", density=0.5), w)
    assert all(lp.thr_glu is not None and lp.thr_glu > 0 for lp in cats.layers)


def test_split_search_and_greedy_allocation(tiny_llama):
    w = calib(tiny_llama)
    plan = calibrate(tiny_llama, SparsityConfig(method="dip", density=0.5, allocation="greedy"), w)
    assert "split_nll" in plan.calibration and plan.rho_in is not None
    assert plan.allocation == "greedy"
    assert plan.calibration["greedy_strength"] in (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4)
    with pytest.raises(ValueError, match="greedy"):
        calibrate(tiny_llama, SparsityConfig(method="cats", density=0.5, allocation="greedy"), w)


def _greedy(lm, w, rho):
    L, d, f = lm.model.config.num_hidden_layers, lm.model.config.hidden_size, lm.model.config.intermediate_size
    base = uniform_plan(SparsityConfig(method="dip", density=rho, rho_in=1.1 * rho), lm.name, L, d, f)
    return allocate_greedy(lm, base, w, tokens=32, density_target=rho)


@pytest.mark.parametrize("rho", [0.5, 0.75])
def test_greedy_allocation_exact_budget_floor_and_deterministic(tiny_llama, rho):
    """The greedy plan reads exactly the global budget (within half a W_d row), keeps every layer at
    ρ/2 or more, and is the same plan on a second run (it once starved layers: PPL 2752 vs 28.5)."""
    w = calib(tiny_llama)
    plan = _greedy(tiny_llama, w, rho)
    L, d, f = len(plan.layers), plan.hidden_size, plan.intermediate_size
    assert abs(sum(plan.layer_density(i) for i in range(L)) - L * rho) <= 0.5 / (3 * f) + 1e-12
    assert min(plan.layer_density(i) for i in range(L)) >= rho / 2 - 1e-12
    assert all(1 <= lp.k_in <= d and 1 <= lp.k_glu <= f for lp in plan.layers)
    again = _greedy(tiny_llama, w, rho)
    assert [(lp.k_in, lp.k_glu) for lp in again.layers] == [(lp.k_in, lp.k_glu) for lp in plan.layers]
    assert SparsityPlan.from_json(plan.to_json()).layers == plan.layers


def test_greedy_suffix_replay_matches_full_forward(tiny_llama):
    """The sensitivity probes re-run only the layers after the changed one; from layer 0 (and any
    layer, with nothing changed) that must give the full forward's log-probabilities."""
    from dipdeploy.sparsity.calibrate import _Suffix

    w = calib(tiny_llama)
    with torch.no_grad():
        suffix = _Suffix(tiny_llama.model, w)
        for i in (0, len(suffix.layers) - 1):
            assert torch.allclose(suffix.logprobs_from(i), suffix.full, atol=1e-5)


def test_greedy_densities_keep_budget_and_floor():
    """A very sensitive layer is pushed to the ceiling and an insensitive one to the floor, yet the mean
    stays ρ and nothing leaves [ρ/2, 1]; strength 0 is the uniform plan."""
    import numpy as np

    from dipdeploy.sparsity.calibrate import _densities

    rise = np.array([0.8, 0.05, 0.04, 0.03, 1e-9, 0.2])
    for rho in (0.4, 0.75):
        for strength in (0.0, 0.4, 5.0):
            r = _densities(rise, strength, rho, rho / 2)
            assert r.mean() == pytest.approx(rho, abs=1e-9)
            assert r.min() >= rho / 2 - 1e-12 and r.max() <= 1.0
        assert np.allclose(_densities(rise, 0.0, rho, rho / 2), rho)
        assert _densities(rise, 5.0, rho, rho / 2)[4] == pytest.approx(rho / 2)
