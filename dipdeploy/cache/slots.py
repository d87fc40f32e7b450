"""Slots: where each cached row of one group lives in its DRAM slab, step by step.

A layer's slab for one group (up|gate rows or down rows) is a preallocated array of
``capacity + staging`` rows. Slots ``[0, capacity)`` hold the rows the :class:`RowCache` keeps
resident; slots ``[capacity, capacity + staging)`` are a staging area for rows that this token needs
but the cache does not admit (LFU and Belady may bypass; policy ``none`` has capacity 0). The op
``SparseGatherMatMul`` reads row ``slots[j]`` of the slab for selected column ``indices[j]``.

One step, given the token's selection, the cache's hits (residency *before* the step) and its
residency *after* the step (``RowCache.access``):

    1. hits keep their slot;
    2. rows evicted by this step that the token does not use free their slots at once;
    3. misses, in ascending row order (so Flash reads coalesce), that the cache admits take the lowest
       free slot; the others, and admitted rows for which no slot is free yet (it is still held by an
       evicted row this token uses), take staging slots in that order;
    4. after the MLP has run (:meth:`SlotTable.finish`), the evicted rows the token used free their
       slots, and the admitted rows that waited in staging move to the lowest free slots (a DRAM copy,
       never a second Flash read).

The rule is deterministic and numpy-only (floor 2), so the host runtime, the simulator and the Java
engine of the Android demo assign the same slots and read the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SlotStep:
    """What one step asks of the slab: ``slots`` [K] for the op (aligned with the selection),
    ``read_rows``/``read_slots`` the Flash reads to do before the MLP (rows ascending), and the
    bookkeeping :meth:`SlotTable.finish` completes afterwards."""

    slots: np.ndarray
    read_rows: np.ndarray
    read_slots: np.ndarray
    release: np.ndarray
    deferred_rows: np.ndarray
    deferred_from: np.ndarray


class SlotTable:
    """Row ↔ slot bookkeeping of one group's slab (see the module docstring for the rule)."""

    def __init__(self, rows: int, capacity: int, staging: int):
        if capacity < 0 or staging < 0 or capacity > rows:
            raise ValueError(f"slot table: need 0 <= capacity <= rows and staging >= 0, got rows={rows}, "
                             f"capacity={capacity}, staging={staging}")
        self.rows, self.capacity, self.staging = rows, capacity, staging
        self.slot_of = np.full(rows, -1, dtype=np.int64)
        self.row_of = np.full(capacity, -1, dtype=np.int64)

    @property
    def slab_rows(self) -> int:
        return self.capacity + self.staging

    def resident(self) -> np.ndarray:
        """Rows that hold a cache slot (bool [rows]); equals the cache's residency between steps."""
        return self.slot_of >= 0

    def _take(self, rows: np.ndarray) -> np.ndarray:
        """Give ``rows`` the lowest free slots (as many as there are free; returns the slots given)."""
        free = np.flatnonzero(self.row_of < 0)[: len(rows)]
        rows = rows[: len(free)]
        self.row_of[free] = rows
        self.slot_of[rows] = free
        return free

    def _release(self, rows: np.ndarray) -> None:
        self.row_of[self.slot_of[rows]] = -1
        self.slot_of[rows] = -1

    def preload(self, rows: np.ndarray) -> SlotStep:
        """Place ``rows`` (e.g. the pinned set of ``static``) before the first token; returns the reads."""
        rows = np.sort(np.asarray(rows, dtype=np.int64))
        if len(rows) > self.capacity:
            raise ValueError(f"preload: {len(rows)} rows exceed the capacity of {self.capacity} slots")
        given = self._take(rows)
        empty = np.empty(0, dtype=np.int64)
        return SlotStep(empty, rows, given, empty, empty, empty)

    def rebase(self, resident: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Match the table to a residency set outside the per-token rule (a batched prefill warms the
        cache from the prompt's selections at once): rows no longer resident free their slots, rows newly
        resident take the lowest free ones. Returns (rows, slots) of the newly placed rows, whose data the
        caller copies in."""
        resident = np.asarray(resident, dtype=bool)
        held = self.row_of[self.row_of >= 0]
        self._release(held[~resident[held]])
        new = np.flatnonzero(resident & (self.slot_of < 0))
        if int(resident.sum()) > self.capacity:
            raise ValueError(f"rebase: {int(resident.sum())} resident rows exceed the capacity of {self.capacity} slots")
        return new, self._take(new)

    def assign(self, selected: np.ndarray, hits: np.ndarray, resident_after: np.ndarray) -> SlotStep:
        """Slots for one token's ``selected`` rows [K] (rule steps 1–3)."""
        sel = np.asarray(selected, dtype=np.int64).reshape(-1)
        hits = np.asarray(hits, dtype=bool).reshape(-1)
        slots = self.slot_of[sel]  # hits keep their slot; misses (-1) are placed below
        if not np.array_equal(slots >= 0, hits):
            raise RuntimeError("slot table out of step with the cache: a hit has no slot or a miss holds one")
        held = self.row_of[self.row_of >= 0]
        evicted = held[~resident_after[held]]
        used = np.zeros(self.rows, dtype=bool)
        used[sel] = True
        self._release(evicted[~used[evicted]])
        misses = np.flatnonzero(~hits)
        misses = misses[np.argsort(sel[misses], kind="stable")]
        kept = resident_after[sel[misses]]
        admitted = misses[kept]
        given = self._take(sel[admitted])
        slots[admitted[: len(given)]] = given
        deferred = admitted[len(given):]
        staged = np.concatenate([misses[~kept], deferred])
        staged = staged[np.argsort(sel[staged], kind="stable")]
        if len(staged) > self.staging:
            raise RuntimeError(f"slot table: {len(staged)} rows need staging, only {self.staging} slots")
        slots[staged] = self.capacity + np.arange(len(staged))
        return SlotStep(slots, sel[misses], slots[misses], evicted[used[evicted]], sel[deferred], slots[deferred])

    def finish(self, step: SlotStep) -> tuple[np.ndarray, np.ndarray]:
        """Rule step 4, after the MLP ran: returns the DRAM copies (staging slot → cache slot) to do."""
        self._release(step.release)
        to = self._take(step.deferred_rows)
        if len(to) != len(step.deferred_rows):
            raise RuntimeError("slot table: no free slot for an admitted row after the step")
        return step.deferred_from, to
