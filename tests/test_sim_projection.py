"""Model-shape projection: rows by rank, layers by relative depth, said plainly to be extrapolated."""

import numpy as np
import pytest

from dipdeploy.registry import get_model
from dipdeploy.sim import SimConfig, simulate
from dipdeploy.sim.pattern import GroupMap, build_pattern
from dipdeploy.sim.synthetic import synthetic_trace

SMOL = get_model("smollm2-135m").shape
MISTRAL = get_model("mistral-7b").shape


def smol_trace(tokens=16, seed=0):
    return synthetic_trace(SMOL.hidden_size, SMOL.intermediate_size, SMOL.num_hidden_layers, tokens=tokens,
                           rho_in=0.55, rho_glu=0.4, seed=seed, model="smollm2-135m")


def test_identity_when_shapes_match():
    tr = smol_trace()
    pat = build_pattern(tr, SMOL)
    assert pat.extrapolation is None and pat.weights.sum() == SMOL.num_hidden_layers
    np.testing.assert_array_equal(pat.sel_in[3], tr.sel_in[3])


def test_group_map_is_a_partition_in_blocks():
    gmap = GroupMap.build(7, 30, np.random.default_rng(0))
    assert gmap.sizes.sum() == 30 and set(gmap.sizes) <= {4, 5}
    members = gmap.members[gmap.members >= 0]
    assert sorted(members.tolist()) == list(range(30))
    for s in range(7):
        assert (gmap.source_of[gmap.members[s][gmap.members[s] >= 0]] == s).all()


def test_projection_onto_mistral_keeps_density_and_layers():
    tr = smol_trace()
    pat = build_pattern(tr, MISTRAL, seed=3)
    assert pat.weights.sum() == MISTRAL.num_hidden_layers
    assert pat.density() == pytest.approx(tr.measured_density(), abs=0.01)
    for sel, rows in ((pat.sel_in[0], MISTRAL.hidden_size), (pat.sel_glu[-1], MISTRAL.intermediate_size)):
        assert sel.min() >= 0 and sel.max() < rows
        assert all(len(np.unique(row)) == sel.shape[1] for row in sel)  # no row twice in a token
    assert "extrapolated" in pat.extrapolation and "relative depth" in pat.extrapolation


def test_projected_rows_follow_their_source_rank():
    tr = smol_trace(tokens=4)
    pat = build_pattern(tr, MISTRAL, seed=0)
    first = tr.sel_in[0][0, 0]  # the top-ranked source row of token 0 → its whole block is selected first
    block = pat.map_in.members[first][pat.map_in.members[first] >= 0]
    assert set(block.tolist()) <= set(pat.sel_in[0][0].tolist())


def test_hit_rate_carries_over_at_the_same_cache_fraction():
    tr = smol_trace(tokens=20, seed=1)
    native = simulate(tr, SimConfig(device="a18", policy="lfu", warmup=8, dram_budget=0.05e9))
    f = native.memory["cache_fraction"]
    from dipdeploy.sim.memory import minimum_budget
    from dipdeploy.sim.precision import bytes_per_weight

    bpw = bytes_per_weight("bq4")
    budget = minimum_budget(MISTRAL, bpw) + f * MISTRAL.num_hidden_layers * MISTRAL.mlp_params_per_layer() * bpw
    proj = simulate(tr, SimConfig(device="a18", model="mistral-7b", policy="lfu", warmup=8, dram_budget=budget))
    assert proj.extrapolated and "extrapolated" in proj.extrapolation
    assert proj.hit_rate == pytest.approx(native.hit_rate, abs=0.03)
