"""The cache inside the graph (``dipdeploy.runtime.backends.joined``): the ops CacheStep/CacheSettle take the numpy
reference's decisions (slots, residency, slab bytes, counters) on random traces, exactly, per token and
in a batched prefill's chunks; the joined decoder decodes what the per-layer path decodes
(near-tie-aware) at budgets below 100 %, through the shared staging window too, and its batched prefill
leaves what the per-layer one leaves; what it cannot do is refused in one line; a forged handle is an
error."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from dipdeploy.cache import RowCache, SlotTable
from dipdeploy.ops.native import library_path, session_options
from dipdeploy.runtime import Engine
from dipdeploy.runtime.native_cache import NativeCache, drain, graph_step_library

from twin_checks import assert_generations_agree

LIB = library_path()
pytestmark = pytest.mark.skipif(LIB is None or graph_step_library(str(LIB)) is None,
                                reason="native library with the graph cache step not built (make ops)")
PROMPT = [3, 17, 42, 9, 100, 7, 64, 5, 11]
ROW_BYTES = 4  # one float32 per row: the op graph below multiplies by it


def _step_graph(k: int, tokens=1):
    """indices [tokens, K] → CacheStep → slots; Y = Σ slab[slots] (read through the slots, as
    SparseGatherMatMul does) → CacheSettle → out: one group's cycle as the joined decoder runs it (a
    symbolic ``tokens``: a batched prefill's chunk)."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    from dipdeploy.ops.nodes import DOMAIN

    nodes = [h.make_node("CacheStep", ["indices", "handle"], ["slots"], domain=DOMAIN),
             h.make_node("Gather", ["slab", "slots"], ["rows"], axis=0),
             h.make_node("ReduceSum", ["rows"], ["y"], keepdims=0),
             h.make_node("CacheSettle", ["y", "handle"], ["out"], domain=DOMAIN)]
    graph = h.make_graph(nodes, "step", [h.make_tensor_value_info("indices", T.INT64, [tokens, k]),
                                         h.make_tensor_value_info("handle", T.INT64, [1]),
                                         h.make_tensor_value_info("slab", T.FLOAT, ["S"])],
                         [h.make_tensor_value_info("slots", T.INT64, [tokens, k]),
                          h.make_tensor_value_info("rows", T.FLOAT, [tokens, k]),
                          h.make_tensor_value_info("out", T.FLOAT, [])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(DOMAIN, 1)],
                        ir_version=onnx.IR_VERSION)


def _split_graph(k: int, tokens=1):
    """The step in two halves as ``_Joiner.split_step`` wires them: CacheBegin → a product over the hits'
    slots → CacheEnd → a product over the misses' slots → their sum → CacheSettle."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    from dipdeploy.ops.nodes import DOMAIN

    nodes = [h.make_node("CacheBegin", ["indices", "handle"], ["hit_idx", "hit_slots"], domain=DOMAIN),
             h.make_node("Gather", ["slab", "hit_slots"], ["hit_rows"], axis=0),
             h.make_node("ReduceSum", ["hit_rows", "axis"], ["y_hit"], keepdims=1),
             h.make_node("CacheEnd", ["y_hit", "handle"], ["y_ready", "miss_idx", "miss_slots"], domain=DOMAIN),
             h.make_node("Gather", ["slab", "miss_slots"], ["miss_rows"], axis=0),
             h.make_node("ReduceSum", ["miss_rows", "axis"], ["y_miss"], keepdims=1),
             h.make_node("Add", ["y_ready", "y_miss"], ["y"]),
             h.make_node("CacheSettle", ["y", "handle"], ["out"], domain=DOMAIN)]
    i64 = lambda name: h.make_tensor_value_info(name, T.INT64, [tokens, None])  # noqa: E731
    f32 = lambda name: h.make_tensor_value_info(name, T.FLOAT, [tokens, None])  # noqa: E731
    graph = h.make_graph(nodes, "split", [h.make_tensor_value_info("indices", T.INT64, [tokens, k]),
                                          h.make_tensor_value_info("handle", T.INT64, [1]),
                                          h.make_tensor_value_info("slab", T.FLOAT, ["S"])],
                         [i64("hit_idx"), i64("hit_slots"), i64("miss_idx"), i64("miss_slots"), f32("hit_rows"),
                          f32("miss_rows"), f32("out")],
                         [h.make_tensor("axis", T.INT64, [1], [1])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(DOMAIN, 1)],
                        ir_version=onnx.IR_VERSION)


def _row_file(tmp_path, rng, rows: int, lead: int):
    """An MLP file of ``lead`` bytes of padding, then two row arrays: rows of 4 KiB + 4 B that straddle
    blocks, then one float32 per row. Returns (path, offsets, wide, the mapped file, the float rows, the
    wide rows as the file holds them)."""
    from dipdeploy.flash import BLOCK

    weights = rng.standard_normal(rows).astype(np.float32)
    path = tmp_path / "mlp.bin"
    wide = BLOCK + ROW_BYTES
    pad = rng.integers(0, 256, rows * wide + lead, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(pad.tobytes())
        f.write(weights.tobytes())
    data = np.memmap(path, np.uint8, mode="r")
    return path, [lead, lead + rows * wide], wide, data, weights, data[lead:lead + rows * wide].reshape(rows, wide)


class _Group(NamedTuple):
    path: object
    offsets: list
    wide: int
    weights: np.ndarray
    wide_rows: np.ndarray
    ref: RowCache
    table: SlotTable
    nat: NativeCache
    flash: object
    slab: np.ndarray
    slab_wide: np.ndarray


def _group(tmp_path, rng, rows: int, k: int, capacity: int, policy: str, io: str, lead: int, pinned=None) -> _Group:
    """One group over ``_row_file``'s two arrays: the numpy reference (cache and slot table), the native
    state on twins of them with its slabs, its misses copied from the mapping (``mmap``) or read by the op
    library's reader (``direct``, a read-through gap of one block); ``pinned`` rows (static) are in their
    slots first, as ``GroupSlab.reset`` reads them."""
    from dipdeploy.flash import BLOCK, MAX_REQUEST
    from dipdeploy.runtime.flash import FlashStore

    path, offsets, wide, data, weights, wide_rows = _row_file(tmp_path, rng, rows, lead)
    ref, mine = (RowCache(rows, capacity, policy, pinned=pinned) for _ in range(2))
    table, mine_table = SlotTable(rows, ref.capacity, k), SlotTable(rows, mine.capacity, k)
    slab = np.zeros(table.slab_rows, np.float32)
    slab_wide = np.zeros((table.slab_rows, wide), np.uint8)
    if pinned is not None:
        for t in (table, mine_table):
            step = t.preload(np.flatnonzero(pinned))
        slab[step.read_slots] = weights[step.read_rows]
        slab_wide[step.read_slots] = wide_rows[step.read_rows]
    nat = NativeCache(str(LIB), mine, mine_table, [slab_wide, slab.view(np.uint8).reshape(-1, ROW_BYTES)], offsets,
                      [wide, ROW_BYTES], data if io == "mmap" else None, np.zeros((1, k), np.int64),
                      np.zeros((1, k), np.int64))
    flash = FlashStore(path, io="direct") if io == "direct" else None
    if flash is not None:
        nat.read_through(flash.native_reader(rows * (wide + ROW_BYTES) + 4 * BLOCK), MAX_REQUEST, 1, BLOCK)
    return _Group(path, offsets, wide, weights, wide_rows, ref, table, nat, flash, slab, slab_wide)


def _reads(g: _Group, rows) -> tuple[int, int]:
    """The device bytes and requests of reading ``rows`` as the op library plans them (one block of gap)."""
    from dipdeploy.flash import plan_reads

    if not len(rows):
        return 0, 0
    plan = plan_reads(g.offsets, [g.wide, ROW_BYTES], rows, max_gap=1)
    return int(np.minimum(plan.length, g.path.stat().st_size - plan.offset).sum()), plan.requests


def _settled(g: _Group, step, t: int) -> None:
    """The reference's settle, then the native slot table and the slab's held rows checked against it."""
    g.table.finish(step)
    assert np.array_equal(g.nat.state.slot_of, g.table.slot_of), t
    held = np.flatnonzero(g.table.slot_of >= 0)
    assert np.array_equal(g.slab_wide[g.table.slot_of[held]], g.wide_rows[held]), t


@pytest.mark.parametrize("io", ["mmap", "direct"])
@pytest.mark.parametrize("policy,capacity", [("lfu", 30), ("lru", 5), ("none", 0), ("lfu", 80)])
def test_cache_step_op_takes_the_reference_decisions(policy, capacity, io, tmp_path):
    """``direct``: the step reads its misses itself, with the requests ``dipdeploy.flash.plan_reads`` plans (rows
    of 4 KiB + 4 B and 4 B in two arrays, a read-through gap of one block)."""
    import onnxruntime as ort

    from dipdeploy.flash import plan_reads, touched_blocks

    rows, k, steps = 80, 12, 30
    rng = np.random.default_rng(7)
    path, offsets, wide, weights, wide_rows, ref, table, nat, flash, slab, slab_wide = _group(tmp_path, rng, rows, k, capacity, policy, io, 123)
    sess = ort.InferenceSession(_step_graph(k).SerializeToString(), session_options(1, True),
                                providers=["CPUExecutionProvider"])
    handle = np.array([nat.handle], np.int64)
    hot = rng.choice(rows, 20, replace=False)
    misses, device, requests, touched, touched_requests = 0, 0, 0, 0, 0
    for t in range(steps):
        sel = np.concatenate([rng.choice(hot, 6, replace=False),
                              rng.choice(np.setdiff1d(np.arange(rows), hot), k - 6, replace=False)])
        hits = ref.access(sel[None])[0]
        step = table.assign(sel, hits, ref.resident[0])
        misses += len(step.read_rows)
        if len(step.read_rows):
            plan = plan_reads(offsets, [wide, ROW_BYTES], step.read_rows, max_gap=1)
            size = path.stat().st_size  # a request reaching past the end of the file returns the rest
            device += int(np.minimum(plan.length, size - plan.offset).sum())
            requests += plan.requests
            blocks, block_requests = touched_blocks(offsets, [wide, ROW_BYTES], step.read_rows)
            touched, touched_requests = touched + blocks, touched_requests + block_requests
        slots, got_rows, out = sess.run(None, {"indices": sel[None], "handle": handle, "slab": slab})
        assert np.array_equal(slots[0], step.slots), t
        assert np.array_equal(nat.resident, ref.resident[0]), t
        assert np.array_equal(got_rows[0], weights[sel]), t  # the rows read through the slots are the file's
        assert np.isclose(out, got_rows.sum(), rtol=1e-5, atol=1e-5), t  # settled after the read, X passed on
        table.finish(step)  # the op settled after the read
        assert np.array_equal(nat.state.slot_of, table.slot_of), t
        held = np.flatnonzero(table.slot_of >= 0)
        assert np.array_equal(slab[table.slot_of[held]], weights[held]), t
        assert np.array_equal(slab_wide[table.slot_of[held]], wide_rows[held]), t
    assert nat.state.counters.tolist() == [ref.step, ref.hits, ref.misses]
    got = drain(str(LIB), handle)
    assert got.misses == misses and got.wanted == misses * (wide + ROW_BYTES)
    if io == "direct":  # the same requests as the Flash store's plan, every byte of them read
        assert (got.blocks, got.requests, got.block_requests) == (device, requests, 0)
    else:  # the blocks holding the rows copied from the mapping and their requests: what the emulation paces
        assert (got.blocks, got.block_requests) == (touched, touched_requests)
    assert drain(str(LIB), handle).misses == 0  # drained
    nat.close()
    if flash is not None:
        flash.close()
    with pytest.raises(Exception, match="no live cache group"):  # a freed (or forged) handle is refused
        sess.run(None, {"indices": np.arange(k, dtype=np.int64)[None], "handle": handle, "slab": slab})


@pytest.mark.parametrize("native", [False, True])
def test_a_product_over_no_rows_is_zero(native):
    """CacheEnd's misses are empty when every row was resident, CacheBegin's hits when none was."""
    import onnxruntime as ort

    from dipdeploy.ops.formats import OpWeights
    from dipdeploy.ops.nodes import make_sgmm_model

    rng = np.random.default_rng(3)
    w = OpWeights.from_matrix(rng.standard_normal((32, 40)).astype(np.float32))
    sess = ort.InferenceSession(make_sgmm_model(w, 32, slab=True).SerializeToString(), session_options(1, native),
                                providers=["CPUExecutionProvider"])
    none = np.zeros((2, 0), np.int64)
    y = sess.run(None, {"X": rng.standard_normal((2, 32)).astype(np.float32), "indices": none, "slots": none})[0]
    assert y.shape == (2, 40) and not y.any()


@pytest.mark.parametrize("io", ["mmap", "direct"])
@pytest.mark.parametrize("policy,capacity", [("lfu", 30), ("none", 0), ("lfu", 80)])
def test_cache_begin_and_end_split_the_step_into_its_hits_and_its_misses(policy, capacity, io, tmp_path):
    """CacheBegin takes CacheStep's decisions and gives the hits (selection order) and their slots, CacheEnd
    the misses (ascending rows, their read slots) once read: together the reference's slots, every
    product over the file's rows, the same reads; a batched prefill's chunk is all hits."""
    import onnxruntime as ort

    from dipdeploy.flash import touched_blocks

    rows, k, steps = 80, 12, 20
    rng = np.random.default_rng(5)
    g = _group(tmp_path, rng, rows, k, capacity, policy, io, 321)
    path, offsets, wide, weights, wide_rows, ref, table, nat, flash, slab, slab_wide = g
    sess = ort.InferenceSession(_split_graph(k).SerializeToString(), session_options(1, True),
                                providers=["CPUExecutionProvider"])
    handle = np.array([nat.handle], np.int64)
    device = requests = touched = touched_requests = 0
    for t in range(steps):
        sel = rng.choice(rows, k, replace=False) if t % 2 else rng.choice(40, k, replace=False)
        hits = ref.access(sel[None])[0]
        step = table.assign(sel, hits, ref.resident[0])
        dev, req = _reads(g, step.read_rows)
        device, requests = device + dev, requests + req
        blocks, block_requests = touched_blocks(offsets, [wide, ROW_BYTES], step.read_rows)
        touched, touched_requests = touched + blocks, touched_requests + block_requests
        hi, hs, mi, ms, hit_rows, miss_rows, out = sess.run(None, {"indices": sel[None], "handle": handle,
                                                                    "slab": slab})
        assert np.array_equal(hi[0], sel[hits]) and np.array_equal(hs[0], step.slots[hits]), t
        assert np.array_equal(mi[0], step.read_rows) and np.array_equal(ms[0], step.read_slots), t
        assert np.array_equal(hit_rows[0], weights[sel[hits]]) and np.array_equal(miss_rows[0], weights[mi[0]]), t
        assert np.isclose(out.sum(), weights[sel].sum(), rtol=1e-5, atol=1e-5), t
        _settled(g, step, t)
    got = drain(str(LIB), handle)
    assert got.misses == ref.misses and got.wanted == ref.misses * (wide + ROW_BYTES)
    assert got.blocks == (device if io == "direct" else touched)
    assert got.block_requests == (0 if io == "direct" else touched_requests)
    if io == "direct":
        assert got.requests == requests
    full, full_wide = np.zeros(rows, np.float32), np.zeros((rows, wide), np.uint8)
    chunk = np.stack([rng.choice(rows, k, replace=False) for _ in range(5)])
    nat.prefill([full_wide, full.view(np.uint8).reshape(-1, ROW_BYTES)])
    prefill = ort.InferenceSession(_split_graph(k, "N").SerializeToString(), session_options(1, True),
                                   providers=["CPUExecutionProvider"])
    hi, hs, mi, ms, hit_rows, _, _ = prefill.run(None, {"indices": chunk, "handle": handle, "slab": full})
    nat.prefill(None)
    assert np.array_equal(hi, chunk) and np.array_equal(hs, chunk) and mi.shape == ms.shape == (5, 0)
    assert np.array_equal(hit_rows, weights[chunk])
    nat.close()
    if flash is not None:
        flash.close()


def _prefetch_graph(d: int, k: int):
    """CachePrefetch(X, handle, H, W, C) -> X with TopKColumnMask's attributes (k; γ 1: plain DIP)."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    from dipdeploy.ops.nodes import DOMAIN

    node = h.make_node("CachePrefetch", ["X", "handle", "H", "W", "C"], ["Y"], domain=DOMAIN, k=k, gamma=1.0)
    graph = h.make_graph([node], "prefetch", [h.make_tensor_value_info("X", T.FLOAT, [1, 3]),
                                              h.make_tensor_value_info("handle", T.INT64, [1]),
                                              h.make_tensor_value_info("H", T.FLOAT, [1, 1, d]),
                                              h.make_tensor_value_info("W", T.FLOAT, [d]),
                                              h.make_tensor_value_info("C", T.BOOL, [d])],
                         [h.make_tensor_value_info("Y", T.FLOAT, [1, 3])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(DOMAIN, 1)],
                        ir_version=onnx.IR_VERSION)


@pytest.mark.parametrize("policy,capacity", [("lfu", 30), ("none", 0)])
def test_a_read_ahead_hands_its_misses_to_cache_begin_and_changes_no_decision(policy, capacity, tmp_path):
    """CachePrefetch reads the rows of the top-K of |H ⊙ W| that are not resident; the next CacheBegin copies
    the step's misses among them to their slots and CacheEnd reads only the others, while the two products
    take the same rows in the same order as without a read-ahead (hits, then every miss): the reference's
    slots and products, every row read ahead counted with its blocks and requests, and the ones the step
    missed counted as used."""
    import onnxruntime as ort

    rows, k, steps = 80, 12, 16
    rng = np.random.default_rng(9)
    g = _group(tmp_path, rng, rows, k, capacity, policy, "direct", 321)
    opts = lambda: session_options(1, True)  # noqa: E731
    ahead = ort.InferenceSession(_prefetch_graph(rows, k).SerializeToString(), opts(), providers=["CPUExecutionProvider"])
    split = ort.InferenceSession(_split_graph(k).SerializeToString(), opts(), providers=["CPUExecutionProvider"])
    handle = np.array([g.nat.handle], np.int64)
    w = rng.uniform(0.5, 2.0, rows).astype(np.float32)
    device = requests = read_ahead = used = 0
    for t in range(steps):
        sel = rng.choice(rows, k, replace=False) if t % 2 else rng.choice(40, k, replace=False)
        guess = np.concatenate([sel[: k // 2], rng.choice(np.setdiff1d(np.arange(rows), sel), k - k // 2, replace=False)])
        hvec = np.full(rows, 1e-3, np.float32)
        hvec[guess] = (10.0 + np.arange(k)) / w[guess]  # |H ⊙ W| ranks exactly the guess first
        resident = g.nat.state.resident.view(bool).copy()
        x = rng.standard_normal((1, 3)).astype(np.float32)
        y = ahead.run(None, {"X": x, "handle": handle, "H": hvec[None, None], "W": w, "C": resident})[0]
        assert np.array_equal(y, x), t
        early = np.unique(guess[~resident[guess]])
        hits = g.ref.access(sel[None])[0]
        step = g.table.assign(sel, hits, g.ref.resident[0])
        arrived = np.isin(step.read_rows, early)
        later = step.read_rows[~arrived]
        read_ahead, used = read_ahead + len(early), used + int(arrived.sum())
        for rows_read in (early, later):
            dev, req = _reads(g, rows_read)
            device, requests = device + dev, requests + req
        hi, hs, mi, ms, hit_rows, miss_rows, out = split.run(None, {"indices": sel[None], "handle": handle,
                                                                     "slab": g.slab})
        assert np.array_equal(hi[0], sel[hits]) and np.array_equal(hs[0], step.slots[hits]), t
        assert np.array_equal(mi[0], step.read_rows) and np.array_equal(ms[0], step.read_slots), t
        assert np.array_equal(hit_rows[0], g.weights[hi[0]]) and np.array_equal(miss_rows[0], g.weights[mi[0]]), t
        assert np.isclose(out.sum(), g.weights[sel].sum(), rtol=1e-5, atol=1e-5), t
        _settled(g, step, t)
    got = drain(str(LIB), handle)
    assert got.misses == g.ref.misses and got.wanted == g.ref.misses * (g.wide + ROW_BYTES)
    assert (got.blocks, got.requests, got.ahead, got.ahead_used) == (device, requests, read_ahead, used)
    assert 0 < used < read_ahead
    g.nat.close()
    g.flash.close()


@pytest.mark.parametrize("io", ["mmap", "direct"])
@pytest.mark.parametrize("policy,capacity", [("lfu", 30), ("lru", 5), ("none", 0), ("static", 25)])
def test_cache_ops_in_a_batched_prefill_take_the_reference_decisions(policy, capacity, io, tmp_path):
    """During ``dd_cache_prefill`` a chunk's CacheStep places every row its selection names in the
    full-height buffers (held rows from the slab, the rest read) and hands the row indices on as slots;
    its CacheSettle leaves the state ``RowCache.access_steps`` + ``SlotTable.rebase`` leave, the new rows
    copied into their slots: the per-layer path's ``_fill_prefill`` and ``_warm``, exactly. Decoding
    then continues token by token on the same state."""
    import onnxruntime as ort

    from dipdeploy.cache import static_rows
    from dipdeploy.flash import plan_reads, touched_blocks

    rows, k = 80, 12
    rng = np.random.default_rng(11)
    pinned = static_rows(rng.random(rows), capacity) if policy == "static" else None
    path, offsets, wide, weights, wide_rows, ref, table, nat, flash, slab, slab_wide = _group(tmp_path, rng, rows, k, capacity, policy, io, 77, pinned)
    full, full_wide = np.zeros(rows, np.float32), np.zeros((rows, wide), np.uint8)
    sess = ort.InferenceSession(_step_graph(k, "N").SerializeToString(), session_options(1, True),
                                providers=["CPUExecutionProvider"])
    handle = np.array([nat.handle], np.int64)

    def selections(n):
        return np.stack([rng.choice(rows, k, replace=False) for _ in range(n)])

    for chunk in (7, 1, 5):  # chunks of a prompt, one of a single token
        sel = selections(chunk)
        union = np.unique(sel)
        missing = union[table.slot_of[union] < 0]
        nat.prefill([full_wide, full.view(np.uint8).reshape(-1, ROW_BYTES)])
        full[:], full_wide[:] = np.nan, 0
        slots, got_rows, out = sess.run(None, {"indices": sel, "handle": handle, "slab": full})
        nat.prefill(None)
        assert np.array_equal(slots, sel)  # the row indices into the full-height buffers
        assert np.array_equal(got_rows, weights[sel]) and np.isclose(out, got_rows.sum(), rtol=1e-5, atol=1e-5)
        assert np.array_equal(full_wide[union], wide_rows[union])
        ref.access_steps(sel)
        new_rows, new_slots = table.rebase(ref.resident[0])
        slab[new_slots], slab_wide[new_slots] = weights[new_rows], wide_rows[new_rows]
        assert np.array_equal(nat.resident, ref.resident[0])
        assert np.array_equal(nat.state.slot_of, table.slot_of) and np.array_equal(nat.state.counters,
                                                                                    [ref.step, ref.hits, ref.misses])
        held = np.flatnonzero(table.slot_of >= 0)
        assert np.array_equal(slab[table.slot_of[held]], weights[held])
        assert np.array_equal(slab_wide[table.slot_of[held]], wide_rows[held])
        got = drain(str(LIB), handle)
        assert got.misses == len(missing) and got.wanted == len(missing) * (wide + ROW_BYTES)
        if io == "direct" and len(missing):
            plan = plan_reads(offsets, [wide, ROW_BYTES], missing, max_gap=1)
            size = path.stat().st_size
            assert (got.blocks, got.requests) == (int(np.minimum(plan.length, size - plan.offset).sum()), plan.requests)
        elif len(missing):
            assert (got.blocks, got.block_requests) == touched_blocks(offsets, [wide, ROW_BYTES], missing)
    step_graph = ort.InferenceSession(_step_graph(k).SerializeToString(), session_options(1, True),
                                      providers=["CPUExecutionProvider"])
    for t in range(8):  # decoding continues on the warmed state
        sel = selections(1)[0]
        hits = ref.access(sel[None])[0]
        step = table.assign(sel, hits, ref.resident[0])
        slots, got_rows, _ = step_graph.run(None, {"indices": sel[None], "handle": handle, "slab": slab})
        assert np.array_equal(slots[0], step.slots) and np.array_equal(got_rows[0], weights[sel]), t
        table.finish(step)
        assert np.array_equal(nat.state.slot_of, table.slot_of), t
    with pytest.raises(Exception, match="one token's selection"):  # outside a prefill a step is one token
        sess.run(None, {"indices": selections(2), "handle": handle, "slab": slab})
    nat.close()
    if flash is not None:
        flash.close()


@pytest.mark.parametrize("attention", ["standard", "gqa"])
@pytest.mark.parametrize("budget,policy,io", [("50%", "lfu", "mmap"), ("30%", "none", "mmap"), ("100%", "lru", "mmap"),
                                              ("50%", "lfu", "direct")])
def test_fused_decoder_decodes_what_the_per_layer_path_decodes(tiny_dipca_bundle, attention, budget, policy, io):
    """DIP-CA as the bundle bakes it: the residency the graph's TopKColumnMask reads is the native state
    the CacheStep before it updated, token by token. Policy none sends every row through the shared
    staging window; ``direct``: the steps read their misses from the file themselves."""
    bundle = tiny_dipca_bundle(attention)
    kw = dict(dram_budget=budget, policy=policy, prefill="token", io=io)
    per_layer = Engine(bundle, single_session=False, fused=False, **kw)
    fused = Engine(bundle, fused=True, **kw)
    assert fused.fused is not None and not fused.single_session
    ref = per_layer.generate(PROMPT, 12, keep_logits=True, stop_at_eos=False)
    got = fused.generate(PROMPT, 12, keep_logits=True, stop_at_eos=False)
    assert_generations_agree(ref, got)
    lookups = sum(a + b for a, b in fused.k) * (len(PROMPT) + len(got.tokens) - 1)
    assert fused.native_hits()[:, :, 1].sum() == lookups
    assert 0 <= got.stats.hit_rate < 1 and got.stats.flash_mb_per_token > 0  # rows came from the file
    assert got.stats.flash_block_mb_per_token >= got.stats.flash_mb_per_token  # whole blocks, mmap too
    if io == "direct":
        assert got.stats.flash_device_mb_per_token == got.stats.flash_block_mb_per_token
    if policy == "none":
        assert got.stats.hit_rate == 0
    again = fused.generate(PROMPT, 12, keep_logits=True, stop_at_eos=False)  # a reset binds new groups
    assert again.tokens == got.tokens


@pytest.mark.parametrize("attention", ["standard", "gqa"])
def test_reading_ahead_changes_the_reads_not_the_tokens(tiny_dipca_bundle, attention):
    """--io direct: the joined graph has a CachePrefetch before each layer's attention; the rows it reads
    ahead are counted, and the decode is the one without it bit for bit (the products take the same rows
    in the same order; the same kernels)."""
    from dipdeploy.export.joined import PREFETCH_OP, fuse_graphs

    bundle = tiny_dipca_bundle(attention)
    kw = dict(dram_budget="50%", policy="lfu", prefill="token", io="direct", fused=True)
    off, on = Engine(bundle, prefetch=False, **kw), Engine(bundle, prefetch=True, **kw)
    layers = len(on.k)
    ops = [n.op_type for n in fuse_graphs(bundle, layers, overlap=True, prefetch=True).graph.node]
    assert ops.count(PREFETCH_OP) == layers
    assert PREFETCH_OP not in [n.op_type for n in fuse_graphs(bundle, layers, overlap=True).graph.node]
    ref = off.generate(PROMPT, 12, keep_logits=True, stop_at_eos=False)
    got = on.generate(PROMPT, 12, keep_logits=True, stop_at_eos=False)
    assert got.tokens == ref.tokens and all(np.array_equal(a, b) for a, b in zip(ref.logits, got.logits))
    assert ref.stats.read_ahead_rows_per_token == 0
    assert 0 < got.stats.read_ahead_used_per_token <= got.stats.read_ahead_rows_per_token
    assert got.stats.hit_rate == ref.stats.hit_rate
    assert (ref.stats.read_ahead, got.stats.read_ahead) == ("off", "on")


def test_prefetch_auto_times_both_settings_and_keeps_one(tiny_dipca_bundle, monkeypatch):
    """The default (prefetch None) switches the read-ahead on and off on alternate tokens until it has
    timed PROBE_TOKENS of each, then keeps the faster: the rows read ahead are those of the "on" tokens
    only, and the logits are those without it, bit for bit, whatever it chose."""
    from dipdeploy.runtime import native_cache
    from dipdeploy.runtime.readahead import PROBE_TOKENS

    bundle = tiny_dipca_bundle()
    kw = dict(dram_budget="50%", policy="lfu", io="direct", fused=True)
    off, auto = Engine(bundle, prefetch=False, **kw), Engine(bundle, **kw)
    switched = []
    real = native_cache.read_ahead
    monkeypatch.setattr("dipdeploy.runtime.backends.joined.read_ahead",
                        lambda lib, handles, on: (switched.append(on), real(lib, handles, on)))
    got = auto.generate(PROMPT, 2 * PROBE_TOKENS + 5, keep_logits=True, stop_at_eos=False)
    ref = off.generate(PROMPT, 2 * PROBE_TOKENS + 5, keep_logits=True, stop_at_eos=False)
    assert got.tokens == ref.tokens and all(np.array_equal(a, b) for a, b in zip(ref.logits, got.logits))
    probe = auto.read_ahead
    assert probe.chosen is not None and got.stats.read_ahead.startswith(f"auto: {'on' if probe.chosen else 'off'}")
    assert switched[: 2 * PROBE_TOKENS] == [True, False] * PROBE_TOKENS
    assert set(switched[2 * PROBE_TOKENS:]) == {probe.chosen}
    assert [len(probe.seconds[True]), len(probe.seconds[False])] == [PROBE_TOKENS, PROBE_TOKENS]
    assert (got.stats.read_ahead_rows_per_token > 0) == (True in switched)
    for e in (off, auto):
        e.close()


def test_fused_refusals(tiny_dipca_bundle):
    bundle = tiny_dipca_bundle()
    with pytest.raises(ValueError, match="--io mmap"):
        Engine(bundle, fused=True, io="pread")
    with pytest.raises(ValueError, match="belady"):
        Engine(bundle, fused=True, policy="belady", gamma=1.0)
    with pytest.raises(ValueError, match="choose one"):
        Engine(bundle, fused=True, single_session=True)
    eng = Engine(bundle, fused=True, dram_budget="50%")
    with pytest.raises(ValueError, match=r"fused=False \(--no-fused\)"):
        eng.generate(PROMPT, 2, trace=eng.trace_recorder())


def test_the_default_joins_the_graphs_where_it_can_and_steps_the_cache_on_the_host_elsewhere(tiny_dipca_bundle):
    """fused=None: the joined decoder below 100 % unless something known at open is in its way; the
    whole model where the budget holds every row; fused=False keeps the host step."""
    bundle = tiny_dipca_bundle()
    eng = Engine(bundle, dram_budget="50%")
    assert eng.fused is not None and not eng.single_session
    assert eng.generate(PROMPT, 2, stop_at_eos=False).stats.fused
    for kw in ({"io": "pread"}, {"policy": "belady", "gamma": 1.0}, {"native": False}, {"native_cache": False},
               {"fused": False}):
        eng = Engine(bundle, dram_budget="50%", **kw)
        assert eng.fused is None and not eng.single_session, kw
        assert not eng.generate(PROMPT, 2, stop_at_eos=False).stats.fused, kw
    assert Engine(bundle, dram_budget="100%").single_session
    assert Engine(bundle, dram_budget="100%", single_session=False).fused is not None


def test_cli_run_joins_the_graphs_by_default_and_traces_on_the_host_step(tiny_dipca_bundle, tmp_path):
    import json

    from typer.testing import CliRunner

    from dipdeploy.cli import app

    bundle, runner = tiny_dipca_bundle(), CliRunner()
    base = ["run", str(bundle), "-p", "hello", "-n", "3", "--dram-budget", "50%"]
    for n, (extra, joined) in enumerate((([], True), (["--no-fused"], False), (["--io", "pread"], False),
                                         (["--trace", str(tmp_path / "t.json")], False))):
        out = tmp_path / f"{n}.json"
        res = runner.invoke(app, [*base, *extra, "--json", str(out)])
        assert res.exit_code == 0, res.output
        assert json.loads(out.read_text())["fused"] is joined, extra
    for extra, named in ((["--trace", str(tmp_path / "u.json")], "--trace"), (["--io", "pread"], "--io pread")):
        res = runner.invoke(app, [*base, "--fused", *extra])
        assert res.exit_code == 2 and named in res.output, res.output


def test_cli_run_reads_ahead_with_io_direct_unless_told_not_to(tiny_dipca_bundle, tmp_path):
    import json

    from typer.testing import CliRunner

    from dipdeploy.cli import app

    bundle, runner = tiny_dipca_bundle(), CliRunner()
    base = ["run", str(bundle), "-p", "hello", "-n", "6", "--dram-budget", "50%", "--io", "direct"]
    ahead = {}
    for flag in ("--prefetch", "--no-prefetch"):
        out = tmp_path / f"{flag}.json"
        res = runner.invoke(app, [*base, flag, "--json", str(out)])
        assert res.exit_code == 0, res.output
        ahead[flag] = json.loads(out.read_text())["read_ahead_rows_per_token"]
        assert ("read ahead per token" in res.output) == (flag == "--prefetch"), res.output
    assert ahead["--prefetch"] > 0 and ahead["--no-prefetch"] == 0


def test_joined_graph_holds_each_per_layer_node_once_and_a_step_pair_per_group(tiny_dipca_bundle):
    import onnx

    from dipdeploy.export.joined import SETTLE_OP, STEP_OP, fuse_graphs

    bundle = tiny_dipca_bundle()
    layers = len(Engine(bundle, fused=True).k)
    model = fuse_graphs(bundle, layers)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count(STEP_OP) == ops.count(SETTLE_OP) == 2 * layers
    parts = ["positions.onnx", "head.onnx"] + [f"layer.{i}.{g}.onnx" for i in range(layers)
                                               for g in ("attn", "mlp_up", "mlp_down")]
    per_layer = sum(len(onnx.load(str(bundle / p), load_external_data=False).graph.node) for p in parts)
    assert len(ops) == per_layer + 4 * layers + 2  # and the head's two inputs cut to the last position
    assert [n.op_type for n in model.graph.node if n.output[0].endswith(".last")] == ["Slice", "Slice"]
    seen = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    for node in model.graph.node:  # topological order, every value produced once
        assert all(x in seen for x in node.input if x), node.name
        out = {x for x in node.output if x}
        assert not seen & out, node.name
        seen |= out


def test_a_chat_continues_its_conversation_on_the_joined_decoder(chat_bundle):
    """``chat`` keeps its KV cache and truncates it when the history changes; the joined decoder binds
    the same KV buffers, so the second turn continues the first."""
    from dipdeploy.runtime import Sampler
    from dipdeploy.runtime.chat import Chat

    chat = Chat(Engine(chat_bundle, dram_budget="50%", fused=True, context=256), Sampler(), None)
    chat.say("first question", 6)
    chat.say("second question", 6)
    assert [m["role"] for m in chat.turns] == ["user", "assistant", "user", "assistant"]
    ids = chat.engine.encode(chat.template.render(chat.history[:3], add_generation_prompt=True))
    assert chat.engine.sequence[: len(ids)] == ids


@pytest.mark.parametrize("budget,policy,io", [("50%", "lfu", "mmap"), ("30%", "lru", "direct"), ("50%", "static", "mmap")])
def test_the_joined_decoders_batched_prefill_is_the_per_layer_paths(tiny_dipca_bundle, budget, policy, io):
    """A prompt in chunks through the one graph (the groups in prefill mode) leaves what the per-layer
    path's batched prefill leaves: the same next-token logits and decode (near-tie-aware), the same
    lookups and hits, the same residency in every group; progress follows each chunk; decoding then
    continues on the joined graph token by token."""
    from dipdeploy.runtime.stats import Timer

    bundle = tiny_dipca_bundle("gqa")
    prompt = PROMPT * 3  # 27 tokens: chunks of 8, the last of 3
    kw = dict(dram_budget=budget, policy=policy, io=io, prefill_chunk=8)
    per_layer = Engine(bundle, single_session=False, fused=False, **kw)
    fused = Engine(bundle, fused=True, **kw)
    assert fused.fused.chunk == 8
    ref = per_layer.generate(prompt, 10, keep_logits=True, stop_at_eos=False)
    got = fused.generate(prompt, 10, keep_logits=True, stop_at_eos=False)
    assert_generations_agree(ref, got)
    assert got.stats.prefill == "batch"
    lookups = sum(a + b for a, b in fused.k) * (len(prompt) + len(got.tokens) - 1)
    assert fused.native_hits()[:, :, 1].sum() == lookups
    # the two paths' selections agree but at near-ties (another graph, other fusions): so do the caches
    same = [np.mean(x.cache.resident == y.cache.resident) for a, b in zip(per_layer.slabs, fused.slabs)
            for x, y in zip(a, b)]
    assert min(same) > 0.9, same
    assert abs(ref.stats.hit_rate - got.stats.hit_rate) < 0.05
    assert got.stats.flash_mb_per_token > 0
    fused.reset()
    seen = []
    logits = fused.prefill(prompt, Timer(), progress=lambda done, total: seen.append((done, total)))
    assert seen == [(8, 27), (16, 27), (24, 27), (27, 27)] and fused.sequence == prompt
    np.testing.assert_allclose(logits, got.logits[0], rtol=1e-5, atol=1e-5)


def test_a_gamma_other_than_the_bundles_reaches_the_joined_graph(tiny_dipca_bundle):
    """``gamma`` rewrites every TopKColumnMask of the joined graph, as it does the per-layer sessions'."""
    bundle = tiny_dipca_bundle()
    kw = dict(dram_budget="50%", prefill="token", gamma=1.0)
    ref = Engine(bundle, single_session=False, fused=False, **kw).generate(PROMPT, 10, keep_logits=True, stop_at_eos=False)
    got = Engine(bundle, fused=True, **kw).generate(PROMPT, 10, keep_logits=True, stop_at_eos=False)
    assert_generations_agree(ref, got)
    baked = Engine(bundle, fused=True, dram_budget="50%").generate(PROMPT, 10, keep_logits=True, stop_at_eos=False)
    assert not all(np.array_equal(a, b) for a, b in zip(baked.logits, got.logits))  # γ changed the selections


def test_a_read_ahead_is_counted_when_no_step_missed(monkeypatch):
    """A token whose CachePrefetch read rows that its steps then did not miss still read them: the device
    bytes, requests and read-ahead rows reach the Flash store's counters; a token that read nothing adds
    nothing."""
    import types

    import dipdeploy.runtime.native_cache as native_cache
    from dipdeploy.runtime.backends.joined import JoinedDecoder
    from dipdeploy.runtime.flash import FlashCounters

    accounted = []
    flash = types.SimpleNamespace(counters=FlashCounters(), settle=lambda: None,
                                  account=lambda *a: accounted.append(a))
    eng = types.SimpleNamespace(_cache_library="lib", fused=types.SimpleNamespace(handles=np.zeros(2, np.int64)),
                                flash=flash)
    for reads in (native_cache.GraphReads(0, 3, 0, 0.002, 12288, ahead=4, ahead_used=0),
                  native_cache.GraphReads(0, 0, 0, 0.0, 0)):
        monkeypatch.setattr(native_cache, "drain", lambda library, handles, r=reads: r)
        JoinedDecoder._drain_graph_reads(eng)
    assert accounted == [(0, 3, 0.002, 12288, 0)]  # direct: FlashStore.account takes the reader's requests
    assert (flash.counters.ahead_rows, flash.counters.ahead_used) == (4, 0)


@pytest.mark.parametrize("attention", ["standard", "gqa"])
def test_export_writes_the_joined_decoder_in_each_form_and_lists_it(tiny_dipca_bundle, attention):
    """The bundle carries the joined graph (``graphs.decoder``, in ``JOINED``'s order), each form the one
    ``fuse_graphs`` builds from the bundle's own per-layer graphs; the prefetch form only where a layer got
    a CachePrefetch (these tiny layers are pre-norm: every form is there)."""
    import onnx

    from dipdeploy.bundle.manifest import read_manifest
    from dipdeploy.bundle.names import JOINED
    from dipdeploy.export.joined import fuse_graphs

    bundle = tiny_dipca_bundle(attention)
    m = read_manifest(bundle)
    assert m.graphs["decoder"] == list(JOINED.values())
    layers = len(Engine(bundle, fused=True).k)
    for form, (overlap, prefetch) in {"step": (False, False), "overlap": (True, False),
                                      "prefetch": (True, True)}.items():
        written = onnx.load(str(bundle / JOINED[form]), load_external_data=False)
        built = fuse_graphs(bundle, layers, None, overlap, prefetch)
        assert written.graph.SerializeToString() == built.graph.SerializeToString(), form
        assert JOINED[form] in m.files


def test_the_joined_decoder_runs_without_the_onnx_package(tiny_dipca_bundle):
    """The default path below 100 % opens the bundle's joined graph as it is: a host with numpy, onnxruntime
    and the op library (no ``onnx``, no graph building) runs it, at the bundle's γ and accuracy level."""
    import subprocess
    import sys

    bundle = tiny_dipca_bundle()
    code = ("import sys; from dipdeploy.runtime import Engine; "
            f"eng = Engine({str(bundle)!r}, dram_budget='50%'); "
            f"out = eng.generate({PROMPT!r}, 3, stop_at_eos=False); "
            "assert out.stats.fused and len(out.tokens) == 3, out.stats; "
            "assert 'onnx' not in sys.modules, 'onnx imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_bundle_without_the_joined_decoder_runs_the_per_layer_graphs(tiny_dipca_bundle, tmp_path):
    """A bundle whose manifest lists no joined graph (a calibrated row order has none) runs the per-layer
    path by default and refuses ``fused=True`` in one line naming the cause."""
    import json
    import shutil

    from dipdeploy.bundle.names import JOINED, MANIFEST

    src = tiny_dipca_bundle()
    bundle = tmp_path / "bundle"
    shutil.copytree(src, bundle)
    raw = json.loads((bundle / MANIFEST).read_text())
    del raw["graphs"]["decoder"]
    for name in JOINED.values():
        (bundle / name).unlink()
        raw["files"].pop(name)
    (bundle / MANIFEST).write_text(json.dumps(raw))
    eng = Engine(bundle, dram_budget="50%")
    assert eng.fused is None and not eng.generate(PROMPT, 2, stop_at_eos=False).stats.fused
    with pytest.raises(ValueError, match="no joined decoder graph"):
        Engine(bundle, dram_budget="50%", fused=True)


@pytest.mark.parametrize("io", ["mmap", "direct"])
def test_draft_mode_multiplies_the_resident_rows_alone(io, tmp_path):
    """``dd_cache_draft`` (``--speculate --draft cache``): CacheBegin gives the selection's resident entries
    and their slots, CacheEnd none, CacheSettle does nothing; the cache, its slots, counters and reads stay
    as they were; CacheStep is refused in one line; out of the draft the steps are as before."""
    import onnxruntime as ort

    from dipdeploy.runtime.native_cache import draft

    rows, k = 80, 12
    rng = np.random.default_rng(11)
    g = _group(tmp_path, rng, rows, k, 30, "lfu", io, 0)
    opts = session_options(1, True)
    split = ort.InferenceSession(_split_graph(k).SerializeToString(), opts, providers=["CPUExecutionProvider"])
    step = ort.InferenceSession(_step_graph(k).SerializeToString(), opts, providers=["CPUExecutionProvider"])
    handle = np.array([g.nat.handle], np.int64)
    for _ in range(10):  # warm the cache
        split.run(None, {"indices": rng.choice(rows, k, replace=False)[None], "handle": handle, "slab": g.slab})
    drain(str(LIB), handle)
    state = g.nat.state
    before = [np.copy(getattr(state, f)) for f in ("resident", "last_use", "uses", "counters", "slot_of")]
    draft(str(LIB), handle, True)
    for _ in range(5):
        sel = rng.choice(rows, k, replace=False)
        hit_idx, hit_slots, miss_idx, miss_slots, hit_rows, miss_rows, out = split.run(
            None, {"indices": sel[None], "handle": handle, "slab": g.slab})
        held = sel[state.resident[sel].astype(bool)]
        assert hit_idx[0].tolist() == held.tolist() and hit_slots[0].tolist() == state.slot_of[held].tolist()
        assert miss_idx.shape == (1, 0) and miss_slots.shape == (1, 0)
        assert np.isclose(out, g.weights[held].sum(), rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match="overlap graph"):
        step.run(None, {"indices": sel[None], "handle": handle, "slab": g.slab})
    for was, f in zip(before, ("resident", "last_use", "uses", "counters", "slot_of")):
        assert np.array_equal(was, getattr(state, f)), f
    assert drain(str(LIB), handle).misses == 0
    draft(str(LIB), handle, False)
    split.run(None, {"indices": rng.choice(rows, k, replace=False)[None], "handle": handle, "slab": g.slab})
    assert state.counters[0] == before[3][0] + 1
