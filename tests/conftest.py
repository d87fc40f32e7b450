"""Shared fixtures: tiny registry models (built once per machine into the dipdeploy cache)."""

import os
from pathlib import Path

import pytest

DATA = Path(os.environ.get("DIPDEPLOY_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "wikitext-2-raw" / "wiki.test.raw").is_file():
        pytest.skip(f"WikiText-2 not found under {DATA} (set DIPDEPLOY_DATA)")
    return DATA


@pytest.fixture(scope="session")
def tiny_llama():
    from dipdeploy.loading import load_model

    return load_model("tiny-llama")


@pytest.fixture(scope="session")
def smollm2():
    from dipdeploy.loading import load_model

    return load_model("smollm2-135m")


# A ChatML-like template for tiny models (their tokenizer has none): what an instruct model's tokenizer ships.
TINY_CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|assistant|>{% endif %}")


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
    cfg = ExportConfig(model="tiny-llama", method="dip-ca", rho_in=0.6, gamma=0.3, quant="bq4", validate_tokens=0)
    out = tmp_path_factory.mktemp("chat") / "bundle"
    export(lm, cfg, out, make_plan(lm, cfg))
    return out
