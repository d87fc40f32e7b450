"""Every size read from a file or a flag has an upper bound, checked before it sizes a read, a loop, an
allocation or a thread pool; each refusal is one line naming the cap and the value to give (exit 2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dipdeploy.bundle.manifest import BUNDLE_FORMAT, BUNDLE_VERSION, MANIFEST_MAX, MAX_ENTRIES, BundleError, read_manifest
from dipdeploy.bundle.names import MANIFEST
from dipdeploy.cli import app
from dipdeploy.limits import MAX_TOKENS
from dipdeploy.runtime.config import MAX_IO_GAP, MAX_IO_THREADS, MAX_THREADS, EngineConfig, FieldError

runner = CliRunner()


def _one_line(args: list[str], *says: str) -> str:
    res = runner.invoke(app, args)
    out = res.output.strip()
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), out
    assert len(out.splitlines()) == 1 and "Traceback" not in out, out
    for text in says:
        assert text in out, out
    return out


def test_a_huge_sparse_manifest_is_refused_before_it_is_read(tmp_path):
    """A 2 GB manifest costs no disk (sparse) but would be read and parsed whole."""
    with open(tmp_path / MANIFEST, "wb") as f:
        f.truncate(2 << 30)
    with pytest.raises(BundleError, match=f"over the {MANIFEST_MAX >> 20} MiB cap on a manifest"):
        read_manifest(tmp_path)
    _one_line(["inspect", str(tmp_path)], "MiB cap on a manifest", "dipdeploy export")


def test_a_manifest_listing_too_many_tensors_is_refused(tmp_path):
    tensors = {f"t{i}": {} for i in range(MAX_ENTRIES + 1)}
    raw = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "source": {}, "method": "dip", "plan": None,
           "quant": None, "ops": {}, "onnxruntime": {}, "graphs": {}, "tensors": tensors, "files": {}}
    (tmp_path / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=f"lists {MAX_ENTRIES + 1} tensors, over the cap of {MAX_ENTRIES}"):
        read_manifest(tmp_path)


@pytest.mark.parametrize("field, value, cap", [
    ("threads", 100000, MAX_THREADS), ("io_threads", 100000, MAX_IO_THREADS), ("io_gap", 10**15, MAX_IO_GAP),
    ("context", 10**11, MAX_TOKENS), ("prefill_chunk", 10**12, MAX_TOKENS)])
def test_engine_counts_have_caps(tmp_path, field, value, cap):
    EngineConfig(**{field: cap})  # the cap itself is allowed
    with pytest.raises(FieldError, match=f"over the cap of {cap}"):
        EngineConfig(**{field: value})
    option = "--" + field.replace("_", "-")
    _one_line(["run", str(tmp_path), "-p", "x", option, str(value)], f"{option} {value} is over the cap of {cap}",
              f"give {cap} or less")


@pytest.mark.parametrize("command", [["run", "-p", "x"], ["chat"], ["inspect", "--prompt", "x"]], ids=lambda c: c[0])
def test_max_new_tokens_has_a_cap(tmp_path, command):
    _one_line([command[0], str(tmp_path), *command[1:], "--max-new-tokens", str(10**12)],
              f"--max-new-tokens {10**12} is over the cap of {MAX_TOKENS}")
