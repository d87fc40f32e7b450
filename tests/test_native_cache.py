"""The native cache step (custom_ops/src/cache/) takes the numpy reference's decisions, every one:
hits, residency, statistics, slots, reads and slab contents on random selection traces for each policy
(ties included), and through the engine, where switching the step between C++ and numpy changes
nothing but time."""

import numpy as np
import pytest

from dipdeploy.cache import POLICIES, RowCache, SlotTable, static_rows
from dipdeploy.flash import MAX_REQUEST, plan_reads, touched_blocks
from dipdeploy.ops.native import library_path
from dipdeploy.runtime.native_cache import NativeCache, cache_library

LIB = library_path()
pytestmark = pytest.mark.skipif(LIB is None or cache_library(str(LIB)) is None,
                                reason="native library with dd_cache_select not built (make ops)")
ROW_BYTES = (12, 5)  # two arrays per row (as BQ4's qweight and scales), odd sizes on purpose


def _trace(rng, rows: int, k: int, steps: int, hot: int) -> np.ndarray:
    """Selections of ``k`` distinct rows (as TopK gives them): most from ``hot`` rows, so rows come back
    and many keys tie on last use and use count, the rest uniform."""
    out = []
    for _ in range(steps):
        n_hot = int(rng.integers(0, k + 1))
        hot_rows = rng.choice(hot, min(n_hot, hot), replace=False)
        rest = np.setdiff1d(np.arange(rows), hot_rows)
        out.append(np.concatenate([hot_rows, rng.choice(rest, k - len(hot_rows), replace=False)]))
    return np.stack(out).astype(np.int64)


def _file(rows: int, rng, folder) -> tuple[np.ndarray, list[int]]:
    """A fake MLP file, mapped read-only as the Flash store maps it (the step drops the pages it read
    from the mapping): the two arrays back to back after a header, random bytes."""
    offsets = [7, 7 + rows * ROW_BYTES[0]]
    path = folder / f"mlp-{rows}.bin"
    rng.integers(0, 256, offsets[1] + rows * ROW_BYTES[1] + 3, dtype=np.uint8).tofile(path)
    return np.memmap(path, np.uint8, mode="r"), offsets


def _run_both(policy: str, seed: int, rows: int, capacity: int, k: int, folder, steps: int = 40):
    rng = np.random.default_rng(seed)
    sels = _trace(rng, rows, k, steps, hot=max(k // 2, 1) + capacity // 2)
    data, offsets = _file(rows, rng, folder)
    pinned = static_rows(np.bincount(sels.reshape(-1), minlength=rows), capacity) if policy == "static" else None
    future = sels if policy == "belady" else None
    ref = RowCache(rows, capacity, policy, future=future, pinned=pinned)
    table = SlotTable(rows, ref.capacity, k)
    if pinned is not None:
        table.preload(np.flatnonzero(pinned))
    slabs = [np.zeros((table.slab_rows, rb), np.uint8) for rb in ROW_BYTES]
    selected, slots = np.zeros((1, k), np.int64), np.zeros((1, k), np.int64)
    mine = RowCache(rows, capacity, policy, future=future, pinned=pinned)
    mine_table = SlotTable(rows, mine.capacity, k)
    if pinned is not None:
        pre = mine_table.preload(np.flatnonzero(pinned))
        for slab, off, rb in zip(slabs, offsets, ROW_BYTES):
            slab[pre.read_slots] = data[off:off + rows * rb].reshape(rows, rb)[pre.read_rows]
    nat = NativeCache(str(LIB), mine, mine_table, slabs, offsets, list(ROW_BYTES), data, selected, slots)
    for t, sel in enumerate(sels):
        hits = ref.access(sel[None])[0]
        step = table.assign(sel, hits, ref.resident[0])
        selected[0] = sel
        got_hits, n = nat.select()
        where = f"{policy} seed {seed} step {t}"
        assert np.array_equal(got_hits, hits), where
        assert np.array_equal(nat.resident, ref.resident[0]), where
        assert np.array_equal(slots[0], step.slots), where
        assert np.array_equal(nat.read_rows[:n], step.read_rows), where
        assert np.array_equal(nat.read_slots[:n], step.read_slots), where
        runs = 1 + int((np.diff(step.read_rows) != 1).sum()) if n else 0
        assert nat.info[1] == runs, where
        blocks, requests = touched_blocks(offsets, list(ROW_BYTES), step.read_rows)
        assert (nat.info[2], nat.info[3]) == (blocks, requests), where  # what is paced
        for slab, off, rb in zip(slabs, offsets, ROW_BYTES):  # the op reads the selected rows' bytes
            assert np.array_equal(slab[slots[0]], data[off:off + rows * rb].reshape(rows, rb)[sel]), where
        table.finish(step)
        nat.settle()
        assert np.array_equal(nat.state.slot_of, table.slot_of), where
        assert np.array_equal(nat.state.row_of[:table.capacity], table.row_of), where
        for slab, off, rb in zip(slabs, offsets, ROW_BYTES):  # cached rows stay where the table says
            held = np.flatnonzero(table.slot_of >= 0)
            assert np.array_equal(slab[table.slot_of[held]], data[off:off + rows * rb].reshape(rows, rb)[held]), where
    assert np.array_equal(nat.state.last_use, ref.last_use[0]) and np.array_equal(nat.state.uses, ref.uses[0])
    assert nat.state.counters.tolist() == [ref.step, ref.hits, ref.misses]
    nat.close()
    return ref


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(12))
def test_native_step_equals_the_numpy_reference(policy, seed, tmp_path):
    rng = np.random.default_rng(1000 + seed)
    rows = int(rng.integers(8, 200))
    k = int(rng.integers(1, rows // 2 + 1))
    capacity = int(rng.integers(0, rows + 1))
    ref = _run_both(policy, seed, rows, capacity, k, tmp_path)
    assert ref.step == 40


def test_block_bytes_and_requests_equal_the_numpy_count_and_the_plan_without_gaps():
    """dd_flash_touched, dipdeploy.flash.touched_blocks and plan_reads(max_gap=0): the same blocks, rows sharing a
    block counted once, arrays in any order, one array's last block shared with the next's, and the same
    requests, a run of touching blocks each, split at the longest request."""
    lib = cache_library(str(LIB))
    rng = np.random.default_rng(5)
    cases = [([0, 10 * 306 + 10], [306, 20], np.array([0, 1, 9, 13, 14])),  # neighbours share blocks
             ([4096], [4096], np.array([0, 1, 5])),  # whole blocks
             ([100, 0], [30, 10], np.array([9])),  # the second array ends in the first's first block
             ([0], [4096 * 40], np.array([0, 1, 3]))]  # runs longer than a request: 80 blocks in 3 requests
    for _ in range(300):
        arrays, rows = int(rng.integers(1, 4)), int(rng.integers(1, 300))
        row_bytes = [int(b) for b in rng.integers(1, 9000, arrays)]
        ends = np.cumsum([int(rng.integers(0, 5000)) + rows * b for b in row_bytes])
        offsets = [int(e) - rows * b for e, b in zip(ends, row_bytes)]
        order = rng.permutation(arrays)
        cases.append(([offsets[i] for i in order], [row_bytes[i] for i in order],
                      np.sort(rng.choice(rows, int(rng.integers(1, rows + 1)), replace=False))))
    for offsets, row_bytes, rows in cases:
        rows = np.unique(rows).astype(np.int64)
        offs, rbs = np.asarray(offsets, np.int64), np.asarray(row_bytes, np.int64)
        requests = np.zeros(1, np.int64)
        native = lib.dd_flash_touched(len(offs), offs.ctypes.data, rbs.ctypes.data, rows.ctypes.data, len(rows), 4096,
                                      MAX_REQUEST, requests.ctypes.data)
        plan = plan_reads(offsets, row_bytes, rows, max_gap=0)
        want = (plan.total, plan.requests)
        assert (native, int(requests[0])) == touched_blocks(offsets, row_bytes, rows) == want, (offsets, row_bytes, rows)
    assert touched_blocks([0], [4096 * 40], np.array([0, 1, 3])) == (120 * 4096, 5)  # 80 blocks in 3, 40 in 2
    descending = np.array([5, 2], np.int64)
    assert lib.dd_flash_touched(1, offs.ctypes.data, rbs.ctypes.data, descending.ctypes.data, 2, 4096, MAX_REQUEST,
                                requests.ctypes.data) == -6


@pytest.mark.parametrize("policy", ["lru", "lfu", "belady"])
def test_native_step_at_the_edges(policy, tmp_path):
    """Capacity 0, 1, K − 1, K and all rows; one row selected; every row selected."""
    for rows, capacity, k in ((16, 0, 4), (16, 1, 4), (16, 3, 4), (16, 4, 4), (16, 16, 4), (9, 2, 1), (9, 4, 9)):
        _run_both(policy, rows * 31 + capacity, rows, capacity, k, tmp_path, steps=25)


def test_state_moves_between_native_and_numpy_without_loss():
    """pull, a numpy step, push, a native step: the same as numpy steps throughout."""
    rng = np.random.default_rng(5)
    rows, cap, k = 60, 20, 8
    sels = _trace(rng, rows, k, 30, hot=12)
    ref, ref_table = RowCache(rows, cap, "lfu"), SlotTable(rows, cap, k)
    cache, table = RowCache(rows, cap, "lfu"), SlotTable(rows, cap, k)
    slabs = [np.zeros((cap + k, 4), np.uint8)]
    selected, slots = np.zeros((1, k), np.int64), np.zeros((1, k), np.int64)
    nat = NativeCache(str(LIB), cache, table, slabs, [0], [4], None, selected, slots)
    for t, sel in enumerate(sels):
        ref_table.finish(ref_table.assign(sel, ref.access(sel[None])[0], ref.resident[0]))
        if t % 3 == 2:  # this step in numpy on the pulled state
            nat.pull(cache, table)
            table.finish(table.assign(sel, cache.access(sel[None])[0], cache.resident[0]))
            nat.push(cache, table)
        else:
            selected[0] = sel
            nat.select()
            nat.settle()
    nat.pull(cache, table)
    assert np.array_equal(cache.resident, ref.resident) and np.array_equal(table.slot_of, ref_table.slot_of)
    assert (cache.step, cache.hits, cache.misses) == (ref.step, ref.hits, ref.misses)


def test_bad_selection_is_refused_like_the_reference():
    cache, table = RowCache(10, 4, "lru"), SlotTable(10, 4, 2)
    selected, slots = np.array([[3, 10]], np.int64), np.zeros((1, 2), np.int64)
    nat = NativeCache(str(LIB), cache, table, [np.zeros((6, 2), np.uint8)], [0], [2], None, selected, slots)
    with pytest.raises(IndexError, match=r"\[0, 10\)"):
        nat.select()
    with pytest.raises(IndexError):
        cache.access(selected)


def test_a_row_outside_the_mapped_file_is_refused(tmp_path):
    cache, table = RowCache(10, 4, "lru"), SlotTable(10, 4, 2)
    selected, slots = np.array([[1, 9]], np.int64), np.zeros((1, 2), np.int64)
    np.zeros(10 * 2 - 1, np.uint8).tofile(tmp_path / "short.bin")  # the last row's bytes are missing
    short = np.memmap(tmp_path / "short.bin", np.uint8, mode="r")
    nat = NativeCache(str(LIB), cache, table, [np.zeros((6, 2), np.uint8)], [0], [2], short, selected, slots)
    with pytest.raises(RuntimeError, match="outside the mapped MLP file"):
        nat.select()


@pytest.fixture(scope="module")
def tiny_bundle(tiny_dipca_bundle):
    return tiny_dipca_bundle()


PROMPT = [3, 14, 15, 92, 65, 35]


def _generate(bundle, **kw):
    from dipdeploy.runtime import Engine

    eng = Engine(bundle, dram_budget="30%", context=64, fused=False, **kw)  # a trace: the host step's selections
    rec = eng.trace_recorder()
    g = eng.generate(PROMPT, 10, keep_logits=True, stop_at_eos=False, trace=rec)
    tail = eng.generate(PROMPT[:3], 6, keep_logits=True, stop_at_eos=False)  # a second sequence: reset
    eng.close()
    return g, rec.finish(), tail


@pytest.mark.parametrize("prefill", ["batch", "token"])
@pytest.mark.parametrize("policy", ["lru", "lfu", "belady", "static", "none"])
def test_engine_native_step_changes_nothing_but_time(tiny_bundle, policy, prefill):
    """Same kernels, the cache step in C++ or numpy: the same tokens, logits, hits, selections, bytes."""
    gamma = 1.0 if policy == "belady" else None
    got = _generate(tiny_bundle, native=True, native_cache=True, policy=policy, prefill=prefill, gamma=gamma)
    ref = _generate(tiny_bundle, native=True, native_cache=False, policy=policy, prefill=prefill, gamma=gamma)
    assert got[0].stats.native_cache and not ref[0].stats.native_cache
    for g, r in ((got[0], ref[0]), (got[2], ref[2])):
        assert g.tokens == r.tokens
        assert all(np.array_equal(a, b) for a, b in zip(g.logits, r.logits))
        for name in ("hit_rate", "flash_mb_per_token", "flash_requests_per_token", "flash_block_mb_per_token",
                     "flash_block_requests_per_token"):
            assert getattr(g.stats, name) == getattr(r.stats, name), name
    for name in ("sel_in", "sel_glu", "hits_in", "hits_glu"):
        assert all(np.array_equal(a, b) for a, b in zip(getattr(got[1], name), getattr(ref[1], name))), name


@pytest.mark.parametrize("prefill", ["batch", "token"])
def test_rows_copied_from_the_mapping_count_the_blocks_numpy_counts(tiny_bundle, prefill):
    """``--io mmap``: the native step's copies report the blocks holding the rows and their device requests,
    which the emulated Flash paces, as the Flash store's numpy path counts them."""
    got = _generate(tiny_bundle, native=True, native_cache=True, policy="lfu", prefill=prefill, io="mmap")
    ref = _generate(tiny_bundle, native=True, native_cache=False, policy="lfu", prefill=prefill, io="mmap")
    for g, r in ((got[0], ref[0]), (got[2], ref[2])):
        assert g.tokens == r.tokens and g.stats.io == "mmap"
        assert g.stats.flash_block_mb_per_token == r.stats.flash_block_mb_per_token > g.stats.flash_mb_per_token > 0
        assert g.stats.flash_block_requests_per_token == r.stats.flash_block_requests_per_token > 0


def test_native_and_fallback_engines_take_the_same_cache_decisions(tiny_bundle):
    """--native (native kernels and cache step) against --no-native (the ONNX fallback functions and the
    numpy step): the tokens agree by dipdeploy.agreement, and the numpy reference replayed on the
    native run's own selections gives the hits that run recorded."""
    from dipdeploy.agreement import compare_free_running, tolerance_for
    from dipdeploy.runtime import Engine

    nat, trace, _ = _generate(tiny_bundle, native=True, policy="lfu", prefill="token")
    fb, _, _ = _generate(tiny_bundle, native=False, policy="lfu", prefill="token")
    assert nat.stats.native_cache and not fb.stats.native_cache
    res = compare_free_running(fb.logits, fb.tokens, nat.tokens, tolerance_for(sparse=True, quantised=True).tie)
    assert res.ok, res.describe()
    eng = Engine(tiny_bundle, dram_budget="30%", context=64, native=False, policy="lfu")
    for layer, pair in enumerate(eng.slabs):
        for slab, sel, hits in ((pair[0], trace.sel_in, trace.hits_in), (pair[1], trace.sel_glu, trace.hits_glu)):
            cache = RowCache(slab.rows, slab.capacity, "lfu")
            replay = np.stack([cache.access(s[None].astype(np.int64))[0] for s in sel[layer]])
            assert np.array_equal(replay, hits[layer]), layer
    eng.close()
