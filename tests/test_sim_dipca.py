"""DIP-CA re-masking in the simulator, and SimConfig validation."""

import pytest

from dipdeploy.registry import get_model
from dipdeploy.sim import SimConfig, simulate
from dipdeploy.sim.memory import minimum_budget
from dipdeploy.sim.precision import bytes_per_weight
from dipdeploy.sim.synthetic import synthetic_trace

TINY = get_model("tiny-llama").shape


def trace(magnitudes=True, seed=0, tokens=64):
    return synthetic_trace(TINY.hidden_size, TINY.intermediate_size, TINY.num_hidden_layers, tokens=tokens,
                           rho_in=0.5, rho_glu=0.4, seed=seed, magnitudes=magnitudes, model="tiny-llama")


def budget(fraction):
    bpw = bytes_per_weight("bq4")
    return minimum_budget(TINY, bpw) + fraction * TINY.num_hidden_layers * TINY.mlp_params_per_layer() * bpw


def test_gamma_one_is_plain_dip_is_the_traced_dip():
    tr = trace()  # a synthetic DIP trace: its rows are top-K of its own magnitudes
    kw = dict(device="a18-paper", policy="lfu", warmup=8, dram_budget=budget(0.3))
    flash = [simulate(tr, SimConfig(**kw, method=m, gamma=1.0)).flash_bytes_per_token
             for m in ("traced", "dip", "dip-ca")]
    assert flash[0] == flash[1] == flash[2] > 0


@pytest.mark.parametrize("policy", ["lfu", "lru", "static"])
def test_cache_aware_masks_hit_more_than_plain_dip(policy):
    tr = trace(seed=2)
    kw = dict(device="a18", policy=policy, warmup=8, dram_budget=budget(0.3))
    dip = simulate(tr, SimConfig(**kw, method="dip"))
    ca = simulate(tr, SimConfig(**kw, method="dip-ca", gamma=0.2))
    assert ca.hit_rate > dip.hit_rate and ca.flash_bytes_per_token < dip.flash_bytes_per_token
    assert ca.density == pytest.approx(dip.density)  # same K: only which rows changes
    assert ca.gamma == 0.2 and dip.gamma is None


def test_gamma_zero_never_prefers_a_miss_over_a_hit():
    tr = trace(seed=3)
    r0 = simulate(tr, SimConfig(device="a18", method="dip-ca", gamma=0.0, policy="lfu", warmup=8,
                                dram_budget=budget(0.6)))
    r2 = simulate(tr, SimConfig(device="a18", method="dip-ca", gamma=0.2, policy="lfu", warmup=8,
                                dram_budget=budget(0.6)))
    assert r0.hit_rate >= r2.hit_rate


def test_remasking_needs_magnitudes():
    tr = trace(magnitudes=False)
    with pytest.raises(ValueError, match="magnitudes"):
        simulate(tr, SimConfig(device="a18", method="dip-ca", dram_budget=budget(0.3)))


@pytest.mark.parametrize("field,value,match", [
    ("precision", "int2", "precision 'int2' unknown"),
    ("method", "oracle", "method 'oracle' unknown"),
    ("policy", "fifo", "policy 'fifo' unknown"),
    ("gamma", 1.5, "gamma must lie in"),
    ("dram_budget", -1.0, "dram_budget must be > 0"),
    ("context", -3, "context must be >= 0"),
    ("warmup", -1, "warmup must be >= 0"),
])
def test_simconfig_rejects_bad_values(field, value, match):
    with pytest.raises(ValueError, match=match):
        SimConfig(**{field: value})


def test_simconfig_rejects_meaningless_pairs():
    with pytest.raises(ValueError, match="only policy 'static'"):
        SimConfig(method="dense", policy="lru")
    with pytest.raises(ValueError, match="belady"):
        SimConfig(method="dip-ca", policy="belady")


def test_warmup_longer_than_trace_is_an_error():
    with pytest.raises(ValueError, match="warmup"):
        simulate(trace(tokens=4), SimConfig(device="a18", warmup=4, dram_budget=budget(0.3)))


def test_cold_caches_miss_more_than_preloaded_ones():
    tr = trace(seed=4, tokens=24)
    kw = dict(device="a18", method="traced", policy="lfu", warmup=0, dram_budget=budget(0.5))
    warm = simulate(tr, SimConfig(**kw))
    cold = simulate(tr, SimConfig(**kw, preload=False))
    assert cold.hit_rate < warm.hit_rate
