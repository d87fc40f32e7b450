"""Export failure cases: clear errors, and never a half bundle or a leftover temp dir."""

import json

import pytest

from dipdeploy.bundle.manifest import Manifest, read_manifest
from dipdeploy.export import bundle as bundle_mod
from dipdeploy.export.bundle import export_model
from dipdeploy.export.config import ExportConfig
from dipdeploy.export.spec import ArchSpec


def _cfg(**kw):
    kw.setdefault("model", "tiny-llama")
    kw.setdefault("rho_in", 0.6)
    kw.setdefault("validate_tokens", 0)
    return ExportConfig(**kw)


@pytest.mark.parametrize("field,value", [("method", "teal"), ("quant", "int2"), ("density", 0.0),
                                         ("gamma", 1.5), ("accuracy_level", 7), ("alignment", 100),
                                         ("max_length", 3)])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        ExportConfig(**{field: value})


def test_existing_out_needs_force(tmp_path):
    out = tmp_path / "b"
    export_model(_cfg(), out)
    before = read_manifest(out).files
    with pytest.raises(FileExistsError, match="--force"):
        export_model(_cfg(), out)
    export_model(_cfg(quant="bq4"), out, force=True)
    assert read_manifest(out).files != before


def test_force_never_replaces_a_foreign_directory(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a dipdeploy bundle"):
        export_model(_cfg(), tmp_path / "mine", force=True)


def test_unknown_model(tmp_path):
    with pytest.raises((KeyError, FileNotFoundError)):
        export_model(_cfg(model="no-such-model"), tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_unsupported_architecture():
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        ArchSpec.from_config({"architectures": ["GPT2LMHeadModel"]})


def test_plan_for_another_model(tmp_path):
    from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan

    plan = uniform_plan(SparsityConfig(method="dip", density=0.5, rho_in=0.6), "other", 3, 64, 128)
    path = plan.save(tmp_path / "plan.json")
    with pytest.raises(ValueError, match="dipdeploy calibrate"):
        export_model(_cfg(plan=str(path)), tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_plan_of_an_unexportable_method(tmp_path):
    from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan

    plan = uniform_plan(SparsityConfig(method="glu", density=0.8), "tiny-llama", 2, 64, 128)
    path = plan.save(tmp_path / "plan.json")
    with pytest.raises(ValueError, match="cannot be exported"):
        export_model(_cfg(plan=str(path)), tmp_path / "b")


def test_unwritable_out(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(PermissionError, match="choose another --out"):
        export_model(_cfg(), blocker / "b")


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupted_export_leaves_nothing(tmp_path, monkeypatch, exc):
    def boom(*a, **k):
        raise exc("interrupted")

    monkeypatch.setattr(bundle_mod, "check_model", boom)
    with pytest.raises(exc):
        export_model(_cfg(), tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_manifest_rejects_unknown_version(tmp_path):
    out = tmp_path / "b"
    export_model(_cfg(), out)
    raw = json.loads((out / "manifest.json").read_text())
    raw["version"] = 99
    with pytest.raises(ValueError, match="dipdeploy export"):
        Manifest.from_json(json.dumps(raw))
    with pytest.raises(FileNotFoundError, match="not a dipdeploy bundle"):
        read_manifest(tmp_path)


def test_verify_finds_corruption(tmp_path):
    from dipdeploy.bundle.manifest import verify

    out = tmp_path / "b"
    export_model(_cfg(), out)
    data = bytearray((out / "mlp.bin").read_bytes())
    data[10] ^= 0xFF
    (out / "mlp.bin").write_bytes(bytes(data))
    assert any("mlp.bin" in p and "sha256" in p for p in verify(out))
