"""The block-read cost model: what reading rows from Flash costs, in blocks and requests (floor 1, numpy only).

A Flash device reads whole blocks (:data:`BLOCK`, 4 KiB), and with ``O_DIRECT`` the OS insists on
block-aligned offsets, lengths and buffers. So a batch of wanted rows (every per-row array of a group, see
docs/method.md "Flash layout") becomes a list of block ranges: each row covers the blocks containing
its bytes, and rows that share or neighbour blocks coalesce into one range (a row smaller than a block,
such as SmolLM2's BQ4 down rows, costs the whole block, but neighbouring selected rows share it). Rows
at most ``max_gap`` blocks apart coalesce too, the blocks between them read and dropped: a request
costs the device far more than a block (:data:`REQUEST_BLOCKS`, benchmarks/results/read-gaps.md), so
reading through a short gap is cheaper than a second request (the runtime's ``IO_GAP``,
benchmarks/results/read-gaps.md). Long ranges are cut into requests of at most :data:`MAX_REQUEST`
bytes, so a batch of a few large ranges still keeps several reads in flight.

Pure arithmetic, one definition for every floor above: the runtime's reads (``dipdeploy/runtime/blockio.py``
runs the requests :func:`plan_reads` plans) and its emulated Flash (:func:`touched_blocks`), the cache
split (:func:`miss_cost`), the sparsity plan, export, and the simulator's replay of many tokens at once
(:func:`flash_reads`, the same rule vectorised over tokens, held to :func:`plan_reads` by
tests/test_sim_flashio.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 4096  # bytes: the Flash page / filesystem block a device reads whole (and ``O_DIRECT`` aligns to)
MAX_REQUEST = 128 * 1024  # bytes: longer coalesced ranges are split so several reads stay in flight
REQUEST_BLOCKS = 8  # what one request costs in blocks' transfer (fitted: benchmarks/results/read-gaps.md)
# The widest gap (blocks) read through to save a request (the runtime's and the simulator's --io-gap): a
# wider one reads more than a whole request's bytes, far more than the request it saves costs, and every
# block read through passes through the bounce buffer.
MAX_GAP = MAX_REQUEST // BLOCK


def miss_cost(row_bytes: int, block: int = BLOCK, request_blocks: int = REQUEST_BLOCKS) -> float:
    """What reading one missed row costs, in blocks' transfer: its request plus the blocks it covers (a
    row smaller than a block still costs the block). The cache plan's ``reads`` split ranks groups by it."""
    return request_blocks + max(1, -(-row_bytes // block))


@dataclass(frozen=True)
class BlockPlan:
    """The requests of one batch and where each wanted row lies in the bounce buffer."""

    offset: np.ndarray  # int64 [n]: block-aligned file offset of each request
    length: np.ndarray  # int64 [n]: a multiple of the block
    need: np.ndarray  # int64 [n]: bytes that must arrive (the wanted bytes end before the block does)
    place: np.ndarray  # int64 [n]: where each request lands in the bounce buffer
    total: int  # bounce bytes
    src: list[np.ndarray]  # per array: the bounce position of each wanted row
    wanted: int  # the rows' bytes

    @property
    def requests(self) -> int:
        return len(self.offset)

    @property
    def device_bytes(self) -> int:
        return int(self.length.sum())


def plan_reads(offsets: list[int], row_bytes: list[int], rows: np.ndarray, *, block: int = BLOCK,
               max_request: int = MAX_REQUEST, max_gap: int = 0) -> BlockPlan:
    """The block-aligned requests that read ``rows`` (ascending) of every array (``offsets[a]`` +
    ``row * row_bytes[a]`` in the file; arrays do not overlap); ranges at most ``max_gap`` blocks apart
    are read as one."""
    if max_request < block or max_request % block:
        raise ValueError(f"max_request={max_request} must be a positive multiple of the block ({block})")
    if max_gap < 0:
        raise ValueError(f"max_gap={max_gap} must be >= 0 blocks")
    rows = np.asarray(rows, dtype=np.int64)
    n = len(rows)
    starts = np.concatenate([off + rows * rb for off, rb in zip(offsets, row_bytes)])
    ends = np.concatenate([off + (rows + 1) * rb for off, rb in zip(offsets, row_bytes)])
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    b0, b1 = s // block, np.maximum.accumulate(-(-e // block))
    first = np.concatenate([[True], b0[1:] > b1[:-1] + max_gap])  # a gap of more than max_gap blocks starts a range
    group = np.cumsum(first) - 1
    g0 = b0[first]
    g1 = np.concatenate([b1[np.flatnonzero(first)[1:] - 1], b1[-1:]])
    gend = np.maximum.reduceat(e, np.flatnonzero(first))  # last wanted byte (+1) of each range
    glen = (g1 - g0) * block
    gplace = np.concatenate([[0], np.cumsum(glen)[:-1]])
    src_sorted = gplace[group] + s - g0[group] * block
    src = np.empty_like(src_sorted)
    src[order] = src_sorted
    # Split ranges into requests of at most max_request bytes (contiguous in the bounce buffer).
    pieces = -(-glen // max_request)
    owner = np.repeat(np.arange(len(glen)), pieces)
    k = np.arange(len(owner)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    offset = g0[owner] * block + k * max_request
    length = np.minimum(max_request, glen[owner] - k * max_request)
    need = np.clip(gend[owner] - offset, 0, length)
    place = gplace[owner] + k * max_request
    return BlockPlan(offset, length, need, place, int(glen.sum()), [src[a * n:(a + 1) * n] for a in range(len(offsets))],
                     n * int(sum(row_bytes)))


def touched_blocks(offsets: list[int], row_bytes: list[int], rows: np.ndarray, *, block: int = BLOCK,
                   max_request: int = MAX_REQUEST) -> tuple[int, int]:
    """(bytes, requests) of the whole blocks holding ``rows`` (ascending) of every array: what a device
    returns for rows read through the page cache (``mmap``, ``pread``), a row smaller than a block costing
    the whole block and rows that share one sharing its read, and the requests that read them, a run of
    touching blocks per request up to ``max_request`` bytes; ``plan_reads(..., max_gap=0)``'s ``total``
    and ``requests``, without the plan. The emulated Flash paces these (``FlashStore.account``); the op
    library's ``dd_flash_touched`` computes the same for its copies from the mapping."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) == 0:
        return 0, 0
    first = np.concatenate([(off + rows * rb) // block for off, rb in sorted(zip(offsets, row_bytes))])
    last = np.concatenate([(off + (rows + 1) * rb - 1) // block for off, rb in sorted(zip(offsets, row_bytes))])
    seen = np.maximum.accumulate(last)  # the highest block counted up to each row
    start = np.concatenate([[True], first[1:] > seen[:-1] + 1])  # a block not touching the ones before: a new run
    run_start = first[start]
    run_end = np.concatenate([seen[np.flatnonzero(start)[1:] - 1], seen[-1:]])
    blocks = run_end - run_start + 1
    per_request = max_request // block
    return int(blocks.sum() * block), int((-(-blocks // per_request)).sum())


def bounce_bytes(offsets: list[int], row_bytes: list[int], rows: int, *, block: int = BLOCK, max_gap: int = 0) -> int:
    """The most any batch of one group's rows can need in the bounce buffer: every block of each
    array's region (a batched prefill may read all of a group's rows), the gaps read through next to
    them, and the alignment slack. The plan holds it (``Residency.read``)."""
    blocks = sum(-(-(off + rows * rb) // block) - off // block for off, rb in zip(offsets, row_bytes))
    return (blocks + len(offsets) * max_gap + 1) * block


def _runs(mask: np.ndarray) -> np.ndarray:
    """Runs of True along the last axis."""
    return mask[..., 0].astype(np.int64) + (mask[..., 1:] & ~mask[..., :-1]).sum(axis=-1)


def _read_through(touched: np.ndarray, gap: int) -> np.ndarray:
    """``touched`` with every run of at most ``gap`` untouched blocks between two touched ones set."""
    n = touched.shape[-1]
    idx = np.arange(n)
    prev = np.maximum.accumulate(np.where(touched, idx, -1), axis=-1)
    nxt = np.flip(np.minimum.accumulate(np.flip(np.where(touched, idx, n), axis=-1), axis=-1), axis=-1)
    return touched | ((prev >= 0) & (nxt < n) & (nxt - prev - 1 <= gap))


def _cut_requests(read: np.ndarray, blocks_per_request: int) -> np.ndarray:
    """Requests [T] when each run of read blocks is cut into pieces of at most ``blocks_per_request``."""
    pad = np.zeros(read.shape[:-1] + (1,), bool)
    edges = np.diff(np.concatenate([pad, read, pad], axis=-1).astype(np.int8), axis=-1)
    out = np.zeros(read.shape[:-1], np.int64)
    for t in np.ndindex(read.shape[:-1]):
        starts, ends = np.flatnonzero(edges[t] == 1), np.flatnonzero(edges[t] == -1)
        out[t] = int((-(-(ends - starts) // blocks_per_request)).sum())
    return out


def flash_reads(missed: np.ndarray, row_bytes: float, unit: int, gap: int = 0,
                max_request: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(bytes [T], requests [T]) of the misses of many tokens at once, for the simulator's replay:
    ``missed`` [T, R] (bool) rows of one group of one layer, row r at bytes [r·row_bytes, (r+1)·row_bytes)
    of a region starting on a ``unit`` boundary (``row_bytes`` may be fractional: a projected format).
    Each token's figures are :func:`plan_reads`'s ``device_bytes`` and ``requests`` for its rows (with
    ``max_gap=gap``; ``max_request`` 0: runs uncut); ``unit`` ≤ 1 is a device without a read unit (the
    paper's model): the rows' bytes and runs of adjacent rows."""
    rows = missed.shape[-1]
    if unit <= 1:
        return missed.sum(axis=-1) * float(row_bytes), _runs(missed)
    edges = np.arange(rows + 1, dtype=np.float64) * row_bytes
    first = np.floor(edges[:-1] / unit).astype(np.int64)  # first block of row r
    last = np.ceil(edges[1:] / unit).astype(np.int64) - 1  # last block of row r
    nblocks = int(last[-1]) + 1
    # rows covering block b: [lo[b], hi[b]] (contiguous, as rows and blocks are both in order)
    lo = np.searchsorted(last, np.arange(nblocks), side="left")
    hi = np.searchsorted(first, np.arange(nblocks), side="right") - 1
    csum = np.concatenate([np.zeros(missed.shape[:-1] + (1,), np.int64), np.cumsum(missed, axis=-1)], axis=-1)
    touched = (csum[..., hi + 1] - csum[..., lo]) > 0
    if gap > 0:
        touched = _read_through(touched, gap)
    requests = _cut_requests(touched, max_request // unit) if max_request >= unit else _runs(touched)
    return touched.sum(axis=-1) * float(unit), requests
