"""The op library a bundle names is code onnxruntime-genai runs when it opens the bundle, so it is never
trusted on the bundle's word alone (docs/bundle.md; docs/design.md, "The op library in a bundle").

``genai_config.json``'s ``custom_ops_library`` must be the manifest's ``ops.native_library`` (a plain file
name in the bundle) or absent: anything else is refused by every reader, one line, exit code 2. A shipped
library must be one this dipdeploy built or knows (``known_library_hashes``): one that is not, even with
its sha256 written into the manifest, is refused by ``--verify``. dipdeploy itself never loads the
bundle's copy: a planted library whose constructor leaves a marker file runs nowhere in a generation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dipdeploy.cli.export  # noqa: F401  (registers inspect)
import dipdeploy.cli.run  # noqa: F401  (registers run)
from dipdeploy.bundle.manifest import BundleError, file_record, read_manifest, verify
from dipdeploy.bundle.names import GENAI_CONFIG, MANIFEST
from dipdeploy.cli._app import app
from dipdeploy.ops.native import LIB_NAME, known_library_hashes, library_path

runner = CliRunner()
UNKNOWN = "is not a library this dipdeploy built or knows: remove it or re-export"
needs_library = pytest.mark.skipif(library_path() is None, reason="the op library is not built (`make ops`)")
# A shared object whose constructor writes the file named by $MARKER: what a hostile bundle would ship.
PLANTED_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *path = getenv("DIPDEPLOY_TEST_MARKER");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (f) { fputs("constructor ran", f); fclose(f); }
}
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = tmp_path_factory.mktemp("library") / "bundle"
    export_model(ExportConfig(model="tiny-llama", method="dip", rho_in=0.6, quant="bq4", validate_tokens=0), out)
    return out


@pytest.fixture
def bundle(exported, tmp_path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(exported, copy)
    return copy


@pytest.fixture(scope="module")
def planted_library(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the planted library")
    where = tmp_path_factory.mktemp("planted")
    (where / "planted.c").write_text(PLANTED_C)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(where / LIB_NAME), str(where / "planted.c")], check=True)
    return where / LIB_NAME


def _rehash(bundle: Path, name: str) -> None:
    """Write ``name``'s size and sha256 into the bundle's own manifest, as a hostile packer would."""
    raw = json.loads((bundle / MANIFEST).read_text())
    raw["files"][name] = file_record(bundle / name)
    (bundle / MANIFEST).write_text(json.dumps(raw))


def _set_genai_library(bundle: Path, value) -> None:
    config = json.loads((bundle / GENAI_CONFIG).read_text())
    config["model"]["decoder"]["session_options"]["custom_ops_library"] = value
    (bundle / GENAI_CONFIG).write_text(json.dumps(config))
    _rehash(bundle, GENAI_CONFIG)


def _one_line_exit_2(result, *messages: str) -> None:
    out = result.output.strip()
    assert result.exit_code == 2, out
    assert len(out.splitlines()) == 1 and "Traceback" not in out, out
    assert all(m in out for m in messages), out


@needs_library
def test_the_exported_bundle_verifies(exported):
    """The control: export ships the library dipdeploy loads and names it in genai_config.json."""
    m = read_manifest(exported, checksums="all", libraries=known_library_hashes())
    assert m.ops["native_library"] == LIB_NAME
    config = json.loads((exported / GENAI_CONFIG).read_text())
    assert config["model"]["decoder"]["session_options"]["custom_ops_library"] == LIB_NAME
    assert file_record(exported / LIB_NAME)["sha256"] == file_record(library_path())["sha256"]
    res = runner.invoke(app, ["inspect", str(exported), "--verify"])
    assert res.exit_code == 0 and "verify: ok" in res.output, res.output


@pytest.mark.parametrize("value", ["/tmp/elsewhere/" + LIB_NAME, "../x.so", "libother_ops.so", ["a.so"]],
                         ids=["absolute", "dotdot", "other name", "not a string"])
def test_custom_ops_library_other_than_the_manifest_is_refused(bundle, value):
    _set_genai_library(bundle, value)
    with pytest.raises(BundleError, match="custom_ops_library .* is not the bundle's ops.native_library") as err:
        read_manifest(bundle)
    assert "\n" not in str(err.value)
    _one_line_exit_2(runner.invoke(app, ["inspect", str(bundle)]), "custom_ops_library", "dipdeploy export")
    _one_line_exit_2(runner.invoke(app, ["run", str(bundle), "-p", "Hi", "-n", "2", "--no-native"]),
                     "custom_ops_library")


def test_custom_ops_library_anywhere_in_genai_config_is_held_to_the_manifest(bundle):
    """genai reads session_options of more than the decoder; every entry of the key counts."""
    config = json.loads((bundle / GENAI_CONFIG).read_text())
    config["model"]["vision"] = {"session_options": {"custom_ops_library": "/opt/x.so"}}
    (bundle / GENAI_CONFIG).write_text(json.dumps(config))
    _rehash(bundle, GENAI_CONFIG)
    with pytest.raises(BundleError, match="'/opt/x.so' is not the bundle's ops.native_library"):
        read_manifest(bundle)


def test_custom_ops_library_without_a_listed_library_is_refused(bundle):
    raw = json.loads((bundle / MANIFEST).read_text())
    raw["ops"]["native_library"] = None
    (bundle / MANIFEST).write_text(json.dumps(raw))
    _set_genai_library(bundle, LIB_NAME)
    with pytest.raises(BundleError, match="names a library but the manifest lists none"):
        read_manifest(bundle)


def test_absent_custom_ops_library_is_accepted(bundle):
    config = json.loads((bundle / GENAI_CONFIG).read_text())
    del config["model"]["decoder"]["session_options"]["custom_ops_library"]
    (bundle / GENAI_CONFIG).write_text(json.dumps(config))
    _rehash(bundle, GENAI_CONFIG)
    assert verify(bundle, checksums="all") == []


def test_symlinked_library_is_refused(bundle, planted_library):
    (bundle / LIB_NAME).unlink()
    (bundle / LIB_NAME).symlink_to(planted_library)
    with pytest.raises(BundleError, match=f"{LIB_NAME}: a symbolic link"):
        read_manifest(bundle)


def test_planted_library_with_its_hash_in_the_manifest_is_refused_by_verify(bundle, planted_library):
    shutil.copy2(planted_library, bundle / LIB_NAME)
    _rehash(bundle, LIB_NAME)
    assert verify(bundle, checksums="all") == []  # the manifest alone vouches for it: not enough
    problems = verify(bundle, checksums="all", libraries=known_library_hashes())
    assert problems == [f"the bundle's {LIB_NAME} {UNKNOWN}"]
    res = runner.invoke(app, ["inspect", str(bundle), "--verify"])
    assert res.exit_code == 1 and UNKNOWN in res.output, res.output
    _one_line_exit_2(runner.invoke(app, ["run", str(bundle), "-p", "Hi", "-n", "2", "--no-native", "--verify"]),
                     UNKNOWN)


def test_a_library_known_through_the_environment_is_accepted(bundle, planted_library, monkeypatch):
    """$DIPDEPLOY_OPS_LIB names the library this dipdeploy would load: a copy of it is known."""
    shutil.copy2(planted_library, bundle / LIB_NAME)
    _rehash(bundle, LIB_NAME)
    monkeypatch.setenv("DIPDEPLOY_OPS_LIB", str(planted_library))
    assert verify(bundle, checksums="all", libraries=known_library_hashes()) == []


def test_a_bundle_without_its_library_verifies(bundle):
    """The fix the refusal names: remove the file; hosts bring their own library (dipdeploy loads its own)."""
    (bundle / LIB_NAME).unlink()
    assert verify(bundle, checksums="all", libraries=known_library_hashes()) == []
    res = runner.invoke(app, ["inspect", str(bundle), "--verify"])
    assert res.exit_code == 0 and "verify: ok" in res.output, res.output


def test_only_a_shared_library_may_be_absent(bundle):
    """A manifest naming another file as its library does not make that file optional."""
    raw = json.loads((bundle / MANIFEST).read_text())
    raw["ops"]["native_library"] = "tokenizer.json"
    (bundle / MANIFEST).write_text(json.dumps(raw))
    _set_genai_library(bundle, "tokenizer.json")
    (bundle / "tokenizer.json").unlink()
    with pytest.raises(BundleError, match="tokenizer.json: missing"):
        read_manifest(bundle)


@needs_library
def test_dipdeploy_never_loads_the_bundles_copy(bundle, planted_library, tmp_path, monkeypatch):
    """The engine and ``inspect --prompt --native`` load the library :func:`library_path` finds; the
    planted copy's constructor would leave the marker if either opened it."""
    from dipdeploy.export.generate import generate
    from dipdeploy.runtime import Engine

    marker = tmp_path / "marker"
    monkeypatch.setenv("DIPDEPLOY_TEST_MARKER", str(marker))
    shutil.copy2(planted_library, bundle / LIB_NAME)
    _rehash(bundle, LIB_NAME)
    # The control: loading the planted file does run its constructor, so the marker can appear.
    subprocess.run(["python3", "-c", f"import ctypes; ctypes.CDLL({str(bundle / LIB_NAME)!r})"], check=True,
                   env={**os.environ, "DIPDEPLOY_TEST_MARKER": str(tmp_path / "control")})
    assert (tmp_path / "control").exists()
    engine = Engine(bundle, native=True)
    assert engine.generate("Hi", 2).tokens
    assert generate(bundle, "Hi", 2, native=True).native
    assert not marker.exists()
