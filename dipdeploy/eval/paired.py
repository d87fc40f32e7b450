"""Paired comparison of two rows' perplexities measured on the same test windows.

Two plans' perplexities can differ by less than the text's own variation between windows, but on the same
windows their difference varies far less, so the comparison is paired: with each window's summed NLL
(``perplexity(per_window=…)``), PPL_a / PPL_b = exp((Σ_w nll_a − Σ_w nll_b) / N) for N predicted tokens,
and resampling the windows with replacement, the same draw for both rows, gives that ratio's spread over
text like this: a percentile bootstrap interval (Efron & Tibshirani, *An Introduction to the Bootstrap*,
1993, ch. 13). It says how much a verdict such as "DIP ≤ TEAL" depends on which windows of text were
drawn. It says nothing of the arithmetic's differences between machines, which move the same plan's
perplexity too (benchmarks/results/accuracy-smollm2.md): compare rows measured on one machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Bootstrap resamples and the interval's coverage: enough draws that the interval's ends move by a small
#: part of its half-width from seed to seed (benchmarks/results/accuracy-smollm2.md, "Bootstrap resamples").
RESAMPLES = 10_000
LEVEL = 0.95


@dataclass(frozen=True)
class PairedRatio:
    """PPL_a / PPL_b over all windows, and the bootstrap interval of that ratio at ``level``."""

    ratio: float
    low: float
    high: float
    windows: int
    level: float = LEVEL

    def percent(self) -> str:
        """The ratio and its interval as percentages of change: ``±R % (paired bootstrap over the W
        windows: 95 % interval ±L … ±H %)``."""
        def pc(v: float) -> str:
            return f"{100 * (v - 1):+.2f}"

        return (f"{pc(self.ratio)} % (paired bootstrap over the {self.windows} windows: "
                f"{round(100 * self.level)} % interval {pc(self.low)} … {pc(self.high)} %)")


def paired_ratio(nll_a: list[float], nll_b: list[float], tokens: int, level: float = LEVEL,
                 resamples: int = RESAMPLES, seed: int = 0) -> PairedRatio:
    """The paired ratio of two rows' perplexities from their per-window summed NLLs (the same windows, in
    the same order, ``tokens`` predicted tokens in all, the same count in each window)."""
    a, b = np.asarray(nll_a, dtype=np.float64), np.asarray(nll_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError(f"a paired comparison needs the same windows for both rows, at least 2; got {a.size} "
                         f"and {b.size}")
    diff = a - b
    draws = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))
    ratios = np.exp(diff[draws].sum(1) / tokens)  # each draw: as many windows, as many tokens
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return PairedRatio(float(np.exp(diff.sum() / tokens)), float(low), float(high), int(a.size), level)


def paired_rows(a: dict | None, b: dict | None) -> PairedRatio | None:
    """:func:`paired_ratio` of two evaluation rows (``Evaluator.row``) when both recorded the NLLs of the
    same windows, at least 2; None otherwise (rows kept from a table have none; one window has no spread)."""
    na, nb = (a or {}).get("window_nll") or [], (b or {}).get("window_nll") or []
    if len(na) < 2 or len(na) != len(nb) or a["tokens"] != b["tokens"]:
        return None
    return paired_ratio(na, nb, a["tokens"])


def paired_lines(rows: list[dict]) -> list[str]:
    """One line per row that shares its target density with an earlier row of the same evaluation: its
    perplexity against the first such row's (``eval --method teal,dip`` gives DIP against TEAL), where
    :func:`paired_rows` can pair them."""
    first: dict[float, dict] = {}
    lines = []
    for r in rows:
        base = first.setdefault(r["target_density"], r)
        ratio = None if base is r else paired_rows(r, base)
        if ratio is not None:
            lines.append(f"{r['method']} against {base['method']} at ρ = {r['target_density']:g}: PPL {ratio.percent()}")
    return lines
