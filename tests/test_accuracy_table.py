"""benchmarks/accuracy.py's table: rows kept from an earlier table, the --only entries and the Goals section."""

from __future__ import annotations


import pytest



@pytest.fixture()
def accuracy(benchmark_module):
    return benchmark_module("accuracy")


def _row(method, rho, ppl, variant="-", **kw):
    over = {} if variant == "-" else dict(kv.split("=") for kv in variant.split(","))
    row = {"model": "tiny", "method": method, "variant": variant, "target_density": rho, "density": rho,
           "rho_in": 1.0, "allocation": over.get("allocation", "uniform"), "score": over.get("score", "abs"),
           "gamma": 1.0, "policy": "-", "cache_frac": None, "ppl": ppl, "tokens": 2046, "seqlen": 1024,
           "windows": 2, "calib_s": 1.0, "eval_s": 2.0}
    row.update(kw)
    return row


def _table(accuracy, rows, name="acc"):
    info = {"cpu": "cpu", "cores": 2, "load_1min": 0.0}
    accuracy.write_table(rows, name, info, 2, 1024, [])
    return accuracy.RESULTS / f"{name}.md"


def test_kept_rows_read_back_what_the_table_wrote(accuracy):
    rows = [_row("dense", 1.0, 20.0), _row("dip", 0.5, 28.5),
            _row("dip", 0.5, 27.4, "allocation=greedy", greedy_strength=0.1),
            _row("dip-ca", 0.5, 32.9, "gamma=0.5", gamma=0.5, policy="lfu", cache_frac=0.5)]
    kept = {r["key"]: r for r in accuracy.kept_rows(_table(accuracy, rows))}
    assert set(kept) == {'dense|1.0|{}', 'dip|0.5|{}', 'dip|0.5|{"allocation": "greedy"}', 'dip-ca|0.5|{"gamma": 0.5}'}
    greedy = kept['dip|0.5|{"allocation": "greedy"}']
    assert (greedy["ppl"], greedy["allocation"], greedy["greedy_strength"], greedy["tokens"], greedy["windows"],
            greedy["seqlen"]) == (27.4, "greedy", 0.1, 2046, 2, 1024)
    assert kept['dip|0.5|{}']["greedy_strength"] is None
    assert kept['dip-ca|0.5|{"gamma": 0.5}']["cache_frac"] == 0.5
    # the keys are the ones the planned configurations get, so a kept row is not run again
    assert accuracy._key("dip", 0.5, {"allocation": "greedy"}) in kept


def test_only_keeps_a_variant_of_several_overrides_whole(accuracy):
    assert accuracy._only("dip:score=wina-in,dip:allocation=greedy,score=wina-in,cats,teal:-") == {
        "dip:score=wina-in", "dip:allocation=greedy,score=wina-in", "cats", "teal:-"}


def test_goals_compare_the_best_dip_with_the_best_teal(accuracy, monkeypatch):
    monkeypatch.setattr(accuracy, "GOAL_DENSITIES", (0.4, 0.5))
    rows = [_row("dense", 1.0, 20.0), _row("dip", 0.5, 28.5), _row("dip", 0.5, 24.0, "score=wina-in"),
            _row("teal", 0.5, 28.0), _row("teal", 0.5, 26.0, "allocation=joint"),
            _row("dip", 0.4, 45.0), _row("teal", 0.4, 42.0)]
    text = accuracy.goals(rows)
    assert "ρ = 0.5, DIP ≤ TEAL: **met**: best DIP 24.00 (score=wina-in) vs best TEAL 26.00 (allocation=joint)" in text
    assert "ρ = 0.4, DIP ≤ TEAL: **NOT met**: best DIP 45.00 (-) vs best TEAL 42.00 (-)" in text
    assert "ρ = 0.5, DIP ≤ 1.25 × dense: **met**" in text  # 24.0 ≤ 25.0
    assert "TEAL variants measured: ρ = 0.4: -; ρ = 0.5: -, allocation=joint" in text
    rows[2]["ppl"] = 25.5  # now above 1.25 × 20 but still the best DIP, and still below TEAL's 26.0
    text = accuracy.goals(rows)
    assert "ρ = 0.5, DIP ≤ 1.25 × dense: **NOT met**" in text and "ρ = 0.5, DIP ≤ TEAL: **met**" in text
    assert "## Goals" in _table(accuracy, rows).read_text()


def test_rewriting_a_table_keeps_its_notes_and_labels_the_cache_split(accuracy):
    rows = [_row("dense", 1.0, 20.0), _row("dip-ca", 0.5, 29.9, cache_split="reads", gamma=0.5, policy="lfu")]
    path = _table(accuracy, rows)
    path.write_text(path.read_text() + "\n**Added by hand.** The conditions of a run.\n")
    _table(accuracy, rows + [_row("dip", 0.5, 28.5)])
    text = path.read_text()
    assert text.count("**Added by hand.**") == 1 and text.index("| dip |") < text.index("**Added by hand.**")
    assert "| reads |" in text
    # a dip-ca row of a table written before the column ran under the only split there was, even
    path.write_text("\n".join(_without_column(ln, 12) if ln.startswith("|") else ln for ln in text.splitlines()))
    assert "cache_split" not in path.read_text().split("## Goals")[0].split("| method |")[1]
    [ca] = [r for r in accuracy.kept_rows(path) if r["method"] == "dip-ca"]
    assert ca["cache_split"] == "even" and ca["ppl"] == 29.9


def test_kept_rows_skip_the_tables_of_notes_added_by_hand(accuracy):
    path = _table(accuracy, [_row("dense", 1.0, 20.0), _row("dip", 0.5, 28.5)])
    path.write_text(path.read_text() + "\n**Added by hand.**\n\n| method | allocation | PPL |\n|---|---|---|\n"
                    "| dip | greedy (strength 0.1) | 21.14 |\n")
    assert {r["key"] for r in accuracy.kept_rows(path)} == {"dense|1.0|{}", "dip|0.5|{}"}


def _without_column(line: str, k: int) -> str:
    cells = line.strip("|").split("|")
    return "|" + "|".join(cells[:k] + cells[k + 1:]) + "|"


def test_the_header_names_each_rows_machine_when_they_differ(accuracy):
    one = _table(accuracy, [_row("dense", 1.0, 20.0, cpu="Xeon"), _row("dip", 0.5, 28.5, cpu="Xeon")])
    assert "Machine: Xeon, 2 cores" in one.read_text()
    mixed = _table(accuracy, [_row("dense", 1.0, 20.0, cpu="EPYC"), _row("dip", 0.5, 28.5, cpu="Xeon"),
                              _row("teal", 0.5, 28.0)], name="mixed")
    text = mixed.read_text()
    assert "Machine: each row's `cpu` (EPYC; Xeon; empty: a row kept from an earlier table" in text
    assert "cpu" in text.split("| method |")[1].split("\n")[0]  # a column of the table
    kept = {r["key"]: r for r in accuracy.kept_rows(mixed)}
    assert kept["dip|0.5|{}"]["cpu"] == "Xeon" and kept["teal|0.5|{}"]["cpu"] is None


def test_goals_give_the_paired_interval_where_both_rows_recorded_their_windows(accuracy, monkeypatch):
    import math

    monkeypatch.setattr(accuracy, "GOAL_DENSITIES", (0.4, 0.5))

    def nll_row(method, rho, per_window, **kw):
        ppl = math.exp(sum(per_window) / 2046)
        return _row(method, rho, ppl, window_nll=per_window, **kw)

    rows = [_row("dense", 1.0, 20.0),
            nll_row("dip", 0.5, [3300.0, 3100.0]), nll_row("teal", 0.5, [3302.0, 3104.0]),
            _row("dip", 0.4, 45.0), nll_row("teal", 0.4, [3900.0, 3800.0])]
    text = accuracy.goals(rows)
    line = next(x for x in text.splitlines() if x.startswith("- ρ = 0.5, DIP ≤ TEAL"))
    # each window: -2 and -4 nats over 1023 tokens; a draw of both windows the same gives the ends
    assert "**met**" in line and "-0.29 % (paired bootstrap over the 2 windows: 95 % interval -0.39 … -0.20 %)" in line
    line = next(x for x in text.splitlines() if x.startswith("- ρ = 0.4, DIP ≤ TEAL"))
    assert "paired" not in line  # the DIP row kept from a table has no windows
    assert "not on the machine's arithmetic" in text
    assert "× dense" in text and "against dense" not in text  # the dense row has no windows
    rows[0] = nll_row("dense", 1.0, [3000.0, 3000.0])
    assert "; against dense +" in accuracy.goals(rows)
    rows[1]["window_nll"] = [3300.0, 3100.0, 3000.0]  # other windows: no pairing
    assert "paired" not in accuracy.goals(rows)


def test_remeasure_drops_the_selected_kept_rows_and_refuses_another_process_rows(accuracy, monkeypatch, tmp_path):
    import json

    monkeypatch.setattr(accuracy, "RESULTS", tmp_path)
    a, b = 'teal|0.6|{}', 'dip|0.6|{"allocation": "greedy"}'
    kept, mine, other = (tmp_path / f".acc.{p}.partial.json" for p in ("kept", "mine", "other"))
    kept.write_text(json.dumps([{"key": a}, {"key": b}]))
    mine.write_text(json.dumps([{"key": a}]))
    assert accuracy.forget_kept("acc", {a}, mine) == 1
    assert [r["key"] for r in json.loads(kept.read_text())] == [b] and json.loads(mine.read_text()) == []
    other.write_text(json.dumps([{"key": b}]))
    with pytest.raises(ValueError, match=r"\.acc\.other\.partial\.json has a row"):
        accuracy.forget_kept("acc", {b}, mine)
    assert [r["key"] for r in json.loads(kept.read_text())] == [b]  # nothing dropped on refusal
    assert accuracy._selected("dip", 0.6, {"allocation": "greedy"}, {"dip:allocation=greedy"}, {0.6})
    assert not accuracy._selected("dip", 0.6, {}, {"dip:allocation=greedy"}, None)
    assert accuracy._selected("dip", 0.75, {}, {"dip"}, None) and not accuracy._selected("dip", 0.75, {}, None, {0.6})


def test_remeasure_of_another_process_row_is_exit_2_before_any_model_loads(accuracy, monkeypatch, tmp_path, capsys):
    import json

    monkeypatch.setattr(accuracy, "RESULTS", tmp_path)
    monkeypatch.setattr(accuracy, "Evaluator", lambda *a, **k: pytest.fail("no model should load"))
    (tmp_path / ".accuracy-smollm2.other.partial.json").write_text(json.dumps([{"key": "teal|0.6|{}"}]))
    monkeypatch.setattr("sys.argv", ["accuracy.py", "--remeasure", "--part", "mine", "--only", "teal:-",
                                     "--densities", "0.6"])
    with pytest.raises(SystemExit) as stop:
        accuracy.main()
    assert stop.value.code == 2 and "other.partial.json has a row" in capsys.readouterr().err
