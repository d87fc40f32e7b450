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


TABLE = """# accuracy-smollm2: WikiText-2 test perplexity of sparse MLP methods

Model smollm2-135m, 16 windows × 2048 tokens (32752 predicted tokens), prefill and decode both sparsified.

| method | variant | target_density | density | density_test | rho_in | allocation | ppl | ppl_x_dense |
|---|---|---|---|---|---|---|---|---|
| dip | - | 0.75 | 0.7499 |  | 0.825 | uniform | 21.22 | 1.025 |
| dip | allocation=greedy | 0.75 | 0.75 | 0.75 | 0.825 | greedy | 21.18 | 1.023 |
| dip | allocation=greedy | 0.6 | 0.6 | 0.6 | 0.66 | greedy | 23.31 | 1.126 |
| teal | allocation=joint | 0.75 | 0.75 | 0.7482 | 0.8077 | joint | 21.13 | 1.02 |
| dense | - | 1 | 1 |  | 1 | - | 20.71 | 1 |
"""


def test_seeded_points_are_the_table_rows_of_each_method(benchmark_module, tmp_path):
    iso = benchmark_module("iso_accuracy")
    table = tmp_path / "accuracy-smollm2.md"
    table.write_text(TABLE)
    pts = iso.seeded(table, ["dip-greedy", "dip", "teal"], 16, 2048)
    assert [(p.label, p.rho, p.ppl, p.density_test) for p in pts] == [
        ("dip-greedy", 0.75, 21.18, 0.75), ("dip-greedy", 0.6, 23.31, 0.6), ("dip", 0.75, 21.22, None)]
    assert {p.source for p in pts} == {"accuracy-smollm2.md"}  # teal-joint's row is not plain teal's


def test_a_seed_table_of_another_protocol_is_refused(benchmark_module, tmp_path, capsys):
    iso = benchmark_module("iso_accuracy")
    table = tmp_path / "accuracy-smollm2.md"
    table.write_text(TABLE)
    with pytest.raises(SystemExit) as e:
        iso.seeded(table, ["dip"], 2, 1024)
    assert e.value.code == 2 and "16 × 2048" in capsys.readouterr().err


def test_partial_files_resume_and_are_shared_between_parts(benchmark_module):
    iso = benchmark_module("iso_accuracy")
    name = iso.table_name("smollm2-135m", 16, 2048)
    a = iso.Partial(name, "a", "smollm2-135m", 16, 2048)
    a.dense = 20.7
    a.points.append(iso.Point("dip", 0.9, 20.8, 0.8995, iso.MEASURED, 40.0, 230.0))
    a.save()
    other = iso.Partial(name, "x", "smollm2-135m", 2, 1024)  # same file name, other protocol: not read
    other.dense = 30.0
    other.points.append(iso.Point("teal", 0.9, 31.0, 0.9, iso.MEASURED))
    other.save()
    assert iso.Partial(name, "a", "smollm2-135m", 16, 2048).points == a.points  # a killed run resumes
    dense, points = iso.Partial(name, "b", "smollm2-135m", 16, 2048).all_points()
    assert dense == 20.7 and points == a.points


def test_a_smaller_protocol_never_writes_the_full_table(benchmark_module):
    iso = benchmark_module("iso_accuracy")
    assert iso.table_name("smollm2-135m", 16, 2048) == "iso-accuracy-smollm2"
    assert iso.table_name("smollm2-135m", 2, 1024) == "iso-accuracy-smollm2-2x1024"
