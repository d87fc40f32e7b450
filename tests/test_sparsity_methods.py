"""Each method's mask and density match their definitions (docs/method.md), on tiny registry models."""

import numpy as np
import pytest
import torch

from dipdeploy.cache import topk_indices
from dipdeploy.sparsity.methods import SparseMLP, reset_caches, sparse_mlps, sparsify_, unsparsify_
from dipdeploy.sparsity.plan import LayerPlan, SparsityConfig, SparsityPlan, uniform_plan


def plan_for(lm, method, density=0.5, **kw):
    c = lm.model.config
    return uniform_plan(SparsityConfig(method=method, density=density, **kw), lm.name, c.num_hidden_layers,
                        c.hidden_size, c.intermediate_size)


def run(lm, plan, ids):
    sparsify_(lm.model, plan)
    try:
        reset_caches(lm.model)
        with torch.no_grad():
            return lm.model(ids, use_cache=False).logits
    finally:
        unsparsify_(lm.model)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))


def test_dip_at_full_density_equals_dense(tiny_llama, ids):
    dense = run(tiny_llama, plan_for(tiny_llama, "dense", 1.0), ids)
    full = run(tiny_llama, plan_for(tiny_llama, "dip", 1.0), ids)
    with torch.no_grad():
        ref = tiny_llama.model(ids, use_cache=False).logits
    assert torch.equal(dense, ref) and torch.equal(full, ref)


def capture(lm, plan, ids):
    """Run one layer-0 SparseMLP and return (x, GLU input to W_d, output) via the record hook."""
    mlp = SparseMLP(lm.model.model.layers[0].mlp, lm.arch, plan, 0)
    seen = {}
    mlp.recorder = lambda i, arrays: seen.update(arrays)
    x = torch.randn(2, 5, lm.model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    seen_down = {}
    hook = mlp.base.down_proj.register_forward_pre_hook(lambda m, a: seen_down.setdefault("h", a[0]))
    with torch.no_grad():
        y = mlp(x)
    hook.remove()
    return x, seen_down["h"], y, seen


@pytest.mark.parametrize("method", ["dip", "dip-ca"])
def test_dip_masks_match_definition(tiny_llama, ids, method):
    plan = plan_for(tiny_llama, method, 0.5, gamma=1.0)
    lp = plan.layers[0]
    x, h, _, seen = capture(tiny_llama, plan, ids)
    # input mask: exactly the top-K_in |x| per token (γ = 1 makes DIP-CA plain DIP)
    sel_in = np.sort(np.asarray(seen["sel_in"]), axis=-1)
    ref_in = np.sort(topk_indices(x.abs().reshape(-1, x.shape[-1]).numpy(), lp.k_in), axis=-1)
    assert (sel_in.reshape(-1, lp.k_in) == ref_in).all()
    # GLU mask: K_glu non-zeros per token reach W_d
    assert ((h != 0).sum(-1) <= lp.k_glu).all() and ((h != 0).sum(-1) >= lp.k_glu - 1).all()
    assert plan.mean_density() == pytest.approx((2 * lp.k_in / 64 + lp.k_glu / 128) / 3)


@pytest.mark.parametrize("method,knob", [("glu", 3 * 0.75 - 2), ("gate", (3 * 0.5 - 1) / 2), ("up", (3 * 0.5 - 1) / 2)])
def test_glu_side_methods_keep_k_columns_of_wd(tiny_llama, ids, method, knob):
    density = 0.75 if method == "glu" else 0.5
    plan = plan_for(tiny_llama, method, density)
    assert plan.layers[0].k_glu == round(knob * 128)
    _, h, _, _ = capture(tiny_llama, plan, ids)
    assert ((h != 0).sum(-1) == plan.layers[0].k_glu).all()
    assert plan.mean_density() == pytest.approx(density, abs=0.01)


def test_dipca_forward_equals_token_by_token_decoding(tiny_llama):
    """One causal forward (sequential loop inside each MLP) == decoding with a KV cache: fed one token at a
    time, each layer's scores rank the forward's selections as its own top-K (up to near-ties: the two
    paths multiply matrices of other shapes), and taking them gives the forward's logits."""
    from dipdeploy.agreement import Tolerance, compare_logits
    from dipdeploy.sparsity.twin import follow

    lm = tiny_llama
    plan = plan_for(lm, "dip-ca", 0.4, gamma=0.2, cache_frac=0.3, policy="lru")
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(3))
    sparsify_(lm.model, plan)
    sel = [{} for _ in range(ids.shape[1])]

    def keep(i, rec):
        for group, key in (("in", "sel_in"), ("glu", "sel_glu")):
            for p, row in enumerate(np.asarray(rec[key])[0]):
                sel[p][(i, group)] = row

    try:
        reset_caches(lm.model)
        for m in sparse_mlps(lm.model):
            m.recorder = keep
        with torch.no_grad():
            full = lm.model(ids).logits[0].float().numpy()
        for m in sparse_mlps(lm.model):
            m.recorder = None
        steps = follow(lm.model, ids[0].tolist(), [0], sel)
    finally:
        unsparsify_(lm.model)
    assert steps.ok and steps.topk_checked == 16 * 2 * 2, steps.as_dict()
    res = compare_logits([full], steps.logits, Tolerance(1e-4, 1e-4))
    assert res.ok, res.describe()


def test_dipca_prefers_resident_rows(tiny_llama):
    """With γ small, DIP-CA's selection overlaps the previous token's more than DIP's does."""
    lm = tiny_llama
    ids = torch.randint(0, 256, (1, 48), generator=torch.Generator().manual_seed(4))

    def overlap(plan):
        sel = []
        sparsify_(lm.model, plan)
        try:
            sparse_mlps(lm.model)[1].recorder = lambda i, a: sel.append(np.asarray(a["sel_in"])[0])
            reset_caches(lm.model)
            with torch.no_grad():
                lm.model(ids, use_cache=False)
        finally:
            unsparsify_(lm.model)
        s = sel[0]
        return np.mean([len(set(s[t]) & set(s[t - 1])) for t in range(1, len(s))])

    assert overlap(plan_for(lm, "dip-ca", 0.4, gamma=0.05, cache_frac=0.5)) > overlap(plan_for(lm, "dip", 0.4))


@pytest.mark.parametrize("name", ["tiny-phi3", "tiny-qwen2", "tiny-mistral"])
def test_every_architecture_sparsifies(name):
    from dipdeploy.loading import load_model

    lm = load_model(name)
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = lm.model(ids, use_cache=False).logits
    assert torch.equal(run(lm, plan_for(lm, "dip", 1.0), ids), ref)
    assert not torch.equal(run(lm, plan_for(lm, "dip", 0.3), ids), ref)


def test_wina_scores_use_column_norms(tiny_llama):
    plan = plan_for(tiny_llama, "dip", 0.5, score="wina")
    mlp = SparseMLP(tiny_llama.model.model.layers[0].mlp, tiny_llama.arch, plan, 0)
    w_u, w_g = mlp.weights_in()
    expect = torch.sqrt((w_u**2).sum(0) + (w_g**2).sum(0))
    torch.testing.assert_close(mlp.norm_in, expect)


def test_thresholds_required_for_cats(tiny_llama, ids):
    plan = plan_for(tiny_llama, "cats", 0.5)
    with pytest.raises(ValueError, match="calibrate"):
        run(tiny_llama, plan, ids)


def test_plan_mismatch_is_clear(tiny_llama):
    plan = SparsityPlan("x", "dip", 0.5, 32, 64, [LayerPlan(16, 32)])
    with pytest.raises(ValueError, match="dipdeploy calibrate"):
        sparsify_(tiny_llama.model, plan)
