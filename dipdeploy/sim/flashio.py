"""From missed rows to Flash reads: requests and bytes, given the row size and the device's read unit.

Layout (docs/method.md, "Flash layout"): the rows of one layer's group lie back to back (row r at bytes
[r·row_bytes, (r+1)·row_bytes), unpadded; the group starts on a read-unit boundary). The device reads in
units of ``unit`` bytes (its logical block: direct I/O and the page cache transfer whole blocks), so a
missed row costs every block it overlaps, and two missed rows that share a block share its read.
A request is a run of consecutive touched blocks (adjacent rows coalesce into one read). With
``unit = 1`` (the paper's model: no granularity) this is simply runs of adjacent missed rows and
missed·row_bytes bytes.

The runtime's reads (``dipdeploy.flash.plan_reads``) also read through runs of at most ``gap``
untouched blocks between touched ones (``--io-gap``: one request instead of two, the gap's bytes read
for nothing) and cut a run into requests of at most ``max_request`` bytes; ``gap`` and ``max_request``
model that (0: touching blocks only, no cut: the model before the runtime had them). Only with
``unit > 1``: without a read unit there are no blocks to read through.
"""

from __future__ import annotations

import numpy as np


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
    """(bytes [T], requests [T]) for ``missed`` [T, R] (bool) rows of one group of one layer; ``gap`` and
    ``max_request`` (bytes, a multiple of ``unit``; 0: uncut) as the module docstring says."""
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
