import json

import pytest
import torch

from dipdeploy.loading import load_model, resolve
from dipdeploy.registry import get_model
from tiny_models import TINY


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_load_from_real_hf_dirs(name):
    lm = load_model(name)
    path, _ = resolve(name)
    spec = get_model(name)
    assert (path / "config.json").is_file() and list(path.glob("*.safetensors"))
    assert lm.model.config.architectures[0] == spec.architecture == lm.arch.name
    assert lm.arch.head_dim(lm.model.config) == spec.shape.head_dim == lm.model.model.layers[0].self_attn.head_dim
    fused = hasattr(lm.model.model.layers[0].mlp, "gate_up_proj")  # the HF module itself (Phi-3, Phi-4-mini)
    assert lm.mlp_layout == ("fused_gate_up" if fused else "split")
    ids = lm.tokenizer("hello", return_tensors="pt").input_ids
    assert lm.tokenizer.decode(ids[0]) == "hello"


def test_tiny_models_are_deterministic(tmp_path):
    from dipdeploy.loading import build_tiny
    from dipdeploy.registry import get_model

    a = build_tiny(get_model("tiny-llama"), tmp_path / "a")
    b = build_tiny(get_model("tiny-llama"), tmp_path / "b")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_load_local_dir(tmp_path):
    path, _ = resolve("tiny-qwen2")
    lm = load_model(str(path))
    assert lm.model.config.model_type == "qwen2"


def test_embedded_gguf_loads(smollm2):
    """The real SmolLM2 GGUF (the default model): dims and a sane next-token prediction."""
    c = smollm2.model.config
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (576, 1536, 30)
    ids = smollm2.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        nxt = smollm2.model(ids).logits[0, -1].argmax().item()
    assert smollm2.tokenizer.decode([nxt]).strip() == "Paris"


def test_gguf_path_shares_the_cache():
    from dipdeploy.loading import _embedded_gguf
    from dipdeploy.registry import get_model

    gguf = _embedded_gguf(get_model("smollm2-135m"))
    assert resolve(str(gguf))[0] == resolve("smollm2-135m")[0]


def test_streamed_gguf_reads_each_tensor_as_the_eager_load_holds_it(smollm2, tmp_path, monkeypatch):
    """A streamed GGUF is dequantised tensor by tensor (no fp32 copy written): every tensor equals the
    eager model's (the same transformers dequantisation and q/k un-permutation, one tensor at a time)."""
    from dipdeploy.checkpoint import GGUFCheckpoint
    from dipdeploy.loading import _embedded_gguf

    monkeypatch.setenv("DIPDEPLOY_CACHE", str(tmp_path / "cache"))  # no fp32 copy there: none may be made
    gguf = str(_embedded_gguf(get_model("smollm2-135m")))
    lm = load_model(gguf, stream=True)
    assert isinstance(lm.checkpoint, GGUFCheckpoint) and not (tmp_path / "cache" / "models").exists()
    assert lm.model.config.architectures == smollm2.model.config.architectures and lm.model.config.tie_word_embeddings
    for name, ref in smollm2.model.state_dict().items():
        if name != "lm_head.weight":  # tied to the embedding
            got = lm.checkpoint._read(name)
            assert got.dtype == torch.float32 and torch.equal(got, ref), name
    assert torch.equal(lm.model.get_input_embeddings().weight, smollm2.model.get_input_embeddings().weight)
    assert lm.tokenizer("The capital").input_ids == smollm2.tokenizer("The capital").input_ids


def test_bad_path_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="registry name"):
        load_model(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="GGUF"):
        load_model(str(tmp_path / "x.gguf"))


def test_unsupported_architecture_is_named(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        load_model(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gpt2"
