"""benchmarks/flash.py's run plan and goal lines: accuracy levels, budgets and variants as chosen, and the
ratios computed per level against the same peers; benchmarks/ceiling.py's ratio lines."""

from __future__ import annotations

import argparse

import pytest


@pytest.fixture()
def flash(benchmark_module):
    return benchmark_module("flash")


def _row(method, tok_s, budget="50%", level=None, variant=None):
    row = {"method": method, "budget": budget, "tok_s": tok_s}
    if level is not None:
        row["accuracy_level"] = level
    if variant:
        row["variant"] = variant
    return row


def test_configs_run_every_level_and_budget(flash):
    cfgs = flash.configs(False, ("direct",), budgets=("50%",), levels=(0, 4))
    limited = [(c["method"], c.get("accuracy_level")) for c in cfgs if c["limited"]]
    assert sorted(limited) == [("dense-static", 0), ("dense-static", 4), ("dip-ca", 0), ("dip-ca", 4)]
    assert all(c["budget"] == "50%" for c in cfgs)
    assert "accuracy_level" not in flash.configs(False, ("direct",))[0]  # the bundle's own level


def test_variant_configs_pick_by_label(flash):
    picked = flash.variant_configs(False, labels=("no read-ahead",), levels=(4,))
    assert {(c["method"], c["prefetch"], c["accuracy_level"]) for c in picked} == {
        ("dip-ca", False, 4), ("dense-static", False, 4)}
    assert flash.variant_configs(False, labels=()) == []
    assert flash.variant_configs(True) == []  # --quick runs none


def test_goals_per_level_against_the_same_peers(flash):
    rows = [_row("dip-ca", 3.0, level=0), _row("dense-static", 2.4, level=0),
            _row("dip-ca", 5.0, level=4), _row("dense-static", 4.0, level=4),
            _row("dip-ca", 5.5, level=4, variant="no read-ahead"),
            _row("dip-ca", 9.0, budget="50%, unlimited", level=4),
            _row(flash.PEERS[2], 2.0), _row(flash.PEERS[1], 1.0)]
    lines = flash.goals(rows)
    assert "- DIP-CA / dense-static at 50 %, accuracy level 0: 1.25× (goal ≥ 1.5×: not met)" in lines
    assert "- DIP-CA / the faster peer at the same limit, accuracy level 0: 1.50× (goal ≥ 2×: not met)" in lines
    assert "- DIP-CA / the faster peer at the same limit, accuracy level 4: 2.50× (goal ≥ 2×: met)" in lines
    assert any("(no read-ahead) / the fastest dense-static row (default) at 50 %, accuracy level 4: 1.38×" in x
               for x in lines)
    assert "- DIP-CA with no read-ahead / the faster peer at the same limit, accuracy level 4: 2.75×" in lines
    assert not any("DIP-CA with" in x and "level 0" in x for x in lines)  # the default row is the fastest there
    assert lines[-1] == f"- no decode figure at 50 % for: {flash.PEERS[0]} (see the notes)"


def test_goals_without_levels_keep_their_wording(flash):
    lines = flash.goals([_row("dip-ca", 3.0), _row("dense-static", 2.0)])
    assert lines[0] == "- DIP-CA / dense-static at 50 %: 1.50× (goal ≥ 1.5×: met)"


@pytest.mark.parametrize("parse, bad", [("_budgets", "120%"), ("_budgets", "half"), ("_levels", "2"),
                                        ("_variants", "γ 0.9"), ("positive_int", "0"), ("positive_int", "-2")])
def test_bad_options_name_the_fix(flash, parse, bad):
    with pytest.raises(argparse.ArgumentTypeError, match="give"):
        getattr(flash, parse)(bad)
    assert flash._levels("0,bundle,4") == (0, None, 4)


def test_ceiling_lines_pair_the_methods_per_model_and_level(benchmark_module):
    ceiling = benchmark_module("ceiling")
    rows = [dict(model="m", level=0, method="dip-ca", token_ms=100.0),
            dict(model="m", level=0, method="dense-static", token_ms=150.0),
            dict(model="m", level=4, method="dip-ca", error="exit 1")]
    assert ceiling.ceilings(rows) == [
        "- m, accuracy level 0: dense-static / DIP-CA with nothing read 1.50× (150 against 100 ms a token)"]


def test_median_rows_keep_each_run_and_the_failures(flash):
    peer = {"method": "llama.cpp", "budget": "50%", "error": "does not fit"}
    a = [_row("dip-ca", 3.0, level=4) | {"device_mb": 200.0}, peer]
    b = [_row("dip-ca", 5.0, level=4) | {"device_mb": 210.0}, peer]
    c = [{"method": "dip-ca", "budget": "50%", "accuracy_level": 4, "error": "exit -9"}, peer]
    rows = flash.median_rows([a, b, c])
    assert rows[0]["tok_s"] == 4.0 and rows[0]["device_mb"] == 205.0 and rows[0]["repeats"] == 2
    assert rows[0]["tok_s_runs"] == "3.00 / 5.00" and "error" not in rows[0]
    assert rows[0]["failed_runs"] == "1 of 3 runs failed (exit -9)"  # the table's notes say so
    assert rows[1]["error"] == "does not fit" and rows[1]["repeats"] == 0 and "failed_runs" not in rows[1]
    assert rows[0]["accuracy_level"] == 4 and type(rows[0]["accuracy_level"]) is int  # a setting, not a median


def test_two_runs_keep_their_settings_whole(flash):
    """The median of two ints is a float; a setting both runs share (the accuracy level) stays an int, so the
    Goals lines say "accuracy level 0", not "0.0"."""
    rows = flash.median_rows([[_row("dip-ca", 3.0, level=0) | {"requests": 4000}],
                              [_row("dip-ca", 5.0, level=0) | {"requests": 4001}]])
    assert type(rows[0]["accuracy_level"]) is int and rows[0]["accuracy_level"] == 0
    assert rows[0]["tok_s"] == 4.0 and rows[0]["requests"] == 4000.5


def test_belady_grant_covers_its_next_use_tables(flash):
    """The limit's grant for Belady equals what it holds per group: the recorded selections and the next-use
    table built from them, which the native cache step reads in place (no copy)."""
    import types

    import numpy as np

    from dipdeploy.cache.policies import RowCache

    rng = np.random.default_rng(0)
    steps, shapes = 11, ((24, 6), (40, 9))  # (rows, K) of a layer's up|gate and down groups
    eng = types.SimpleNamespace(slabs=[tuple(types.SimpleNamespace(rows=r, k=k) for r, k in shapes)] * 3)
    futures = [np.stack([rng.choice(r, k, replace=False) for _ in range(steps)]).astype(np.int64) for r, k in shapes]
    tables = [RowCache(r, r // 2, "belady", future=f) for (r, _), f in zip(shapes, futures)]
    held = sum(c._next_use.nbytes + f.nbytes for c, f in zip(tables, futures))
    assert np.shares_memory(np.ascontiguousarray(tables[0]._next_use[:, 0, :], dtype=np.int32), tables[0]._next_use)
    assert flash.belady_table_bytes(eng, steps) == 3 * held


def test_one_budget_plot_with_nothing_decoded_writes_nothing(flash, tmp_path):
    rows = [{"method": "dip-ca", "budget": "50%", "limit_mb": 700.0, "error": "killed at the memory limit"},
            {"method": flash.PEERS[0], "budget": "50%", "limit_mb": 700.0, "error": "does not fit"}]
    flash.plot_1b(rows, tmp_path / "bars.png")
    assert not (tmp_path / "bars.png").exists()


def test_error_lines_name_the_configuration(flash):
    assert flash._label({"method": "dip-ca", "variant": "dip belady"}) == "dip-ca dip belady"
    assert flash._label({"method": "dense-static", "accuracy_level": 4}) == "dense-static level 4"
    assert flash._label({"method": "dip-ca", "variant": "no read-ahead", "accuracy_level": 0}) == \
        "dip-ca no read-ahead level 0"


def _smollm2_section(flash, tmp_path, monkeypatch, fake_run, *extra: str) -> None:
    """Run flash.py's SmolLM2 section at 50 %, --io direct, with ``fake_run`` for each child; the table is t.md."""
    monkeypatch.setattr(flash, "run_in_group", fake_run)
    monkeypatch.setattr(flash, "ensure_bundles", lambda model, orders: {
        (m, o): tmp_path for m in ("dip-ca", "dense-static") for o in orders})
    monkeypatch.setattr(flash, "storage", lambda path: "disk")
    monkeypatch.setattr(flash, "lscpu", lambda: "cpu")
    monkeypatch.setattr(flash, "plot", lambda rows, path, model: None)
    monkeypatch.setattr(flash, "RESULTS", tmp_path)
    monkeypatch.setattr("sys.argv", ["flash.py", "--io", "direct", "--budgets", "50%", "--variants", "none",
                                     "--no-thread-sweep", *extra, "--name", "t"])
    flash.main()


def test_the_smollm2_section_runs_every_configuration_per_repeat_and_gives_medians(flash, tmp_path, monkeypatch):
    """``--repeats`` on the SmolLM2 section: each configuration once per repeat, in the same order, and
    the table the medians with each run's tok/s."""
    speeds = iter([10.0, 20.0, 30.0, 40.0,  # repeat 1: dip-ca limited, unlimited; dense-static the same
                   12.0, 22.0, None, 42.0, 11.0, 21.0, 31.0, 41.0])
    run = []

    def fake_run(spec, timeout, cmd=None):
        run.append((spec["method"], spec["limited"]))
        tok_s = next(speeds)
        if tok_s is None:
            return {"error": "killed at the memory limit"}
        return {"tok_s": tok_s, "wanted_mb": 1.0, "device_mb": 2.0, "requests": 3.0}

    _smollm2_section(flash, tmp_path, monkeypatch, fake_run, "--repeats", "3")
    assert run == [("dip-ca", True), ("dip-ca", False), ("dense-static", True), ("dense-static", False)] * 3
    text = (tmp_path / "t.md").read_text()
    assert "3 interleaved repeats" in text and "| tok_s | tok_s_runs |" in text
    assert "| 11 | 10.00 / 12.00 / 11.00 |" in text and "| 41 | 40.00 / 42.00 / 41.00 |" in text
    assert "| 30.5 | 30.00 / 31.00 |" in text  # the killed run left out of the median, and said why:
    assert "- dense-static direct 50%: 1 of 3 runs failed (killed at the memory limit)" in text


def test_problem_lines_name_each_failure_once_in_both_sections(flash):
    rows = [{"method": "dip-ca", "io": "direct", "budget": "50%", "tok_s": 9.0, "note": "--io direct: fell back"},
            {"method": "dip-ca", "io": "direct", "budget": "25%", "error": "exit -9\n  killed", "note": "--io direct: fell back"},
            {"method": "dense-static", "io": "direct", "budget": "50%", "accuracy_level": 4, "tok_s": 8.0,
             "failed_runs": "1 of 3 runs failed (exit -9)"},
            {"method": "llama.cpp", "budget": "50%", "error": "does not fit"}]
    assert flash.problem_lines(rows, ("io", "budget")) == [
        "- --io direct: fell back",  # once, however many rows carry it
        "- dip-ca direct 25%: exit -9 killed",
        "- llama.cpp 50%: does not fit",  # a key a row lacks is left out of its name
        "- dense-static level 4 direct 50%: 1 of 3 runs failed (exit -9)"]


def test_one_run_of_the_smollm2_section_lists_a_failed_configuration(flash, tmp_path, monkeypatch):
    def fake_run(spec, timeout, cmd=None):
        if spec["method"] == "dense-static" and spec["limited"]:
            return {"error": "killed at\nthe memory limit"}
        return {"tok_s": 10.0, "wanted_mb": 1.0, "device_mb": 2.0, "requests": 3.0}

    _smollm2_section(flash, tmp_path, monkeypatch, fake_run)
    text = (tmp_path / "t.md").read_text()
    assert "tok_s_runs" not in text and "interleaved" not in text
    assert "- dense-static direct 50%: killed at the memory limit" in text


def test_one_budget_smollm2_plot_is_bars_per_configuration(flash, tmp_path, monkeypatch):
    rows = [{"method": m, "budget": "50%", "limit_mb": 150.0, "tok_s": t, "device_mb": d, "io": "direct",
             "row_order": "natural", "accuracy_level": lv}
            for m, t, d, lv in (("dip-ca", 22.0, 39.0, 0), ("dense-static", 23.0, 21.6, 0), ("dip-ca", 22.5, 38.6, 4))]
    flash.plot(rows, tmp_path / "bars.png", "smollm2-135m")
    assert (tmp_path / "bars.png").stat().st_size > 0
    titles = []
    monkeypatch.setattr(flash, "_bars", lambda rows, path, title: titles.append(title))
    flash.plot(rows, tmp_path / "again.png", "smollm2-135m")
    assert titles == ["smollm2-135m, {budget} budget, cgroup-limited"]
    flash.plot(rows + [dict(rows[0], budget="25%", limit_mb=140.0)], tmp_path / "lines.png", "smollm2-135m")
    assert len(titles) == 1 and (tmp_path / "lines.png").is_file()  # two budgets: the lines over budgets
