import pytest

from dipdeploy.registry import SUPPORTED_ARCHITECTURES, get_model, list_models

REQUIRED = ["smollm2-135m", "mistral-7b", "llama-3-8b", "phi-3-mini", "phi-3-medium", "qwen2.5-0.5b",
            "tiny-llama", "tiny-mistral", "tiny-phi3", "tiny-qwen2"]


def test_registry_has_required_models():
    names = {m.name for m in list_models()}
    assert set(REQUIRED) <= names


def test_paper_shapes():
    s = get_model("phi-3-medium").shape
    assert (s.hidden_size, s.intermediate_size, s.num_hidden_layers) == (5120, 17920, 40)
    assert get_model("phi-3-medium").mlp_layout == "fused_gate_up"


def test_unknown_model_lists_known():
    with pytest.raises(KeyError, match="smollm2-135m"):
        get_model("gpt-2")


def test_all_architectures_supported():
    assert {m.architecture for m in list_models()} <= set(SUPPORTED_ARCHITECTURES)
