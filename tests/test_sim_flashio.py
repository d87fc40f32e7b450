"""Missed rows → Flash bytes and requests, with and without a read unit."""

import numpy as np
import pytest

from dipdeploy.sim.flashio import flash_reads


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
