"""The Flash store's ``direct`` path: block-aligned O_DIRECT reads, many in flight (the op library's
io_uring ring and pread threads, and the Python fallback), its counters, and the fall-back where
O_DIRECT is refused."""

import errno
import os

import numpy as np
import pytest

from dipdeploy.flash import BLOCK, MAX_REQUEST, bounce_bytes, plan_reads
from dipdeploy.runtime import blockio
from dipdeploy.runtime.blockio import PythonReader, make_reader
from dipdeploy.runtime.flash import FlashStore, RowArray
from dipdeploy.sim.devices import FlashModel


def _native_built() -> bool:
    from dipdeploy.ops.native import library_path

    return library_path() is not None


def _ring_works() -> bool:
    if not _native_built():
        return False
    try:
        make_reader(2, engine="io_uring").close()
    except ValueError:
        return False
    return True


READERS = ["python",
           pytest.param("threads", marks=pytest.mark.skipif(not _native_built(), reason="native library not built (make ops)")),
           pytest.param("io_uring", marks=pytest.mark.skipif(not _ring_works(), reason="no io_uring here (or no op library)"))]


def _file(tmp_path, size: int, seed: int = 0):
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    path = tmp_path / "mlp.bin"
    path.write_bytes(data.tobytes())
    return path, data


# Two per-row arrays like BQ4's qweight and scales: row sizes that do not divide the block, the second
# array starting mid-block, the file not ending on a block boundary.
ARRAYS = [RowArray("q", 0, 700, 306, "uint8", (306,)), RowArray("s", 700 * 306 + 10, 700, 20, "uint8", (20,))]
FILE_SIZE = 700 * 306 + 10 + 700 * 20 + 77


def _store(path, reader: str, **kw) -> FlashStore:
    store = FlashStore(path, io="direct", native=(reader != "python"),
                       io_engine="threads" if reader == "python" else reader, **kw)
    assert store.reader_kind == reader
    return store


@pytest.mark.parametrize("in_flight", [2, 16])
@pytest.mark.parametrize("reader", READERS)
def test_direct_reads_are_the_bytes_of_the_file(tmp_path, reader, in_flight):
    path, data = _file(tmp_path, FILE_SIZE)
    store = _store(path, reader, io_threads=in_flight, io_gap=in_flight // 4)  # 2: most batches hold more requests
    # than may fly; gaps of 0 and 4 blocks read through
    assert store.note is None  # tmp_path is a disk filesystem here: O_DIRECT accepted
    rng = np.random.default_rng(1)
    for trial in range(20):
        rows = np.sort(rng.choice(700, int(rng.integers(1, 300)), replace=False))
        if trial == 0:
            rows = np.array([0, 699])  # the file's first and last rows
        slots = rng.permutation(400)[:len(rows)]
        slabs = [np.zeros((400, a.row_bytes), np.uint8) for a in ARRAYS]
        store.read(ARRAYS, slabs, rows, slots)
        for a, slab in zip(ARRAYS, slabs):
            want = data[a.offset: a.offset + a.rows * a.row_bytes].reshape(a.rows, a.row_bytes)[rows]
            assert np.array_equal(slab[slots], want)  # bit-equal by contract
    store.close()


@pytest.mark.skipif(not _ring_works(), reason="no io_uring here (or no op library)")
def test_the_ring_reads_in_two_halves(tmp_path):
    """dd_io_ring_begin submits and returns, dd_io_ring_end completes the batch: the file's bytes, a second
    batch refused while one is open (-EBUSY), an end without a begin refused (-EINVAL)."""
    import ctypes

    from dipdeploy.ops.native import library_path

    path, data = _file(tmp_path, FILE_SIZE)
    rows = np.arange(0, 700, 25)  # rows blocks apart: a request each
    plan = plan_reads([a.offset for a in ARRAYS], [a.row_bytes for a in ARRAYS], rows, max_gap=0)
    lib = ctypes.CDLL(str(library_path()))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.dd_io_ring_new.restype, lib.dd_io_ring_new.argtypes = p, [ctypes.c_int]
    lib.dd_io_ring_free.restype, lib.dd_io_ring_free.argtypes = None, [p]
    lib.dd_io_ring_begin.restype, lib.dd_io_ring_begin.argtypes = i64, [p, ctypes.c_int, i64, p, p, p, p, p]
    lib.dd_io_ring_end.restype, lib.dd_io_ring_end.argtypes = i64, [p, ctypes.POINTER(i64)]
    ring = lib.dd_io_ring_new(4)  # fewer entries than requests: the end half submits the rest
    assert ring and plan.requests > 4
    aligned = blockio.AlignedBuffer()  # kept alive: the kernel writes into it
    buf = aligned.get(plan.total)
    fd, _ = blockio.open_direct(str(path))
    failed = i64(-1)
    try:
        args = (plan.offset.ctypes.data, plan.length.ctypes.data, plan.need.ctypes.data, buf.ctypes.data,
                plan.place.ctypes.data)
        assert lib.dd_io_ring_end(ring, ctypes.byref(failed)) == -errno.EINVAL
        assert lib.dd_io_ring_begin(ring, fd, plan.requests, *args) == 0
        assert lib.dd_io_ring_begin(ring, fd, plan.requests, *args) == -errno.EBUSY
        assert lib.dd_io_ring_end(ring, ctypes.byref(failed)) >= int(plan.need.sum())
        assert lib.dd_io_ring_end(ring, ctypes.byref(failed)) == -errno.EINVAL
    finally:
        os.close(fd)
        lib.dd_io_ring_free(ring)
    for a, src in zip(ARRAYS, plan.src):
        want = data[a.offset: a.offset + a.rows * a.row_bytes].reshape(a.rows, a.row_bytes)[rows]
        got = np.stack([buf[s: s + a.row_bytes] for s in src.tolist()])
        assert np.array_equal(got, want)  # bit-equal by contract


def _expected(rows: np.ndarray, gap: int) -> tuple[int, int, int]:
    """Requests, device bytes and wanted bytes computed the slow way: the set of blocks each row touches,
    runs of blocks at most ``gap`` blocks apart (the blocks between read too), each run cut at MAX_REQUEST."""
    blocks = set()
    for a in ARRAYS:
        for r in rows.tolist():
            lo, hi = a.offset + r * a.row_bytes, a.offset + (r + 1) * a.row_bytes
            blocks.update(range(lo // BLOCK, (hi - 1) // BLOCK + 1))
    blocks = sorted(blocks)
    runs, start = [], blocks[0]
    for prev, b in zip(blocks, blocks[1:] + [None]):
        if b is None or b - prev - 1 > gap:
            runs.append((start, prev + 1))
            start = b
    per = MAX_REQUEST // BLOCK
    requests = sum(-(-(end - begin) // per) for begin, end in runs)
    read = [b for begin, end in runs for b in range(begin, end)]
    device = sum(min(BLOCK, FILE_SIZE - b * BLOCK) for b in read)  # the last block ends with the file
    return requests, device, len(rows) * sum(a.row_bytes for a in ARRAYS)


@pytest.mark.parametrize("gap", [0, 3])
@pytest.mark.parametrize("reader", READERS)
def test_counters_are_wanted_bytes_device_bytes_and_requests(tmp_path, reader, gap):
    path, _ = _file(tmp_path, FILE_SIZE)
    store = _store(path, reader, io_gap=gap)
    rng = np.random.default_rng(2)
    for rows in (np.array([3]), np.array([0, 1, 2, 13, 14]), np.arange(700), np.sort(rng.choice(700, 50, replace=False))):
        slabs = [np.zeros((700, a.row_bytes), np.uint8) for a in ARRAYS]
        before = store.counters.snapshot()
        store.read(ARRAYS, slabs, rows, np.arange(len(rows)))
        got = store.counters - before
        requests, device, wanted = _expected(rows, gap)
        assert (got.requests, got.device_bytes, got.bytes) == (requests, device, wanted)
        assert got.block_bytes == got.device_bytes >= got.bytes
    store.close()


def test_plan_coalesces_rows_sharing_or_neighbouring_blocks():
    # Rows of 1000 B: rows 0 and 3 share block 0; row 20 ([20000, 21000)) straddles blocks 4 and 5.
    plan = plan_reads([0], [1000], np.array([0, 3, 20]))
    assert plan.offset.tolist() == [0, 4 * BLOCK]
    assert plan.length.tolist() == [BLOCK, 2 * BLOCK]
    assert plan.need.tolist() == [4000, 21000 - 4 * BLOCK]  # up to the last wanted byte
    assert plan.src[0].tolist() == [0, 3000, BLOCK + 20000 - 4 * BLOCK]
    plan = plan_reads([0], [1000], np.array([0, 5]))  # blocks 0 and 1: neighbours, one request
    assert plan.requests == 1 and plan.device_bytes == 2 * BLOCK
    assert plan.src[0].tolist() == [0, 5000]
    gap = plan_reads([0], [1000], np.array([0, 20]), max_gap=3)  # blocks 0 and 4-5: the 3 between read through
    assert gap.requests == 1 and gap.device_bytes == 6 * BLOCK and gap.src[0].tolist() == [0, 20000]
    assert plan_reads([0], [1000], np.array([0, 20]), max_gap=2).requests == 2
    big = plan_reads([0], [BLOCK], np.arange(100), max_request=8 * BLOCK)  # one range, cut into 13 requests
    assert big.requests == 13 and big.length.sum() == 100 * BLOCK and big.place.tolist() == big.offset.tolist()
    with pytest.raises(ValueError, match="multiple of the block"):
        plan_reads([0], [10], np.array([1]), max_request=1000)


@pytest.mark.parametrize("reader", READERS)
def test_a_truncated_file_is_a_clear_error(tmp_path, reader):
    path, _ = _file(tmp_path, 5 * BLOCK)
    store = _store(path, reader)
    arr = RowArray("q", 0, 100, BLOCK, "uint8", (BLOCK,))  # claims 100 blocks, the file has 5
    with pytest.raises(OSError, match="truncated"):
        store.read([arr], [np.zeros((10, BLOCK), np.uint8)], np.array([2, 7]), np.array([0, 1]))
    store.close()


def _refuse_o_direct(monkeypatch):
    """A filesystem that refuses O_DIRECT, on open and on an open descriptor (``blockio.direct_fd``)."""
    import fcntl

    real_open, real_fcntl = os.open, fcntl.fcntl

    def refusing_open(p, flags, *a, **kw):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(p, flags, *a, **kw)

    def refusing_fcntl(fd, cmd, arg=0):
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fcntl(fd, cmd, arg)

    monkeypatch.setattr(os, "open", refusing_open)
    monkeypatch.setattr(fcntl, "fcntl", refusing_fcntl)


def test_refused_o_direct_falls_back_with_one_line(tmp_path, monkeypatch):
    path, data = _file(tmp_path, FILE_SIZE)
    _refuse_o_direct(monkeypatch)
    store = FlashStore(path, io="direct", native=False)
    assert store.note is not None and "\n" not in store.note
    assert "refuses O_DIRECT" in store.note and "page cache" in store.note
    rows = np.array([5, 6, 400])
    slabs = [np.zeros((3, a.row_bytes), np.uint8) for a in ARRAYS]
    store.read(ARRAYS, slabs, rows, np.arange(3))
    a = ARRAYS[0]
    assert np.array_equal(slabs[0], data[a.offset:a.offset + a.rows * a.row_bytes].reshape(a.rows, -1)[rows])
    store.close()


def test_emulated_bandwidth_paces_the_device_bytes(tmp_path):
    """On top of real reads, --flash-bandwidth owes the blocks read, not only the rows' bytes."""
    path, _ = _file(tmp_path, FILE_SIZE)
    store = FlashStore(path, io="direct", emulate=FlashModel(20e6, 0.0), native=False)
    rows = np.arange(0, 700, 14)  # one 306 B row per 4 KiB block: device bytes ≈ 13 × the rows'
    store.read(ARRAYS, [np.zeros((len(rows), a.row_bytes), np.uint8) for a in ARRAYS], rows, np.arange(len(rows)))
    store.settle()
    c = store.counters
    assert c.device_bytes > 5 * c.bytes
    assert c.emulated_wait + c.io_seconds >= c.device_bytes / 20e6 * 0.999
    store.close()


@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_emulated_bandwidth_paces_the_blocks_holding_the_rows(tmp_path, io):
    """Through the page cache too, --flash-bandwidth owes the 4 KiB blocks a device would return for the
    rows (rows sharing a block share it), not the rows' bytes."""
    path, _ = _file(tmp_path, FILE_SIZE)
    store = FlashStore(path, io=io, emulate=FlashModel(20e6, 0.0))
    rows = np.array([0, 1, 2] + list(range(28, 700, 14)))  # rows 0-2 share a block; then one row per block
    store.read(ARRAYS, [np.zeros((len(rows), a.row_bytes), np.uint8) for a in ARRAYS], rows, np.arange(len(rows)))
    store.settle()
    c = store.counters
    assert c.block_bytes == plan_reads([a.offset for a in ARRAYS], [a.row_bytes for a in ARRAYS], rows).total
    assert c.block_bytes > 5 * c.bytes and c.device_bytes == 0  # whether the page cache held them is the OS's
    assert c.emulated_wait + c.io_seconds >= c.block_bytes / 20e6 * 0.999
    store.close()


@pytest.mark.parametrize("io", ["mmap", "pread", "direct"])
def test_a_device_profiles_request_cost_is_paced_per_device_request(tmp_path, io):
    """--flash-device owes each device request its cost: the requests read (direct), or a run of touching
    blocks each through the page cache, whatever the reader's own calls were; its bandwidth is paced too."""
    path, _ = _file(tmp_path, FILE_SIZE)
    store = FlashStore(path, io=io, emulate=FlashModel(1e12, 2e-3), native=False)
    rows = np.array([0, 1, 2, 3] + list(range(28, 420, 14)))  # rows 0-3 share a run; then a block or two apart
    store.read(ARRAYS, [np.zeros((len(rows), a.row_bytes), np.uint8) for a in ARRAYS], rows, np.arange(len(rows)))
    store.settle()
    c = store.counters
    plan = plan_reads([a.offset for a in ARRAYS], [a.row_bytes for a in ARRAYS], rows,
                      max_gap=store.io_gap if io == "direct" else 0)
    assert c.block_requests == plan.requests > 1
    if io == "direct":  # the reader's requests are the device's
        assert c.requests == plan.requests
    assert c.emulated_wait + c.io_seconds >= plan.requests * 2e-3 * 0.999
    store.close()


def test_emulation_is_a_bandwidth_or_a_device_profile():
    from dipdeploy.runtime.flash import emulation
    from dipdeploy.sim.devices import get_device

    assert emulation(None, None) is None
    assert emulation(5e8, None) == FlashModel(5e8, 0.0)
    want = get_device("sd8gen3").flash
    got = emulation(None, "sd8gen3")
    assert (got.seq_bandwidth, got.request_s) == (want.seq_bandwidth, want.request_s) and got.request_s > 0
    with pytest.raises(ValueError, match="not both"):
        emulation(5e8, "sd8gen3")
    with pytest.raises(KeyError, match="unknown device 'toaster'"):
        emulation(None, "toaster")


def test_reader_choice(monkeypatch):
    import dipdeploy.ops.native as native

    monkeypatch.setattr(native, "library_path", lambda arch=None: None)
    reader = make_reader(4)
    assert isinstance(reader, PythonReader)
    reader.close()
    with pytest.raises(ValueError, match="io threads"):
        make_reader(0)
    with pytest.raises(ValueError, match="needs the op library"):
        make_reader(4, engine="io_uring")
    with pytest.raises(ValueError, match="choose one of"):
        make_reader(4, engine="aio")
    with pytest.raises(ValueError, match="max_gap"):
        plan_reads([0], [10], np.array([1]), max_gap=-1)



@pytest.mark.skipif(not _native_built(), reason="native library not built (make ops)")
def test_auto_takes_the_ring_where_granted_else_the_threads(monkeypatch):
    """``auto`` (the default) is the ring at its own depth where the kernel grants one; where the ring is
    refused it is the pread threads at theirs, while naming ``io_uring`` stays an error there. A depth
    given (``--io-threads``) is the one used either way."""
    reader = make_reader()
    assert (reader.kind, reader.threads) == (("io_uring", blockio.IO_RING_DEPTH) if _ring_works()
                                             else ("threads", blockio.IO_THREADS))
    reader.close()
    refused = blockio.NativeReader

    class NoRing(refused):
        def __init__(self, library, threads, engine):
            if engine == "io_uring":
                raise ValueError("--io-engine io_uring: this kernel has no io_uring")
            super().__init__(library, threads, engine)

    monkeypatch.setattr(blockio, "NativeReader", NoRing)
    for threads, expect in ((None, blockio.IO_THREADS), (3, 3)):
        reader = make_reader(threads, engine="auto")
        assert (reader.kind, reader.threads) == ("threads", expect)
        reader.close()
    with pytest.raises(ValueError, match="no io_uring"):
        make_reader(engine="io_uring")

@pytest.fixture(scope="module")
def tiny_bundle(tiny_dipca_bundle):
    return tiny_dipca_bundle()


def test_run_with_direct_reads_equals_pread(tiny_bundle):
    """Same rows bit for bit, so the same numerics: the tokens are equal, not merely close."""
    from dipdeploy.runtime import Engine

    prompt = [3, 14, 15, 92, 65, 35]
    engines = {io: Engine(tiny_bundle, dram_budget="30%", policy="lfu", io=io, cold=True, native=False, io_threads=3)
               for io in ("pread", "direct")}
    assert engines["direct"].flash._reader.threads == 3
    runs = {io: eng.generate(prompt, 10, stop_at_eos=False) for io, eng in engines.items()}
    assert runs["direct"].tokens == runs["pread"].tokens
    pread, direct = runs["pread"].stats, runs["direct"].stats
    assert direct.flash_mb_per_token == pytest.approx(pread.flash_mb_per_token)  # the same misses
    assert direct.flash_device_mb_per_token >= direct.flash_mb_per_token
    assert pread.flash_device_mb_per_token is None


def test_cli_run_reports_device_bytes(tiny_bundle, tmp_path):
    import json

    from typer.testing import CliRunner

    from dipdeploy.cli import app

    js = tmp_path / "r.json"
    args = ["run", str(tiny_bundle), "--prompt", "ab", "-n", "4", "--no-native", "--dram-budget", "50%",
            "--io", "direct", "--cold", "--json", str(js)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "read from device per token" in res.output
    row = json.loads(js.read_text())
    assert row["io"] == "direct" and row["flash_device_mb_per_token"] >= row["flash_mb_per_token"] > 0
    args[args.index("--json"):] = ["--io-threads", "3"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output


@pytest.mark.skipif(not _ring_works(), reason="no io_uring here (or no op library)")
@pytest.mark.parametrize("prefetch", [False, True])
def test_run_through_the_ring_equals_the_threads(tiny_bundle, prefetch):
    """The two native readers fetch the same bytes, begun before the resident rows' product and ended
    after it, with the read-ahead during the attention or without: bit-equal logits, the same reads
    counted. A ring of 2 entries keeps most of a batch's requests for its end half."""
    from dipdeploy.runtime import Engine

    prompt = [3, 14, 15, 92, 65, 35]
    runs = {}
    for engine in ("threads", "io_uring"):
        eng = Engine(tiny_bundle, dram_budget="30%", policy="lfu", io="direct", cold=True, io_threads=2,
                     io_engine=engine, prefetch=prefetch)
        assert eng.flash.reader_kind == engine
        runs[engine] = eng.generate(prompt, 10, stop_at_eos=False, keep_logits=True)
        assert runs[engine].stats.io_engine == engine
        eng.close()
    a, b = runs["threads"], runs["io_uring"]
    assert a.tokens == b.tokens and all(np.array_equal(x, y) for x, y in zip(a.logits, b.logits))
    assert a.stats.flash_mb_per_token == b.stats.flash_mb_per_token
    assert a.stats.flash_requests_per_token == b.stats.flash_requests_per_token
    assert a.stats.read_ahead_rows_per_token == b.stats.read_ahead_rows_per_token
    assert a.stats.read_ahead_used_per_token == b.stats.read_ahead_used_per_token
    assert (a.stats.read_ahead_rows_per_token > 0) == prefetch


def test_the_bounce_buffer_never_outgrows_its_bound():
    """Any batch of rows, at any gap, lands within ``bounce_bytes`` (the plan's read buffer), alignment
    slack included; all rows of the group at once is the worst case."""
    rng = np.random.default_rng(3)
    offsets, row_bytes = [a.offset for a in ARRAYS], [a.row_bytes for a in ARRAYS]
    for gap in (0, 1, 4, 16):
        bound = bounce_bytes(offsets, row_bytes, 700, max_gap=gap)
        for n in (1, 50, 350, 700):
            rows = np.sort(rng.choice(700, n, replace=False))
            plan = plan_reads(offsets, row_bytes, rows, max_gap=gap)
            assert plan.total + BLOCK <= bound
    whole = plan_reads(offsets, row_bytes, np.arange(700))
    assert whole.total + BLOCK <= bounce_bytes(offsets, row_bytes, 700) <= whole.total + 3 * BLOCK


def test_the_plan_holds_the_read_buffer_of_direct_reads(tiny_bundle):
    from dipdeploy.runtime import Engine

    prompt = [3, 14, 15, 92, 65, 35]
    mapped = Engine(tiny_bundle, dram_budget="30%", policy="lfu", io="mmap", native=False)
    direct = Engine(tiny_bundle, dram_budget="30%", policy="lfu", io="direct", cold=True, native=False)
    assert mapped.residency.read == 0 < direct.residency.read
    assert direct.residency.total == mapped.residency.total + direct.residency.read  # a fraction: same caches
    direct.generate(prompt, 8, stop_at_eos=False)
    assert 0 < len(direct.flash._bounce.view) <= direct.residency.read
    with pytest.raises(ValueError, match="read buffer"):
        Engine(tiny_bundle, dram_budget=f"{(direct.residency.total - direct.residency.caches) / 1e6 - 0.1:.1f}MB",
               io="direct", native=False, single_session=False)  # the per-layer plan's read buffer


def test_io_auto_reads_direct_only_where_rows_stay_on_flash_and_o_direct_works(tmp_path, monkeypatch):
    from dipdeploy.runtime.flash import choose_io

    path, _ = _file(tmp_path, FILE_SIZE)
    assert choose_io(path, rows_on_flash=True) == ("direct", "rows read from Flash")
    assert choose_io(path, rows_on_flash=False) == ("mmap", "every MLP row resident")
    _refuse_o_direct(monkeypatch)
    assert choose_io(path, rows_on_flash=True) == ("mmap", "the filesystem refuses O_DIRECT")


def test_engine_resolves_io_auto_once_the_plan_is_known(tiny_bundle, monkeypatch):
    """The default ``auto`` becomes ``direct`` on the per-layer path below 100 % (the plan's read buffer
    with it), ``mmap`` where model.onnx holds every row; the stats say which and why; a name that is no
    mode is refused before the bundle opens."""
    from dipdeploy.runtime import Engine, EngineConfig

    assert EngineConfig().io == "auto"
    below = Engine(tiny_bundle, dram_budget="30%", policy="lfu", native=False)
    assert (below.cfg.io, below.io_why) == ("direct", "rows read from Flash") and below.residency.read > 0
    stats = below.generate([3, 14, 15, 92], 4, stop_at_eos=False).stats
    assert (stats.io, stats.io_why) == ("direct", "rows read from Flash")
    assert stats.flash_device_mb_per_token is not None
    assert "--io direct (auto: rows read from Flash)" in dict(stats.table())["Flash per token"]
    given = Engine(tiny_bundle, dram_budget="30%", policy="lfu", io="mmap", native=False)
    assert (given.cfg.io, given.io_why, given.residency.read) == ("mmap", "given", 0)
    whole = Engine(tiny_bundle, dram_budget="100%", native=False)
    if whole.single_session:
        assert (whole.cfg.io, whole.io_why) == ("mmap", "every MLP row resident")
    _refuse_o_direct(monkeypatch)
    refused = Engine(tiny_bundle, dram_budget="30%", policy="lfu", native=False)
    assert (refused.cfg.io, refused.io_why) == ("mmap", "the filesystem refuses O_DIRECT")
    with pytest.raises(ValueError, match="choose one of auto, mmap, pread, direct"):
        EngineConfig(io="odirect")
