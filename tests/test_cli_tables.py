"""Every table of the CLI fits 80 columns: long cells wrap, none is cut to "…" (dipdeploy/cli/tables.py)."""

import pytest
from typer.testing import CliRunner

from dipdeploy.cli import app, core, sim
from dipdeploy.export.bundle import export_model
from dipdeploy.export.config import ExportConfig

runner = CliRunner()


@pytest.fixture
def narrow(monkeypatch):
    for console in (core.console, core.err_console, sim.console):
        monkeypatch.setattr(console, "width", 80)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("tables") / "b"
    export_model(ExportConfig(model="tiny-llama", quant="bq4", rho_in=0.6, validate_tokens=4), out)
    return out


def _fits(output: str) -> None:
    """The tables are stdout; progress lines (stderr, ``what … done``) are not tables."""
    assert "…" not in output, output
    too_long = [line for line in output.splitlines() if len(line) > 80]
    assert not too_long, too_long


@pytest.mark.parametrize("args", [["models"], ["devices"],
                                  ["simulate", "--method", "dense", "--policy", "static", "--model", "phi-3-medium",
                                   "--sweep-dram", "auto", "--steps", "3"]], ids=lambda a: a[0])
def test_listing_tables_fit_80_columns(narrow, args):
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    _fits(res.stdout)
    if args[0] == "devices":  # every profile's assumptions are shown, wrapped, not cut
        from dipdeploy.sim.devices import list_devices

        flat = "".join(res.output.split())
        assert all("".join(", ".join(d.assumptions).split()) in flat for d in list_devices())


def test_inspect_is_a_short_summary_and_files_lists_every_file(narrow, bundle):
    res = runner.invoke(app, ["inspect", str(bundle)])
    assert res.exit_code == 0, res.output
    _fits(res.stdout)
    assert "mlp.bin" in res.output and "sha256" not in res.output
    flat = " ".join(res.stdout.split())
    # validation is a check against the torch reference, and says so; quality is eval's to measure
    assert "matches its torch reference" in flat and "passed" not in flat
    assert "quality" in flat and "dipdeploy eval --model tiny-llama --method dip" in flat
    assert len(res.output.splitlines()) <= 24  # one screen
    full = runner.invoke(app, ["inspect", str(bundle), "--files"])
    assert full.exit_code == 0, full.output
    _fits(full.output)
    assert "sha256" in full.output and "layer.1.mlp_down.onnx" in full.output


def test_run_stats_and_eval_rows_fit_80_columns(narrow, bundle):
    res = runner.invoke(app, ["run", str(bundle), "-p", "Hi", "-n", "2", "--no-native"])
    assert res.exit_code == 0, res.output
    # the stats table (stderr): after the prompt and the "[… stopped at 2 tokens]" mark
    _fits(res.stderr[res.stderr.index(f"dipdeploy run {bundle.name}"):])
    row = {"method": "dip-ca", "density": 0.4948, "rho_in": 0.55, "allocation": "greedy", "ppl": 1234.5678,
           "quant": "VQ3QuantConfig (a-long-folder-name/smollm2-vq3-gptq.npz)", "bits_per_weight": 3.1289,
           "tokens": 2047 * 16, "calib_s": 4321.5, "eval_s": 1234.5}
    with core.console.capture() as cap:
        core.print_rows([row, {**row, "method": "dense"}], "smollm2-135m · WikiText-2 · seqlen 2048 · 16 windows",
                        12345.6)
    _fits(cap.get())
    assert "time: 3 h 25 min in all" in cap.get() and "4322" in cap.get()


def test_eval_says_the_time_in_all_and_per_part():
    rows = [{"calib_s": 221.0, "eval_s": 13.6}, {"calib_s": 0.0, "eval_s": 6.4}]
    assert core.time_line(rows, 250.0) == ("time: 4 min 10 s in all (calibrate 3 min 41 s, evaluate 20.0 s, load "
                                           "and the rest 9.0 s)")
    assert core.time_line([{"calib_s": 0.0, "eval_s": 13.6}], 15.0) == ("time: 15.0 s in all (evaluate 13.6 s, "
                                                                         "load and the rest 1.4 s)")


def test_the_validation_verdict_counts_near_ties_and_says_which_way_the_bound_went():
    from dipdeploy.cli.export import _verdict

    rec = {"agrees_stock": True, "agrees_native": True, "near_ties_stock": [3, 5], "near_ties_native": [5],
           "max_abs_diff": 0.002, "tolerance": 0.01, "ok": True}
    assert _verdict(rec) == ("matches its torch reference (stock ORT agrees, native agrees, 3 near-ties; "
                             "max |Δlogit| 0.002 ≤ tolerance 0.01)")
    bad = _verdict({**rec, "agrees_stock": False, "max_abs_diff": 0.5, "ok": False})
    assert bad.startswith("DIFFERS from its torch reference (stock ORT DIFFERS") and "0.5 > tolerance 0.01" in bad
