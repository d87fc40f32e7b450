"""From missed rows to Flash reads: requests and bytes, given the row size and the device's read unit.

Layout (docs/method.md, "Flash layout"): the rows of one layer's group lie back to back (row r at bytes
[r·row_bytes, (r+1)·row_bytes), unpadded; the group starts on a read-unit boundary). The device reads in
units of ``unit`` bytes (its logical block: direct I/O and the page cache transfer whole blocks), so a
missed row costs every block it overlaps, and two missed rows that share a block share its read.
A request is a run of consecutive touched blocks (adjacent rows coalesce into one read). With
``unit = 1`` (the paper's model: no granularity) this is simply runs of adjacent missed rows and
missed·row_bytes bytes.
"""

from __future__ import annotations

import numpy as np


def _runs(mask: np.ndarray) -> np.ndarray:
    """Runs of True along the last axis."""
    return mask[..., 0].astype(np.int64) + (mask[..., 1:] & ~mask[..., :-1]).sum(axis=-1)


def flash_reads(missed: np.ndarray, row_bytes: float, unit: int) -> tuple[np.ndarray, np.ndarray]:
    """(bytes [T], requests [T]) for ``missed`` [T, R] (bool) rows of one group of one layer."""
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
    return touched.sum(axis=-1) * float(unit), _runs(touched)
