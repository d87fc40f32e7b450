"""The host runtime on the real embedded model (SmolLM2-135M, DIP-CA BQ4 bundle): equal to model.onnx
with an unlimited budget and γ = 1, and to the torch DIP-CA reference under a 50 % LFU budget, by the
project's agreement rule (near-ties of a top-K may go either way)."""

import copy

import numpy as np
import pytest

from dipdeploy.agreement import Tolerance, tolerance_for
from dipdeploy.export.bundle import export
from dipdeploy.export.config import ExportConfig
from dipdeploy.export.prepare import make_plan
from dipdeploy.export.validate import torch_greedy
from dipdeploy.runtime import Engine
from dipdeploy.sparsity.twin import compare_with_twin
from twin_checks import assert_runs_agree, model_onnx_run

# compared across implementations: CI runs these under every kernel set too (Makefile: test-kernel-sets)
pytestmark = pytest.mark.numerics

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def smol_bundle(tmp_path_factory):
    from dipdeploy.loading import load_model

    lm = load_model("smollm2-135m")
    cfg = ExportConfig(model="smollm2-135m", method="dip-ca", density=0.5, rho_in=0.55, gamma=0.3, quant="bq4",
                       validate_tokens=0)
    plan = make_plan(lm, cfg)
    out = tmp_path_factory.mktemp("smol") / "bundle"
    export(lm, cfg, out, plan)
    ids = np.asarray(lm.tokenizer(PROMPT, add_special_tokens=False).input_ids, dtype=np.int64)
    return out, lm, plan, ids


def test_smollm2_unlimited_budget_equals_model_onnx(smol_bundle):
    out, lm, _, ids = smol_bundle
    eng = Engine(out, dram_budget="100%", single_session=False, fused=False, gamma=1.0, prefill="token")
    g = eng.generate(ids.tolist(), 12, stop_at_eos=False)
    c = lm.model.config

    class Spec:
        num_kv_heads, head_dim, num_layers = c.num_key_value_heads, c.head_dim, c.num_hidden_layers

    logits, sel = eng.teacher_forced(ids.tolist(), g.tokens)
    ref_logits, ref_sel = model_onnx_run(out / "model.onnx", Spec, ids, g.tokens)
    assert_runs_agree(ref_logits, ref_sel, logits, sel, len(ids), Tolerance(1e-3, 1e-3))


def test_smollm2_dipca_equals_torch_reference(smol_bundle):
    """Fed the torch DIP-CA reference's tokens, every runtime selection is the reference's top-K up to
    near-ties, and the twin that follows them gives the runtime's logits."""
    from dipdeploy.sparsity.methods import reset_caches, sparsify_

    out, lm, plan, ids = smol_bundle
    ref_plan = copy.deepcopy(plan)
    ref_plan.method, ref_plan.gamma, ref_plan.policy, ref_plan.cache_frac = "dip-ca", 0.3, "lfu", 0.5
    model = copy.deepcopy(lm.model)
    sparsify_(model, ref_plan)
    reset_caches(model)
    ref_tokens, _ = torch_greedy(model, ids, 12)
    eng = Engine(out, dram_budget="50%", policy="lfu", fused=False)
    logits, sel = eng.teacher_forced(ids.tolist(), ref_tokens)
    token, twin = compare_with_twin(model, ids.tolist(), ref_tokens, logits, sel,
                                    tolerance_for(sparse=True, quantised=True))
    assert token.ok and twin.ok, f"{token.describe()}; {twin.as_dict()}"
    g = eng.generate(ids.tolist(), 12, stop_at_eos=False)
    assert 0.5 < g.stats.hit_rate < 1.0
