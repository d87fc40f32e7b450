import json

from typer.testing import CliRunner

from dipdeploy.cli import app

runner = CliRunner()


def test_models_lists_registry():
    res = runner.invoke(app, ["models"])
    assert res.exit_code == 0 and "smollm2-135m" in res.output and "tiny-phi3" in res.output


def test_eval_json_and_plot(tmp_path, data_dir):
    out, png = tmp_path / "rows.json", tmp_path / "pareto.png"
    res = runner.invoke(app, ["eval", "--model", "tiny-llama", "--method", "dense,dip", "--density", "1,0.5",
                              "--seqlen", "64", "--max-windows", "1", "--data-dir", str(data_dir),
                              "--rho-in", "0.55", "--json", str(out), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())
    assert [r["method"] for r in rows] == ["dense", "dip", "dip"] and png.stat().st_size > 1000


def test_bad_density_is_a_clear_error():
    res = runner.invoke(app, ["eval", "--model", "tiny-llama", "--density", "1.5"])
    assert res.exit_code == 2 and "density" in res.output


def test_calibrate_and_trace(tmp_path, data_dir):
    plan = tmp_path / "plan.json"
    args = ["calibrate", "--model", "tiny-llama", "--method", "dip-ca", "--density", "0.5", "--rho-in", "0.55",
            "--data-dir", str(data_dir), "--windows", "1", "--seqlen", "64", "--out", str(plan)]
    assert runner.invoke(app, args).exit_code == 0
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "--force" in res.output  # never clobbered without --force
    trace = tmp_path / "t.npz"
    res = runner.invoke(app, ["trace", "--model", "tiny-llama", "--plan", str(plan), "--tokens", "32",
                              "--data-dir", str(data_dir), "--out", str(trace)])
    assert res.exit_code == 0, res.output
    from dipdeploy.trace import Trace

    t = Trace.load(trace)
    assert t.method == "dip-ca" and t.num_tokens == 32 and t.num_layers == 2 and t.x_abs is not None
