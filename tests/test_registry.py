import pytest

from dipdeploy.arch import ArchitectureError, families, get_arch
from dipdeploy.registry import PACKAGED_MODELS, get_model, list_models

REQUIRED = ["smollm2-135m", "gemma3-270m", "mistral-7b", "llama-3-8b", "phi-3-mini", "phi-3-medium", "qwen2.5-0.5b",
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
    assert {m.architecture for m in list_models()} <= set(families())


def test_head_dim_comes_from_the_family_rule():
    """Qwen3 states head_dim (≠ d / heads); Llama's is d / heads."""
    assert get_model("tiny-qwen3").shape.head_dim == 32 != 64 // 4
    assert get_model("tiny-llama").shape.head_dim == 64 // 4
    with pytest.raises(ArchitectureError, match="head_dim"):
        get_arch("Qwen3ForCausalLM").head_dim({"hidden_size": 64, "num_attention_heads": 4})


def test_registry_ships_inside_the_package():
    """The registry folder is inside the package and pyproject's package-data covers its files, so a
    built wheel carries it (``dipdeploy models`` works from any directory after ``pip install``)."""
    import tomllib
    from pathlib import Path

    import dipdeploy

    package = Path(dipdeploy.__file__).resolve().parent
    assert PACKAGED_MODELS.is_relative_to(package) and list(PACKAGED_MODELS.glob("*.toml"))
    project = tomllib.loads((package.parent / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["package-data"]["dipdeploy"]
    rel = [p.relative_to(package) for p in PACKAGED_MODELS.glob("*.toml")]
    assert all(any(r.match(pat) for pat in patterns) for r in rel)


def test_extra_registry_folders_come_first(tmp_path, monkeypatch):
    (tmp_path / "tiny-llama.toml").write_text((PACKAGED_MODELS / "tiny-llama.toml").read_text()
                                              .replace("seed = 0", "seed = 7"))
    monkeypatch.setenv("DIPDEPLOY_MODELS", str(tmp_path))
    assert get_model("tiny-llama").tiny == {"seed": 7}
    assert get_model("tiny-phi3").architecture == "Phi3ForCausalLM"


def test_layout_in_a_registry_file_is_refused(tmp_path, monkeypatch):
    text = (PACKAGED_MODELS / "tiny-llama.toml").read_text().replace('tiny = {', 'mlp_layout = "split"\ntiny = {')
    (tmp_path / "tiny-x.toml").write_text(text.replace('name = "tiny-llama"', 'name = "tiny-x"'))
    monkeypatch.setenv("DIPDEPLOY_MODELS", str(tmp_path))
    with pytest.raises(ValueError, match="mlp_layout is the family record"):
        get_model("tiny-x")
