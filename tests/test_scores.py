"""Weighted DIP scores folded into the weights (dipdeploy/sparsity/scores.py): the fold keeps the dense
model, plain top-|·| on the folded model is the weighted score of the original one, and a ``wina-in``
plan exports to a bundle that agrees with its torch reference, streamed as eager."""

import numpy as np
import pytest
import torch

from dipdeploy.agreement import compare_topk
from dipdeploy.loading import load_model
from dipdeploy.sparsity.methods import sparse_mlps, sparsify_, unsparsify_
from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan
from dipdeploy.sparsity.scores import FOLDED, Fold, fold_scores

#: Families whose MLP layout or norm differ: split/fused gate_up, w and (1 + w) norms, q/k/v bias, sandwich norms.
FAMILIES = ["tiny-llama", "tiny-phi3", "tiny-qwen2", "tiny-gemma", "tiny-gemma2", "tiny-gemma3"]


def _ids(lm, n=24):
    return torch.randint(0, lm.model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))


def _plan(lm, score, density=0.5):
    c = lm.model.config
    return uniform_plan(SparsityConfig(method="dip", density=density, rho_in=0.55, score=score), lm.name,
                        c.num_hidden_layers, c.hidden_size, c.intermediate_size)


def _selections(lm, plan, ids):
    """Per layer, the recorded (scores_in [T, d], sel_in [T, K_in], scores_glu, sel_glu) of one forward."""
    rec = {}
    sparsify_(lm.model, plan)
    try:
        for m in sparse_mlps(lm.model):
            m.recorder = lambda i, a: rec.__setitem__(i, [a[k][0].detach().numpy()
                                                          for k in ("x_abs", "sel_in", "glu_abs", "sel_glu")])
        with torch.no_grad():
            lm.model(ids, use_cache=False)
    finally:
        unsparsify_(lm.model)
    return [rec[i] for i in sorted(rec)]


@pytest.mark.parametrize("fold", [Fold(1.0, 1.0), Fold(0.5, 0.0)])
@pytest.mark.parametrize("name", FAMILIES)
def test_fold_keeps_the_dense_model(name, fold):
    lm = load_model(name)
    ids = _ids(lm)
    norm = lm.arch.norms.mlp_in
    before = getattr(lm.model.model.layers[0], norm).weight.clone()
    with torch.no_grad():
        ref = lm.model(ids, use_cache=False).logits
        fold_scores(lm.model, fold)
        got = lm.model(ids, use_cache=False).logits
    assert not torch.equal(getattr(lm.model.model.layers[0], norm).weight, before)  # the norm took s
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-phi3", "tiny-gemma3"])
def test_folded_abs_selects_as_the_weighted_score(name):
    """DIP (|x|) on the folded model keeps, at every layer, the top-K of wina-in's |x|·s on the original
    (near-ties aside: agreement.compare_topk); plain |x| on the original picks other features."""
    lm = load_model(name)
    ids = _ids(lm)
    weighted = _selections(lm, _plan(lm, "wina-in"), ids)
    plain = _selections(lm, _plan(lm, "abs"), ids)
    fold_scores(lm.model, FOLDED["wina-in"])
    folded = _selections(lm, _plan(lm, "abs"), ids)
    for (s_in, _, s_glu, _), (_, sel_in, _, sel_glu) in zip(weighted, folded):
        res_in, res_glu = compare_topk(s_in, sel_in), compare_topk(s_glu, sel_glu)
        assert res_in.ok and res_glu.ok, (res_in, res_glu)
    assert any(not np.array_equal(np.sort(p[1], -1), np.sort(f[1], -1)) for p, f in zip(plain, folded))


def test_wina_in_weights_only_the_input_group(tiny_llama):
    from dipdeploy.sparsity.methods import SparseMLP

    mlp = SparseMLP(tiny_llama.model.model.layers[0].mlp, tiny_llama.arch, _plan(tiny_llama, "wina-in"), 0)
    w_u, w_g = mlp.weights_in()
    torch.testing.assert_close(mlp.norm_in, torch.sqrt((w_u**2).sum(0) + (w_g**2).sum(0)) ** FOLDED["wina-in"].alpha_in)
    assert mlp.norm_glu is None


def _plan_file(tmp_path, name, score="wina-in"):
    lm = load_model(name)
    return str(_plan(lm, score).save(tmp_path / f"{name}-{score}.json"))


@pytest.mark.numerics
@pytest.mark.parametrize("quant", ["none", "bq4"])
def test_wina_in_bundle_matches_torch(tmp_path, quant):
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    res = export_model(ExportConfig(model="tiny-llama", plan=_plan_file(tmp_path, "tiny-llama"), quant=quant,
                                    validate_tokens=8), tmp_path / "b")
    assert res.manifest.plan["score"] == "wina-in" and res.manifest.validation["agrees_stock"]
    assert not any("colnorm" in t for t in res.manifest.tensors)  # folded: the graph is plain DIP's


@pytest.mark.numerics
@pytest.mark.parametrize("model", ["tiny-phi3", "tiny-gemma3"])
def test_wina_in_streamed_export_gives_the_eager_bundle(tmp_path, model):
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig
    from test_export_streamed import _same_bundle

    kw = dict(model=model, method="dip", quant="bq4", plan=_plan_file(tmp_path, model))
    eager = export_model(ExportConfig(stream=False, validate_tokens=4, **kw), tmp_path / "eager")
    streamed = export_model(ExportConfig(stream=True, **kw), tmp_path / "streamed")
    abs_bundle = export_model(ExportConfig(**{**kw, "plan": _plan_file(tmp_path, model, "abs")}, stream=True),
                              tmp_path / "abs")
    assert (abs_bundle.out / "mlp.bin").read_bytes() != (streamed.out / "mlp.bin").read_bytes()  # folded weights
    _same_bundle(eager.out, streamed.out)


def test_wina_in_export_refuses_a_family_without_mlp_norm(tmp_path):
    from dipdeploy.export.prepare import load_plan

    lm = load_model("tiny-olmo2")
    with pytest.raises(ValueError, match="--score abs"):
        load_plan(_plan(lm, "wina-in").save(tmp_path / "p.json"), lm)
