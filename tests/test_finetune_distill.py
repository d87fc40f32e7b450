"""Distillation recovery (`finetune --objective distill`) on tiny-llama: the student runs the plan's masks,
the teacher is the dense base without the adapter, training lowers the KL to it, the adapter loads in
`eval --lora`, and WikiText text is refused as training text in one line."""

import math

import peft
import pytest
import torch
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.finetune import LoraConfig, apply_lora, finetune, read_metadata
from dipdeploy.finetune.data import check_not_evaluation_text, pydoc_topics, source_text, training_windows
from dipdeploy.finetune.distill import MlpTaps, hidden_match, kl_to_teacher, mlp_match, teacher_logits
from dipdeploy.loading import load_model
from dipdeploy.sparsity.methods import sparsify_
from dipdeploy.sparsity.plan import SparsityConfig, SparsityPlan, uniform_plan

runner = CliRunner()
IDS = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))


def _plan(lm, density=0.5):
    c = lm.model.config
    return uniform_plan(SparsityConfig(method="dip", density=density), lm.name, c.num_hidden_layers,
                        c.hidden_size, c.intermediate_size)


def _logits(lm, plan=None):
    if plan is not None:
        sparsify_(lm.model, plan)
    with torch.no_grad():
        return lm.model(IDS).logits


def _student(lm, plan):
    """tiny-llama wrapped as `finetune` wraps it: peft LoRA on the MLP projections, then the masks."""
    model = peft.get_peft_model(lm.model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["up_proj", "gate_proj",
                                                                                              "down_proj"]))
    hf = model.get_base_model()
    sparsify_(hf, plan)
    return model, hf


def test_student_runs_the_masks_and_the_teacher_is_the_dense_base_without_adapter():
    plan = _plan(load_model("tiny-llama"))
    dip, dense = _logits(load_model("tiny-llama"), plan), _logits(load_model("tiny-llama"))
    assert not torch.allclose(dip, dense, atol=1e-3)  # the plan changes the output: the checks below can fail
    model, hf = _student(load_model("tiny-llama"), plan)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=IDS).logits, dip)  # B = 0 at init: the student is DIP
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(hash(name) % 2**31))
        assert not torch.allclose(model(input_ids=IDS).logits, dip, atol=1e-3)  # now the adapter acts
    torch.testing.assert_close(teacher_logits(model, hf, IDS), dense)  # ... but never in the teacher
    with torch.no_grad():  # and the student keeps its masks and adapter after a teacher pass
        assert not torch.allclose(model(input_ids=IDS).logits, dip, atol=1e-3)
    assert type(hf.model.layers[0].mlp).__name__ == "SparseMLP"


def test_kl_is_zero_for_the_teacher_itself_and_positive_otherwise():
    t = torch.randn(2, 5, 11)
    assert float(kl_to_teacher(t, t)) == pytest.approx(0.0, abs=1e-6)
    assert float(kl_to_teacher(t + torch.randn(2, 5, 11), t)) > 0.01
    full = kl_to_teacher(t + 1.5 * torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(0)), t)
    assert float(kl_to_teacher(t, t, num_items=8)) == pytest.approx(0.0, abs=1e-6) and math.isfinite(float(full))


def _kl_on(windows, plan, adapter=None):
    """Mean KL(dense ‖ DIP student) over ``windows``, with the adapter live when given."""
    student = load_model("tiny-llama")
    if adapter is not None:
        student = apply_lora(student, adapter, merge=False, plan=plan)
    sparsify_(student.model, plan)
    with torch.no_grad():
        return float(kl_to_teacher(student.model(windows).logits, load_model("tiny-llama").model(windows).logits))


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    text = tmp_path_factory.mktemp("dt") / "train.txt"
    text.write_text("pack my box with five dozen liquor jugs; the quick brown fox jumps over it. " * 60)
    torch.manual_seed(0)
    lm = load_model("tiny-llama")
    plan = _plan(lm, density=0.4)
    out = tmp_path_factory.mktemp("da") / "adapter"
    cfg = LoraConfig(objective="distill", steps=12, lr=2e-3, seqlen=24, batch_size=2, warmup_steps=0,
                     logging_steps=1, save_steps=12, rank=4, text_file=str(text), seed=0)
    return plan, out, finetune(lm, plan, cfg, out, progress=False), training_windows(lm, cfg)


def test_distillation_trains_and_lowers_the_kl_to_the_dense_model(distilled):
    plan, out, res, windows = distilled
    assert res.steps == 12 and all(math.isfinite(h["loss"]) for h in res.log_history if "loss" in h)
    assert res.first_loss > 0
    meta = read_metadata(out)
    assert meta["lora"]["objective"] == "distill" and meta["train"]["objective"] == "distill"
    before, after = _kl_on(windows, plan), _kl_on(windows, plan, out)  # over every training window
    assert after < 0.9 * before, (before, after)


def test_distilled_adapter_loads_in_eval_lora(distilled, tmp_path):
    plan, out, _, _ = distilled
    text = tmp_path / "eval.txt"
    text.write_text("an evaluation text the adapter never saw, for a tiny model. " * 30)
    res = runner.invoke(app, ["eval", "--model", "tiny-llama", "--method", "dip", "--density", "0.4", "--lora", str(out),
                              "--text-file", str(text), "--seqlen", "32", "--max-windows", "2", "--json",
                              str(tmp_path / "rows.json")])
    assert res.exit_code == 0, res.output
    import json

    row = json.loads((tmp_path / "rows.json").read_text())["rows"][0]
    assert row["lora"] == "merged" and math.isfinite(row["ppl"])
    assert SparsityPlan.load(out / "plan.json").layers == plan.layers


def test_dense_samples_are_the_models_own_seeded_windows():
    """``dense-samples``: one window per window trained on, BOS first, then tokens the dense model sampled;
    the same seed gives the same windows (a resumed run trains on the same text), another seed others."""
    from dipdeploy.finetune.data import dense_samples, training_text

    lm = load_model("tiny-llama")
    cfg = LoraConfig(objective="distill", data="dense-samples", steps=3, batch_size=2, seqlen=12)
    w = training_windows(lm, cfg)
    assert w.shape == (6, 12) and w.dtype == torch.long
    assert (w[:, 0] == (lm.tokenizer.bos_token_id or 0)).all()
    assert int(w.min()) >= 0 and int(w.max()) < lm.model.config.vocab_size
    assert torch.equal(w, dense_samples(lm, 6, 12, cfg.seed))
    assert not torch.equal(w, dense_samples(lm, 6, 12, cfg.seed + 1))
    assert training_text(cfg) == "" and not lm.model.training


def test_sample_windows_caps_the_draw_and_the_training_reads_them_in_turn(tmp_path):
    """``sample_windows``: fewer windows drawn than trained on (seeded as the full draw), the Trainer going
    over them again; never more than one per window trained."""
    from dipdeploy.finetune.data import dense_samples, sampled_windows

    full = LoraConfig(objective="distill", data="dense-samples", steps=3, batch_size=2, seqlen=12)
    capped = LoraConfig(objective="distill", data="dense-samples", steps=3, batch_size=2, seqlen=12, sample_windows=2)
    assert sampled_windows(full) == 6 and sampled_windows(capped) == 2
    assert sampled_windows(LoraConfig(objective="distill", data="dense-samples", steps=1, batch_size=2,
                                      sample_windows=50)) == 2
    lm = load_model("tiny-llama")
    w = training_windows(lm, capped)
    assert w.shape == (2, 12) and torch.equal(w, dense_samples(lm, 2, 12, capped.seed))
    res = finetune(lm, _plan(lm), capped, tmp_path / "a", progress=False)
    assert res.steps == 3 and res.train_tokens == 3 * 2 * 12
    assert read_metadata(tmp_path / "a")["train"]["windows"] == 2
    assert next(lm.model.parameters()).device.type == "cpu"  # the model back where it came from


def test_a_failure_before_training_sends_the_model_home(tmp_path, monkeypatch):
    """The model moves to the training device before its windows are drawn; if drawing them fails, it goes
    back where it came from (a GPU would otherwise keep it)."""
    from dipdeploy.finetune import train

    lm = load_model("tiny-llama")
    moves = []
    monkeypatch.setattr(lm.model, "to", lambda dev: moves.append(dev) or lm.model)
    monkeypatch.setattr(train, "_train_device", lambda device: "the training device")

    def no_text(*a, **k):
        raise RuntimeError("no text")

    monkeypatch.setattr(train, "training_windows", no_text)
    cfg = LoraConfig(objective="distill", data="dense-samples", steps=1, batch_size=1, seqlen=8)
    with pytest.raises(RuntimeError, match="no text"):
        finetune(lm, _plan(lm), cfg, tmp_path / "a", progress=False)
    assert moves == ["the training device", torch.device("cpu")]


def test_objective_defaults_and_sources():
    assert LoraConfig().objective == "lm" and LoraConfig().data == "wikitext2-valid"
    assert LoraConfig(objective="distill").data == "pydoc-topics"
    with pytest.raises(ValueError, match="not WikiText"):
        LoraConfig(objective="distill", data="wikitext2-valid")
    with pytest.raises(ValueError, match="objective 'kl' unknown"):
        LoraConfig(objective="kl")
    text = source_text(LoraConfig(objective="distill"))
    assert text == pydoc_topics() and len(text) > 100_000 and "Wikipedia" not in text


@pytest.fixture()
def fake_wikitext(tmp_path):
    """A data dir holding stand-in WikiText-2 splits (long lines, as WikiText's paragraphs are)."""
    root = tmp_path / "data" / "wikitext-2-raw"
    root.mkdir(parents=True)
    splits = {}
    for name, tag in (("wiki.test.raw", "test"), ("wiki.valid.raw", "valid")):
        lines = [f" The {tag} paragraph number {i} tells of a river, a town and the year {1800 + i} in some detail ."
                 for i in range(40)]
        (root / name).write_text("\n".join(lines) + "\n")
        splits[tag] = lines
    return tmp_path / "data", splits


@pytest.mark.parametrize("objective,split,refused", [("distill", "test", True), ("distill", "valid", True),
                                                     ("lm", "test", True), ("lm", "valid", False)])
def test_wikitext_as_training_text_is_refused(fake_wikitext, tmp_path, objective, split, refused):
    data_dir, splits = fake_wikitext
    f = tmp_path / "copy.txt"
    f.write_text("my own notes\n" + "\n".join(splits[split][5:25]) + "\n")
    cfg = LoraConfig(objective=objective, text_file=str(f))
    if refused:
        with pytest.raises(ValueError, match="WikiText-2"):
            check_not_evaluation_text(f.read_text(), cfg, data_dir)
    else:
        check_not_evaluation_text(f.read_text(), cfg, data_dir)


def test_cli_refuses_wikitext_in_one_line_before_loading(fake_wikitext, tmp_path, finetune_inputs):
    data_dir, splits = fake_wikitext
    plan, _ = finetune_inputs
    f = tmp_path / "copy.txt"
    f.write_text("\n".join(splits["valid"]) + "\n")
    out = tmp_path / "adapter"
    res = runner.invoke(app, ["finetune", "--model", "tiny-llama", "--plan", str(plan), "--objective", "distill",
                              "--text-file", str(f), "--data-dir", str(data_dir), "--out", str(out)])
    line = res.output.strip()
    assert res.exit_code == 2 and len(line.splitlines()) == 1 and line.startswith("error:"), line
    assert "WikiText-2 validation" in line and "--data pydoc-topics" in line and not out.exists()


def test_hidden_match_is_zero_for_the_teacher_and_ignores_the_embeddings():
    g = torch.Generator().manual_seed(1)
    t = tuple(torch.randn(2, 5, 8, generator=g) * (i + 1) for i in range(4))
    assert float(hidden_match(t, t)) == pytest.approx(0.0, abs=1e-7)
    moved_embeddings = (t[0] + 3.0,) + t[1:]
    assert float(hidden_match(moved_embeddings, t)) == pytest.approx(0.0, abs=1e-7)
    off = tuple(x + 0.1 * x.norm() / x.numel() ** 0.5 * torch.randn(x.shape, generator=g) for x in t)
    assert 0.005 < float(hidden_match(off, t)) < 0.02  # ≈ 0.1² relative, whatever each layer's scale
    with pytest.raises(ValueError):
        hidden_match(t, t[:-1])


def test_hidden_weight_is_for_distillation_only():
    assert LoraConfig(objective="distill", hidden_weight=0.5).hidden_weight == 0.5
    with pytest.raises(ValueError, match="only with objective distill"):
        LoraConfig(hidden_weight=0.5)
    with pytest.raises(ValueError, match="hidden_weight -1"):
        LoraConfig(objective="distill", hidden_weight=-1)


def _distil_pair(tmp_path, term: str):
    """The same 30-step distillation of tiny-llama at ρ 0.4 twice, without and with ``term`` (a LoraConfig
    weight) at 10: {weight: (adapter dir, plan, training windows)}."""
    text = tmp_path / "train.txt"
    text.write_text("pack my box with five dozen liquor jugs; the quick brown fox jumps over it. " * 60)
    plan = _plan(load_model("tiny-llama"), density=0.4)
    runs = {}
    for weight in (0.0, 10.0):
        cfg = LoraConfig(objective="distill", steps=30, lr=1e-2, seqlen=24, batch_size=2, warmup_steps=0,
                         logging_steps=1, save_steps=30, rank=4, text_file=str(text), seed=0, **{term: weight})
        out = tmp_path / f"adapter-{weight}"
        res = finetune(load_model("tiny-llama"), plan, cfg, out, progress=False)
        assert res.steps == 30 and all(math.isfinite(h["loss"]) for h in res.log_history if "loss" in h)
        assert read_metadata(out)["lora"][term] == weight
        runs[weight] = out, plan, training_windows(load_model("tiny-llama"), cfg)
    return runs


def test_the_hidden_term_trains_and_lowers_the_hidden_error_more_than_logits_alone(tmp_path):
    """Both recipes from the same seed and text: the one with the hidden-state term must end with the hidden
    states closer to the dense model's, on the mean over layers, than the logits-only one (it is what that
    term optimises; the check fails if the term is not passed to the loss)."""
    errors = {}
    for weight, (out, plan, windows) in _distil_pair(tmp_path, "hidden_weight").items():
        student = apply_lora(load_model("tiny-llama"), out, merge=False, plan=plan)
        sparsify_(student.model, plan)
        with torch.no_grad():
            s = student.model(windows, output_hidden_states=True).hidden_states
            t = load_model("tiny-llama").model(windows, output_hidden_states=True).hidden_states
        errors[weight] = float(hidden_match(s, t))
    assert errors[10.0] < 0.93 * errors[0.0], errors  # measured: 0.00419 against 0.00475 (untrained 0.00598)


def _local_errors(student, plan, windows=IDS) -> list[float]:
    """Each layer's ‖y − y_dense‖² / ‖y_dense‖² of ``student`` (an HF model) under ``plan``, y_dense from
    the untouched base model's MLP on the student's own MLP input: mlp_match's formula, computed apart."""
    sparsify_(student, plan)
    taps = MlpTaps()
    taps.attach(student)
    with torch.no_grad():
        student(windows)
        base = load_model("tiny-llama").model.model.layers
        return [float((y - base[i].mlp(x)).pow(2).sum() / base[i].mlp(x).pow(2).sum())
                for i, (_, x, y) in enumerate(taps.seen)]


def test_mlp_match_targets_the_dense_base_mlp_without_the_adapter():
    lm = load_model("tiny-llama")
    model = peft.get_peft_model(lm.model, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["up_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    hf = model.get_base_model()
    for density in (1.0, 0.4):
        plan = _plan(lm, density=density)
        want = _local_errors(hf, plan)
        assert len(want) == hf.config.num_hidden_layers and min(want) > 1e-3  # the adapter acts at any density
        taps = MlpTaps()
        taps.attach(hf)
        with torch.no_grad():
            hf(IDS)
            got = float(mlp_match(model, taps.seen))
        assert got == pytest.approx(sum(want) / len(want), rel=1e-5)
    unmasked = peft.get_peft_model(load_model("tiny-llama").model, peft.LoraConfig(r=2, target_modules=["up_proj"]))
    assert max(_local_errors(unmasked.get_base_model(), _plan(lm, density=1.0))) < 1e-10  # B = 0, no mask: dense


def test_mlp_weight_is_for_distillation_only():
    assert LoraConfig(objective="distill", mlp_weight=2.0).mlp_weight == 2.0
    with pytest.raises(ValueError, match="mlp_weight 2.0: .*only with objective distill"):
        LoraConfig(mlp_weight=2.0)


def test_the_mlp_term_trains_and_lowers_the_local_mlp_error_more_than_logits_alone(tmp_path):
    """Both recipes from the same seed and text: the one with the per-layer MLP term must end with each
    layer's sparse MLP closer to the dense MLP on its own input than the logits-only one (what that term
    optimises; the check fails if the taps or the term do not reach the loss)."""
    errors = {}
    for weight, (out, plan, windows) in _distil_pair(tmp_path, "mlp_weight").items():
        local = _local_errors(apply_lora(load_model("tiny-llama"), out, merge=True, plan=plan).model, plan, windows)
        errors[weight] = sum(local) / len(local)
    assert errors[10.0] < 0.9 * errors[0.0], errors
