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


@pytest.fixture(scope="session")
def smollm2():
    from dipdeploy.loading import load_model

    return load_model("smollm2-135m")
