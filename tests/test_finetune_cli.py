"""`dipdeploy finetune` end to end on a tiny model: reads a plan, trains, writes the adapter; refuses
to clobber it and reports bad options as one clear line."""

from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.finetune import adapter_plan, read_metadata

runner = CliRunner()


def test_finetune_cli(tmp_path, finetune_inputs):
    plan, text = finetune_inputs
    out = tmp_path / "adapter"
    args = ["finetune", "--model", "tiny-llama", "--plan", str(plan), "--steps", "2",
            "--seqlen", "32", "--batch-size", "2", "--rank", "2", "--text-file", str(text), "--out", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "adapter →" in res.output
    assert read_metadata(out)["train"]["steps"] == 2 and adapter_plan(out).method == "dip"
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "--force" in res.output


def test_finetune_cli_bad_option(tmp_path):
    res = runner.invoke(app, ["finetune", "--model", "tiny-llama", "--targets", "up,mlp", "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and "targets" in res.output


def test_finetune_cli_distills_on_the_dense_models_samples(tmp_path, finetune_inputs):
    plan, _ = finetune_inputs
    out = tmp_path / "adapter"
    res = runner.invoke(app, ["finetune", "--model", "tiny-llama", "--plan", str(plan), "--steps", "2",
                              "--seqlen", "16", "--batch-size", "2", "--rank", "2", "--objective", "distill",
                              "--data", "dense-samples", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "sampling 4 windows of 16 tokens" in res.output
    meta = read_metadata(out)
    assert meta["train"]["windows"] == 4 and meta["train"]["text"] == "dense-samples"
    res = runner.invoke(app, ["finetune", "--model", "tiny-llama", "--plan", str(plan), "--steps", "2",
                              "--seqlen", "16", "--batch-size", "2", "--rank", "2", "--objective", "distill",
                              "--data", "dense-samples", "--sample-windows", "3", "--out", str(tmp_path / "capped")])
    assert res.exit_code == 0, res.output
    assert "sampling 3 windows of 16 tokens" in res.output
    assert read_metadata(tmp_path / "capped")["train"]["windows"] == 3
    res = runner.invoke(app, ["finetune", "--model", "tiny-llama", "--sample-windows", "0",
                              "--out", str(tmp_path / "z")])
    assert res.exit_code == 2 and "sample_windows" in res.output
