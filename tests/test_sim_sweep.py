"""Sweeps, the paper's summary numbers (DRAM reduction, throughput gain), sizes, plots and the CLI."""

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.registry import get_model
from dipdeploy.sim import SimConfig
from dipdeploy.sim.simulate import SimResult
from dipdeploy.sim.sweep import auto_budgets, compare, expand_variants, sweep
from dipdeploy.sim.synthetic import synthetic_trace
from dipdeploy.sim.units import parse_range, parse_size

TINY = get_model("tiny-llama").shape
JSON_KEYS = {"device", "model", "method", "policy", "gamma", "dram_bytes", "tok_s", "flash_bytes_per_token", "hit_rate"}


def tiny_trace(tokens=24):
    return synthetic_trace(TINY.hidden_size, TINY.intermediate_size, TINY.num_hidden_layers, tokens=tokens,
                           rho_in=0.5, rho_glu=0.4, seed=0, model="tiny-llama")


def row(dram, tok_s, method="dip"):
    return SimResult(device="x", model="m", trace_model=None, method=method, policy="lfu", gamma=None,
                     precision="bq4", dram_bytes=dram, tok_s=tok_s, tok_s_overlap=tok_s, dram_bytes_per_token=0,
                     flash_bytes_per_token=0, flash_requests_per_token=0, hit_rate=0, density=1, tokens=1,
                     extrapolated=False, extrapolation=None)


def test_compare_gain_and_reduction_by_hand():
    base = [row(2, 1.0, "dense"), row(4, 2.0, "dense"), row(6, 3.0, "dense")]
    meth = [row(2, 1.5), row(4, 3.0), row(6, 4.5)]
    c = compare(base, meth)
    assert [x.gain for x in c] == pytest.approx([0.5, 0.5, 0.5])
    # dense 2 tok/s at 4 GB; the method reaches 2 tok/s at 2 + 2 * (0.5 / 1.5) = 2.667 GB
    assert c[1].dram_for_base_tok_s == pytest.approx(2 + 2 / 3) and not c[1].bound
    assert c[1].dram_reduction == pytest.approx(1 - (2 + 2 / 3) / 4)
    assert c[0].bound and c[0].dram_reduction == 0.0  # already faster at the smallest swept DRAM


def test_compare_not_reached():
    c = compare([row(2, 5.0, "dense")], [row(2, 1.0), row(4, 2.0)])
    assert c[0].dram_reduction is None and c[0].gain == pytest.approx(-0.8)


def test_sweep_dense_rises_with_dram_and_reuses_replays():
    tr = tiny_trace()
    base = SimConfig(device="a18", warmup=4)
    cfgs = expand_variants(base, ["dense", "traced", "dip-ca"], ["lfu", "belady"], [0.2])
    assert [(c.method, c.policy) for c in cfgs] == [("dense", "static"), ("traced", "lfu"), ("traced", "belady"),
                                                     ("dip-ca", "lfu")]
    budgets = auto_budgets(tr, base, 4)
    rows = sweep(tr, cfgs, budgets)
    dense = [r.tok_s for r in rows if r.method == "dense"]
    assert dense == sorted(dense) and len(rows) == 16
    assert rows[-1].memory["cache_fraction"] == pytest.approx(1.0)


def test_sizes():
    assert parse_size("4GB") == 4e9 and parse_size("1GiB") == 2**30 and parse_size("2e9") == 2e9
    assert parse_range("1GB..3GB", 3) == [1e9, 2e9, 3e9]
    with pytest.raises(ValueError, match="e.g. 4GB"):
        parse_size("four gigs")
    with pytest.raises(ValueError, match="A..B"):
        parse_range("1GB-3GB", 3)


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setattr("dipdeploy.cli.sim.console", Console(width=200))


def test_cli_simulate_json_and_plot(tmp_path):
    path = tiny_trace().save(tmp_path / "t.npz")
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = ["simulate", "--trace", str(path), "--device", "sd8gen3", "--sweep-dram", "auto", "--steps", "3",
            "--method", "dense,traced,dip-ca", "--policy", "lfu", "--gamma", "0.2", "--warmup", "4",
            "--json", str(out), "--plot", str(png)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert (doc["schema"], doc["schema_version"]) == ("dipdeploy.simulate", 1)
    rows = doc["rows"]
    assert len(rows) == 9 and JSON_KEYS <= set(rows[0])
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "vs dense-static" in res.output
    again = CliRunner().invoke(app, args)
    assert again.exit_code != 0 and "--force" in again.output


def test_cli_projection_says_extrapolated(tmp_path):
    path = tiny_trace(8).save(tmp_path / "t.npz")
    res = CliRunner().invoke(app, ["simulate", "--trace", str(path), "--model", "smollm2-135m", "--dram", "60MB",
                                   "--device", "a18"])
    assert res.exit_code == 0, res.output
    assert "extrapolated" in res.output


def test_cli_devices_and_dense_without_trace():
    r = CliRunner().invoke(app, ["devices"])
    assert r.exit_code == 0 and "a18-paper" in r.output
    r = CliRunner().invoke(app, ["simulate", "--model", "phi-3-medium", "--method", "dense", "--policy", "static",
                                 "--device", "a18-paper", "--dram", "4GB"])
    assert r.exit_code == 0 and "0.283" in r.output


def test_cli_accepts_a_runtime_trace_and_shows_its_hit_rate(tmp_path):
    tr = tiny_trace(8)
    tr.source, tr.policy = "runtime", "lfu"
    tr.hits_in = [(s % 2 == 0) for s in tr.sel_in]
    tr.hits_glu = [(s % 2 == 0) for s in tr.sel_glu]
    path = tr.save(tmp_path / "rt.npz")
    res = CliRunner().invoke(app, ["simulate", "--trace", str(path), "--device", "midrange", "--policy", "lfu"])
    assert res.exit_code == 0, res.output
    assert "hit rate recorded in the trace (runtime, policy lfu)" in res.output
