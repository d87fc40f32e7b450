"""A streamed export (one decoder layer in memory at a time, from safetensors or a GGUF) calibrates and
merges LoRA exactly as the eager export does: the same plan, the same bundle bytes
(dipdeploy/sparsity/streamed.py, dipdeploy/export/prepare.py ``stream_lora``); ``dipdeploy calibrate
--stream`` takes the same path."""

import json

import pytest
import torch
from typer.testing import CliRunner

import dipdeploy.cli  # noqa: F401  (registers every command)
from dipdeploy.bundle.names import MANIFEST
from dipdeploy.cli._app import app
from dipdeploy.export.bundle import export_model
from dipdeploy.export.config import ExportConfig

pytestmark = pytest.mark.numerics

#: Manifest fields that name the mode, the only ones allowed to differ: ``source.streamed`` (True),
#: ``export_config.stream`` and ``.validate_tokens`` (a streamed export does not validate against torch)
#: and the ``validation`` record itself (the eager one's, or the streamed one's "skipped" note).
MODE_FIELDS = {"source": ("streamed",), "export_config": ("stream", "validate_tokens"), "validation": None}
CALIB = dict(calib_windows=2, calib_seqlen=64)  # short calibration text: seconds, same code path


def _without_mode(manifest: dict, config_paths: bool = False) -> dict:
    """``config_paths``: drop ``source.config._name_or_path`` too, the folder transformers read the config
    from: for a GGUF, the eager load's fp32 copy in the cache, and the GGUF's own folder when streamed."""
    out = json.loads(json.dumps(manifest))
    if config_paths:
        out["source"]["config"].pop("_name_or_path", None)
    for key, fields in MODE_FIELDS.items():
        if fields is None:
            out.pop(key, None)
        else:
            for f in fields:
                out[key].pop(f, None)
    return out


def _same_bundle(eager, streamed, config_paths: bool = False) -> None:
    names = sorted(p.relative_to(eager).as_posix() for p in eager.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(streamed).as_posix() for p in streamed.rglob("*") if p.is_file())
    for name in names:
        if name != MANIFEST:
            assert (eager / name).read_bytes() == (streamed / name).read_bytes(), name
    m_eager, m_streamed = (json.loads((d / MANIFEST).read_text()) for d in (eager, streamed))
    assert m_streamed["source"]["streamed"] is True and "skipped" in m_streamed["validation"]
    assert m_eager["validation"]["ok"]
    assert _without_mode(m_eager, config_paths) == _without_mode(m_streamed, config_paths)


def _adapter(model, path, targets):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))
    peft_model.save_pretrained(path)
    return path


@pytest.mark.parametrize("model", ["tiny-mistral", "tiny-gemma3"])
def test_streamed_calibration_gives_the_eager_bundle(tmp_path, data_dir, model):
    """No --plan, no --rho-in: both calibrate the split on the same text; every file is byte-identical."""
    kw = dict(model=model, method="dip-ca", quant="bq4", data_dir=str(data_dir), **CALIB)
    eager = export_model(ExportConfig(stream=False, validate_tokens=4, **kw), tmp_path / "eager")
    streamed = export_model(ExportConfig(stream=True, **kw), tmp_path / "streamed")
    assert len(eager.manifest.plan["calibration"]["split_nll"]) > 1  # the search ran
    _same_bundle(eager.out, streamed.out)


@pytest.mark.parametrize("model,targets", [("tiny-llama", ["gate_proj", "up_proj", "down_proj", "q_proj"]),
                                           ("tiny-phi3", ["gate_up_proj", "down_proj"])])
def test_streamed_lora_merge_gives_the_eager_bundle(tmp_path, data_dir, model, targets):
    """The adapter merged as each layer is read, then calibrated and quantised: peft's merge, bit for bit."""
    from dipdeploy.loading import load_model

    adapter = _adapter(load_model(model).model, tmp_path / "adapter", targets)
    kw = dict(model=model, method="dip", quant="bq4", lora=str(adapter), data_dir=str(data_dir), **CALIB)
    eager = export_model(ExportConfig(stream=False, validate_tokens=4, **kw), tmp_path / "eager")
    streamed = export_model(ExportConfig(stream=True, **kw), tmp_path / "streamed")
    base = export_model(ExportConfig(**{**kw, "lora": None}, stream=True), tmp_path / "base")
    assert (base.out / "mlp.bin").read_bytes() != (streamed.out / "mlp.bin").read_bytes()  # the adapter is in it
    _same_bundle(eager.out, streamed.out)


def test_streamed_lora_refuses_what_it_cannot_merge(tmp_path):
    from dipdeploy.loading import load_model

    adapter = _adapter(load_model("tiny-llama").model, tmp_path / "adapter", ["up_proj"])
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora"):
        export_model(ExportConfig(model="tiny-llama", rho_in=0.6, lora=str(adapter), stream=True), tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_streamed_lora_for_another_shape_is_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256))
    adapter = _adapter(other, tmp_path / "adapter", ["up_proj"])
    with pytest.raises(ValueError, match="does not fit"):
        export_model(ExportConfig(model="tiny-llama", rho_in=0.6, lora=str(adapter), stream=True), tmp_path / "b")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_device_auto_is_cpu_and_cuda_without_a_gpu_is_one_line_exit_2(tmp_path):
    from dipdeploy.torchdevice import resolve_device

    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    res = CliRunner().invoke(app, ["export", "--model", "tiny-llama", "--device", "cuda", "--out",
                                   str(tmp_path / "b")])
    out = res.output.strip()
    assert res.exit_code == 2 and len(out.splitlines()) == 1 and out.startswith("error:"), out
    assert "--device cuda" in out and "--device cpu" in out
    assert not (tmp_path / "b").exists()


def test_unknown_device_is_refused(tmp_path):
    res = CliRunner().invoke(app, ["export", "--model", "tiny-llama", "--device", "tpu", "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "device='tpu'" in res.output and "Traceback" not in res.output


def test_streamed_gguf_gives_the_eager_bundle_of_the_same_gguf(tmp_path, data_dir, monkeypatch):
    """A GGUF (Q8_0 matrices) streamed tensor by tensor (``checkpoint.GGUFCheckpoint``, no fp32 copy written)
    and calibrated layer by layer gives the bundle of the eager export of the same file (transformers'
    whole-file dequantisation, then its fp32 copy), byte for byte."""
    from dipdeploy.loading import load_model
    from tiny_gguf import write_llama_gguf

    tiny = load_model("tiny-llama")
    gguf = write_llama_gguf(tiny, tmp_path / "tiny-llama-q8.gguf")
    monkeypatch.setenv("DIPDEPLOY_CACHE", str(tmp_path / "cache"))  # the eager load's fp32 copy goes here
    kw = dict(model=str(gguf), method="dip-ca", quant="bq4", data_dir=str(data_dir), **CALIB)
    streamed = export_model(ExportConfig(stream=True, **kw), tmp_path / "streamed")
    assert not list((tmp_path / "cache").glob("models/gguf-*"))  # streamed: the file itself, no copy
    eager = export_model(ExportConfig(stream=False, validate_tokens=4, **kw), tmp_path / "eager")
    assert list((tmp_path / "cache").glob("models/gguf-*"))
    assert len(eager.manifest.plan["calibration"]["split_nll"]) > 1  # the search ran
    _same_bundle(eager.out, streamed.out, config_paths=True)
    # the file holds tiny-llama (q/k un-permuted right), within Q8_0's rounding
    held = load_model(str(gguf)).model.state_dict()
    for name, ref in tiny.model.state_dict().items():
        err = (held[name] - ref).abs().max().item()
        assert err < 0.01 * ref.abs().max().item() + 1e-6, (name, err)


def _calibrate(tmp_path, data_dir, name, *extra):
    out = tmp_path / f"{name}.json"
    res = CliRunner().invoke(app, ["calibrate", "--model", "tiny-mistral", "--method", "dip-ca", "--density", "0.5",
                                   "--windows", "2", "--seqlen", "64", "--data-dir", str(data_dir), "--out", str(out),
                                   *extra])
    return res, out


def test_calibrate_stream_gives_the_eager_plan(tmp_path, data_dir):
    """`dipdeploy calibrate --stream` runs export's streamed split search (one path, ``calibrate_on``):
    the plan is the eager one."""
    from dipdeploy.sparsity.plan import SparsityPlan

    plans = {}
    for mode in ("--stream", "--no-stream"):
        res, out = _calibrate(tmp_path, data_dir, mode, mode)
        assert res.exit_code == 0, res.output
        plans[mode] = SparsityPlan.load(out)
    assert len(plans["--stream"].calibration["split_nll"]) > 1  # the search ran
    assert plans["--stream"].to_json() == plans["--no-stream"].to_json()


@pytest.mark.parametrize("extra,named", [(["--method", "teal"], "--method teal"),
                                         (["--allocation", "greedy"], "--allocation greedy")])
def test_calibrate_stream_refuses_what_needs_the_whole_model(tmp_path, data_dir, extra, named):
    res, out = _calibrate(tmp_path, data_dir, "plan", "--stream", *extra)
    line = res.output.strip()
    assert res.exit_code == 2 and len(line.splitlines()) == 1 and line.startswith("error:"), res.output
    assert named in line and "--no-stream" in line and not out.exists()


def test_streamed_export_releases_the_quantised_embedding(tmp_path):
    """Nothing reads a streamed model's torch embedding once its int4 rows are taken (no validation, the head
    quantised apart or from those rows): the table goes back to ``meta`` instead of being written back."""
    from dipdeploy.export.bundle import export
    from dipdeploy.export.prepare import make_plan
    from dipdeploy.loading import load_model

    lm = load_model("tiny-llama", stream=True)
    cfg = ExportConfig(model="tiny-llama", rho_in=0.6, quant="bq4", stream=True, validate_tokens=0)
    export(lm, cfg, tmp_path / "b", make_plan(lm, cfg))
    assert lm.model.get_input_embeddings().weight.is_meta and lm.model.get_output_embeddings().weight.is_meta


def test_write_back_in_row_blocks_is_the_whole_dequantisation(monkeypatch):
    """The eager reference's fake-quantised weights are written a block of rows at a time, across the
    modules a packed matrix stacks ([q; k; v]): the same values as the whole matrix dequantised at once."""
    import numpy as np

    import dipdeploy.export.source as source
    from dipdeploy.quant.api import dequantize_rows, quantize_dense
    from dipdeploy.quant.config import Block4QuantConfig

    torch.manual_seed(0)
    modules = [torch.nn.Linear(64, 20), torch.nn.Linear(64, 17)]
    rows = torch.cat([m.weight for m in modules]).detach().numpy()
    packed = quantize_dense(rows, Block4QuantConfig())
    monkeypatch.setattr(source, "WRITE_BACK_BYTES", 4 * 64 * 6)  # 6 rows a block, straddling the two modules
    source.ModelSource._assign(modules, packed)
    got = torch.cat([m.weight for m in modules]).detach().numpy()
    assert np.array_equal(got, dequantize_rows(packed)) and not np.array_equal(got, rows)
