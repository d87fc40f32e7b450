"""`dipdeploy bench simulate`: a trace through the HW simulator over devices, shapes, variants and a DRAM
sweep, one row per point of each curve, each variant against dense-static at the same budget; traces of a
registry model recorded once into the trace cache and reused; bad input refused in one line (exit 2)
before any trace is recorded; every count bounded. Behaviour only: no timings."""

import json
from functools import partial

import pytest

from dipdeploy.bench.simulate import MAX_SIMULATIONS, MAX_STEPS
from bench_helpers import bench, one_line_refusal

SYNTH = ["--trace", "synthetic", "--source", "tiny-llama", "--quick"]
_sim = partial(bench, "simulate")


@pytest.mark.parametrize("args, words", [
    (["--method", "dip,dip-ca"], ["--method needs dense"]),
    (["--method", "teal"], ["--method 'teal'", "dense, dip, dip-ca"]),
    (["--device", "nokia-3310"], ["nokia-3310"]),
    (["-m", "no-such-model"], ["no-such-model", "not a registry model"]),
    (["--steps", "1"], ["--steps", ">= 2"]),
    (["--steps", str(MAX_STEPS + 1)], ["--steps", "cap"]),
    (["--tokens", "0"], ["--tokens", ">= 1"]),
    (["--precision", "fp3"], ["precision 'fp3' unknown"]),
    (["--gamma", "2"], ["--gamma"]),
    (["--policy", "random"], ["policy 'random' unknown"]),
    (["--density", "0.5"], ["--density picks the traces", "one or the other"]),
    (["-o", "xml"], ["-o 'xml'"]),
    (["--device", "a18,a18-paper,sd8gen3,midrange,laptop-nvme", "--precision", "bq4,fp16,fp32,vq3",
      "--policy", "lru,lfu", "--gamma", "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8", "--steps", "101"],
     ["the grid runs", f"cap of {MAX_SIMULATIONS}"]),
])
def test_bad_input_is_one_line_and_exit_2(args, words):
    one_line_refusal(_sim(*SYNTH, *args), *words)


def test_a_missing_trace_file_and_source_are_refused_before_any_recording(tmp_path):
    one_line_refusal(_sim("--trace", str(tmp_path / "none.npz")), "--trace")
    one_line_refusal(_sim("--source", "no-such-model", "--trace-cache", str(tmp_path / "t")), "no-such-model")
    assert not (tmp_path / "t").exists()


def test_each_variant_is_a_curve_over_the_sweep_against_dense_static():
    res = _sim(*SYNTH, "--device", "a18,sd8gen3", "--policy", "lru,lfu", "--gamma", "0.2", "-o", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    rows = out["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    assert methods == ["dense-static", "dip lru", "dip lfu", "dip-ca lru γ0.2", "dip-ca lfu γ0.2"]
    assert len(rows) == 2 * len(methods) * 5  # devices × variants × --quick's 5 budgets
    for device in ("a18", "sd8gen3"):
        mine = [r for r in rows if r["device"] == device]
        budgets = sorted({r["dram_gb"] for r in mine})
        assert len(budgets) == 5 and all(r["gain"] is None for r in mine if r["method"] == "dense-static")
        dense = {r["dram_gb"]: r["tok_s"] for r in mine if r["method"] == "dense-static"}
        for r in mine:
            if r["method"] != "dense-static":
                assert r["gain"] == pytest.approx(r["tok_s"] / dense[r["dram_gb"]] - 1)
    assert all(r["tok_s"] > 0 and 0 <= r["hit_rate"] <= 1 and r["model"] == "tiny-llama" for r in rows)
    assert "--steps 5" in out["header"]["command"] and out["header"]["machine"]["cpu"]
    from test_json_docs import documented

    doc = documented()["dipdeploy.bench.simulate"]
    assert set(rows[0]) == set(doc["rows"]) and set(out["header"]) == set(doc["header"])


def test_a_larger_shape_is_an_extrapolation_and_says_so():
    res = _sim(*SYNTH, "-m", "tiny-llama,smollm2-135m", "--method", "dense,dip", "--steps", "3")
    assert res.exit_code == 0, res.output
    table = [line for line in res.stdout.splitlines() if line.startswith("| ") and "GB" not in line]
    assert sum("smollm2-135m (extrap.) | a18 | dip lfu" in line for line in table) == 3  # the trace's pattern
    assert sum(line.startswith("| smollm2-135m | a18 | dense-static") for line in table) == 3  # no pattern: its own
    assert sum(line.startswith("| tiny-llama |") for line in table) == 6


def test_a_trace_is_recorded_once_and_reused(tmp_path, data_dir):
    cache = tmp_path / "traces"
    args = ["--source", "tiny-llama", "--density", "0.5", "--trace-cache", str(cache), "--data-dir", str(data_dir),
            "--quick", "--method", "dense,dip", "-o", "csv"]
    res = _sim(*args)
    assert res.exit_code == 0, res.output
    assert "recording a DIP trace of tiny-llama" in res.stderr
    assert [p.name for p in cache.iterdir()] == ["tiny-llama-dip-0.5.npz"]
    again = _sim(*args)
    assert again.exit_code == 0 and "recording" not in again.stderr and again.stdout.count("\n") == 11  # head + 10


def test_the_published_scenario_holds_the_scripts_flags():
    from pathlib import Path

    from dipdeploy.bench.scenario import load

    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "scenarios"
    sc = load(folder / "simulate-smollm2.toml")
    assert sc.suite == "simulate" and sc.published.endswith("results/simulate.md")
    assert sc.value("steps", None) == 9 and sc.value("policy", None) == ["lru", "lfu", "belady"]
    assert sc.value("steps", 3) == 3  # the command line wins
    assert load(folder / "simulate-qwen2.5-coder-1.5b.toml").value("trace", None) == ["build/qwen15-dipca-trace.npz"]
