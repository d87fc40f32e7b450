"""One group's per-token cache step in the op library (custom_ops/src/cache/), through ctypes.

The numpy ``RowCache.access`` + ``SlotTable.assign`` + ``FlashStore.read`` of a decoded token cost
about a dozen numpy calls per group, 60 groups per SmolLM2 token: the largest share of the host's time
(docs/decisions/0001-native-cache-step.md). The op library runs the same rules (``dipdeploy.cache``, which stays the
reference the tests hold this to, decision for decision) in one call per group and token, reading the
misses from the mapped MLP file straight into the slab.

The state is a handful of numpy arrays (:class:`NativeState`) that the C++ code updates in place;
``pull`` and ``push`` copy it to and from the numpy ``RowCache`` / ``SlotTable``, so the batched
prefill, which runs in numpy, and the tests see one state. Torch-free (floor 5).
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from dataclasses import dataclass

import numpy as np

from dipdeploy.cache import RowCache, SlotTable, policy_of

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_ERRORS = {-2: "slot table out of step with the cache: a hit has no slot or a miss holds one",
           -3: "slot table: more rows need staging than the slab has",
           -4: "slot table: no free slot for an admitted row after the step",
           -5: "a row's bytes lie outside the mapped MLP file: the bundle is truncated; re-export it or run "
               "`dipdeploy inspect --verify`",
           -6: "dd_cache: bad arguments",
           -10: "a step outside a batched prefill takes one token's selection",
           -11: "a speculative draft runs the joined decoder's overlap graph (CacheBegin/CacheEnd), not CacheStep"}


@functools.cache
def cache_library(path: str):
    """The op library with the ``dd_cache_*`` functions typed, or None if it predates them."""
    lib = ctypes.CDLL(path)
    if not hasattr(lib, "dd_cache_select"):
        return None
    if not hasattr(lib, "dd_flash_touched"):  # its step reports no blocks and requests (info[2:4]) to pace
        raise RuntimeError(f"{path} predates the Flash block count (dd_flash_touched): rebuild it (make ops)")
    lib.dd_flash_touched.restype = _I64
    lib.dd_flash_touched.argtypes = [_I64, _P, _P, _P, _I64, _I64, _I64, _P]
    lib.dd_cache_new.restype = _P
    lib.dd_cache_new.argtypes = [_I64, _I64, _I64, ctypes.c_int, _P, _P, _P, _P, _P, _P, _P, _I64]
    lib.dd_cache_free.restype, lib.dd_cache_free.argtypes = None, [_P]
    lib.dd_cache_arrays.restype = _I64
    lib.dd_cache_arrays.argtypes = [_P, _I64, _P, _P, _P, _P, _I64]
    lib.dd_cache_select.restype = _I64
    lib.dd_cache_select.argtypes = [_P, _P, _I64, _P, _P, _P, _P, _P]
    lib.dd_cache_settle.restype, lib.dd_cache_settle.argtypes = _I64, [_P]
    lib.dd_cache_drop_step.restype, lib.dd_cache_drop_step.argtypes = None, [_P]
    if hasattr(lib, "dd_cache_direct"):  # the graph step (dipdeploy.runtime.backends.joined): its reads and counters
        lib.dd_cache_drain.restype, lib.dd_cache_drain.argtypes = _I64, [_P, _I64, _P]
        lib.dd_cache_direct.restype = _I64
        lib.dd_cache_direct.argtypes = [_P, ctypes.c_int, _P, ctypes.c_int, _I64, _I64, _I64, _P, _I64]
    if hasattr(lib, "dd_cache_prefill"):  # the graph's batched prefill
        lib.dd_cache_prefill.restype, lib.dd_cache_prefill.argtypes = _I64, [_P, _I64, _P]
    if hasattr(lib, "dd_cache_chunk_bytes"):
        lib.dd_cache_chunk_bytes.restype, lib.dd_cache_chunk_bytes.argtypes = _I64, [_P]
    if hasattr(lib, "dd_cache_read_ahead"):  # CachePrefetch's switch
        lib.dd_cache_read_ahead.restype, lib.dd_cache_read_ahead.argtypes = _I64, [_P, _I64, ctypes.c_int]
    if hasattr(lib, "dd_cache_draft"):  # a speculative draft over the resident rows (dipdeploy.runtime.speculate)
        lib.dd_cache_draft.restype, lib.dd_cache_draft.argtypes = _I64, [_P, _I64, ctypes.c_int]
    return lib


@dataclass(frozen=True)
class GraphReads:
    """What CacheStep nodes read since the last ``drain``."""

    misses: int  # rows
    requests: int
    wanted: int  # the rows' bytes
    seconds: float  # inside the copies or reads
    blocks: int  # bytes of whole blocks: read from the device (--io direct), or holding the rows copied from
    # the mapping (dipdeploy.flash.touched_blocks)
    ahead: int = 0  # rows read ahead by CachePrefetch nodes
    ahead_used: int = 0  # ... of which a step then missed: read during the attention, not after the selection
    block_requests: int = 0  # the requests a device serves the copied rows' blocks in (0 with --io direct:
    # ``requests`` are the device's there)


def choose_cache_library(native: bool, native_cache: bool | None) -> str | None:
    """The op library for the engine's native cache step, or None for the numpy one
    (``EngineConfig.native_cache``: None follows ``native``, True insists, False refuses)."""
    from dipdeploy.ops.native import require_library

    wanted = native if native_cache is None else native_cache
    if not wanted:
        return None
    path = str(require_library())
    if cache_library(path) is None:
        if native_cache:
            raise RuntimeError(f"{path} predates the native cache step (no dd_cache_select): rebuild it "
                               "with `make ops`")
        warnings.warn(f"{path} predates the native cache step: running it in numpy; `make ops` rebuilds "
                      "the library", stacklevel=3)
        return None
    return path


def graph_step_library(library: str):
    """The op library with the graph step's functions (its batched prefill too), or None if it predates
    them."""
    lib = cache_library(library)
    return lib if lib is not None and hasattr(lib, "dd_cache_prefill") else None


def drain(library: str, handles: np.ndarray) -> GraphReads:
    """What the CacheStep nodes of the groups ``handles`` (int64 addresses) read since the last drain; the
    groups' counters restart from zero."""
    lib = graph_step_library(library)
    if lib is None:
        raise RuntimeError(f"{library} has no dd_cache_drain: rebuild it (make ops)")
    out = np.zeros(8, np.int64)
    _check(lib.dd_cache_drain(handles.ctypes.data, handles.size, out.ctypes.data), 0)
    return GraphReads(int(out[0]), int(out[1]), int(out[2]), float(out[3]) * 1e-9, int(out[4]), int(out[5]),
                      int(out[6]), int(out[7]))


def read_ahead(library: str, handles: np.ndarray, on: bool) -> None:
    """Switch the CachePrefetch read-ahead of the groups ``handles`` on or off (on as made); it changes
    which rows are read when, not the logits (custom_ops/README.md, CachePrefetch)."""
    lib = cache_library(library)
    if lib is None or not hasattr(lib, "dd_cache_read_ahead"):
        raise RuntimeError(f"{library} has no dd_cache_read_ahead: rebuild it (make ops)")
    _check(lib.dd_cache_read_ahead(handles.ctypes.data, handles.size, int(on)), 0)


def draft(library: str, handles: np.ndarray, on: bool) -> None:
    """Put the groups ``handles`` in or out of a speculative draft: their CacheBegin/CacheEnd multiply the
    selection's resident rows only, nothing is read and the caches do not change (custom_ops/README.md,
    CacheBegin; ``dipdeploy.runtime.speculate``)."""
    lib = cache_library(library)
    if lib is None or not hasattr(lib, "dd_cache_draft"):
        raise RuntimeError(f"{library} has no dd_cache_draft: rebuild it (make ops)")
    _check(lib.dd_cache_draft(handles.ctypes.data, handles.size, int(on)), 0)


def _check(rc: int, rows: int) -> int:
    if rc == -1:
        raise IndexError(f"selected rows must lie in [0, {rows})")
    if rc < 0:
        raise RuntimeError(_ERRORS.get(rc, f"dd_cache: error {rc}"))
    return rc


@dataclass
class NativeState:
    """The arrays the C++ step updates in place (one sequence: the runtime's case)."""

    resident: np.ndarray  # uint8 [rows]
    last_use: np.ndarray  # int64 [rows]
    uses: np.ndarray  # int64 [rows]
    counters: np.ndarray  # int64 [3]: step, hits, misses
    slot_of: np.ndarray  # int64 [rows]
    row_of: np.ndarray  # int64 [capacity] (at least one element, for a valid pointer)

    @classmethod
    def empty(cls, rows: int, capacity: int) -> "NativeState":
        return cls(np.zeros(rows, np.uint8), np.zeros(rows, np.int64), np.zeros(rows, np.int64),
                   np.zeros(3, np.int64), np.full(rows, -1, np.int64), np.full(max(capacity, 1), -1, np.int64))


class NativeCache:
    """One group's cache + slot table + reads, stepped by the op library.

    ``slabs``/``offsets``/``row_bytes``: the group's slab arrays and where their rows lie in the MLP
    file; ``mapping`` (the file's read-only map as a uint8 array) lets the step copy the misses itself,
    without it ``select`` returns them for the Flash store to read. ``selected``/``slots``: the graph
    buffers the step reads the selection from and writes the slots into ([1, K] int64, bound once)."""

    def __init__(self, library: str, cache: RowCache, table: SlotTable, slabs: list[np.ndarray],
                 offsets: list[int], row_bytes: list[int], mapping: np.ndarray | None,
                 selected: np.ndarray, slots: np.ndarray):
        lib = cache_library(library)
        if lib is None:
            raise RuntimeError(f"{library} has no dd_cache_select: rebuild it (make ops)")
        if cache.batch != 1:
            raise ValueError("the native cache step runs one sequence")
        for buf in (selected, slots):
            if buf.dtype != np.int64 or not buf.flags.c_contiguous:
                raise ValueError("the selection and slot buffers must be contiguous int64")
        self._lib, self.rows, self.k = lib, cache.rows, selected.size
        self.state = s = NativeState.empty(cache.rows, table.capacity)
        self._next_use = None
        steps = 0
        if policy_of(cache.policy).needs_future:
            self._next_use = np.ascontiguousarray(cache._next_use[:, 0, :], dtype=np.int32)
            steps = self._next_use.shape[0]
        ptr = (lambda a: None if a is None else a.ctypes.data)  # noqa: E731
        self._handle = lib.dd_cache_new(cache.rows, table.capacity, table.staging, policy_of(cache.policy).code,
                                        ptr(s.resident), ptr(s.last_use), ptr(s.uses), ptr(s.counters),
                                        ptr(s.slot_of), ptr(s.row_of), ptr(self._next_use), steps)
        if not self._handle:
            raise RuntimeError("dd_cache_new refused the group's shape")
        self._slabs = slabs  # kept alive: the library holds their pointers
        self._full: list[np.ndarray] | None = None
        self._mapping = mapping
        pointers = (ctypes.c_void_p * max(len(slabs), 1))(*[a.ctypes.data for a in slabs])
        offs, rbs = np.asarray(offsets, np.int64), np.asarray(row_bytes, np.int64)
        _check(lib.dd_cache_arrays(self._handle, len(slabs), pointers, offs.ctypes.data, rbs.ctypes.data,
                                   ptr(mapping), 0 if mapping is None else mapping.size), self.rows)
        self.copies = mapping is not None
        self._hits = np.zeros(self.k, np.uint8)
        self.read_rows = np.zeros(self.k, np.int64)
        self.read_slots = np.zeros(self.k, np.int64)
        self.info = np.zeros(4, np.int64)
        self._selected, self._slots = selected, slots
        self._args = (self._handle, _P(selected.ctypes.data), self.k, _P(slots.ctypes.data),
                      _P(self._hits.ctypes.data), _P(self.read_rows.ctypes.data), _P(self.read_slots.ctypes.data),
                      _P(self.info.ctypes.data))
        self.push(cache, table)

    @property
    def handle(self) -> int:
        """The group's address in the op library: a graph's CacheStep/CacheSettle ``handle`` input."""
        return int(self._handle)

    @property
    def resident(self) -> np.ndarray:
        """Residency (bool [rows]), a view of the state."""
        return self.state.resident.view(bool)

    def select(self) -> tuple[np.ndarray, int]:
        """One token's step on the bound selection: returns (hits [K] bool, a copy; misses). The misses'
        rows and slots are ``read_rows[:misses]`` / ``read_slots[:misses]``; ``info`` = [copy ns, runs, bytes
        of the blocks holding the misses' rows, the requests a device serves those blocks in] (the last
        two with the mapping)."""
        n = _check(self._lib.dd_cache_select(*self._args), self.rows)
        return self._hits.view(bool).copy(), n

    def settle(self) -> None:
        _check(self._lib.dd_cache_settle(self._handle), self.rows)

    def read_through(self, reader, max_request: int, max_gap: int, block: int) -> None:
        """Let a graph step read this group's misses itself (no mapping): ``reader`` is
        ``FlashStore.native_reader``'s (fd, handle, ring, bounce), the requests planned as
        ``dipdeploy.flash.plan_reads`` plans them."""
        fd, handle, ring, bounce = reader
        self._bounce = bounce  # kept alive: the library holds its address
        _check(self._lib.dd_cache_direct(self._handle, fd, handle, int(ring), block, max_request, max_gap,
                                         bounce.ctypes.data, bounce.size), self.rows)

    def prefill(self, buffers: list[np.ndarray] | None) -> None:
        """Start (``buffers``: one full-height [rows, …] array per slab array, in the slabs' order) or end
        (None) a batched prefill on the graph: meanwhile its CacheStep places each chunk's rows in
        ``buffers`` at their row index and its CacheSettle warms the cache from the chunk's selection
        (custom_ops/src/cache/ ``dd_cache_prefill``; the numpy counterpart is the per-layer path's
        ``PerLayerDecoder._fill_prefill`` and ``_warm``, runtime/backends/per_layer.py)."""
        if buffers is None:
            self._full = None
            _check(self._lib.dd_cache_prefill(self._handle, 0, None), self.rows)
            return
        if len(buffers) != len(self._slabs) or any(b.shape[0] != self.rows or not b.flags.c_contiguous
                                                   or b[0].nbytes != s[0].nbytes for b, s in zip(buffers, self._slabs)):
            raise ValueError("a prefill takes one contiguous [rows, …] buffer per slab array, rows as the slab's")
        self._full = buffers  # kept alive: the library holds their addresses
        pointers = (ctypes.c_void_p * len(buffers))(*[b.ctypes.data for b in buffers])
        _check(self._lib.dd_cache_prefill(self._handle, len(buffers), pointers), self.rows)

    def chunk_bytes(self) -> int:
        """The bytes the group still holds for a batched prefill's chunk (the selection the settle warms the
        cache from): 0 once each chunk has settled, so the groups of every layer never hold their selections
        at once."""
        return int(_check(self._lib.dd_cache_chunk_bytes(self._handle), self.rows))

    def pull(self, cache: RowCache, table: SlotTable) -> None:
        """Copy the state into the numpy reference objects (which then own it)."""
        s = self.state
        cache.resident = s.resident.view(bool)[None].copy()
        cache.last_use[0], cache.uses[0] = s.last_use, s.uses
        cache.step, cache.hits, cache.misses = (int(v) for v in s.counters)
        table.slot_of[:] = s.slot_of
        table.row_of[:] = s.row_of[: table.capacity]

    def push(self, cache: RowCache, table: SlotTable) -> None:
        """Take the state from the numpy reference objects (a step still pending is dropped)."""
        s = self.state
        s.resident[:] = cache.resident[0]
        s.last_use[:], s.uses[:] = cache.last_use[0], cache.uses[0]
        s.counters[:] = (cache.step, cache.hits, cache.misses)
        s.slot_of[:] = table.slot_of
        s.row_of[: table.capacity] = table.row_of
        self._lib.dd_cache_drop_step(self._handle)

    def close(self) -> None:
        if self._handle:
            self._lib.dd_cache_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()
