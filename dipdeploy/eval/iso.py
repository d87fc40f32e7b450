"""The iso-accuracy view: the lowest MLP density at which a method stays within a tolerance of dense.

The paper compares methods at equal accuracy as well as at equal density; this is the former. A method's
perplexity is measured on a density grid (the sweep that the Pareto plot draws); the lowest grid point
from which every denser grid point is within ``(1 + tolerance)·dense`` brackets the crossing with the
next lower grid point, and bisection between the two (a real evaluation at each midpoint) narrows it.
Requiring every denser point to pass makes a single lucky point below a failing one not count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass
class IsoPoint:
    """The result for one method and tolerance. ``density`` is None when even the densest grid point
    fails; ``at_grid_floor`` is True when the lowest grid point passes (the true value may be lower)."""

    tolerance: float
    limit: float  # the perplexity bound, (1 + tolerance)·dense
    density: float | None
    ppl: float | None
    at_grid_floor: bool
    bracket: tuple[float, float] | None  # (failing, passing) densities after bisection
    evaluated: dict[float, float] = field(default_factory=dict)


def sweep_grid(lo: float = 0.4, hi: float = 0.95, step: float = 0.05) -> list[float]:
    """Densities lo, lo + step, …, hi, rounded so that 0.4 + 0.05·k is exactly 0.45, 0.5, …"""
    n = round((hi - lo) / step)
    return [round(lo + i * step, 6) for i in range(n + 1)]


def lowest_density(ppl_at: Callable[[float], float], dense_ppl: float, tolerance: float,
                   grid: Sequence[float], refine: int = 3, evaluated: dict[float, float] | None = None) -> IsoPoint:
    """The lowest density whose perplexity ``ppl_at(ρ)`` is within ``tolerance`` of ``dense_ppl``.

    ``evaluated`` memoises ρ → PPL (pass the same dict for several tolerances of one method, so the sweep
    runs once); it is filled with every evaluation made. ``refine`` bisection steps narrow the bracket
    between the last failing and the first passing grid point by 2^refine."""
    memo = {} if evaluated is None else evaluated

    def at(rho: float) -> float:
        rho = round(rho, 6)
        if rho not in memo:
            memo[rho] = float(ppl_at(rho))
        return memo[rho]

    limit = (1 + tolerance) * dense_ppl
    desc = sorted(set(grid), reverse=True)
    passing = None
    for rho in desc:  # densest first: stop at the first failure below a run of passes
        if at(rho) > limit:
            break
        passing = rho
    if passing is None:
        return IsoPoint(tolerance, limit, None, None, False, None, memo)
    lower = [r for r in desc if r < passing]
    if not lower:
        return IsoPoint(tolerance, limit, passing, at(passing), True, None, memo)
    fail = lower[0]
    for _ in range(refine):
        mid = (fail + passing) / 2
        if at(mid) <= limit:
            passing = round(mid, 6)
        else:
            fail = round(mid, 6)
    return IsoPoint(tolerance, limit, passing, at(passing), False, (fail, passing), memo)
