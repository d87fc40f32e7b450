"""scripts/random_checkpoint.py on a tiny config: HF's sharded bf16 layout that transformers and
`load_model` read, deterministic in its seed, streamed (one tensor made, written and freed at a time),
the registry's Mistral-7B config, and the project's refusals."""

import gc
import importlib.util
import json
import sys
import weakref
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("random_checkpoint", ROOT / "scripts" / "random_checkpoint.py")
rc = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = rc  # its dataclasses look their module up
_spec.loader.exec_module(rc)

TINY = {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 320, "max_position_embeddings": 256, "sliding_window": 64,
        "tie_word_embeddings": False}
SHARD = 60_000  # bytes: several shards for the tiny model, as 5 GB gives a 7B one


@pytest.fixture
def tiny_config(tmp_path) -> Path:
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps(TINY))
    return p


def _write(out, config, **kw):
    return rc.write_checkpoint(out, config_file=config, shard_bytes=SHARD, **kw)


def _tensors(d: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(d.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_loads_in_transformers_and_dipdeploy(tmp_path, tiny_config):
    from transformers import AutoModelForCausalLM

    from dipdeploy.loading import load_model

    out = tmp_path / "ck"
    report = _write(out, tiny_config, layers=1)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(report.shards) > 1 and set(index["weight_map"].values()) == {s["file"] for s in report.shards}
    model = AutoModelForCausalLM.from_pretrained(out)
    assert set(index["weight_map"]) == set(model.state_dict())
    assert index["metadata"]["total_size"] == report.total_bytes == sum(2 * p.numel() for p in model.parameters())
    assert model.config.num_hidden_layers == 1 and "random weights" in model.config.dipdeploy_note
    files = _tensors(out)
    assert all(t.dtype == torch.bfloat16 for t in files.values())
    emb = files["model.embed_tokens.weight"].float()
    assert abs(emb.std().item() - 0.02) < 0.002 and torch.all(files["model.norm.weight"] == 1)
    lm = load_model(str(out))
    assert len(lm.tokenizer) == TINY["vocab_size"] == lm.model.config.vocab_size
    ids = lm.tokenizer("The capital of France is")["input_ids"]
    assert lm.tokenizer.decode(ids) == "The capital of France is" and max(ids) < TINY["vocab_size"]
    with torch.no_grad():
        assert torch.isfinite(lm.model(torch.tensor([ids])).logits).all()


def test_deterministic_in_its_seed(tmp_path, tiny_config):
    a, b, c, cut = (tmp_path / n for n in ("a", "b", "c", "cut"))
    _write(a, tiny_config, seed=3)
    _write(b, tiny_config, seed=3)
    _write(c, tiny_config, seed=4)
    _write(cut, tiny_config, seed=3, layers=1)
    ta, tb, tc, tcut = map(_tensors, (a, b, c, cut))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert not torch.equal(ta["model.layers.0.mlp.up_proj.weight"], tc["model.layers.0.mlp.up_proj.weight"])
    assert all(torch.equal(tcut[k], ta[k]) for k in tcut)  # a --layers cut holds the full model's tensors
    assert "model.layers.1.mlp.up_proj.weight" in ta and "model.layers.1.mlp.up_proj.weight" not in tcut


def test_streams_one_tensor_at_a_time(tmp_path, tiny_config, monkeypatch):
    """Each tensor is made, written and freed before the next is made; no state dict is ever built."""
    events, alive = [], []
    make, write = rc.make_tensor, rc.write_tensor

    def spy_make(spec, seed, std):
        gc.collect()
        events.append(("make", spec.name, sum(r() is not None for r in alive)))
        t = make(spec, seed, std)
        alive.append(weakref.ref(t))
        return t

    def spy_write(f, tensor):
        events.append(("write", tuple(tensor.shape), None))
        write(f, tensor)

    def no_state_dict(*a, **k):
        raise AssertionError("a whole state dict was saved")

    monkeypatch.setattr(rc, "make_tensor", spy_make)
    monkeypatch.setattr(rc, "write_tensor", spy_write)
    monkeypatch.setattr("safetensors.torch.save_file", no_state_dict)
    monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", no_state_dict)
    report = _write(tmp_path / "ck", tiny_config)
    assert len(events) == 2 * report.tensors
    assert [e[0] for e in events] == ["make", "write"] * report.tensors
    assert all(live == 0 for kind, _, live in events if kind == "make")  # the previous tensor was freed
    gc.collect()
    assert all(r() is None for r in alive)


def test_mistral_7b_config_from_the_registry():
    from dipdeploy.registry import get_model

    config = rc.build_config(None, 2)
    s = get_model("mistral-7b").shape
    assert (config.hidden_size, config.intermediate_size, config.num_attention_heads, config.num_key_value_heads,
            config.vocab_size, config.max_position_embeddings) == (
        s.hidden_size, s.intermediate_size, s.num_attention_heads, s.num_key_value_heads, s.vocab_size,
        s.max_position_embeddings)
    assert config.num_hidden_layers == 2 and config.sliding_window == 4096 and config.rms_norm_eps == 1e-5
    assert json.dumps(config.to_dict()).count('"rope_theta": 10000.0') == 1
    specs = rc.tensor_specs(config)
    assert {sp.shape for sp in specs if sp.name.endswith("mlp.down_proj.weight")} == {(4096, 14336)}
    assert sum(sp.nbytes for sp in rc.tensor_specs(rc.build_config(None, None))) == pytest.approx(14.48e9, rel=0.01)


@pytest.mark.parametrize("args, needle", [
    (["--layers", "0"], "--layers 0"),
    (["--config", "missing.json"], "--config missing.json does not exist"),
    (["--json", "."], "is a directory"),
])
def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    assert rc.main(["--out", "ck", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and "\n" not in err
    assert not (tmp_path / "ck").exists()


def test_never_clobbers_without_force(tmp_path, tiny_config, capsys):
    out = tmp_path / "ck"
    assert rc.main(["--out", str(out), "--config", str(tiny_config), "--layers", "1"]) == 0
    before = (out / "config.json").read_bytes()
    assert rc.main(["--out", str(out), "--config", str(tiny_config), "--seed", "1"]) == 2
    assert "--force" in capsys.readouterr().err and (out / "config.json").read_bytes() == before
    assert rc.main(["--out", str(out), "--config", str(tiny_config), "--seed", "1", "--force"]) == 0
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == TINY["num_hidden_layers"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ck.")]


def test_vocab_too_small_for_bytes(tmp_path, capsys):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({**TINY, "vocab_size": 256}))
    assert rc.main(["--out", str(tmp_path / "ck"), "--config", str(p)]) == 2
    assert "vocab_size 256" in capsys.readouterr().err and not (tmp_path / "ck").exists()


def test_tokenizer_of_another_model(tmp_path, capsys):
    """--tokenizer saves that model's tokenizer (tiny-llama's 256 bytes here) when the sizes agree, and
    refuses with one line, writing nothing, when they do not."""
    from transformers import AutoTokenizer

    from dipdeploy.loading import resolve

    p = tmp_path / "c.json"
    p.write_text(json.dumps({**TINY, "vocab_size": 256}))
    out = tmp_path / "ck"
    assert rc.main(["--out", str(out), "--config", str(p), "--layers", "1", "--tokenizer", "tiny-llama"]) == 0
    saved, source = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(resolve("tiny-llama")[0])
    text = "Hello, wörld"
    assert len(saved) == 256 and saved.encode(text) == source.encode(text)
    assert "<s>" not in saved.get_vocab()  # not the byte-level writer's own (which has <unk>, <s>, </s>)
    p.write_text(json.dumps({**TINY, "vocab_size": 320}))
    assert rc.main(["--out", str(tmp_path / "ck2"), "--config", str(p), "--tokenizer", "tiny-llama"]) == 2
    err = capsys.readouterr().err.strip()
    assert "has 256 tokens" in err and "vocab_size is 320" in err and "\n" not in err
    assert not (tmp_path / "ck2").exists()
