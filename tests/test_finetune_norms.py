"""`finetune --targets …,norms` on tiny-llama: the RMSNorm weights train whole beside the LoRA, the dense
teacher keeps the base norms, the model is left as it came, and the adapter (merged or live) carries the
trained norms into `eval --lora` and `export --lora`."""

import pytest
import torch

from dipdeploy.finetune import LoraConfig, apply_lora, finetune
from dipdeploy.finetune.adapter import norm_modules
from dipdeploy.finetune.distill import teacher_logits
from dipdeploy.loading import load_model
from dipdeploy.sparsity.methods import sparsify_
from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan

IDS = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(5))


def _norms(model):
    """Every norm weight ``norms`` trains, by path (tiny-llama: two a layer and the final one)."""
    named = dict(model.named_modules())
    return {name: named[name].weight.detach().clone() for name in norm_modules(model)}


def _plan(lm, density=0.4):
    c = lm.model.config
    return uniform_plan(SparsityConfig(method="dip", density=density), lm.name, c.num_hidden_layers,
                        c.hidden_size, c.intermediate_size)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    text = tmp_path_factory.mktemp("nt") / "train.txt"
    text.write_text("pack my box with five dozen liquor jugs; the quick brown fox jumps over it. " * 60)
    lm = load_model("tiny-llama")
    before = _norms(lm.model)
    plan = _plan(lm)
    out = tmp_path_factory.mktemp("na") / "adapter"
    cfg = LoraConfig(objective="distill", steps=6, lr=5e-3, seqlen=24, batch_size=2, warmup_steps=0,
                     logging_steps=1, save_steps=6, rank=4, targets=("up", "gate", "down", "norms"),
                     text_file=str(text), seed=0)
    finetune(lm, plan, cfg, out, progress=False)
    return lm, before, plan, out


@pytest.mark.parametrize("model,per_layer", [("tiny-llama", 2), ("tiny-gemma3", 4), ("tiny-olmo2", 2),
                                             ("tiny-phi3", 2)])
def test_norm_modules_name_each_layers_norms_and_the_final_one_by_full_path(model, per_layer):
    """Llama's two norms a layer, Gemma 3's four (sandwich), OLMo2's two after the sub-layers: each name one
    RMSNorm module of the model, matched by peft exactly (no name is a suffix of another)."""
    lm = load_model(model)
    names = norm_modules(lm.model)
    layers = lm.model.config.num_hidden_layers
    assert len(names) == per_layer * layers + 1 and names[-1] == "model.norm"
    named = dict(lm.model.named_modules())
    assert all(type(named[n]).__name__.endswith("RMSNorm") for n in names)
    assert not any(a != b and a.endswith(b) for a in named for b in names if a not in names)


def test_norms_train_and_the_model_is_left_as_it_came(trained):
    lm, before, _, _ = trained
    after = _norms(lm.model)
    assert after.keys() == before.keys()
    for name in before:
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=0)


def test_the_adapter_carries_trained_norms_merged_and_live(trained):
    _, before, plan, out = trained
    merged = apply_lora(load_model("tiny-llama"), out, merge=True, plan=plan)
    trained_norms = _norms(merged.model)
    moved = [n for n in before if not torch.equal(trained_norms[n], before[n])]
    assert len(moved) == len(before), f"untrained norms: {sorted(set(before) - set(moved))}"
    live = apply_lora(load_model("tiny-llama"), out, merge=False, plan=plan)
    sparsify_(merged.model, plan)
    sparsify_(live.model, plan)
    with torch.no_grad():
        torch.testing.assert_close(live.model(IDS).logits, merged.model(IDS).logits, rtol=1e-4, atol=1e-4)


def test_the_teacher_runs_the_base_norms_while_the_student_trains_its_own():
    import peft

    lm = load_model("tiny-llama")
    plan = _plan(lm)
    with torch.no_grad():
        dense = lm.model(IDS).logits
    model = peft.get_peft_model(lm.model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["up_proj"],
                                                          modules_to_save=norm_modules(lm.model)))
    hf = model.get_base_model()
    sparsify_(hf, plan)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "modules_to_save" in name:
                p.mul_(1.5)  # the student's norms move ...
    torch.testing.assert_close(teacher_logits(model, hf, IDS), dense)  # ... never the teacher's


def test_norms_alone_are_refused():
    with pytest.raises(ValueError, match="norms train beside a LoRA"):
        LoraConfig(targets=("norms",))


def test_export_merges_the_trained_norms_and_a_streamed_export_refuses_them(trained, tmp_path):
    """The eager export merges the adapter with peft (the norms included), so the bundle's dense weights
    change and it still agrees with torch; the streamed export's weight-by-weight merge cannot express a
    module trained whole and says so before any work."""
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    _, _, _, out = trained
    kw = dict(model="tiny-llama", method="dip", rho_in=0.6, quant="bq4", validate_tokens=8)
    base = export_model(ExportConfig(**kw), tmp_path / "base")
    tuned = export_model(ExportConfig(lora=str(out), **kw), tmp_path / "tuned")
    assert tuned.manifest.validation["agrees_stock"]
    assert tuned.manifest.files["dense.bin"]["sha256"] != base.manifest.files["dense.bin"]["sha256"]
    with pytest.raises(ValueError, match="modules_to_save"):
        export_model(ExportConfig(lora=str(out), stream=True, **kw), tmp_path / "streamed")
    assert not (tmp_path / "streamed").exists()


def test_the_norms_step_at_their_own_share_of_the_learning_rate(tmp_path):
    """One Adam step moves each weight by about the learning rate (its first update is lr · g/|g|), so the
    norms trained at norm_lr_scale 0.1 move a tenth as far as at 1, while the LoRA moves alike in both."""
    text = tmp_path / "train.txt"
    text.write_text("pack my box with five dozen liquor jugs; the quick brown fox jumps over it. " * 60)
    moved = {}
    for scale in (1.0, 0.1):
        lm = load_model("tiny-llama")
        plan, before = _plan(lm), _norms(lm.model)
        out = tmp_path / f"adapter-{scale:g}"
        cfg = LoraConfig(objective="distill", steps=1, lr=1e-2, scheduler="constant", seqlen=24, batch_size=2,
                         warmup_steps=0, logging_steps=1, save_steps=1, rank=4, targets=("up", "gate", "down", "norms"),
                         norm_lr_scale=scale, text_file=str(text), seed=0)
        finetune(lm, plan, cfg, out, progress=False)
        after = _norms(apply_lora(load_model("tiny-llama"), out, merge=True, plan=plan).model)
        moved[scale] = max(float((after[n] - before[n]).abs().max()) for n in before)
    assert moved[1.0] == pytest.approx(1e-2, rel=0.05)
    assert moved[0.1] == pytest.approx(1e-3, rel=0.05)
