"""`dipdeploy bench`: the grid's comma lists expand to every combination in flag order, repetitions run
round-robin, every count is bounded and bad input is refused in one line (exit 2) before any work, the
one row schema is written as markdown, CSV and JSON naming the machine, --output is written atomically
and never clobbered without --force, and a tiny end-to-end decode run gives a pp and a tg row per
configuration. Behaviour only: no test reads a timing."""

import csv
import dataclasses
import io
import json
from functools import partial

import pytest

from dipdeploy.bench import grid as g
from dipdeploy.bench.bundles import BundleSpec, cache_folder, ensure, plan_density, specs_for
from dipdeploy.bench.machine import flags_summary, machine
from dipdeploy.bench.rows import FORMATS, Row, Sample, mean_std, render, row
from dipdeploy.cli import app
from bench_helpers import bench, one_line_refusal, runner

TINY = ["-p", "8", "-n", "4", "-r", "1"]
_bench = partial(bench, "decode")


# --- the grid ---------------------------------------------------------------------------------------

def test_comma_lists_and_repeated_flags_expand_in_order_without_repeats():
    assert g.split(["50%,100%", "25%", "50%"], "--budget") == ["50%", "100%", "25%"]
    assert g.split(None, "--io") == []
    assert g.ints(["0,64", "512"], "-p", 0, g.MAX_PROMPT, "tokens") == [0, 64, 512]
    assert g.densities(["0.5,1"]) == [0.5, 1.0]
    assert g.budgets(["50%, 120MB"]) == ["50%", "120MB"]


def test_cases_are_the_product_in_flag_order_and_repetitions_round_robin():
    specs = [BundleSpec("m", "dense", 1.0, "a"), BundleSpec("m", "dip-ca", 0.5, "b")]
    grid = g.DecodeGrid(models=["m"], budgets=["50%", "100%"], ios=["mmap"], threads=[1, 2])
    cases = grid.cases(specs)
    assert [c.key()[:6] for c in cases][:3] == [("m", "dense", 1.0, "50%", "mmap", 1),
                                                ("m", "dense", 1.0, "50%", "mmap", 2),
                                                ("m", "dense", 1.0, "100%", "mmap", 1)]
    assert len(cases) == 8
    assert g.order(3, 2) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_tests_are_llama_bench_rows_and_zero_leaves_one_out():
    grid = g.DecodeGrid(models=["m"], n_prompt=[0, 16], n_gen=[8])
    assert grid.tests() == [("pp", 16), ("tg", 8)]
    with pytest.raises(ValueError, match="nothing to measure"):
        g.DecodeGrid(models=["m"], n_prompt=[0], n_gen=[0])


def test_a_model_gives_one_bundle_per_method_and_density_and_dense_once(tmp_path):
    specs = specs_for("tiny-llama", ("dense", "dip", "dip-ca"), (0.5, 0.25), tmp_path, "bq4")
    assert [(s.method, s.density) for s in specs] == [("dense", 1.0), ("dip", 0.5), ("dip", 0.25),
                                                      ("dip-ca", 0.5), ("dip-ca", 0.25)]
    assert specs[0].policy == "static" and all(s.policy is None for s in specs[1:])
    dense = cache_folder(tmp_path, "tiny-llama", "dense", 1.0, "bq4")
    assert specs[0].path == dense == tmp_path / "tiny-llama-dense-bq4"
    assert specs[3].path.name == "tiny-llama-dip-ca-r0.5-bq4"


def test_plan_density_counts_up_and_gate_twice():
    plan = {"hidden_size": 8, "intermediate_size": 16, "layers": [{"k_in": 4, "k_glu": 16}]}
    assert plan_density(plan) == round((2 * 0.5 + 1.0) / 3, 4)


# --- refusals: one line, exit 2, before any work ----------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["-m", "tiny-llama", "-r", "0"], ["-r/--repetitions", ">= 1"]),
    (["-m", "tiny-llama", "-r", str(g.MAX_REPETITIONS + 1)], ["cap of 100"]),
    (["-m", "tiny-llama", "-n", str(g.MAX_GEN + 1)], ["-n/--n-gen", "cap"]),
    (["-m", "tiny-llama", "-p", "-1"], ["-p/--n-prompt", ">= 0"]),
    (["-m", "tiny-llama", "-p", "many"], ["-p/--n-prompt", "whole numbers"]),
    (["-m", "tiny-llama", "-t", "0"], ["-t/--threads"]),
    (["-m", "tiny-llama", "-t", "100000"], ["-t/--threads", "cap"]),
    (["-m", "tiny-llama", "--budget", "150%"], ["--budget 150%"]),
    (["-m", "tiny-llama", "--budget", "lots"], ["--budget lots", "not a size"]),
    (["-m", "tiny-llama", "--budget", "50%,,100%"], ["empty item"]),
    (["-m", "tiny-llama", "--method", "dense,teal"], ["--method 'teal'", "dense, dip, dip-ca"]),
    (["-m", "tiny-llama", "--density", "1.5"], ["--density", "(0, 1]"]),
    (["-m", "tiny-llama", "--io", "floppy"], ["--io 'floppy'"]),
    (["-m", "tiny-llama", "--quant", "int2"], ["--quant 'int2'"]),
    (["-m", "tiny-llama", "-o", "xml"], ["-o 'xml'", "md, csv, json"]),
    (["-m", "no-such-model"], ["-m no-such-model", "neither a bundle"]),
    ([], ["give a model"]),
    (["-m", "tiny-llama", "--budget", ",".join(f"{i}%" for i in range(g.MAX_VALUES + 1))], ["--budget", "cap"]),
    (["-m", "tiny-llama", "--budget", ",".join(f"{i}%" for i in range(30)), "--density", "0.1,0.2,0.3,0.4,0.5",
      "-r", "20"], ["the grid runs", "cap of 2000"]),
    (["-m", "tiny-llama", "-r", "x"], ["-r"]),
])
def test_bad_input_is_one_line_and_exit_2(args, words, tmp_path):
    one_line_refusal(_bench(*args, "--bundle-cache", str(tmp_path / "cache")), *words)
    assert not (tmp_path / "cache").exists()  # refused before any export


def test_an_existing_output_is_refused_without_force_before_the_work(tmp_path):
    out = tmp_path / "rows.md"
    out.write_text("earlier results")
    one_line_refusal(_bench("-m", "tiny-llama", "--output", str(out), "--bundle-cache", str(tmp_path / "c")),
                      "exists", "--force")
    assert out.read_text() == "earlier results" and not (tmp_path / "c").exists()


def test_a_cached_folder_of_another_export_is_refused_not_overwritten(tmp_path, tiny_dipca_bundle):
    import shutil

    spec = specs_for("tiny-llama", ("dip",), (0.5,), tmp_path, "bq4")[0]
    shutil.copytree(tiny_dipca_bundle(), spec.path)  # a DIP-CA bundle where the DIP one belongs
    with pytest.raises(FileExistsError, match="another export"):
        ensure(spec)


# --- rows and formats -------------------------------------------------------------------------------

def _rows():
    labels = dict(model="tiny-llama", method="dip-ca", density=0.5, budget="50%", io="auto", threads=1)
    return [row(labels, "pp8", [Sample(100.0, 0.1, None, None, "mmap"), Sample(110.0, 0.1, None, None, "mmap")]),
            row(labels, "tg4", [Sample(10.0, 0.2, 0.5, 0.75, "direct")])]


def _header():
    m = machine()
    return {"suite": "decode", "command": "dipdeploy bench decode -m tiny-llama",
            "machine": {**m.as_dict(), "line": m.line()}}


def test_mean_and_sample_std_as_llama_bench():
    assert mean_std([2.0]) == (2.0, 0.0)
    mean, std = mean_std([1.0, 3.0])
    assert mean == 2.0 and std == pytest.approx(2 ** 0.5)
    pp, tg = _rows()
    assert pp.tok_s == 105.0 and pp.repetitions == 2 and pp.io_used == "mmap" and pp.hit_rate is None
    assert tg.device_mb_per_token == 0.5 and tg.hit_rate == 0.75


def test_a_figure_missing_from_one_repetition_is_left_empty():
    labels = dict(model="m", method="dip", density=0.5, budget="50%", io="auto", threads=1)
    r = row(labels, "tg4", [Sample(1.0, hit_rate=0.5), Sample(1.0, hit_rate=None)])
    assert r.hit_rate is None


def test_every_format_names_the_machine_and_holds_every_row():
    rows, header = _rows(), _header()
    cpu = header["machine"]["cpu"]
    md = render(rows, header, "md")
    assert md.startswith("`dipdeploy bench decode -m tiny-llama`") and f"machine: {cpu}" in md
    table = [line for line in md.splitlines() if line.startswith("| tiny-llama")]
    assert len(table) == 2 and "105.00 ± 7.07" in table[0] and "auto→mmap" in table[0] and "auto→direct" in table[1]
    parsed = list(csv.DictReader(io.StringIO(render(rows, header, "csv"))))
    assert [r["test"] for r in parsed] == ["pp8", "tg4"] and all(r["machine_cpu"] == cpu for r in parsed)
    assert parsed[0]["hit_rate"] == "" and float(parsed[1]["hit_rate"]) == 0.75
    js = json.loads(render(rows, header, "json"))
    assert js["header"]["machine"]["cpu"] == cpu and [r["test"] for r in js["rows"]] == ["pp8", "tg4"]
    assert "load at the end" not in md  # only a run's header has it
    assert set(js["rows"][0]) == {f.name for f in dataclasses.fields(Row)}
    assert FORMATS == ("md", "csv", "json")


def test_the_machine_record():
    m = machine()
    assert m.cores >= 1 and m.python and m.date.endswith("Z") and m.git
    assert flags_summary("fpu avx2 sse avx512f asimd") == "avx2 avx512f asimd"
    assert m.cpu in m.line() and m.onnxruntime in m.line()


# --- end to end on the tiny model -------------------------------------------------------------------

def test_decode_on_a_bundle_folder_gives_a_pp_and_a_tg_row_per_configuration(tiny_dipca_bundle):
    res = _bench("-m", str(tiny_dipca_bundle()), "--budget", "25%,100%", "-r", "2", "-p", "8", "-n", "4",
                 "--io", "mmap", "-o", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    rows = out["rows"]
    assert [(r["budget"], r["test"]) for r in rows] == [("25%", "pp8"), ("25%", "tg4"),
                                                        ("100%", "pp8"), ("100%", "tg4")]
    assert all(r["method"] == "dip-ca" and r["repetitions"] == 2 and r["tok_s"] > 0 for r in rows)
    assert rows[1]["hit_rate"] is not None and rows[0]["hit_rate"] is None  # a decode figure only
    assert out["header"]["machine"]["cpu"] and "-r 2" in out["header"]["command"]
    assert out["header"]["load_1min_end"] >= 0 and out["header"]["machine"]["load_1min"] >= 0
    progress = [line for line in res.stderr.splitlines() if line.startswith("[")]
    assert [line.split(":")[1].split(",")[1].strip() for line in progress] == [
        "budget 25%", "budget 100%", "budget 25%", "budget 100%"]  # round-robin, not both 25% first
    assert res.stderr.splitlines()[0].startswith("machine: ")


def test_decode_exports_a_model_once_per_method_and_reuses_it(tmp_path):
    cache = tmp_path / "cache"
    args = ["-m", "tiny-llama", "--method", "dense,dip-ca", "--density", "0.5", "--bundle-cache", str(cache)]
    res = _bench(*args, *TINY, "-o", "csv")
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [(r["method"], r["density"], r["test"]) for r in rows] == [
        ("dense", "1.0", "pp8"), ("dense", "1.0", "tg4"), ("dip-ca", "0.5", "pp8"), ("dip-ca", "0.5", "tg4")]
    assert sorted(p.name for p in cache.iterdir()) == ["tiny-llama-dense-bq4", "tiny-llama-dip-ca-r0.5-bq4"]
    again = _bench(*args, "--quick", "-n", "0", "-p", "8")
    assert again.exit_code == 0, again.output
    assert "exporting" not in again.stderr, again.stderr
    assert "| tg" not in again.stdout and again.stdout.count("| pp8 |") == 2


def test_output_is_written_atomically_and_replaced_only_with_force(tmp_path, tiny_dipca_bundle):
    out = tmp_path / "rows.json"
    base = ["-m", str(tiny_dipca_bundle()), *TINY, "--io", "mmap", "--output", str(out)]
    res = _bench(*base)
    assert res.exit_code == 0, res.output
    assert res.stdout == "" and json.loads(out.read_text())["rows"]  # the suffix chose JSON
    assert [p.name for p in tmp_path.iterdir()] == ["rows.json"]  # no temporary file left
    first = out.read_text()
    one_line_refusal(_bench(*base), "exists", "--force")
    assert out.read_text() == first
    res = _bench(*base, "--force", "-o", "md")
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith("`dipdeploy bench decode") and out.read_text() != first


@pytest.mark.parametrize("suite", ["decode", "memory"])
def test_help_lists_the_suites_and_each_fits_80_columns(suite):
    res = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "100"})
    assert res.exit_code == 0 and "decode" in res.output and "memory" in res.output and "Planned" in res.output
    res = runner.invoke(app, ["bench", suite, "--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0
    assert all(len(line) <= 80 for line in res.output.splitlines())
    for name in ("--model", "--method", "--density", "--budget", "--io", "--threads", "--n-prompt", "--n-gen",
                 "--repetitions", "--quick", "--output", "--force", "--format", "--scenario"):
        assert name in res.output
    assert "--limit" in res.output and ("--cold" in res.output) == (suite == "decode")


# --- scenario files ---------------------------------------------------------------------------------

def _scenario(tmp_path, text):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


def test_the_published_scenario_holds_the_showcase_flags():
    from pathlib import Path

    from dipdeploy.bench.scenario import load

    sc = load(Path(__file__).resolve().parents[1] / "benchmarks" / "scenarios" / "decode-smollm2.toml")
    assert sc.suite == "decode" and sc.value("model", None) == ["smollm2-135m"]
    assert sc.value("method", []) == ["dense", "dip-ca"] and sc.value("budget", None) == ["50%", "100%"]
    assert sc.value("repetitions", None) == 3 and sc.value("budget", ["25%"]) == ["25%"]  # the command line wins


@pytest.mark.parametrize("text, words", [
    ('suite = "decode"\nflavour = 1\n', ["unknown keys flavour"]),
    ('suite = "decode"\n[flags]\npeers = "llama.cpp"\n', ["flags peers", "not options of `bench decode`"]),
    ('suite = "profile"\n', ["suite = 'profile'", "not one of decode"]),  # a planned suite
    ('suite = "decode"\n[flags]\nrepetitions = "3"\n', ["flags.repetitions", "whole number"]),
    ('suite = "decode"\n[flags]\nbudget = []\n', ["flags.budget"]),
    ('suite = "decode"\n[flags\n', ["not UTF-8 TOML"]),
])
def test_a_bad_scenario_is_refused_in_one_line(tmp_path, text, words):
    path = _scenario(tmp_path, text)
    for args in (["bench", "decode", "--scenario", str(path)], ["bench", "--scenario", str(path)]):
        one_line_refusal(runner.invoke(app, args), *words)


def test_a_scenario_runs_alone_or_under_its_suite_and_the_command_line_wins(tmp_path, tiny_dipca_bundle):
    path = _scenario(tmp_path, f'suite = "decode"\ntitle = "a tiny table"\n[flags]\nmodel = "{tiny_dipca_bundle()}"\n'
                               'io = "mmap"\nn_prompt = 8\nn_gen = [4]\nrepetitions = 1\nbudget = ["25%", "50%"]\n')
    res = runner.invoke(app, ["bench", "--scenario", str(path)])
    assert res.exit_code == 0, res.output
    assert f"scenario `{path}`: a tiny table" in res.stdout and res.stdout.count("| tg4 |") == 2
    res = runner.invoke(app, ["bench", "decode", "--scenario", str(path), "--budget", "100%", "-o", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {r["budget"] for r in out["rows"]} == {"100%"} and out["header"]["scenario"]["title"] == "a tiny table"
    one_line_refusal(runner.invoke(app, ["bench", "--scenario", str(path), "decode"]), "give --scenario after")


# --- the memory suite -------------------------------------------------------------------------------

def test_limits_parse_and_a_bad_one_is_refused_in_one_line(tmp_path):
    from dipdeploy.bench.memory import parse_limit

    assert parse_limit("none") is None and parse_limit("300MB") == 300 * 10**6 and parse_limit("1GiB") == 2**30
    one_line_refusal(runner.invoke(app, ["bench", "memory", "-m", "tiny-llama", "--limit", "lots",
                                          "--bundle-cache", str(tmp_path / "c")]), "--limit lots")
    one_line_refusal(runner.invoke(app, ["bench", "memory", "-m", "tiny-llama", "--limit", "0MB",
                                          "--bundle-cache", str(tmp_path / "c")]), "above 0")
    assert not (tmp_path / "c").exists()


def test_memory_rows_keep_the_largest_peak_and_say_how_many_runs_finished():
    from dipdeploy.bench.memory import Run, aggregate

    labels = dict(model="m", method="dip-ca", density=0.5, budget="50%", io="auto", threads=1, limit="200MB")
    r = aggregate(labels, "pp8+tg4", [Run("ok", planned_mb=1.0, peak_rss_mb=5.0, cgroup_peak_mb=4.0, limit_hits=0,
                                          decode_tok_s=2.0, io_used="direct"),
                                      Run("ok", planned_mb=1.0, peak_rss_mb=6.0, cgroup_peak_mb=3.0, limit_hits=2,
                                          decode_tok_s=4.0, io_used="direct")])
    assert (r.status, r.peak_rss_mb, r.cgroup_peak_mb, r.limit_hits, r.decode_tok_s) == ("ok", 6.0, 4.0, 2, 3.0)
    mixed = aggregate(labels, "pp8+tg4", [Run("ok", decode_tok_s=2.0), Run("killed", why="exit -9")])
    assert mixed.status == "1/2 ok" and mixed.decode_tok_s == 2.0
    assert aggregate(labels, "pp8+tg4", [Run("refused", why="no room")]).decode_tok_s is None


def test_memory_runs_each_configuration_in_a_process_and_a_group_of_its_own(tiny_dipca_bundle):
    from dipdeploy.bench.cgroup import probe

    groups = probe() is None
    limits = "none,10MB" if groups else "none"
    res = runner.invoke(app, ["bench", "memory", "-m", str(tiny_dipca_bundle()), "--limit", limits, "-p", "8",
                              "-n", "4", "--io", "mmap", "-o", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert rows[0]["status"] == "ok" and rows[0]["test"] == "pp8+tg4" and rows[0]["limit"] == "none"
    assert rows[0]["planned_mb"] > 0 and rows[0]["peak_rss_mb"] > 0 and rows[0]["decode_tok_s"] > 0
    assert (rows[0]["cgroup_peak_mb"] is not None) == groups
    if groups:  # a limit near the interpreter's own pages: killed by it, or refused by the engine's check
        assert rows[1]["status"] in ("killed", "refused") and rows[1]["limit"] == "10MB"
        assert rows[1]["decode_tok_s"] is None and rows[1]["status"] in json.loads(res.stdout)["header"]["notes"][0]


def test_an_interrupt_keeps_the_rows_measured_and_exits_130(tiny_dipca_bundle, monkeypatch, tmp_path):
    from dipdeploy.bench import decode

    real, calls = decode.measure, []

    def measure(case, grid):
        calls.append(case)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(case, grid)

    monkeypatch.setattr(decode, "measure", measure)
    out = tmp_path / "partial.json"
    res = _bench("-m", str(tiny_dipca_bundle()), "--budget", "25%,100%", "-r", "2", "-p", "8", "-n", "4",
                 "--io", "mmap", "--output", str(out))
    assert res.exit_code == 130, res.output
    js = json.loads(out.read_text())
    assert js["header"]["interrupted"] is True
    assert [(r["budget"], r["test"], r["repetitions"]) for r in js["rows"]] == [
        ("25%", "pp8", 1), ("25%", "tg4", 1), ("100%", "pp8", 1), ("100%", "tg4", 1)]


def test_cold_is_a_switch_of_the_command_line_or_the_scenario(tmp_path, tiny_dipca_bundle):
    from dipdeploy.bench.scenario import load

    sc = load(_scenario(tmp_path, 'suite = "decode"\n[flags]\ncold = true\n'))
    assert sc.value("cold", False) is True
    assert load(_scenario(tmp_path, 'suite = "decode"\n')).value("cold", True) is True
    one_line_refusal(runner.invoke(app, ["bench", "decode", "--scenario",
                                          str(_scenario(tmp_path, 'suite = "decode"\n[flags]\ncold = 1\n'))]),
                      "flags.cold", "boolean")
    res = _bench("-m", str(tiny_dipca_bundle()), *TINY, "--io", "mmap", "--cold", "-o", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["header"]["command"].endswith("--cold") and len(json.loads(res.stdout)["rows"]) == 2


def test_decode_under_a_limit_runs_each_repetition_in_a_limited_group_and_counts_what_failed(tiny_dipca_bundle):
    from dipdeploy.bench.cgroup import probe

    args = ["-m", str(tiny_dipca_bundle()), "-p", "8", "-n", "4", "-r", "2", "--io", "mmap"]
    if probe() is not None:  # no rights to make a group: a limit is refused before any work
        one_line_refusal(_bench(*args, "--limit", "500MB"), "--limit needs a cgroup")
        return
    res = _bench(*args, "--limit", "500MB,10MB", "-o", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [(r["limit"], r["test"], r["repetitions"], r["failed"]) for r in out["rows"]] == [
        ("500MB", "pp8", 2, 0), ("500MB", "tg4", 2, 0)]  # 10MB: every repetition killed or refused, no row
    assert all(0 < r["cgroup_peak_mb"] <= 500 and r["kept"] is None for r in out["rows"])  # no limit-none row
    assert len(out["header"]["notes"]) == 2 and all("limit 10MB" in n for n in out["header"]["notes"])
    assert "--limit 500MB,10MB" in out["header"]["command"]
    md = _bench(*args, "-r", "1", "--limit", "500MB")
    assert md.exit_code == 0, md.output
    assert "| limit |" in md.stdout and "| 500MB |" in md.stdout and "| failed |" not in md.stdout
    plain = _bench(*args, "-r", "1")
    assert "| limit |" not in plain.stdout  # the usual value: the column is left out of the markdown


def test_without_cgroup_rights_a_limit_is_refused_and_none_still_runs(tmp_path, monkeypatch, tiny_dipca_bundle):
    from dipdeploy.bench import cgroup

    monkeypatch.setattr(cgroup, "probe", lambda root=cgroup.ROOT: "cannot make a cgroup memory group (no rights)")
    for suite in ("decode", "memory"):
        res = runner.invoke(app, ["bench", suite, "-m", "tiny-llama", "--limit", "none,300MB",
                                  "--bundle-cache", str(tmp_path / "c")])
        one_line_refusal(res, "--limit needs a cgroup memory group", "no rights", "--limit none")
    assert not (tmp_path / "c").exists()
    res = runner.invoke(app, ["bench", "memory", "-m", str(tiny_dipca_bundle()), "-p", "8", "-n", "4", "--io", "mmap",
                              "-o", "json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)["rows"][0]
    assert row["status"] == "ok" and row["cgroup_peak_mb"] is None and row["peak_rss_mb"] > 0
