"""The physical order of a group's rows in the Flash file (docs/method.md, "Flash layout").

A group's rows keep their logical ids (what the graphs, the masks, the caches and the torch reference
use); only where each one lies in the MLP file changes. ``position[r]`` is the file row that holds logical
row ``r`` (a permutation of ``range(R)``); ``order = argsort(position)`` lists the logical row of each file
row. The device reads whole blocks, so a missed row smaller than a block costs the block (SmolLM2's BQ4
down rows are); putting rows that miss together in the same blocks lets one block serve
several wanted rows.

What counts is the rows that *miss*: a row the cache holds costs no read wherever it lies. So the
orderings are built from a miss trace (per token, the rows of the group read from Flash), and measured by
the blocks it touches under the group's real arrays (:func:`blocks_touched`, the same count the direct
reader's requests cover, ``dipdeploy.flash.plan_reads``). Candidates, each cheap:

- ``natural``: the logical order;
- ``frequency``: rows by miss count, most missed first (rows that always hit or are never selected end up
  in blocks that are rarely read);
- ``chain``: greedy chaining on the co-miss counts: start from the most missed row, then append the
  unplaced row that misses most often together with the last rows placed (as many as one block of the
  largest array holds), restarting from the most missed unplaced row when nothing co-misses.

:func:`calibrate_order` keeps, per group, the candidate that touches the fewest blocks on the trace
(natural included, so a calibrated group never touches more blocks than natural on its own trace).
Torch-free (floor 2): numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dipdeploy.flash import BLOCK

ORDERINGS = ("natural", "frequency", "chain")


@dataclass(frozen=True)
class GroupGeometry:
    """Where a group's per-row arrays lie: each array's file offset and row bytes, the device block."""

    offsets: tuple[int, ...]
    row_bytes: tuple[int, ...]
    block: int = BLOCK


def miss_matrix(misses: list[np.ndarray], rows: int) -> np.ndarray:
    """bool [T, rows]: token t missed row r."""
    out = np.zeros((len(misses), rows), dtype=bool)
    for t, m in enumerate(misses):
        out[t, np.asarray(m, dtype=np.int64)] = True
    return out


def blocks_touched(position: np.ndarray, missed: np.ndarray, geometry: GroupGeometry) -> int:
    """Blocks read over the trace (sum over tokens and arrays) when logical row r lies at file row
    ``position[r]`` and token t reads the rows ``missed[t]`` (bool [T, R]) of every array."""
    t_idx, r_idx = np.nonzero(missed)
    if len(t_idx) == 0:
        return 0
    p = np.asarray(position, dtype=np.int64)[r_idx]
    total = 0
    for off, rb in zip(geometry.offsets, geometry.row_bytes):
        b0 = (off + p * rb) // geometry.block
        b1 = (off + (p + 1) * rb - 1) // geometry.block
        span = int((b1 - b0).max()) + 1
        keys = np.concatenate([(t_idx.astype(np.int64) << 40) + b0 + k for k in range(span)])
        ok = np.concatenate([b0 + k <= b1 for k in range(span)])
        total += len(np.unique(keys[ok]))
    return total


def _frequency(missed: np.ndarray) -> np.ndarray:
    counts = missed.sum(axis=0)
    return np.argsort(-counts, kind="stable")


def _chain(missed: np.ndarray, window: int) -> np.ndarray:
    m = missed.astype(np.float32)
    co = m.T @ m  # co-miss counts [R, R]
    counts = np.diag(co).copy()
    R = len(counts)
    placed = np.zeros(R, dtype=bool)
    order = np.empty(R, dtype=np.int64)
    by_count = np.argsort(-counts, kind="stable")
    next_seed = 0
    affinity = np.zeros(R, dtype=np.float32)
    recent: list[int] = []
    for n in range(R):
        cand = np.where(placed, -1.0, affinity)
        best = int(np.argmax(cand))  # ties → the lower row
        if cand[best] <= 0:
            while placed[by_count[next_seed]]:
                next_seed += 1
            best = int(by_count[next_seed])
        order[n] = best
        placed[best] = True
        recent.append(best)
        affinity += co[best]
        if len(recent) > window:
            affinity -= co[recent.pop(0)]
    return order


def candidate_order(name: str, missed: np.ndarray, geometry: GroupGeometry) -> np.ndarray:
    """``order`` (the logical row of each file row) of one candidate ordering on a miss matrix [T, R]."""
    R = missed.shape[1]
    if name == "natural":
        return np.arange(R, dtype=np.int64)
    if name == "frequency":
        return _frequency(missed)
    if name == "chain":
        window = max(1, geometry.block // max(geometry.row_bytes))
        return _chain(missed, window)
    raise ValueError(f"row ordering {name!r} unknown; choose one of {', '.join(ORDERINGS)}")


def position_of(order: np.ndarray) -> np.ndarray:
    """The inverse permutation: ``position[order[p]] = p``."""
    order = np.asarray(order, dtype=np.int64)
    position = np.empty_like(order)
    position[order] = np.arange(len(order), dtype=np.int64)
    return position


@dataclass(frozen=True)
class GroupOrder:
    """The calibrated order of one group: the kept candidate, its ``position`` and every candidate's
    blocks touched on the calibration trace."""

    ordering: str
    position: np.ndarray
    blocks: dict[str, int]


def calibrate_order(missed: np.ndarray, geometry: GroupGeometry) -> GroupOrder:
    """The candidate (see the module docstring) that touches the fewest blocks on ``missed`` [T, R];
    ties keep the earlier of ``ORDERINGS`` (natural first)."""
    best, blocks = None, {}
    for name in ORDERINGS:
        position = position_of(candidate_order(name, missed, geometry))
        blocks[name] = blocks_touched(position, missed, geometry)
        if best is None or blocks[name] < blocks[best[0]]:
            best = (name, position)
    return GroupOrder(best[0], best[1], blocks)
