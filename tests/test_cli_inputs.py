"""Inputs refused before any work, with one line and exit code 2; --version."""

import pytest
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.runtime import DramBudget

runner = CliRunner()


def test_version():
    from dipdeploy import __version__

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"dipdeploy {__version__}"


@pytest.mark.parametrize("text", ["50", "0.5", " 200 "])
def test_dram_budget_without_a_unit_is_refused(text):
    with pytest.raises(ValueError, match="needs a unit"):
        DramBudget.parse(text)
    assert DramBudget.parse("50%").cache_frac == 0.5 and DramBudget.parse("200MB").total_bytes == 200 * 10**6


def test_run_refuses_a_unitless_budget_before_opening_the_bundle(tmp_path):
    res = runner.invoke(app, ["run", str(tmp_path / "missing"), "-p", "hi", "--dram-budget", "50"])
    assert res.exit_code == 2 and "needs a unit" in res.output, res.output


@pytest.mark.parametrize("level", ["1", "2", "3"])
def test_export_refuses_accuracy_levels_without_a_kernel(tmp_path, level):
    out = tmp_path / "b"
    res = runner.invoke(app, ["export", "--model", "tiny-llama", "--rho-in", "0.6", "--quant", "bq4",
                              "--accuracy-level", level, "--out", str(out)])
    assert res.exit_code == 2 and "accuracy_level" in res.output, res.output
    assert not out.exists()


def test_trace_refuses_zero_tokens(tmp_path):
    out = tmp_path / "t.npz"
    res = runner.invoke(app, ["trace", "--model", "tiny-llama", "--tokens", "0", "--out", str(out)])
    assert res.exit_code == 2 and "--tokens" in res.output, res.output
    assert not out.exists()
