"""`--device auto|cpu|cuda` of calibrate, eval and finetune (dipdeploy/torchdevice.py, one rule with
export's): on the CPU each gives what the stage computed before it had the flag (the same torch calls on
the same inputs, so the same numbers exactly), `auto` is the CPU on a machine without a GPU, `cuda` there
is one line and exit code 2 with nothing written, and under a launcher accelerate keeps the choice."""

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.torchdevice import resolve_device

runner = CliRunner()
CALIB = ["--windows", "2", "--seqlen", "64"]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")


def _windows(lm, data_dir, split, seqlen, n):
    from dipdeploy.data import load_text, windows

    return windows(lm.tokenizer, load_text("wikitext2", split, None, data_dir), seqlen, n)


@no_gpu
def test_calibrate_and_eval_on_the_cpu_are_the_plain_torch_results(tmp_path, data_dir):
    """The plan (split searched: no --rho-in) and the perplexity under it, from the CLI with --device cpu
    and with the default (auto: the CPU here), equal the library's calls on a model never moved."""
    from dipdeploy.eval.perplexity import perplexity
    from dipdeploy.loading import load_model
    from dipdeploy.sparsity.calibrate import calibrate
    from dipdeploy.sparsity.methods import sparsify_
    from dipdeploy.sparsity.plan import SparsityConfig, SparsityPlan

    lm = load_model("tiny-llama")
    ref = calibrate(lm, SparsityConfig(method="dip", density=0.5), _windows(lm, data_dir, "validation", 64, 2))
    assert len(ref.calibration["split_nll"]) > 1
    sparsify_(lm.model, ref)
    ref_ppl, _ = perplexity(lm.model, _windows(lm, data_dir, "test", 64, 2))
    for flag in (["--device", "cpu"], []):
        plan, rows = tmp_path / f"plan{len(flag)}.json", tmp_path / f"rows{len(flag)}.json"
        res = runner.invoke(app, ["calibrate", "--model", "tiny-llama", "--method", "dip", "--density", "0.5",
                                  *CALIB, "--data-dir", str(data_dir), "--out", str(plan), *flag])
        assert res.exit_code == 0, res.output
        assert SparsityPlan.load(plan).to_json() == ref.to_json()
        res = runner.invoke(app, ["eval", "--model", "tiny-llama", "--plan", str(plan), "--seqlen", "64",
                                  "--max-windows", "2", "--data-dir", str(data_dir), "--json", str(rows), *flag])
        assert res.exit_code == 0, res.output
        assert json.loads(rows.read_text())["rows"][0]["ppl"] == ref_ppl


@no_gpu
def test_finetune_on_the_cpu_is_the_trainers_own_choice(tmp_path, finetune_inputs, tiny_llama):
    """`finetune --device cpu` trains the adapter the library trains when the Trainer picks the device
    itself (device None: the CPU where torch sees no GPU), tensor for tensor."""
    from dipdeploy.finetune import finetune
    from dipdeploy.finetune.config import LoraConfig
    from dipdeploy.loading import load_model
    from dipdeploy.sparsity.plan import SparsityPlan

    plan, text = finetune_inputs
    cfg = LoraConfig(rank=2, steps=2, seqlen=32, batch_size=2, text_file=str(text))
    finetune(load_model("tiny-llama"), SparsityPlan.load(plan), cfg, tmp_path / "lib", progress=False)
    res = runner.invoke(app, ["finetune", "--model", "tiny-llama", "--plan", str(plan), "--steps", "2", "--seqlen",
                              "32", "--batch-size", "2", "--rank", "2", "--text-file", str(text), "--device", "cpu",
                              "--out", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    ours, lib = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in ("cli", "lib"))
    assert ours.keys() == lib.keys() and all(torch.equal(ours[k], lib[k]) for k in ours)


@no_gpu
@pytest.mark.parametrize("command", [
    ["calibrate", "--out", "{out}"],
    ["eval", "--json", "{out}"],
    ["finetune", "--out", "{out}"],
])
def test_cuda_without_a_gpu_is_one_line_exit_2(tmp_path, data_dir, command):
    out = tmp_path / "out"
    args = [a.format(out=out) for a in command]
    res = runner.invoke(app, [*args, "--model", "tiny-llama", "--data-dir", str(data_dir), "--device", "cuda"])
    line = res.output.strip()
    assert res.exit_code == 2 and len(line.splitlines()) == 1 and line.startswith("error:"), res.output
    assert "--device cuda" in line and "--device cpu" in line and not out.exists()


def test_auto_follows_what_torch_sees(monkeypatch):
    """The rule itself, for both answers of torch.cuda.is_available (no device is faked: only the rule
    runs); an unknown name is refused with the choices."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert (resolve_device("auto"), resolve_device("cuda"), resolve_device("cpu")) == ("cuda", "cuda", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert (resolve_device("auto"), resolve_device("cpu")) == ("cpu", "cpu")
    with pytest.raises(ValueError, match="choose auto, cpu or cuda"):
        resolve_device("tpu")


def test_finetune_device_under_a_launcher_is_refused(tmp_path, monkeypatch, finetune_inputs):
    """Under `accelerate launch` (RANK/WORLD_SIZE set) the launcher places each process; an explicit
    --device is refused in one line, in every process (process 0 says why)."""
    plan, text = finetune_inputs
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = tmp_path / "adapter"
    res = runner.invoke(app, ["finetune", "--model", "tiny-llama", "--plan", str(plan), "--text-file", str(text),
                              "--device", "cpu", "--out", str(out)])
    line = res.output.strip()
    assert res.exit_code == 2 and len(line.splitlines()) == 1 and "drop --device" in line, res.output
    assert "accelerate" in line and not out.exists()
