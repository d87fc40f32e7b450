"""The slot rule of dipdeploy.cache.slots: slabs stay consistent with the cache under every policy."""

import numpy as np
import pytest

from dipdeploy.cache import RowCache, SlotTable, static_rows


def _simulate(policy: str, rows: int = 48, capacity: int = 20, k: int = 12, steps: int = 60, seed: int = 0):
    """Drive a RowCache + SlotTable with random selections; model the slab's contents explicitly."""
    rng = np.random.default_rng(seed)
    sels = np.stack([rng.choice(rows, k, replace=False, p=_zipf(rows)) for _ in range(steps)])
    pinned = static_rows(np.bincount(sels.reshape(-1), minlength=rows), capacity) if policy == "static" else None
    cache = RowCache(rows, capacity, policy, future=sels if policy == "belady" else None, pinned=pinned)
    table = SlotTable(rows, cache.capacity, k)
    slab = np.full(table.slab_rows, -1)  # which row each slot holds
    if pinned is not None:
        pre = table.preload(np.flatnonzero(pinned))
        slab[pre.read_slots] = pre.read_rows
    reads = 0
    for sel in sels:
        hits = cache.access(sel[None])[0]
        step = table.assign(sel, hits, cache.resident[0])
        slab[step.read_slots] = step.read_rows
        reads += len(step.read_rows)
        assert np.array_equal(slab[step.slots], sel), "the op would read another row than selected"
        src, dst = table.finish(step)
        slab[dst] = slab[src]
        assert np.array_equal(table.resident(), cache.resident[0])
        held = table.slot_of[table.resident()]
        assert np.array_equal(slab[held], np.flatnonzero(table.resident()))
        assert (held < table.capacity).all()
    return reads, cache


def _zipf(rows: int) -> np.ndarray:
    p = 1.0 / np.arange(1, rows + 1)
    return p / p.sum()


@pytest.mark.parametrize("policy", ["none", "lru", "lfu", "belady", "static"])
def test_slab_holds_what_the_op_reads(policy: str) -> None:
    reads, cache = _simulate(policy)
    assert reads == cache.misses  # every miss is read from Flash exactly once, hits never


def test_reads_are_in_ascending_row_order_and_admitted_rows_take_lowest_slots() -> None:
    table = SlotTable(rows=10, capacity=4, staging=3)
    cache = RowCache(10, 4, "lru")
    sel = np.array([7, 2, 5])
    step = table.assign(sel, cache.access(sel[None])[0], cache.resident[0])
    assert step.read_rows.tolist() == [2, 5, 7]
    assert step.read_slots.tolist() == [0, 1, 2]
    assert step.slots.tolist() == [2, 0, 1]


def test_policy_none_uses_staging_only() -> None:
    table = SlotTable(rows=10, capacity=0, staging=3)
    cache = RowCache(10, 5, "none")
    sel = np.array([9, 1, 4])
    step = table.assign(sel, cache.access(sel[None])[0], cache.resident[0])
    assert step.slots.tolist() == [2, 0, 1]
    assert table.finish(step)[0].size == 0


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="capacity <= rows"):
        SlotTable(rows=4, capacity=5, staging=1)


@pytest.mark.parametrize("policy", ["lru", "lfu", "belady", "static", "none"])
def test_one_sequence_fast_path_equals_the_batched_rule(policy: str) -> None:
    """RowCache._access_one (batch = 1) against the batched path on two identical sequences."""
    rng = np.random.default_rng(3)
    rows, cap, k, steps = 40, 15, 9, 80
    sels = np.stack([rng.choice(rows, k, replace=False, p=_zipf(rows)) for _ in range(steps)])
    pinned = static_rows(np.bincount(sels.reshape(-1), minlength=rows), cap) if policy == "static" else None
    one = RowCache(rows, cap, policy, future=sels if policy == "belady" else None, pinned=pinned)
    two = RowCache(rows, cap, policy, batch=2, future=np.stack([sels, sels], 1) if policy == "belady" else None,
                   pinned=pinned)
    for sel in sels:
        h1 = one.access(sel[None])
        h2 = two.access(np.stack([sel, sel]))
        assert np.array_equal(h1[0], h2[0]) and np.array_equal(h2[0], h2[1])
        assert np.array_equal(one.resident[0], two.resident[0])
