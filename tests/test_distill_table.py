"""benchmarks/distill.py's results section: gap closed against the untrained row of the same plan, the goal
line against the dense row, and the hand-written reading kept when the tables are rewritten."""

from __future__ import annotations

import sys

import pytest

INFO = {"cpu": "cpu", "cores": 2, "load_1min": 0.0}


@pytest.fixture()
def distill(benchmark_module, monkeypatch):
    mod = benchmark_module("distill")
    monkeypatch.setattr(sys, "argv", ["distill.py"])
    return mod


def _row(method, rho, allocation, training, ppl, **kw):
    row = {"model": "tiny", "method": method, "density": rho, "target_density": rho, "allocation": allocation,
           "training": training, "ppl": ppl, "tokens": 2047, "seqlen": 2048, "windows": 1, "train_tokens": 0,
           "steps": 0, "wall_s": 0.0, "eval_s": 1.0, "eval_load": 1.0}
    row.update(kw)
    return row


def _rows(distilled: float, steps: int = 70, planned: int = 70) -> list[dict]:
    trained = dict(adapter_rho=0.5, train_tokens=1024 * steps, steps=steps, planned_steps=planned, batch=2,
                   train_seqlen=512, lr=0.002, first_loss=0.33, last_loss=0.23)
    return [_row("dense", 1.0, "-", "none", 20.0), _row("dip", 0.5, "uniform", "none", 30.0),
            _row("dip", 0.5, "greedy", "none", 28.0), _row("dip", 0.5, "greedy", "distill", distilled, **trained)]


def test_gap_closed_is_against_the_untrained_row_of_the_same_allocation(distill):
    rows = _rows(24.0)
    distill.derive(rows)
    assert rows[-1]["gap_closed"] == pytest.approx((28.0 - 24.0) / (28.0 - 20.0))  # not (30 − 24) / (30 − 20)
    assert rows[1]["gap_closed"] is None and rows[0]["x_dense"] == 1.0


def test_goal_line_is_met_only_within_1_10_of_the_dense_row(distill):
    assert "**met**" in distill.goal(_rows(21.9), 0.5)
    line = distill.goal(_rows(22.1), 0.5)
    assert "**NOT met**" in line and "1.105×" in line
    assert "stopped by --train-minutes at step 40 of 70" in distill.goal(_rows(22.1, steps=40), 0.5)
    assert "not measured yet" in distill.goal(_rows(22.1)[:3], 0.5)


def test_rewriting_the_section_keeps_what_precedes_it_and_the_reading(distill):
    path = distill.RESULTS / "lora-smollm2.md"
    path.write_text(f"# title\n\nearlier section\n\n{distill.SECTION}\n\nold tables\n\n{distill.READING} (by hand)\n\nnotes\n")
    distill.write_table(_rows(24.0), "distill-smollm2", INFO, distill.parse())
    text = path.read_text()
    assert text.startswith("# title\n\nearlier section\n\n" + distill.SECTION)
    assert "old tables" not in text and text.count(distill.SECTION) == 1
    assert text.endswith(f"{distill.READING} (by hand)\n\nnotes\n")
    assert "| dip | 0.5 | greedy | distill | pydoc-topics | 0 | 0 | 16 | up,gate,down |  |  | 0.5 | 24 |" in text


def test_adapters_trained_on_other_text_are_rows_of_their_own(distill):
    """A row from before the data column is a pydoc-topics row; a dense-samples row beside it is kept."""
    rows = _rows(24.0)
    samples = {**rows[-1], "ppl": 23.0, "data": "dense-samples"}
    assert distill.key(rows[-1]) != distill.key(samples)
    assert distill.data_of(rows[-1]) == "pydoc-topics" and distill.data_of(rows[0]) == "-"
    lines = distill.goal(rows + [samples], 0.5).splitlines()
    assert len(lines) == 2 and "pydoc-topics" in lines[0] and "dense-samples" in lines[1]


def test_adapters_distilled_with_the_hidden_term_are_rows_of_their_own(distill):
    """A row from before the hidden_weight column is a logits-only row (weight 0); one distilled with the
    hidden-state term beside it is kept, and its goal line says so."""
    rows = _rows(24.0)
    hidden = {**rows[-1], "ppl": 23.5, "hidden_weight": 10.0}
    assert distill.key(rows[-1]) != distill.key(hidden)
    assert distill.hidden_of(rows[-1]) == 0.0 and distill.hidden_of({**rows[0], "hidden_weight": 5.0}) == 0.0
    lines = distill.goal(rows + [hidden], 0.5).splitlines()
    assert len(lines) == 2 and "hidden states" not in lines[0] and "hidden states ×10" in lines[1]


def test_adapters_of_another_rank_or_targets_are_rows_of_their_own(distill):
    """A row from before the rank, targets and sample_windows columns is the recipe of its day (rank 16 on
    up,gate,down, fresh windows); adapters of another recipe beside it are kept, and their goal lines say
    which is which."""
    rows = _rows(24.0)
    attn = {**rows[-1], "ppl": 23.0, "rank": 16, "targets": "up,gate,down,attn", "sample_windows": 4096}
    wide = {**attn, "ppl": 22.5, "rank": 64}
    keys = {distill.key(r) for r in (rows[-1], attn, wide)}
    assert len(keys) == 3 and distill.recipe_of(rows[-1]) == (16, "up,gate,down", None, 0.0, None)
    assert distill.recipe_of(rows[0]) == ("-",) * 5
    lines = distill.goal(rows + [attn, wide], 0.5).splitlines()
    assert len(lines) == 3 and "rank" not in lines[0]
    assert "rank 16 on up,gate,down,attn" in lines[1] and "rank 64 on up,gate,down,attn" in lines[2]
    local = {**rows[-1], "ppl": 23.8, "mlp_weight": 4.0}
    assert distill.key(local) != distill.key(rows[-1])
    assert "MLP outputs ×4" in distill.goal(rows + [local], 0.5).splitlines()[1]


def test_norms_rows_carry_their_learning_rate_share(distill):
    """A norms row from before the norm_lr_scale column trained its norms at the LoRA's rate (1); one at
    another share is a row of its own; rows without norms have no share, whatever was passed."""
    rows = _rows(24.0)
    old = {**rows[-1], "targets": "up,gate,down,norms"}
    low = {**old, "ppl": 23.7, "norm_lr_scale": 0.1}
    assert distill.recipe_of(old)[-1] == 1.0 and distill.recipe_of(low)[-1] == 0.1
    assert distill.recipe_of({**rows[-1], "norm_lr_scale": 0.1})[-1] is None
    assert len({distill.key(r) for r in (rows[-1], old, low)}) == 3
    lines = distill.goal(rows + [old, low], 0.5).splitlines()
    assert "the norms at 1 × lr" in lines[1] and "the norms at 0.1 × lr" in lines[2]
