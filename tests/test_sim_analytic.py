"""Simulator cases with answers in closed form, and the paper's dense sanity figure."""

import math

import numpy as np
import pytest

from dipdeploy.registry import get_model
from dipdeploy.sim import SimConfig, get_device, simulate
from dipdeploy.sim.memory import minimum_budget, plan_memory
from dipdeploy.sim.precision import bytes_per_weight
from dipdeploy.sim.synthetic import synthetic_trace
from dipdeploy.trace import Trace

PHI3 = get_model("phi-3-medium").shape
SMOL = get_model("smollm2-135m").shape


def smol_trace(tokens=24, seed=0, **kw):
    return synthetic_trace(SMOL.hidden_size, SMOL.intermediate_size, SMOL.num_hidden_layers, tokens=tokens,
                           rho_in=0.55, rho_glu=0.4, seed=seed, model="smollm2-135m", **kw)


def whole_model_bytes(shape, precision="bq4"):
    bpw = bytes_per_weight(precision)
    return shape.non_mlp_params() * bpw + shape.num_hidden_layers * shape.mlp_params_per_layer() * bpw


@pytest.mark.parametrize("method,policy", [("dense", "static"), ("traced", "static"), ("traced", "lfu"),
                                           ("traced", "lru")])
def test_everything_in_dram_runs_at_dram_bandwidth(method, policy):
    dev = get_device("sd8gen3")
    tr = smol_trace(tokens=8)
    warm = 0
    if policy in ("lfu", "lru"):  # dynamic caches start cold: repeat token 0's rows, measure after it
        tr.sel_in = [np.tile(a[:1], (8, 1)) for a in tr.sel_in]
        tr.sel_glu = [np.tile(a[:1], (8, 1)) for a in tr.sel_glu]
        warm = 1
    r = simulate(tr, SimConfig(device="sd8gen3", method=method, policy=policy,
                               dram_budget=whole_model_bytes(SMOL) * 1.01, warmup=warm))
    assert r.flash_bytes_per_token == 0 and r.hit_rate == 1.0
    assert r.tok_s == pytest.approx(dev.dram_bandwidth / r.dram_bytes_per_token, rel=1e-9)
    bpw = bytes_per_weight("bq4")
    mlp = SMOL.num_hidden_layers * SMOL.mlp_params_per_layer() * bpw
    expected = SMOL.non_mlp_params() * bpw + (1.0 if method == "dense" else r.density) * mlp
    assert r.dram_bytes_per_token == pytest.approx(expected, rel=1e-9)  # tied embeddings: all read


def test_dense_static_closed_form():
    dev, budget = get_device("midrange"), 5.0e9
    bpw = bytes_per_weight("bq4")
    d, F, L = PHI3.hidden_size, PHI3.intermediate_size, PHI3.num_hidden_layers
    non_mlp = PHI3.non_mlp_params() * bpw
    f = (budget - non_mlp) / (L * 3 * d * F * bpw)
    c_in, c_glu = math.floor(f * d), math.floor(f * F)
    U = dev.flash.read_unit  # 4 KiB: the streamed rows [C, R) cover whole blocks

    def streamed(c, rows, row_bytes):
        return (math.ceil(rows * row_bytes / U) - math.floor(c * row_bytes / U)) * U

    flash = L * (streamed(c_in, d, 2 * F * bpw) + streamed(c_glu, F, d * bpw))
    assert flash == pytest.approx(L * ((d - c_in) * 2 * F + (F - c_glu) * d) * bpw, rel=1e-3)
    read = (PHI3.non_mlp_params() - (PHI3.vocab_size - 1) * d + L * 3 * d * F) * bpw  # one embedding row read
    t = read / dev.dram_bandwidth + 2 * L * dev.flash.request_s + flash / dev.flash.seq_bandwidth
    r = simulate(None, SimConfig(device="midrange", model="phi-3-medium", method="dense", policy="static",
                                 dram_budget=budget))
    assert r.flash_bytes_per_token == pytest.approx(flash, rel=1e-12)
    assert r.flash_requests_per_token == 2 * L
    assert r.tok_s == pytest.approx(1 / t, rel=1e-12)
    assert r.tok_s_overlap == pytest.approx(1 / max(read / dev.dram_bandwidth, t - read / dev.dram_bandwidth))


def test_paper_dense_sanity_phi3_medium():
    """Phi-3-Medium dense, 4.25 bits, A18 (paper profile), 4 GB DRAM → the paper's ≈0.29 tok/s."""
    r = simulate(None, SimConfig(device="a18-paper", model="phi-3-medium", method="dense", policy="static",
                                 precision="bq4", dram_budget=4e9))
    assert r.dram_bytes_per_token == pytest.approx(7.33e9, rel=0.01)  # docs/method.md: ≈7.3 GB read per token
    assert r.tok_s == pytest.approx(0.283, abs=0.002)  # serial; the paper quotes ≈0.29
    assert r.tok_s_overlap == pytest.approx(0.293, abs=0.002)


@pytest.mark.parametrize("policy", ["lru", "lfu", "static", "belady"])
def test_zero_mlp_budget_reads_rho_times_mlp_from_flash(policy):
    tr = smol_trace(tokens=6)
    budget = minimum_budget(SMOL, bytes_per_weight("bq4"))
    r = simulate(tr, SimConfig(device="a18-paper", method="traced", policy=policy, dram_budget=budget))
    mlp = SMOL.num_hidden_layers * SMOL.mlp_params_per_layer() * bytes_per_weight("bq4")
    assert r.memory["mlp_cache"] == 0 and r.hit_rate == 0.0
    assert r.flash_bytes_per_token == pytest.approx(tr.measured_density() * mlp, rel=1e-9)


def test_budget_below_resident_part_names_the_minimum():
    lo = minimum_budget(PHI3, bytes_per_weight("bq4"), context=1024)
    with pytest.raises(ValueError, match=f"minimum is {lo / 1e9:.3f} GB"):
        plan_memory(PHI3, lo - 1e6, bytes_per_weight("bq4"), context=1024)


def test_kv_cache_takes_dram_first_and_is_read():
    base = simulate(None, SimConfig(device="a18", model="phi-3-medium", method="dense", policy="static",
                                    dram_budget=4e9))
    ctx = simulate(None, SimConfig(device="a18", model="phi-3-medium", method="dense", policy="static",
                                   dram_budget=4e9, context=2048))
    kv = 2 * 40 * 10 * 128 * 2048 * 2
    assert ctx.memory["kv_cache"] == kv
    assert ctx.dram_bytes_per_token == pytest.approx(base.dram_bytes_per_token + kv)
    assert ctx.flash_bytes_per_token > base.flash_bytes_per_token


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("budget_frac", [0.2, 0.5])
def test_belady_never_worse_than_lru_or_lfu(seed, budget_frac):
    shape = get_model("tiny-llama").shape
    tr = synthetic_trace(shape.hidden_size, shape.intermediate_size, shape.num_hidden_layers, tokens=80,
                         rho_in=0.3, rho_glu=0.3, seed=seed, model="tiny-llama")
    lo = minimum_budget(shape, bytes_per_weight("bq4"))
    budget = lo + budget_frac * shape.num_hidden_layers * shape.mlp_params_per_layer() * bytes_per_weight("bq4")
    flash = {p: simulate(tr, SimConfig(device="a18-paper", policy=p, dram_budget=budget)).flash_bytes_per_token
             for p in ("belady", "lru", "lfu")}
    assert flash["belady"] <= flash["lru"] and flash["belady"] <= flash["lfu"]


def test_policy_none_reads_everything_from_flash_and_overlap_is_faster():
    tr = smol_trace(tokens=6)
    r = simulate(tr, SimConfig(device="a18", policy="none", dram_budget=1e9))
    assert r.hit_rate == 0.0 and r.tok_s_overlap >= r.tok_s


def test_adjacent_missed_rows_are_one_request():
    d, F, L, K = SMOL.hidden_size, SMOL.intermediate_size, SMOL.num_hidden_layers, 100
    contiguous = [np.tile(np.arange(K), (3, 1)) for _ in range(L)]
    scattered = [np.tile(np.arange(0, 2 * K, 2), (3, 1)) for _ in range(L)]
    for sel, requests in ((contiguous, 2 * L), (scattered, (K + K) * L)):
        tr = Trace(source="synthetic", model="smollm2-135m", hidden_size=d, intermediate_size=F, num_layers=L,
                   method="dip", density=0.1, sel_in=sel, sel_glu=sel)
        r = simulate(tr, SimConfig(device="a18-paper", policy="none", dram_budget=1e9))
        assert r.flash_requests_per_token == requests


def test_small_rows_cost_whole_read_units():
    """SmolLM2's GLU rows (576 weights ≈ 306 B at bq4) cost a 4 KiB block each when isolated."""
    d, F, L = SMOL.hidden_size, SMOL.intermediate_size, SMOL.num_hidden_layers
    row_glu = d * bytes_per_weight("bq4")
    rows = [math.ceil(j * 8192 / row_glu) for j in range(32)]  # each just after every other block boundary
    sel_glu = [np.tile(rows, (3, 1)) for _ in range(L)]
    sel_in = [np.zeros((3, 1), dtype=np.int64) for _ in range(L)]
    tr = Trace(source="synthetic", model="smollm2-135m", hidden_size=d, intermediate_size=F, num_layers=L,
               method="dip", density=0.1, sel_in=sel_in, sel_glu=sel_glu)
    flat = simulate(tr, SimConfig(device="a18-paper", policy="none", dram_budget=1e9))
    block = simulate(tr, SimConfig(device="a18", policy="none", dram_budget=1e9))
    row_in = 2 * F * bytes_per_weight("bq4")
    assert flat.flash_bytes_per_token == pytest.approx(L * (row_in + 32 * row_glu))
    assert block.flash_bytes_per_token == pytest.approx(L * (1 + 32) * 4096)  # 1632 B input row: one block
    assert block.flash_requests_per_token == L * (1 + 32)


def test_reads_split_caches_the_small_rows_first_and_saves_flash_reads():
    """The simulator's plan follows the runtime's ``--cache-split reads``: the same MLP cache bytes, the
    small GLU rows (SmolLM2's down) cached first, so fewer requests from Flash for the same trace."""
    dev = get_device("a18")
    bpw = bytes_per_weight("bq4")
    budget = SMOL.non_mlp_params() * bpw + 0.5 * SMOL.num_hidden_layers * SMOL.mlp_params_per_layer() * bpw
    even = plan_memory(SMOL, budget, bpw)
    reads = plan_memory(SMOL, budget, bpw, split="reads", k=(0.55 * 576, 0.4 * 1536), flash=dev.flash)
    assert reads.capacity_glu == SMOL.intermediate_size and reads.capacity_in < even.capacity_in
    assert reads.mlp_cache_bytes <= even.mlp_cache_bytes
    assert even.mlp_cache_bytes - reads.mlp_cache_bytes < SMOL.num_hidden_layers * reads.row_bytes_in
    with pytest.raises(ValueError, match="needs the rows selected"):
        plan_memory(SMOL, budget, bpw, split="reads")
    tr = smol_trace(tokens=16)
    r = {s: simulate(tr, SimConfig(device="a18", method="traced", policy="lfu", dram_budget=budget, cache_split=s))
         for s in ("even", "reads")}
    assert r["reads"].flash_requests_per_token < r["even"].flash_requests_per_token
    with pytest.raises(ValueError, match="cache split 'odd' unknown"):
        SimConfig(cache_split="odd")
