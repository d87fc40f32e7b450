"""Missed rows → Flash bytes and requests, with and without a read unit."""

import numpy as np
import pytest

from dipdeploy.flash import flash_reads


def mask(rows, missed):
    m = np.zeros((1, rows), dtype=bool)
    m[0, missed] = True
    return m


def test_no_granularity_counts_rows_and_runs():
    b, r = flash_reads(mask(10, [0, 1, 5, 7, 8]), 300, 1)
    assert b[0] == 5 * 300 and r[0] == 3


def test_rows_sharing_a_block_share_its_read():
    b, r = flash_reads(mask(10, [0, 1, 5]), 300, 1024)  # rows 0, 1 in block 0, row 5 in block 1
    assert b[0] == 2048 and r[0] == 1


def test_rows_larger_than_a_block_touch_every_block_they_overlap():
    b, r = flash_reads(mask(10, [0, 1, 5]), 5000, 4096)  # blocks {0,1}, {1,2}, {6,7}
    assert b[0] == 5 * 4096 and r[0] == 2


@pytest.mark.parametrize("row_bytes,unit", [(306, 4096), (19040, 4096), (2720, 4096), (100, 64)])
def test_block_reads_never_fewer_bytes_than_rows_and_never_more_requests(row_bytes, unit):
    rng = np.random.default_rng(row_bytes)
    m = rng.random((5, 300)) < 0.3
    b1, r1 = flash_reads(m, row_bytes, 1)
    bu, ru = flash_reads(m, row_bytes, unit)
    assert (bu >= b1).all() and (ru <= r1).all()
    assert (bu % unit == 0).all()


@pytest.mark.parametrize("row_bytes,gap", [(306, 4), (306, 0), (9216, 4), (1152, 1), (4096, 8)])
def test_the_runtime_read_model_is_the_runtime_plan(row_bytes, gap):
    """With a gap and the request cut, the simulator's bytes and requests are what the runtime's Flash
    store plans for the same rows (``dipdeploy.flash.plan_reads``, one array starting on a block)."""
    from dipdeploy.flash import BLOCK, MAX_REQUEST, plan_reads

    rng = np.random.default_rng(row_bytes + gap)
    m = rng.random((6, 400)) < rng.uniform(0.02, 0.6, (6, 1))
    m[0] = False  # a token with no miss
    m[1] = True  # every row: one run, cut into requests
    b, r = flash_reads(m, row_bytes, BLOCK, gap, MAX_REQUEST)
    for t in range(len(m)):
        rows = np.flatnonzero(m[t])
        if not len(rows):
            assert b[t] == 0 and r[t] == 0
            continue
        plan = plan_reads([0], [row_bytes], rows, max_gap=gap)
        assert (b[t], r[t]) == (plan.device_bytes, plan.requests), t


def test_a_gap_reads_through_and_saves_a_request():
    b, r = flash_reads(mask(64, [0, 35]), 100, 1024, gap=3)  # blocks 0 and 3: the two between read through
    assert b[0] == 4 * 1024 and r[0] == 1
    b, r = flash_reads(mask(64, [0, 50]), 100, 1024, gap=3)  # blocks 0 and 4: a gap of 3 blocks still joins
    assert b[0] == 5 * 1024 and r[0] == 1
    b, r = flash_reads(mask(64, [0, 62]), 100, 1024, gap=3)  # blocks 0 and 6: too far apart
    assert b[0] == 2 * 1024 and r[0] == 2


def test_a_negative_io_gap_is_refused():
    from dipdeploy.sim import SimConfig

    with pytest.raises(ValueError, match="io gap"):
        SimConfig(io_gap=-1)
