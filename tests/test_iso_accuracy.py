"""The iso-accuracy search (dipdeploy.eval.iso) on synthetic perplexity curves with known thresholds."""

import math

import pytest

from dipdeploy.eval.iso import lowest_density, sweep_grid

DENSE = 20.0


def _curve(rho: float) -> float:
    """Monotone: PPL = dense·(1 + 0.5·(1 − ρ)²), so +tol is reached at ρ* = 1 − √(2·tol)."""
    return DENSE * (1 + 0.5 * (1 - rho) ** 2)


def test_sweep_grid_is_the_requested_densities():
    assert sweep_grid() == [0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95]


@pytest.mark.parametrize("tol", [0.01, 0.03])
def test_bisection_finds_the_known_threshold(tol):
    exact = 1 - math.sqrt(2 * tol)  # 0.8586 at +1 %, 0.7551 at +3 %
    memo = {}
    iso = lowest_density(_curve, DENSE, tol, sweep_grid(), refine=6, evaluated=memo)
    assert iso.density is not None and not iso.at_grid_floor
    assert exact <= iso.density <= exact + 0.05 / 2 ** 6 + 1e-9  # passing side, within the final bracket
    assert iso.bracket[0] < exact <= iso.bracket[1]
    assert iso.ppl <= iso.limit and _curve(iso.bracket[0]) > iso.limit
    assert all(r in memo for r in sweep_grid() if r >= iso.bracket[1] - 1e-9)


def test_a_lucky_point_below_a_failure_does_not_count():
    curve = {0.95: 20.1, 0.9: 20.15, 0.85: 21.0, 0.8: 20.05, 0.75: 25.0}
    iso = lowest_density(lambda r: curve.get(round(r, 6), 21.0), DENSE, 0.01, sorted(curve), refine=0)
    assert iso.density == 0.9 and iso.bracket == (0.85, 0.9)


def test_every_point_failing_or_passing():
    assert lowest_density(lambda r: 30.0, DENSE, 0.03, sweep_grid()).density is None
    floor = lowest_density(lambda r: DENSE, DENSE, 0.01, sweep_grid())
    assert floor.density == 0.4 and floor.at_grid_floor and floor.bracket is None


def test_evaluations_are_shared_across_tolerances():
    calls = []

    def ppl(r):
        calls.append(r)
        return _curve(r)

    memo = {}
    lowest_density(ppl, DENSE, 0.03, sweep_grid(), refine=2, evaluated=memo)
    n = len(calls)
    lowest_density(ppl, DENSE, 0.03, sweep_grid(), refine=2, evaluated=memo)
    assert len(calls) == n and len(set(calls)) == len(calls)
