"""The host runtime on the real embedded model (SmolLM2-135M, DIP-CA BQ4 bundle): equal to model.onnx
with an unlimited budget and γ = 1, and to the torch DIP-CA reference under a 50 % LFU budget."""

import copy

import numpy as np
import onnxruntime as ort
import pytest

from dipdeploy.export.bundle import export
from dipdeploy.export.config import ExportConfig
from dipdeploy.export.prepare import make_plan
from dipdeploy.export.validate import ort_teacher_forced, torch_greedy
from dipdeploy.runtime import Engine

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
    g = Engine(out, dram_budget="100%", gamma=1.0).generate(ids.tolist(), 12, keep_logits=True, stop_at_eos=False)
    c = lm.model.config

    class Spec:
        num_kv_heads, head_dim, num_layers = c.num_key_value_heads, c.head_dim, c.num_hidden_layers

    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    picks, logits = ort_teacher_forced(sess, Spec, ids, g.tokens)
    assert picks == g.tokens
    assert max(float(np.abs(a - b[-1]).max()) for a, b in zip(g.logits, logits)) < 1e-3


def test_smollm2_dipca_equals_torch_reference(smol_bundle):
    from dipdeploy.sparsity.methods import reset_caches, sparsify_

    out, lm, plan, ids = smol_bundle
    ref_plan = copy.deepcopy(plan)
    ref_plan.method, ref_plan.gamma, ref_plan.policy, ref_plan.cache_frac = "dip-ca", 0.3, "lfu", 0.5
    model = copy.deepcopy(lm.model)
    sparsify_(model, ref_plan, lm.mlp_layout)
    reset_caches(model)
    ref_tokens, _ = torch_greedy(model, ids, 12)
    g = Engine(out, dram_budget="50%", policy="lfu").generate(ids.tolist(), 12, stop_at_eos=False)
    assert g.tokens == ref_tokens
    assert 0.5 < g.stats.hit_rate < 1.0
