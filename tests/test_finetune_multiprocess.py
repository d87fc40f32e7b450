"""`dipdeploy finetune` as two data-parallel processes through `accelerate launch` (DDP over gloo on the
CPU, CUDA hidden): only process 0 prints and writes, the adapter has the one-process format and loads in
`eval --lora`, and the overwrite rule holds across the launch."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.finetune import read_metadata

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
runner = CliRunner()


def _tool(name: str) -> str:
    found = BIN / name if (BIN / name).is_file() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed beside {sys.executable}")
    return str(found)


def _free_port() -> int:
    with socket.socket() as s:  # other test runs on this machine may hold accelerate's default 29500
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "ACCELERATE_USE_CPU": "1",
           "OMP_NUM_THREADS": "1"}
    cmd = [_tool("accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
           _tool("dipdeploy"), *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)


def _adapter_tensors(d: Path) -> dict:
    with safe_open(str(d / "adapter_model.safetensors"), framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def test_finetune_two_processes(tmp_path, finetune_inputs, data_dir):
    plan, text = finetune_inputs
    common = ["finetune", "--model", "tiny-llama", "--plan", str(plan), "--seqlen", "32", "--batch-size", "2",
              "--rank", "2", "--text-file", str(text)]
    out = tmp_path / "ddp"
    ddp = [*common, "--tokens", str(2 * 2 * 32 * 2), "--out", str(out)]  # 2 steps of 2 processes × 2 windows
    res = _launch(ddp)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("adapter →") == 1 and "× 2 processes" in res.stdout, res.stdout
    train = read_metadata(out)["train"]
    assert train["processes"] == 2 and train["steps"] == 2 and train["train_tokens"] == 2 * 2 * 32 * 2
    assert not list(tmp_path.glob(".ddp.*")) and not (tmp_path / "ddp.checkpoints").exists()

    single = tmp_path / "single"
    res1 = runner.invoke(app, [*common, "--steps", "2", "--out", str(single)])
    assert res1.exit_code == 0, res1.output
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in single.iterdir())
    assert _adapter_tensors(out) == _adapter_tensors(single)
    cfg, cfg1 = (json.loads((d / "adapter_config.json").read_text()) for d in (out, single))
    assert (cfg["r"], sorted(cfg["target_modules"])) == (cfg1["r"], sorted(cfg1["target_modules"]))
    assert read_metadata(single)["train"]["processes"] == 1

    before = (out / "adapter_model.safetensors").read_bytes()
    again = _launch(ddp)
    # each process exits 2 with no traceback of its own (the launcher then prints its ChildFailedError)
    assert again.returncode != 0 and f'File "{ROOT / "dipdeploy"}' not in again.stdout + again.stderr
    assert "exitcode  : 2" in again.stderr, again.stderr
    (refusal,) = [line for line in again.stderr.splitlines() if line.startswith("error:")]  # stderr (core.fail)
    assert "--force" in refusal and "error:" not in again.stdout, again.stderr
    assert (out / "adapter_model.safetensors").read_bytes() == before

    ev = runner.invoke(app, ["eval", "--model", "tiny-llama", "--lora", str(out), "--seqlen", "64",
                             "--max-windows", "1", "--data-dir", str(data_dir)])
    assert ev.exit_code == 0, ev.output
    assert "tiny-llama" in ev.output


def test_refusal_waits_for_process_zero(monkeypatch):
    """A refusing process other than 0 sleeps (the launcher ends it once process 0 has reported and exited),
    so it can never take process 0 down before the error line; process 0 and a single process never wait."""
    from dipdeploy.finetune import launch

    slept = []
    monkeypatch.setattr(launch.time, "sleep", slept.append)
    launch.ProcessInfo(0, 2).await_main_refusal()
    launch.ProcessInfo().await_main_refusal()
    assert slept == []
    launch.ProcessInfo(1, 2).await_main_refusal(5.0)
    assert slept == [5.0]
