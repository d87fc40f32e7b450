"""`eval --bundle`: WikiText-2 perplexity of an exported bundle as the host runtime runs it, on eval's windows
and protocol, so it compares with eval's torch rows; the torch-only options refused beside it."""

import json

import pytest
from typer.testing import CliRunner

from dipdeploy.cli import app

runner = CliRunner()
WINDOWS = ["--seqlen", "64", "--max-windows", "2"]


@pytest.fixture(scope="module")
def dip_bundle(tmp_path_factory):
    """A plain-DIP BQ4 bundle of tiny-llama: with γ = 1 its selections do not depend on the caches, so the
    engine computes what eval's torch reference of the same plan and quantisation computes."""
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = tmp_path_factory.mktemp("eval-bundle") / "dip"
    export_model(ExportConfig(model="tiny-llama", method="dip", density=0.5, rho_in=0.6, quant="bq4",
                              validate_tokens=0), out)
    return out


def _one_line_refusal(res, *words):
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output, res.output
    for w in words:
        assert w in res.output, res.output


def test_a_bundles_perplexity_is_its_torch_references(dip_bundle, tmp_path, data_dir):
    ours, ref = tmp_path / "bundle.json", tmp_path / "torch.json"
    res = runner.invoke(app, ["eval", "--bundle", str(dip_bundle), *WINDOWS, "--data-dir", str(data_dir),
                              "--json", str(ours)])
    assert res.exit_code == 0, res.output
    assert "time: " in res.output and f"bundle {dip_bundle.name}" in res.output
    torch_res = runner.invoke(app, ["eval", "-m", "tiny-llama", "--method", "dip", "--density", "0.5", "--rho-in",
                                    "0.6", "--quant", "bq4", *WINDOWS, "--data-dir", str(data_dir), "--json", str(ref)])
    assert torch_res.exit_code == 0, torch_res.output
    (b,), (t,) = json.loads(ours.read_text())["rows"], json.loads(ref.read_text())["rows"]
    assert (b["engine"], b["method"], b["quant"], b["model"]) == ("bundle", "dip", "bq4", "tiny-llama")
    assert (b["density"], b["rho_in"], b["tokens"], b["windows"]) == (t["density"], t["rho_in"], t["tokens"], 2)
    assert b["ppl"] == pytest.approx(t["ppl"], rel=1e-3)
    assert b["window_nll"] == pytest.approx(t["window_nll"], rel=1e-3)


def test_the_dram_budget_applies_to_the_bundles_engine(tmp_path, data_dir, request):
    bundle = request.getfixturevalue("tiny_dipca_bundle")()
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["eval", "--bundle", str(bundle), *WINDOWS, "--data-dir", str(data_dir),
                              "--dram-budget", "30%", "--json", str(out)])
    assert res.exit_code == 0, res.output
    row = json.loads(out.read_text())["rows"][0]
    assert row["dram_budget"] == "30%" and row["method"] == "dip-ca" and row["ppl"] > 1


@pytest.mark.parametrize("args, words", [
    (["--method", "dip"], ["--bundle runs the bundle's own method", "drop --method"]),
    (["--density", "0.5", "--quant", "bq4"], ["drop --density/--quant"]),
    (["--speculate", "2"], ["drop --speculate/--draft/--batch-size"]),
    (["--seqlen", "100000"], ["--seqlen 100000 exceeds the", "positions"]),
])
def test_torch_only_options_and_impossible_windows_are_refused_beside_bundle(dip_bundle, data_dir, args, words):
    _one_line_refusal(runner.invoke(app, ["eval", "--bundle", str(dip_bundle), "--data-dir", str(data_dir), *args]),
                      *words)


def test_a_model_given_as_the_bundle_is_named_with_the_export_to_run(data_dir):
    _one_line_refusal(runner.invoke(app, ["eval", "--bundle", "tiny-llama", "--data-dir", str(data_dir)]),
                      "not a bundle", "dipdeploy eval --bundle BUNDLE")


def test_the_engines_options_without_bundle_are_refused():
    _one_line_refusal(runner.invoke(app, ["eval", "-m", "tiny-llama", "--dram-budget", "50%"]),
                      "add --bundle or drop them")
