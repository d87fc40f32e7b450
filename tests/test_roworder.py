"""The calibrated row order (dipdeploy.quant.roworder): its block count matches the direct reader's, it
cuts the blocks a co-selected trace touches, and the Flash store reads a reordered file's rows
bit-identically to the natural file's."""

import numpy as np
import pytest

from dipdeploy.flash import BLOCK, plan_reads
from dipdeploy.quant.roworder import (GroupGeometry, blocks_touched, calibrate_order, candidate_order, miss_matrix,
                                      position_of)
from dipdeploy.runtime.flash import FlashStore, RowArray

R = 512
GEOMETRY = GroupGeometry((0, 4096 * 40), (306, 18))  # SmolLM2's down rows: BQ4 qweight + scales


def _clustered_trace(seed: int, tokens: int = 200, clusters: int = 32, per_token: int = 4) -> np.ndarray:
    """Each token misses every row of ``per_token`` random clusters; cluster c = rows c, c + 32, c + 64, …
    (scattered over the natural order, so each of its rows sits in another block)."""
    rng = np.random.default_rng(seed)
    misses = []
    for _ in range(tokens):
        chosen = rng.choice(clusters, per_token, replace=False)
        misses.append(np.concatenate([np.arange(c, R, clusters) for c in chosen]))
    return miss_matrix(misses, R)


def test_blocks_touched_is_what_the_direct_reader_reads():
    rng = np.random.default_rng(0)
    for _ in range(10):
        position = rng.permutation(R)
        missed = rng.random((5, R)) < rng.uniform(0.01, 0.5)
        want = 0
        for row in missed:
            rows = np.sort(position[np.flatnonzero(row)])
            if len(rows):
                want += plan_reads(list(GEOMETRY.offsets), list(GEOMETRY.row_bytes), rows).device_bytes // BLOCK
        assert blocks_touched(position, missed, GEOMETRY) == want


def test_calibrated_order_touches_fewer_blocks_on_a_co_selected_trace():
    train, test = _clustered_trace(1), _clustered_trace(2)
    got = calibrate_order(train, GEOMETRY)
    assert got.ordering != "natural"
    assert sorted(got.position.tolist()) == list(range(R))
    natural = blocks_touched(np.arange(R), test, GEOMETRY)
    calibrated = blocks_touched(got.position, test, GEOMETRY)
    assert calibrated * 3 < natural  # 16 rows of a cluster: 16 blocks scattered, 2-3 blocks placed together
    assert got.blocks[got.ordering] == min(got.blocks.values())


def test_calibrated_order_is_never_worse_than_natural_on_its_trace():
    rng = np.random.default_rng(3)
    missed = rng.random((50, R)) < 0.1  # no structure to find
    got = calibrate_order(missed, GEOMETRY)
    assert got.blocks[got.ordering] <= got.blocks["natural"]
    assert got.ordering in got.blocks


def test_frequency_puts_the_most_missed_rows_first_and_position_inverts_order():
    missed = np.zeros((10, 8), dtype=bool)
    missed[:, 5] = True
    missed[:6, 2] = True
    missed[:1, 7] = True
    order = candidate_order("frequency", missed, GEOMETRY)
    assert order[:3].tolist() == [5, 2, 7]
    position = position_of(order)
    assert (position[order] == np.arange(8)).all()
    with pytest.raises(ValueError, match="unknown"):
        candidate_order("random", missed, GEOMETRY)


def _arrays(position=None):
    return [RowArray("q", 0, R, 306, "uint8", (306,), position),
            RowArray("s", 4096 * 40, R, 18, "uint8", (18,), position)]


@pytest.mark.parametrize("io", ["mmap", "pread", "direct"])
def test_a_reordered_file_reads_the_same_rows(tmp_path, io):
    rng = np.random.default_rng(4)
    rows_q = rng.integers(0, 256, (R, 306), dtype=np.uint8)
    rows_s = rng.integers(0, 256, (R, 18), dtype=np.uint8)
    position = calibrate_order(_clustered_trace(5), GEOMETRY).position
    order = np.argsort(position)

    def write(path, q, s):
        data = np.zeros(4096 * 40 + R * 18 + 100, dtype=np.uint8)
        data[:R * 306] = q.reshape(-1)
        data[4096 * 40: 4096 * 40 + R * 18] = s.reshape(-1)
        path.write_bytes(data.tobytes())

    write(tmp_path / "natural.bin", rows_q, rows_s)
    write(tmp_path / "ordered.bin", rows_q[order], rows_s[order])
    natural = FlashStore(tmp_path / "natural.bin", io=io, native=False)
    ordered = FlashStore(tmp_path / "ordered.bin", io=io, native=False)
    test = _clustered_trace(6, tokens=20)
    for row in test:
        rows = np.flatnonzero(row)
        slots = rng.permutation(R)[:len(rows)]
        got = []
        for store, arrays in ((natural, _arrays()), (ordered, _arrays(position))):
            slabs = [np.zeros((R, 306), np.uint8), np.zeros((R, 18), np.uint8)]
            store.read(arrays, slabs, rows, slots)
            got.append(slabs)
        for a, b, want in zip(*got, (rows_q, rows_s)):
            assert np.array_equal(a[slots], want[rows]) and np.array_equal(b[slots], want[rows])
    assert natural.counters.bytes == ordered.counters.bytes  # the same rows' bytes asked for
    if io == "direct":
        assert ordered.counters.device_bytes * 2 < natural.counters.device_bytes
    else:
        assert ordered.counters.requests < natural.counters.requests  # placed together: fewer runs
    natural.close()
    ordered.close()


def test_one_call_reads_one_group():
    store_arrays = [RowArray("q", 0, R, 306, "uint8", (306,), np.arange(R)),
                    RowArray("s", 4096 * 40, R, 18, "uint8", (18,), np.arange(R))]
    with pytest.raises(ValueError, match="one row order"):
        FlashStore.__new__(FlashStore).read(store_arrays, [], np.array([1]), np.array([0]))
