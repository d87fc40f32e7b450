"""The torch tracer's file goes straight into the simulator (the interface between the two stages)."""

import pytest
import torch

from dipdeploy.registry import get_model
from dipdeploy.sim import SimConfig, simulate
from dipdeploy.sim.memory import minimum_budget
from dipdeploy.sim.precision import bytes_per_weight
from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan
from dipdeploy.sparsity.trace import record_trace
from dipdeploy.trace import Trace


def test_torch_trace_round_trips_into_simulate(tiny_llama, tmp_path):
    lm = tiny_llama
    c = lm.model.config
    plan = uniform_plan(SparsityConfig(method="dip", density=0.5), lm.name, c.num_hidden_layers, c.hidden_size,
                        c.intermediate_size)
    ids = torch.randint(0, c.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    path = record_trace(lm, plan, ids).save(tmp_path / "t.npz")
    tr = Trace.load(path)
    assert tr.source == "torch" and tr.has_magnitudes and tr.num_tokens == 24
    bpw = bytes_per_weight("bq4")
    shape = get_model(tr.model).shape
    budget = minimum_budget(shape, bpw) + 0.3 * shape.num_hidden_layers * shape.mlp_params_per_layer() * bpw
    kw = dict(device="a18-paper", policy="lfu", warmup=4, dram_budget=budget)
    traced = simulate(tr, SimConfig(**kw, method="traced"))
    dip = simulate(tr, SimConfig(**kw, method="dip"))
    ca = simulate(tr, SimConfig(**kw, method="dip-ca", gamma=0.1))
    # the recorded rows are top-K of the recorded magnitudes (up to fp16 ties), so re-masking agrees
    assert abs(traced.hit_rate - dip.hit_rate) < 0.02
    assert ca.hit_rate > dip.hit_rate
    assert traced.density == pytest.approx(tr.measured_density())
