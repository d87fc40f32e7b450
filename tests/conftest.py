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
