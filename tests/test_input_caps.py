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
from dipdeploy.limits import MAX_THREADS, MAX_TOKENS
from dipdeploy.runtime.config import MAX_IO_GAP, MAX_IO_THREADS, EngineConfig, FieldError

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


def _trace(tmp_path: Path) -> Path:
    from dipdeploy.sim.synthetic import synthetic_trace

    return synthetic_trace(16, 48, 2, tokens=4, seed=0).save(tmp_path / "t.npz")


def _replace_member(path: Path, name: str, data: bytes) -> None:
    import zipfile

    members = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            members[info.filename] = z.read(info)
    members[name] = data
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in members.items():
            z.writestr(n, d)


def test_a_trace_member_declaring_more_than_it_holds_is_refused(tmp_path):
    """A .npy header may declare any shape; the reader would allocate it before finding the bytes short."""
    import io

    from numpy.lib import format as npy

    from dipdeploy.trace import Trace, TraceError

    path = _trace(tmp_path)
    f = io.BytesIO()
    npy.write_array_header_1_0(f, {"descr": "<i4", "fortran_order": False, "shape": (1 << 34, 4)})
    _replace_member(path, "sel_in.0.npy", f.getvalue() + bytes(64))
    with pytest.raises(TraceError, match=r"declares shape \(17179869184, 4\)"):
        Trace.load(path)
    _one_line(["simulate", "--trace", str(path), "--device", "sd8gen3"], "declares shape", "dipdeploy trace")


def test_a_trace_inflating_past_memory_is_refused_before_reading(tmp_path, monkeypatch):
    """What a small compressed file inflates to is its members' declared sizes, known before any read."""
    from dipdeploy.trace import Trace, TraceError

    path = _trace(tmp_path)
    assert Trace.load(path).num_tokens == 4  # the machine's memory holds it
    with pytest.raises(TraceError, match="inflate to .* over the cap"):
        Trace.load(path, max_bytes=1000)
    monkeypatch.setattr("dipdeploy.cli.sim.trace_room", lambda: 1000)
    _one_line(["simulate", "--trace", str(path), "--device", "sd8gen3"], "over the cap", "record fewer tokens")


def test_a_trace_header_with_a_huge_layer_count_is_refused(tmp_path):
    import numpy as np

    from dipdeploy.trace import Trace, TraceError

    path = _trace(tmp_path)
    z = dict(np.load(path))
    head = json.loads(str(z["header"]))
    head["num_layers"] = 10**12
    z["header"] = np.array(json.dumps(head))
    np.savez(path, **z)
    with pytest.raises(TraceError, match=r"num_layers 1000000000000 is not a whole number in \[1, 4096\]"):
        Trace.load(path)


PROFILE = """name = "bad"
dram_bandwidth_gbs = {dram}
dram_bandwidth_gbs_source = "test"
dram_capacity_gb = 8.0
dram_capacity_gb_source = "test"
flash_seq_read_gbs = {flash}
flash_seq_read_gbs_source = "test"
flash_random_4k_iops = {iops}
flash_random_4k_iops_source = "test"
"""


@pytest.mark.parametrize("values, says", [
    ({"iops": 0}, "flash_random_4k_iops must be a finite number > 0, got 0"),
    ({"flash": "nan"}, "flash_seq_read_gbs must be a finite number > 0, got nan"),
    ({"dram": "inf"}, "dram_bandwidth_gbs must be a finite number > 0, got inf"),
    ({"flash": '"fast"'}, "flash_seq_read_gbs must be a finite number > 0, got 'fast'"),
], ids=["0 IOPS", "nan bandwidth", "inf DRAM bandwidth", "a string"])
def test_device_profiles_with_impossible_numbers_are_refused(tmp_path, values, says):
    profile = tmp_path / "bad.toml"
    profile.write_text(PROFILE.format(**{"dram": 50.0, "flash": 2.0, "iops": 100000, **values}))
    _one_line(["simulate", "--model", "tiny-llama", "--method", "dense", "--policy", "static", "--device",
               str(profile)], says)


def test_a_registry_shape_with_a_huge_layer_count_is_refused(tmp_path, monkeypatch):
    from dipdeploy.registry import PACKAGED_MODELS

    text = (PACKAGED_MODELS / "tiny-llama.toml").read_text()
    text = text.replace("name = \"tiny-llama\"", "name = \"huge\"")
    assert "num_hidden_layers = 2" in text
    (tmp_path / "huge.toml").write_text(text.replace("num_hidden_layers = 2", "num_hidden_layers = 1000000000000"))
    monkeypatch.setenv("DIPDEPLOY_MODELS", str(tmp_path))
    _one_line(["simulate", "--model", "huge", "--method", "dense", "--policy", "static", "--device", "sd8gen3"],
              "num_hidden_layers 1000000000000 is not a whole number in [1, 4096]")


@pytest.mark.parametrize("args, says", [
    (["--io-gap", str(10**15)], f"io gap {10**15} is over the cap of"),
    (["--context", str(10**12)], f"context {10**12} is over the cap of {MAX_TOKENS}"),
    (["--steps", str(10**9), "--sweep-dram", "1GB..2GB"], f"--steps {10**9} is over the cap of 1000"),
    (["--warmup", str(10**12)], f"warmup {10**12} is over the cap of {MAX_TOKENS}"),
    (["--gamma-warmup", str(10**12)], f"gamma_warmup {10**12} is over the cap of {MAX_TOKENS}"),
    (["--fixed-top-n", str(10**12)], f"fixed_top_n {10**12} is over the cap of"),
    (["--tokens", str(10**12)], f"--tokens {10**12} is over the cap of {MAX_TOKENS}"),
], ids=["io-gap", "context", "steps", "warmup", "gamma-warmup", "fixed-top-n", "tokens"])
def test_simulate_counts_have_caps(args, says):
    _one_line(["simulate", "--model", "tiny-llama", "--method", "dense", "--policy", "static", "--device", "sd8gen3",
               *args], says)


@pytest.mark.parametrize("source, says", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "runs over the cap of 1048576 loop steps"),
    ("{% for i in range(10**9) %}{% endfor %}", "1000000000.* over the cap"),
    ("{{ 'x'|center(10**9) }}", "passes 1000000000 to the center filter, over the cap"),
    ("{{ 'x'.ljust(10**9) }}", "passes 1000000000 to ljust, over the cap"),
    ("{{ messages|batch(10**9)|list }}", "passes 1000000000 to the batch filter, over the cap"),
    ("{{ '{:>1000000000}'.format('x') }}", "formats a field 1000000000 wide, over the cap"),
    ("{{ '%1000000000s' % 'x' }}", "formats a field 1000000000 wide, over the cap"),
    ("{{ '%.1000000000f'|format(1.0) }}", "formats a field 1000000000 wide, over the cap"),
    ("{{ 'x' * 10**10 }}", "repeats a sequence to 10000000000 items, over the cap"),
    ("{{ 7 ** 100000000 }}", "raises to the power 100000000, over the cap of 1024"),
    ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "writes over the cap of 16777216 characters"),
], ids=["nested ranges", "one huge range", "center", "ljust", "batch", "str.format width", "% width",
        "format filter precision", "repeated string", "huge power", "huge output"])
def test_chat_template_renders_are_capped(source, says):
    from dipdeploy.runtime.template import ChatTemplate

    with pytest.raises(ValueError, match=says) as err:
        ChatTemplate(source, {}).render([{"role": "user", "content": "hi"}])
    assert "\n" not in str(err.value) and "model's own chat template" in str(err.value)


def test_a_bundle_with_a_runaway_chat_template_is_refused_in_one_line(chat_bundle, tmp_path):
    import shutil

    from dipdeploy.bundle.manifest import file_record
    from dipdeploy.runtime.template import TEMPLATE_FILE

    bundle = tmp_path / "bundle"
    shutil.copytree(chat_bundle, bundle)
    raw = json.loads((bundle / MANIFEST).read_text())
    assert TEMPLATE_FILE in raw["files"]  # the template export ships beside the tokenizer
    (bundle / TEMPLATE_FILE).write_text("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                                        "{% endfor %}")
    raw["files"][TEMPLATE_FILE] = file_record(bundle / TEMPLATE_FILE)
    (bundle / MANIFEST).write_text(json.dumps(raw))
    _one_line(["run", str(bundle), "-p", "hi", "--chat", "-n", "1", "--no-native"],
              "chat template runs over the cap of 1048576 loop steps")


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}


@pytest.mark.parametrize("change, says", [
    ({"hidden_size": 66}, "hidden_size 66 is not divisible by num_attention_heads 4"),
    ({"vocab_size": 0}, "vocab_size 0 must be a whole number in [1, "),
    ({"num_hidden_layers": 0}, "num_hidden_layers 0 must be a whole number in [1, 4096]"),
    ({"num_attention_heads": 0}, "num_attention_heads 0 must be a whole number in [1, "),
    ({"num_hidden_layers": 10**12}, "num_hidden_layers 1000000000000 must be a whole number in [1, 4096]"),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not divisible by num_key_value_heads 3"),
    ({"hidden_size": "64"}, "hidden_size '64' must be a whole number"),
], ids=["hidden not divisible", "vocab 0", "0 layers", "0 heads", "1e12 layers", "kv groups", "a string"])
def test_impossible_hf_configs_are_refused_before_transformers(tmp_path, monkeypatch, change, says):
    """The refusal comes from the raw config.json, before transformers builds a config or a model."""
    import transformers

    def built(*a, **k):
        raise AssertionError("transformers was asked to read the config")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", built)
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **change}))
    _one_line(["eval", "--model", str(tmp_path), "--max-windows", "1"], says, "fix config.json")


def test_a_config_with_head_dim_need_not_split_evenly(tmp_path):
    from dipdeploy.loading import _shape_problem

    assert _shape_problem(LLAMA) is None
    assert _shape_problem({**LLAMA, "hidden_size": 66, "head_dim": 16}) is None


@pytest.mark.parametrize("args, says", [
    (["eval", "--model", "tiny-llama", "--seqlen", str(10**9)], f"--seqlen {10**9} is over the cap of {MAX_TOKENS}"),
    (["eval", "--model", "tiny-llama", "--max-windows", str(10**9)], f"--max-windows {10**9} is over the cap of"),
    (["eval", "--model", "tiny-llama", "--batch-size", str(10**9)], f"--batch-size {10**9} is over the cap of 1024"),
    (["eval", "--model", "tiny-llama", "--calib-windows", str(10**9)], f"--calib-windows {10**9} is over the cap"),
    (["eval", "--task", "humaneval", "--model", "tiny-llama", "--timeout", "1e15"], "--timeout 1e+15 out of range"),
    (["calibrate", "--model", "tiny-llama", "-o", "{tmp}/p.json", "--windows", str(10**9)],
     f"--windows {10**9} is over the cap of"),
    (["trace", "--model", "tiny-llama", "-o", "{tmp}/t.npz", "--tokens", str(10**12)],
     f"--tokens {10**12} is over the cap of {MAX_TOKENS}"),
    (["demo", "--max-new-tokens", str(10**12)], f"--max-new-tokens {10**12} is over the cap of {MAX_TOKENS}"),
    (["export", "--model", "tiny-llama", "--out", "{tmp}/b", "--max-length", str(10**11)],
     f"--max-length {10**11} is over the cap of {MAX_TOKENS}"),
    (["export", "--model", "tiny-llama", "--out", "{tmp}/b", "--stats-windows", str(10**9)],
     f"--stats-windows {10**9} is over the cap of"),
], ids=["eval seqlen", "eval max-windows", "eval batch-size", "eval calib-windows", "humaneval timeout",
        "calibrate windows", "trace tokens", "demo max-new-tokens", "export max-length", "export stats-windows"])
def test_other_commands_counts_have_caps(tmp_path, args, says):
    _one_line([a.format(tmp=tmp_path) for a in args], says)


@pytest.mark.parametrize("option, value, says", [
    ("--top-k", 10**12, "--top-k must be an integer in [0, 4194304]"), ("--seed", -5, "--seed must be >= 0, got -5")])
def test_sampling_options_are_bounded(tmp_path, option, value, says):
    _one_line(["run", str(tmp_path), "-p", "x", option, str(value)], says)


def test_export_threads_have_a_cap():
    from dipdeploy.export.config import ExportConfig

    with pytest.raises(ValueError, match=f"ExportConfig.threads 100000 is over the cap of {MAX_THREADS}"):
        ExportConfig(threads=100000)
