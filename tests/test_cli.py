import json

import typer
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.demo import DemoConfig, chat_hint

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
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["dense", "dip", "dip"] and png.stat().st_size > 1000
    assert len(rows[0]["window_nll"]) == 1 and "against dense" not in res.output  # one window: no interval
    assert "time: " in res.output and " in all (" in res.output and "load and the rest" in res.output


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
    from dipdeploy.sparsity.plan import SparsityPlan

    assert SparsityPlan.load(plan).cache_split == "reads"  # the runtime's default, kept in the plan
    even = tmp_path / "even.json"
    assert runner.invoke(app, args[:-1] + [str(even), "--cache-split", "even"]).exit_code == 0
    assert SparsityPlan.load(even).cache_split == "even"
    res = runner.invoke(app, args[:-1] + [str(tmp_path / "odd.json"), "--cache-split", "odd"])
    assert res.exit_code == 2 and "cache split" in res.output
    trace = tmp_path / "t.npz"
    res = runner.invoke(app, ["trace", "--model", "tiny-llama", "--plan", str(plan), "--tokens", "32",
                              "--data-dir", str(data_dir), "--out", str(trace)])
    assert res.exit_code == 0, res.output
    from dipdeploy.trace import Trace

    t = Trace.load(trace)
    assert t.method == "dip-ca" and t.num_tokens == 32 and t.num_layers == 2 and t.x_abs is not None


def test_eval_with_lora_adapter(tmp_path, data_dir, tiny_llama):
    """`eval --lora`: an adapter from `finetune` applied live and merged gives the same perplexity."""
    from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan

    c = tiny_llama.model.config
    plan = tmp_path / "plan.json"
    uniform_plan(SparsityConfig(method="dip", density=0.5, rho_in=0.55), "tiny-llama", c.num_hidden_layers,
                 c.hidden_size, c.intermediate_size).save(plan)
    text = tmp_path / "train.txt"
    text.write_text("a small training text for a tiny model, repeated. " * 40)
    adapter = tmp_path / "adapter"
    res = runner.invoke(app, ["finetune", "--model", "tiny-llama", "--plan", str(plan), "--steps", "2", "--seqlen",
                              "32", "--batch-size", "2", "--rank", "2", "--text-file", str(text), "--out", str(adapter)])
    assert res.exit_code == 0, res.output
    ppl = {}
    for mode in ("--lora-merge", "--lora-live"):
        out = tmp_path / f"{mode}.json"
        res = runner.invoke(app, ["eval", "--model", "tiny-llama", "--plan", str(plan), "--seqlen", "64",
                                  "--max-windows", "1", "--data-dir", str(data_dir), "--lora", str(adapter), mode,
                                  "--json", str(out)])
        assert res.exit_code == 0, res.output
        row = json.loads(out.read_text())["rows"][0]
        ppl[row["lora"]] = row["ppl"]
    assert set(ppl) == {"merged", "adapter"}
    assert abs(ppl["merged"] - ppl["adapter"]) / ppl["adapter"] < 1e-3


def test_demo_sets_dense_against_dip_ca_on_one_screen(data_dir, tmp_path):
    """tiny-llama has no chat template: the demo says so and continues the question as raw text."""
    out, js = tmp_path / "demo", tmp_path / "demo.json"
    args = ["demo", "--model", "tiny-llama", "--density", "0.6", "--windows", "1", "--seqlen", "32", "-n", "4",
            "--out", str(out), "--data-dir", str(data_dir), "--json", str(js)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = json.loads(js.read_text())["rows"]
    assert [(r["label"], r["density"] == 1.0) for r in rows] == [("dense", True), ("DIP-CA", False)]
    assert all(r["ppl"] > 1 and r["flash_mb_per_token"] >= 0 and r["new_tokens"] >= 1 for r in rows)
    assert rows[1]["flash_mb_per_token"] < rows[0]["flash_mb_per_token"]  # fewer rows read at ρ 0.6
    assert all(r["flash_block_mb_per_token"] >= r["flash_mb_per_token"] for r in rows)  # whole blocks paced
    assert "perplexity" in res.output and "What is the capital of France?" in res.output
    assert "raw text" in res.output and "[1/2] dense" in res.output
    hint = chat_hint(DemoConfig(), rows[1]["bundle"])  # the line it prints parses as chat, at the demo's settings
    assert " ".join(hint).replace(" ", "") in res.output.replace(" ", "").replace("\n", "")
    chat = typer.main.get_command(app).commands["chat"].make_context("chat", hint[1:]).params
    assert (chat["dram_budget"], chat["io"], chat["flash_bandwidth"]) == ("50%", "mmap", "1GB/s")
    res = CliRunner().invoke(app, args[:-2])  # the bundles exist: replaced only with --force
    assert res.exit_code == 2 and "--force" in res.output


def test_demo_refuses_bad_densities_in_one_line():
    res = CliRunner().invoke(app, ["demo", "--density", "0.7,x"])
    assert res.exit_code == 2 and "--density" in res.output and len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(app, ["demo", "--density", "1.2"])
    assert res.exit_code == 2 and "--density" in res.output


def test_eval_with_a_plan_labels_and_meters_the_row_as_the_plan(tmp_path, data_dir):
    """A TEAL plan given to `eval` without --method is evaluated, labelled and metered as TEAL at its own
    density (not as the defaults' DIP at 0.5); a --method or --density that contradicts it is one line, exit 2."""
    plan, rows = tmp_path / "teal.json", tmp_path / "rows.json"
    res = runner.invoke(app, ["calibrate", "--model", "tiny-llama", "--method", "teal", "--density", "0.6",
                              "--rho-in", "0.66", "--windows", "1", "--seqlen", "32", "--data-dir", str(data_dir),
                              "--out", str(plan)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["eval", "--model", "tiny-llama", "--plan", str(plan), "--seqlen", "64",
                              "--max-windows", "1", "--data-dir", str(data_dir), "--json", str(rows)])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(rows.read_text())["rows"]
    assert (row["method"], row["target_density"], row["density"]) == ("teal", 0.6, 0.6)
    assert row["density_test"] != row["density"]  # measured on the test tokens, as for a calibrated TEAL row
    for extra in (["--method", "dip"], ["--density", "0.5"]):
        res = runner.invoke(app, ["eval", "--model", "tiny-llama", "--plan", str(plan), "--data-dir", str(data_dir),
                                  *extra])
        assert res.exit_code == 2 and "is a teal plan at ρ 0.6" in res.output, res.output
