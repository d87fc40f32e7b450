"""The predictor baseline (Deja Vu / LLM in a flash) and the recall meter, on tiny registry models."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.eval import EvalConfig, evaluate
from dipdeploy.eval.meter import RecallMeter
from dipdeploy.sparsity.methods import sparse_mlps, sparsify_, topk_mask, unsparsify_
from dipdeploy.sparsity.plan import SparsityConfig, SparsityPlan, predictor_share, uniform_plan
from dipdeploy.sparsity.predictor import attach, fit_predictors

runner = CliRunner()


def _plan(lm, density: float = 0.5, rank: int = 4) -> SparsityPlan:
    c = lm.model.config
    cfg = SparsityConfig(method="predictor", density=density, predictor_rank=rank)
    return uniform_plan(cfg, lm.name, c.num_hidden_layers, c.hidden_size, c.intermediate_size)


def _windows(lm, n: int = 2, t: int = 32) -> torch.Tensor:
    vocab = lm.model.config.vocab_size
    return torch.randint(vocab, (n, t), generator=torch.Generator().manual_seed(1))


def test_density_counts_the_predictor_bytes(tiny_llama):
    """ρ = (3·d·K + |A| + |B| + |b|) / (3·d·F): the units read plus the predictor's own elements, in one dtype."""
    plan = _plan(tiny_llama, 0.5, rank=4)
    d, f = plan.hidden_size, plan.intermediate_size
    fit = fit_predictors(tiny_llama, plan, _windows(tiny_llama), steps=3)
    for lp, pred in zip(plan.layers, fit.predictors):
        assert tuple(pred.A.shape) == (d, 4) and tuple(pred.B.shape) == (4, f) and tuple(pred.b.shape) == (f,)
        assert plan.layer_density(0) == pytest.approx((3 * d * lp.k_glu + pred.elements()) / (3 * d * f))
    assert plan.density == pytest.approx(0.5, abs=0.5 / f)
    # a larger predictor leaves fewer units for the same density
    assert _plan(tiny_llama, 0.5, rank=16).layers[0].k_glu < plan.layers[0].k_glu
    assert predictor_share(16, d, f) > predictor_share(4, d, f) > 0


def test_the_predictor_selects_its_top_k_units_for_the_whole_mlp(tiny_llama):
    plan = _plan(tiny_llama)
    fit = fit_predictors(tiny_llama, plan, _windows(tiny_llama), steps=3)
    sparsify_(tiny_llama.model, plan)
    try:
        attach(tiny_llama.model, fit)
        x = torch.randn(1, 5, plan.hidden_size, generator=torch.Generator().manual_seed(2))
        for mlp, lp in zip(sparse_mlps(tiny_llama.model), plan.layers):
            chosen = topk_mask(mlp.predictor(x), lp.k_glu)
            assert (chosen.sum(-1) == lp.k_glu).all()
            gate, up = mlp.gate_up(x)
            want = mlp.down(mlp.act(gate) * up * chosen)
            assert torch.equal(mlp(x), want)
    finally:
        unsparsify_(tiny_llama.model)


def test_a_fixed_seed_trains_the_same_predictors(tiny_llama):
    plan, w = _plan(tiny_llama), _windows(tiny_llama)
    one, two = (fit_predictors(tiny_llama, plan, w, steps=5, seed=3) for _ in range(2))
    other = fit_predictors(tiny_llama, plan, w, steps=5, seed=4)
    for p, q in zip(one.predictors, two.predictors):
        assert all(torch.equal(getattr(p, n), getattr(q, n)) for n in ("A", "B", "b"))
    assert one.held_recall == two.held_recall
    assert not all(torch.equal(p.A, q.A) for p, q in zip(one.predictors, other.predictors))


def test_the_predictor_cannot_run_untrained(tiny_llama):
    sparsify_(tiny_llama.model, _plan(tiny_llama))
    try:
        with pytest.raises(ValueError, match="dipdeploy eval --method predictor"):
            tiny_llama.model(_windows(tiny_llama, 1, 8))
    finally:
        unsparsify_(tiny_llama.model)


def test_recall_meter_counts_the_dense_top_k(tiny_llama):
    """The oracle (glu, score abs) chooses the dense top-K itself: recall 1; a plan with K = F: recall 1."""
    c = tiny_llama.model.config
    for method, rho in (("glu", 0.8), ("dip", 1.0)):
        plan = uniform_plan(SparsityConfig(method=method, density=rho, rho_in=1.0), "t", c.num_hidden_layers,
                            c.hidden_size, c.intermediate_size)
        sparsify_(tiny_llama.model, plan)
        try:
            with RecallMeter(tiny_llama.model) as meter, torch.no_grad():
                tiny_llama.model(_windows(tiny_llama, 1, 8))
        finally:
            unsparsify_(tiny_llama.model)
        assert meter.layers() == [1.0] * c.num_hidden_layers and meter.recall() == 1.0


def test_eval_rows_carry_recall(data_dir):
    rows = evaluate(EvalConfig(model="tiny-qwen2", method="dense,dip,predictor", density="0.5", seqlen=32,
                               max_windows=2, data_dir=str(data_dir), calib_windows=2, calib_seqlen=32,
                               progress=False, recall=True,
                               sparsity=SparsityConfig(predictor_rank=4, predictor_steps=5)))
    by = {r["method"]: r for r in rows}
    assert by["dense"]["recall"] is None
    for m in ("dip", "predictor"):
        assert 0.0 <= by[m]["recall"] <= 1.0 and by[m]["ppl"] > 0
    info = by["predictor"]["predictor"]
    assert info["rank"] == 4 and info["steps"] == 5 and 0.0 <= info["calib_recall"] <= 1.0
    assert by["predictor"]["density"] == pytest.approx(0.5, abs=0.01)
    # without --recall only the predictor measures it (its dense GLU is computed anyway)
    rows = evaluate(EvalConfig(model="tiny-qwen2", method="dip", density="0.5", seqlen=32, max_windows=1,
                               data_dir=str(data_dir), calib_windows=1, calib_seqlen=32, progress=False))
    assert rows[0]["recall"] is None


@pytest.mark.parametrize("args, expect", [
    ("eval -m tiny-llama --method predictor --predictor-rank 0", "--predictor-rank must be >= 1"),
    ("eval -m tiny-llama --method predictor --predictor-rank 100000", "over the cap"),
    ("eval -m tiny-llama --method predictor --predictor-steps 0", "--predictor-steps must be >= 1"),
    ("eval -m tiny-llama --method predictor --quant bq4", "drop them for its rows"),
    ("calibrate -m tiny-llama --method predictor -o {tmp}/plan.json", "dipdeploy eval --method predictor"),
    ("export -m tiny-llama --method predictor -o {tmp}/b", "dipdeploy eval --method predictor"),
])
def test_bad_predictor_flags_are_one_line_exit_2(args, expect, tmp_path):
    res = runner.invoke(app, args.format(tmp=tmp_path).split())
    out = res.output.strip()
    assert res.exit_code == 2, out
    assert len(out.splitlines()) == 1 and expect in out, out
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, expect", [
    ("--density 0.01", "below the rank-8 predictor's own bytes"),
    ("--predictor-rank 65", "exceeds the model's width"),
])
def test_a_predictor_the_model_cannot_hold_is_refused(args, expect, data_dir):
    res = runner.invoke(app, ["eval", "-m", "tiny-llama", "--method", "predictor", "--predictor-rank", "8",
                              "--seqlen", "32", "--max-windows", "1", "--calib-windows", "1", "--calib-seqlen", "32",
                              "--data-dir", str(data_dir), *args.split()])
    lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error:")]
    assert res.exit_code == 2 and len(lines) == 1 and expect in lines[0], res.output
