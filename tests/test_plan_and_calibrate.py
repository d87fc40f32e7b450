import json

import pytest
import torch

from dipdeploy.sparsity.calibrate import calibrate
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
    sparsify_(tiny_llama.model, plan, tiny_llama.mlp_layout)
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
    assert plan.mean_density() == pytest.approx(0.5, abs=0.03)
    with pytest.raises(ValueError, match="greedy"):
        calibrate(tiny_llama, SparsityConfig(method="cats", density=0.5, allocation="greedy"), w)
