"""dipdeploy.eval.paired: the paired ratio of two rows' perplexities and its bootstrap interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dipdeploy.eval.paired import paired_ratio


def _windows(seed: int, n: int = 16, tokens: int = 2047):
    """Per-window summed NLLs of a text whose windows differ far more than two plans do on each."""
    rng = np.random.default_rng(seed)
    base = tokens * rng.uniform(2.8, 3.6, n)  # the text's own variation between windows
    return base, tokens * n


def test_the_ratio_is_that_of_the_perplexities():
    base, tokens = _windows(0)
    a, b = base + 5.0, base
    r = paired_ratio(a, b, tokens)
    assert r.ratio == pytest.approx(math.exp(a.sum() / tokens) / math.exp(b.sum() / tokens), rel=1e-12)
    assert r.windows == 16 and r.low <= r.ratio <= r.high


def test_a_steady_difference_is_told_apart_where_the_text_varies_more():
    """About +0.3 % on every window: the paired interval excludes 0 though the windows' own spread
    (±10 %) is thirty times that, which an unpaired comparison could not see."""
    base, tokens = _windows(1)
    steady = np.random.default_rng(6).normal(0.003, 0.0005, 16) * 2047
    r = paired_ratio(base + steady, base, tokens)
    assert 1.0 < r.low < r.high < 1.01


def test_a_difference_of_mixed_sign_gives_an_interval_around_it():
    base, tokens = _windows(2)
    noise = np.random.default_rng(3).normal(0.0, 0.01 * 2047, 16)
    r = paired_ratio(base + noise, base, tokens)
    assert r.low < 1.0 < r.high
    assert r.percent().startswith(f"{100 * (r.ratio - 1):+.2f} % (paired bootstrap over the 16 windows: 95 % interval ")


def test_fixed_seed_gives_the_same_interval():
    base, tokens = _windows(4)
    noisy = base + np.random.default_rng(5).normal(0.0, 10.0, 16)
    assert paired_ratio(noisy, base, tokens) == paired_ratio(noisy, base, tokens)


@pytest.mark.parametrize("a, b", [([1.0, 2.0], [1.0]), ([1.0], [1.0])])
def test_unpaired_or_single_windows_are_refused(a, b):
    with pytest.raises(ValueError, match="same windows"):
        paired_ratio(a, b, 100)


def test_eval_lines_compare_each_row_with_the_first_at_its_density():
    from dipdeploy.eval.paired import paired_lines

    base, tokens = _windows(7, n=4)

    def row(method, rho, shift):
        return {"method": method, "target_density": rho, "tokens": tokens, "window_nll": list(base + shift)}

    rows = [row("dense", 1.0, 0.0), row("teal", 0.6, 40.0), row("dip", 0.6, 50.0), row("cats", 0.6, 90.0),
            row("dip", 0.5, 100.0)]
    lines = paired_lines(rows)
    assert [x.split(":")[0] for x in lines] == ["dip against teal at ρ = 0.6", "cats against teal at ρ = 0.6"]
    assert lines[0].startswith(f"dip against teal at ρ = 0.6: PPL +{100 * (math.exp(40 / tokens) - 1):.2f} % (paired")
    rows[2].pop("window_nll")  # a row without its windows
    assert len(paired_lines(rows)) == 1
    assert paired_lines([dict(r, window_nll=r.get("window_nll", [])[:1]) for r in rows]) == []  # one window each


def test_rows_pair_only_on_the_same_windows_at_least_two():
    from dipdeploy.eval.paired import paired_rows

    base, tokens = _windows(8, n=3)
    a, b = ({"tokens": tokens, "window_nll": list(base + s)} for s in (1.0, 0.0))
    assert paired_rows(a, b) == paired_ratio(a["window_nll"], b["window_nll"], tokens)
    assert paired_rows(a, None) is None and paired_rows(a, {"tokens": tokens}) is None  # a kept row
    assert paired_rows(a, dict(b, window_nll=b["window_nll"][:2])) is None  # other windows
    assert paired_rows(dict(a, window_nll=a["window_nll"][:1]), dict(b, window_nll=b["window_nll"][:1])) is None
