"""Every family record end to end on its tiny registry model: loads, evaluates dense and DIP in torch,
exports a bundle validated against torch, and the host runtime runs that bundle as model.onnx does.
Refusals say why. The test family of tests/families/ proves the recipe of docs/contributing/family.md."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dipdeploy.agreement import Tolerance
from dipdeploy.arch import ArchitectureError, arch_of, families, get_arch
from dipdeploy.registry import get_model
from tiny_models import EXPORTABLE, TINY
from twin_checks import assert_runs_agree, model_onnx_run

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28]  # longer than tiny-gemma3's window


@pytest.mark.parametrize("name, why", [
    ("GPT2LMHeadModel", "has no gated MLP \\(GLU\\).*not supported"),
    ("Qwen3MoeForCausalLM", "is a mixture of experts: not supported"),
    ("MixtralForCausalLM", "is a mixture of experts: not supported"),
    ("NoSuchForCausalLM", "has no family record; registered: .*LlamaForCausalLM"),
])
def test_refusals_say_why(name, why):
    with pytest.raises(ArchitectureError, match=why):
        get_arch(name)


def test_config_level_refusals():
    with pytest.raises(ArchitectureError, match="mixture of experts"):
        arch_of({"architectures": ["LlamaForCausalLM"], "num_local_experts": 8})
    with pytest.raises(ArchitectureError, match="hidden_act='gelu'.*silu"):
        arch_of({"architectures": ["LlamaForCausalLM"], "hidden_act": "gelu"})
    with pytest.raises(ArchitectureError, match="names no architectures"):
        arch_of({"model_type": "llama"})


def _config_only(tmp_path, name: str, **changes) -> str:
    """A model directory holding only ``name``'s config.json, with ``changes``: no weights at all."""
    from dipdeploy.loading import resolve

    src, _ = resolve(name)
    config = {**json.loads((src / "config.json").read_text()), **changes}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    return str(tmp_path / "m")


def _phi4_rope(tmp_path, **rope_changes) -> str:
    """tiny-phi4-mini's config alone with its RoPE changed (at the top level too, as Phi configs say it)."""
    from dipdeploy.loading import resolve

    src, _ = resolve("tiny-phi4-mini")
    rope = {**json.loads((src / "config.json").read_text())["rope_parameters"], **rope_changes}
    return _config_only(tmp_path, "tiny-phi4-mini", rope_parameters=rope, **rope_changes)


def test_longrope_beyond_its_short_factors_is_refused_before_any_weight(tmp_path):
    """Past original_max_position_embeddings longrope switches every position to its long factors; the
    graphs carry one table (the short one), so a longer context is refused from config.json alone (the
    directory has no weights) in one line naming the fix."""
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig
    from dipdeploy.export.spec import ArchSpec
    from dipdeploy.loading import model_config

    model = _phi4_rope(tmp_path, original_max_position_embeddings=64)
    with pytest.raises(ArchitectureError, match="cannot export Phi3ForCausalLM with max_length 256: its longrope "
                       "RoPE switches to the long factors beyond original_max_position_embeddings=64.*"
                       "pass --max-length 64 or less"):
        export_model(ExportConfig(model=model, rho_in=0.6), tmp_path / "b")
    assert not (tmp_path / "b").exists()
    spec = ArchSpec.from_config(model_config(model))  # the short factors' range itself is exported
    assert spec.context_length(64) == 64
    with pytest.raises(ArchitectureError, match="max_length 65"):
        spec.context_length(65)


def test_gqa_refuses_partial_rope_it_cannot_rotate_before_any_weight(tmp_path):
    """GroupQueryAttention takes RoPE halves in multiples of 8 dims: 3/4 of a 64-dim head (24) runs
    (the parametrised GQA export), 5/8 (20) is refused up front; the standard form builds either."""
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig
    from dipdeploy.export.spec import ArchSpec
    from dipdeploy.loading import model_config, resolve

    src, _ = resolve("tiny-phi4-mini")
    rope = json.loads((src / "config.json").read_text())["rope_parameters"]
    model = _phi4_rope(tmp_path, partial_rotary_factor=0.625, short_factor=rope["short_factor"][:20],
                       long_factor=rope["long_factor"][:20])
    with pytest.raises(ArchitectureError, match="cannot export Phi3ForCausalLM: attention='gqa' cannot rotate 40 "
                       "of 64 dims per head.*use --attention standard"):
        export_model(ExportConfig(model=model, rho_in=0.6, attention="gqa"), tmp_path / "b")
    assert not (tmp_path / "b").exists()
    assert ArchSpec.from_config(model_config(model)).rotary_dim == 40
    assert ArchSpec.from_config(model_config("tiny-phi4-mini")).gqa_refusal() == ""


def test_the_test_family_is_picked_up():
    """tests/families/ registered a record and a registry file; nothing else names them."""
    assert "DipTestLlamaForCausalLM" in families()
    assert "tiny-diptest" in TINY and "tiny-diptest" in EXPORTABLE


@pytest.mark.parametrize("name", TINY)
def test_record_activation_and_modules_match_the_hf_mlp(name):
    """SparseMLP (dense method) with the record's activation and module names reproduces the HF MLP."""
    from dipdeploy.loading import load_model
    from dipdeploy.sparsity.methods import SparseMLP
    from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan

    lm = load_model(name)
    c = lm.model.config
    plan = uniform_plan(SparsityConfig(method="dense", density=1.0), name, c.num_hidden_layers, c.hidden_size,
                        c.intermediate_size)
    base = lm.model.model.layers[0].mlp
    x = torch.randn(1, 5, c.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(SparseMLP(base, lm.arch, plan, 0)(x), base(x))


def test_cats_under_geglu_thresholds_gelu():
    """Gemma's record says gelu_tanh: CATS's |act(W_g x)| is |GELU(W_g x)|, not |SiLU(W_g x)|."""
    from dipdeploy.loading import load_model
    from dipdeploy.sparsity.methods import SparseMLP
    from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan

    lm = load_model("tiny-gemma3")
    assert lm.arch.activation == "gelu_tanh"
    plan = uniform_plan(SparsityConfig(method="cats", density=0.5), "tiny-gemma3", 2, 64, 128)
    mlp = SparseMLP(lm.model.model.layers[0].mlp, lm.arch, plan, 0)
    seen = {}
    mlp.observer = lambda i, key, t: seen.setdefault(key, t)
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        mlp(x)
        gate = mlp.gate_up(x)[0]
    torch.testing.assert_close(seen["gate"], torch.nn.functional.gelu(gate, approximate="tanh").abs())
    assert not torch.allclose(seen["gate"], torch.nn.functional.silu(gate).abs())


@pytest.mark.parametrize("name", TINY)
def test_eval_runs_dense_and_dip(name, data_dir):
    from dipdeploy.eval import EvalConfig, evaluate

    rows = evaluate(EvalConfig(model=name, method="dense,dip", density="1.0,0.5", seqlen=64, max_windows=2,
                               data_dir=str(data_dir), calib_windows=2, calib_seqlen=64, progress=False))
    ppl = {(r["method"], r["target_density"]): r["ppl"] for r in rows}
    assert all(math.isfinite(p) for p in ppl.values())
    assert ppl["dip", 1.0] == pytest.approx(ppl["dense", 1.0], rel=1e-5) and ppl["dip", 0.5] != ppl["dense", 1.0]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """One DIP-CA BQ4 bundle with per-layer graphs per exportable family (validated by the export)."""
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    made = {}

    def bundle(name):
        if name not in made:
            out = tmp_path_factory.mktemp(name) / "bundle"
            res = export_model(ExportConfig(model=name, method="dip-ca", rho_in=0.6, gamma=0.3, quant="bq4",
                                            validate_tokens=8), out)
            made[name] = (out, res.manifest.validation)
        return made[name]
    return bundle


@pytest.mark.numerics
@pytest.mark.parametrize("name", EXPORTABLE)
def test_host_runtime_runs_the_bundle_as_model_onnx(bundles, name):
    from dipdeploy.runtime import Engine

    out, validation = bundles(name)
    assert validation["ok"] and validation["agrees_stock"]
    genai = json.loads((out / "genai_config.json").read_text())["model"]
    spec = get_model(name)
    assert genai["type"] == spec.arch.genai_type and genai["decoder"]["head_size"] == spec.shape.head_dim
    eng = Engine(out, dram_budget="100%", single_session=False, gamma=1.0, native=False)
    g = eng.generate(PROMPT, 6, keep_logits=True, stop_at_eos=False)
    logits, sel = eng.teacher_forced(PROMPT, g.tokens)
    shape = SimpleNamespace(num_kv_heads=spec.shape.num_key_value_heads, head_dim=spec.shape.head_dim,
                            num_layers=spec.shape.num_hidden_layers)
    ref_logits, ref_sel = model_onnx_run(out / "model.onnx", shape, PROMPT, g.tokens)
    assert_runs_agree(ref_logits, ref_sel, logits, sel, len(PROMPT), Tolerance(1e-4, 1e-4))
    assert np.isfinite(np.stack(g.logits)).all()
    # generate's prompt ran batched (the default); at γ = 1 that is the token-by-token prompt
    from dipdeploy.agreement import compare_logits, tolerance_for

    first = compare_logits(logits[:1], g.logits[:1], tolerance_for(sparse=True, quantised=True))
    assert first.ok, first.describe()


@pytest.mark.parametrize("name", ["tiny-granite", "tiny-llama"])
def test_perplexity_applies_the_family_logit_transform(name):
    """The chunked head of eval gives the HF forward's loss (Granite divides its logits by logits_scaling)."""
    from dipdeploy.eval.perplexity import window_nll
    from dipdeploy.loading import load_model

    lm = load_model(name)
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(3))
    nll, n = window_nll(lm.model, ids)
    with torch.no_grad():
        ref = lm.model(ids, labels=ids).loss
    assert nll / n == pytest.approx(float(ref), rel=1e-5)


@pytest.mark.parametrize("name", TINY)
def test_registry_shape_counts_the_real_model(name):
    """The simulator's sizes come from the registry shape (head_dim by the family's rule): they match the
    built model (norm vectors aside: within 1 %)."""
    from dipdeploy.loading import load_model

    lm = load_model(name)
    shape = get_model(name).shape
    layers = lm.model.model.layers
    mlp = sum(p.numel() for p in layers[0].mlp.parameters())
    assert shape.mlp_params_per_layer() == mlp
    rest = sum(p.numel() for p in lm.model.parameters()) - mlp * len(layers)
    assert shape.non_mlp_params() == pytest.approx(rest, rel=0.01)


@pytest.mark.parametrize("name", TINY)
def test_lora_targets_and_fake_quant_find_the_modules(name):
    """The record's module names are what peft and the fake quantiser look for."""
    from peft import LoraConfig, get_peft_model

    from dipdeploy.finetune.adapter import target_modules
    from dipdeploy.loading import load_model
    from dipdeploy.quant.fake import quant_config_from_name, quantize_model_

    lm = load_model(name)
    names = target_modules(lm.arch, ("up", "gate", "down", "attn"))
    present = {n.rsplit(".", 1)[-1] for n, _ in lm.model.model.layers[0].named_modules()}
    assert set(names) <= present
    peft_model = get_peft_model(lm.model, LoraConfig(r=2, target_modules=names))
    assert peft_model.get_nb_trainable_parameters()[0] > 0
    model = peft_model.unload()
    report = quantize_model_(model, quant_config_from_name("bq4"), "all", progress=False)
    assert report.layers == 2 and report.bits_per_weight_mlp == pytest.approx(4.25)


def test_a_record_registered_for_a_block_only():
    from dataclasses import replace

    from dipdeploy.arch import register, registered

    alias = replace(get_arch("LlamaForCausalLM"), name="BlockOnlyForCausalLM")
    with registered(alias):
        assert arch_of({"architectures": ["BlockOnlyForCausalLM"]}) is alias
        with pytest.raises(ValueError, match="registered already"):
            register(alias)
    with pytest.raises(ArchitectureError, match="has no family record"):
        get_arch("BlockOnlyForCausalLM")


@pytest.mark.parametrize("command", [["eval", "--method", "dense", "--density", "1"],
                                     ["export", "--rho-in", "0.6", "--out", "OUT"]])
def test_cli_refuses_a_model_without_a_gated_mlp_in_one_line(tmp_path, command):
    """A GPT-2 checkpoint: exit code 2, one line saying why, no traceback, nothing written."""
    from typer.testing import CliRunner

    from dipdeploy.cli import app

    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"],
                                                               "model_type": "gpt2"}))
    args = [str(tmp_path / "b") if a == "OUT" else a for a in command]
    res = CliRunner().invoke(app, [args[0], "--model", str(tmp_path / "gpt2"), *args[1:]])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "GPT2LMHeadModel has no gated MLP (GLU)" in lines[0]
    assert "Traceback" not in res.output and not (tmp_path / "b").exists()
