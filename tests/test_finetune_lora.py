"""LoRA recovery on a tiny model: training lowers the loss, merging is W + (α/r)·B·A, resume continues
from a checkpoint, and a mismatched base or plan is a clear error."""

import json

import pytest
import torch
from safetensors.torch import load_file

from dipdeploy.finetune import LoraConfig, adapter_plan, apply_lora, finetune, read_metadata
from dipdeploy.finetune.train import checkpoint_dir
from dipdeploy.loading import load_model
from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan

TEXT = "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. " * 60


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("ft") / "train.txt"
    p.write_text(TEXT)
    return str(p)


def _plan(lm, density=0.5, method="dip"):
    c = lm.model.config
    return uniform_plan(SparsityConfig(method=method, density=density), lm.name, c.num_hidden_layers,
                        c.hidden_size, c.intermediate_size)


def _cfg(text_file, **kw):
    base = dict(steps=6, lr=1e-2, seqlen=32, batch_size=2, warmup_steps=0, logging_steps=1, save_steps=3,
                rank=4, text_file=text_file, seed=0)
    return LoraConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def trained(tmp_path_factory, text_file):
    """One short DIP-active run on tiny-llama, shared by the read-only tests below."""
    torch.manual_seed(0)
    lm = load_model("tiny-llama")
    out = tmp_path_factory.mktemp("ad") / "adapter"
    res = finetune(lm, _plan(lm), _cfg(text_file), out, progress=False)
    return lm, out, res


def test_training_lowers_the_loss_and_leaves_the_model_as_it_came(trained):
    lm, out, res = trained
    assert res.steps == 6 and res.train_tokens == 6 * 2 * 32
    assert res.last_loss < res.first_loss - 0.05
    assert not any("lora" in n for n, _ in lm.model.named_parameters())
    assert type(lm.model.model.layers[0].mlp).__name__ == "LlamaMLP"  # unwrapped again


def test_adapter_is_standard_peft_with_plan(trained):
    from peft import PeftModel

    lm, out, _ = trained
    keys = load_file(str(out / "adapter_model.safetensors"))
    assert keys and all(".mlp.base." not in k for k in keys)  # plain module paths, no SparseMLP wrapper
    assert {k.split(".mlp.")[1].split(".")[0] for k in keys} == {"up_proj", "gate_proj", "down_proj"}
    fresh = load_model("tiny-llama")
    PeftModel.from_pretrained(fresh.model, str(out))  # loads with stock peft, no dipdeploy involved
    meta = read_metadata(out)
    assert meta["train"]["steps"] == 6 and meta["lora"]["rank"] == 4
    assert adapter_plan(out).layers == _plan(lm).layers
    assert not checkpoint_dir(out).exists()  # removed after a finished run


def test_merged_weights_are_base_plus_scaled_BA(trained):
    lm, out, _ = trained
    base = load_model("tiny-llama")
    merged = apply_lora(load_model("tiny-llama"), out, merge=True)
    ab = load_file(str(out / "adapter_model.safetensors"))
    scale = 8.0 / 4  # alpha = 2·rank by default → α/r = 2
    for i, layer in enumerate(base.model.model.layers):
        for name in ("up_proj", "gate_proj", "down_proj"):
            pre = f"base_model.model.model.layers.{i}.mlp.{name}"
            want = getattr(layer.mlp, name).weight + scale * ab[f"{pre}.lora_B.weight"] @ ab[f"{pre}.lora_A.weight"]
            got = getattr(merged.model.model.layers[i].mlp, name).weight
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            assert not torch.allclose(got, getattr(layer.mlp, name).weight)  # training did move B


def test_merged_equals_adapter_applied_under_dip(trained):
    from dipdeploy.sparsity.methods import sparsify_

    lm, out, _ = trained
    plan = adapter_plan(out)
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(1))
    logits = []
    for merge in (False, True):
        m = apply_lora(load_model("tiny-llama"), out, merge=merge, plan=plan)
        sparsify_(m.model, plan)
        with torch.no_grad():
            logits.append(m.model(ids).logits)
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


def test_mismatched_base_or_plan_is_a_clear_error(trained):
    lm, out, _ = trained
    other_ckpt = load_model("tiny-llama")
    with torch.no_grad():
        other_ckpt.model.model.layers[0].mlp.down_proj.weight.mul_(1.01)  # same shape, other weights
    with pytest.raises(ValueError, match="weights differ"):
        apply_lora(other_ckpt, out, merge=True)
    for name in ("tiny-mistral", "tiny-phi3"):  # other architecture; other MLP layout
        with pytest.raises(ValueError, match="trained on 'tiny-llama'"):
            apply_lora(load_model(name), out, merge=True)
    other = _plan(lm, density=0.75)
    with pytest.raises(ValueError, match="trained under dip at density"):
        apply_lora(load_model("tiny-llama"), out, merge=False, plan=other)
    apply_lora(load_model("tiny-llama"), out, merge=False, plan=other, allow_other_plan=True)
    with pytest.raises(FileNotFoundError, match="not a dipdeploy LoRA adapter"):
        apply_lora(load_model("tiny-llama"), out.parent, merge=True)


def test_output_is_not_clobbered(trained, text_file):
    lm, out, _ = trained
    with pytest.raises(FileExistsError, match="--force"):
        finetune(lm, _plan(lm), _cfg(text_file), out, progress=False)


class _Interrupt(Exception):
    pass


def test_resume_continues_from_the_checkpoint(tmp_path, text_file):
    """Interrupted after the step-3 checkpoint, then resumed: the same adapter as one straight run."""
    from transformers import TrainerCallback

    class StopAfterSave(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            raise _Interrupt(state.global_step)

    cfg = _cfg(text_file, dropout=0.1)  # dropout makes the RNG state part of what resume must restore
    lm = load_model("tiny-llama")
    plan = _plan(lm)
    straight = finetune(lm, plan, cfg, tmp_path / "straight", progress=False)
    with pytest.raises(_Interrupt):
        finetune(lm, plan, cfg, tmp_path / "resumed", progress=False, callbacks=(StopAfterSave(),))
    assert (checkpoint_dir(tmp_path / "resumed") / "checkpoint-3").is_dir()
    assert not (tmp_path / "resumed").exists()  # nothing half-written
    with pytest.raises(FileExistsError, match="--resume"):
        finetune(lm, plan, cfg, tmp_path / "resumed", progress=False)
    resumed = finetune(lm, plan, cfg, tmp_path / "resumed", progress=False, resume=True)
    assert resumed.steps == 6 and read_metadata(tmp_path / "resumed")["train"]["resumed"]
    a = load_file(str(tmp_path / "straight" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "adapter_model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    assert json.loads((tmp_path / "resumed" / "plan.json").read_text())["method"] == "dip"


@pytest.mark.parametrize("bad,match", [({"rank": 0}, "rank"), ({"targets": "up,mlp"}, "targets"),
                                       ({"data": "wikitext2-test"}, "data"), ({"scheduler": "step"}, "scheduler"),
                                       ({"dropout": 1.0}, "dropout"), ({"tokens": 0}, "tokens"),
                                       ({"alpha": -1.0}, "alpha"), ({"lr": 0.0}, "lr"),
                                       ({"sample_windows": 0}, "sample_windows")])
def test_lora_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        LoraConfig(**bad)


def test_tokens_override_steps_and_roundtrip():
    cfg = LoraConfig(tokens=5000, batch_size=2, seqlen=512, targets="up,down")
    assert cfg.total_steps() == 5 and cfg.total_steps(processes=2) == 3 and cfg.targets == ("up", "down")
    assert LoraConfig.from_dict(json.loads(cfg.to_json())) == cfg


def test_dip_ca_trains_with_cold_caches(tmp_path, text_file):
    lm = load_model("tiny-llama")
    res = finetune(lm, _plan(lm, method="dip-ca"), _cfg(text_file, steps=2, seqlen=16), tmp_path / "ca", progress=False)
    assert res.steps == 2 and adapter_plan(tmp_path / "ca").method == "dip-ca"
