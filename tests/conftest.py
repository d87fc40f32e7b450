"""Shared fixtures: tiny registry models (built once per machine into the dipdeploy cache), and the
test-only families of ``tests/families/`` (records and registry files), registered before collection."""

import importlib.util
import os
from pathlib import Path

import pytest

DATA = Path(os.environ.get("DIPDEPLOY_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
FAMILIES = Path(__file__).resolve().parent / "families"


def _family_modules():
    for path in sorted(FAMILIES.glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"test_family_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module


def pytest_configure(config):
    """Register each test family's record and add its registry folder (as a user's plugin would),
    so parametrised tests over families and tiny models pick them up unedited."""
    from dipdeploy.arch import register

    config.test_families = list(_family_modules())
    for module in config.test_families:
        register(module.RECORD)
    os.environ["DIPDEPLOY_MODELS"] = os.pathsep.join(p for p in (str(FAMILIES), os.environ.get("DIPDEPLOY_MODELS"))
                                                     if p)


@pytest.fixture(scope="session", autouse=True)
def test_families_in_transformers(pytestconfig):
    """The HF classes of the test families, registered in transformers once per session (this imports
    transformers, about a second, in every session)."""
    for module in pytestconfig.test_families:
        module.register_hf()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "wikitext-2-raw" / "wiki.test.raw").is_file():
        pytest.skip(f"WikiText-2 not found under {DATA} (set DIPDEPLOY_DATA)")
    return DATA


@pytest.fixture(scope="session")
def tiny_llama():
    from dipdeploy.loading import load_model

    return load_model("tiny-llama")


@pytest.fixture
def finetune_inputs(tmp_path, tiny_llama):
    """(plan, text file) for a `dipdeploy finetune` of tiny-llama: a uniform DIP ρ = 0.5 plan and a short
    training text."""
    from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan

    c = tiny_llama.model.config
    plan = tmp_path / "plan.json"
    uniform_plan(SparsityConfig(method="dip", density=0.5), "tiny-llama", c.num_hidden_layers, c.hidden_size,
                 c.intermediate_size).save(plan)
    text = tmp_path / "train.txt"
    text.write_text("a small training text for a tiny model, repeated. " * 40)
    return plan, text


@pytest.fixture(scope="session")
def smollm2():
    from dipdeploy.loading import load_model

    return load_model("smollm2-135m")


# A ChatML-like template for tiny models (their tokenizer has none): what an instruct model's tokenizer ships.
TINY_CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="session")
def tiny_dipca_bundle(tmp_path_factory):
    """``get(attention="standard")``: the tiny-llama DIP-CA BQ4 bundle (ρ 0.5, ρ_in 0.6, γ 0.3) the runtime tests
    share, one per attention variant (their KV layouts differ), exported once per session with its
    validation against torch run."""
    from dipdeploy.export.bundle import export
    from dipdeploy.export.config import ExportConfig
    from dipdeploy.export.prepare import make_plan
    from dipdeploy.loading import load_model

    made = {}

    def get(attention: str = "standard"):
        if attention not in made:
            lm = load_model("tiny-llama")
            cfg = ExportConfig(model="tiny-llama", method="dip-ca", density=0.5, rho_in=0.6, gamma=0.3,
                               quant="bq4", validate_tokens=4, attention=attention)  # ρ pinned: not the users' default
            made[attention] = tmp_path_factory.mktemp(f"dipca-{attention}") / "bundle"
            export(lm, cfg, made[attention], make_plan(lm, cfg))
        return made[attention]

    return get


@pytest.fixture(scope="session")
def chat_bundle(tmp_path_factory):
    """A tiny-llama DIP-CA BQ4 bundle exported with a chat template (its tokenizer carries one)."""
    import copy
    import dataclasses

    from dipdeploy.export.bundle import export
    from dipdeploy.export.config import ExportConfig
    from dipdeploy.export.prepare import make_plan
    from dipdeploy.loading import load_model

    lm = load_model("tiny-llama")
    tokenizer = copy.deepcopy(lm.tokenizer)
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    lm = dataclasses.replace(lm, tokenizer=tokenizer)
    cfg = ExportConfig(model="tiny-llama", method="dip-ca", density=0.5, rho_in=0.6, gamma=0.3, quant="bq4", validate_tokens=0)
    out = tmp_path_factory.mktemp("chat") / "bundle"
    export(lm, cfg, out, make_plan(lm, cfg))
    return out


@pytest.fixture
def benchmark_module(tmp_path, monkeypatch):
    """``benchmark_module("accuracy")``: a fresh import of ``benchmarks/<name>.py`` writing its results
    under ``tmp_path`` instead of ``benchmarks/results``."""
    import importlib
    import sys

    def load(name: str):
        monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
        sys.modules.pop(name, None)
        mod = importlib.import_module(name)
        monkeypatch.setattr(mod, "RESULTS", tmp_path)
        return mod

    return load
