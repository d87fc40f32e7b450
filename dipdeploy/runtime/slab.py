"""One layer-group's DRAM slab: preallocated slot arrays, the row cache, the slot table, its Flash rows.

A group is the up|gate rows (one per input feature, R = d) or the down rows (one per GLU unit, R = F)
of one layer. Its per-row arrays (fp32 ``rows``; BQ4 ``qweight``, ``scales``[, ``zeros``]; VQ3
``codes``) get a slab of ``capacity + staging`` rows each, allocated once and bound to the MLP graph
as inputs (zero copy); shared tables (VQ3 codebooks) are read whole and stay resident. With a
``SharedStaging`` the staging rows of every group are the same pages (``staging.py`` says why that is
safe).

Per token: ``step`` (cache access + slot assignment + Flash reads of the misses) before the MLP
graph runs, ``settle`` (the deferred moves of the slot rule) after; in numpy (``dipdeploy.cache``) or,
with the op library, in one native call per group (``native_cache.py``, the same rules; DESIGN.md says
why). Torch-free (floor 5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dipdeploy.bundle.manifest import REGENERATE, BundleError, open_tensor, row_positions
from dipdeploy.bundle.names import MLP_FILE, SLAB_DIM
from dipdeploy.cache import RowCache, SlotStep, SlotTable
from dipdeploy.runtime.flash import FlashStore, RowArray
from dipdeploy.runtime.native_cache import NativeCache
from dipdeploy.runtime.staging import SharedStaging, window_offsets


@dataclass
class GroupArrays:
    """The group's tensors in the bundle, split into per-row arrays (streamed) and shared tables."""

    per_row: list[RowArray]
    shared: dict[str, np.ndarray]

    @property
    def row_bytes(self) -> int:
        return sum(a.row_bytes for a in self.per_row)

    @property
    def shared_bytes(self) -> int:
        return sum(a.nbytes for a in self.shared.values())


def group_arrays(manifest, bundle, layer: int, group: str, inputs: list) -> GroupArrays:
    """The arrays of ``model.layers.{layer}.mlp.{group}.*`` behind the graph inputs ``{group}.{label}``
    (ORT ``NodeArg``s, in graph order); per-row iff the input's first dim is ``SLAB_DIM``. Each per-row
    array carries the group's row positions where the bundle's row order is calibrated (the Flash store
    reads logical row r from file row ``position[r]``)."""
    per_row, shared, position = [], {}, None
    for arg in inputs:
        name = arg.name
        label = name.split(".", 1)[1]
        tensor = f"model.layers.{layer}.mlp.{group}.{label}"
        if tensor not in manifest.tensors:
            raise BundleError(f"{bundle}: graph input {name} has no tensor {tensor} in the manifest; {REGENERATE}")
        t = manifest.tensors[tensor]
        shape = tuple(t["shape"])
        if arg.shape and arg.shape[0] == SLAB_DIM:
            if t["file"] != MLP_FILE:  # rows are streamed from the Flash file only
                raise BundleError(f"{bundle}: per-row tensor {tensor} lies in {t['file']}, not {MLP_FILE}; "
                                  f"{REGENERATE}")
            item = np.dtype(t["dtype"]).itemsize
            row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * item
            if position is None:
                position = row_positions(bundle, manifest, layer, group, shape[0])
            per_row.append(RowArray(name, t["offset"], shape[0], row_bytes, t["dtype"], shape[1:], position))
        else:
            shared[name] = np.array(open_tensor(bundle, manifest, tensor))
    return GroupArrays(per_row, shared)


class GroupSlab:
    """Slab + RowCache + SlotTable of one group (see the module docstring).

    With ``native`` (the op library's path) the per-token step runs in C++ (``NativeCache``, the same
    rules): its state is the truth while decoding, and ``cache`` / ``table`` bring the numpy objects up
    to date when something else (the batched prefill, a test) reads or changes them."""

    def __init__(self, arrays: GroupArrays, rows: int, k: int, capacity: int, flash: FlashStore,
                 native: str | None = None, shared: SharedStaging | None = None):
        self.arrays, self.rows, self.k, self.flash = arrays, rows, k, flash
        self.capacity = capacity
        if shared is None:
            self.slabs = [np.zeros((capacity + k, *a.row_shape), dtype=a.dtype) for a in arrays.per_row]
        else:  # the staging slots of every array are consecutive windows of the shared pages
            offsets = window_offsets([a.row_bytes for a in arrays.per_row], k)
            self.slabs = [shared.slab(capacity, k, a.row_shape, a.dtype, o)
                          for a, o in zip(arrays.per_row, offsets)]
        self._cache: RowCache | None = None
        self._table: SlotTable | None = None
        self._step: SlotStep | None = None
        self._library = native
        self._native: NativeCache | None = None
        self._native_owns = False
        self._selected = self._slots = None

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        """Graph inputs that never change: the slab arrays and the shared tables."""
        return {**{a.name: s for a, s in zip(self.arrays.per_row, self.slabs)}, **self.arrays.shared}

    @property
    def slab_bytes(self) -> int:
        return sum(s.nbytes for s in self.slabs)

    @property
    def native(self) -> bool:
        return self._library is not None

    def bind(self, selected: np.ndarray, slots: np.ndarray) -> None:
        """The graph buffers ``step`` reads the selection [1, K] from and writes the slots [1, K] into."""
        self._selected, self._slots = selected, slots

    def reset(self, policy: str, future: np.ndarray | None = None, pinned: np.ndarray | None = None) -> None:
        """A new sequence: an empty cache (``static``: the pinned rows, read now)."""
        self.close()
        self._cache = RowCache(self.rows, self.capacity, policy, future=future, pinned=pinned)
        self._table = SlotTable(self.rows, self._cache.capacity, self.k)
        if pinned is not None:
            step = self._table.preload(np.flatnonzero(pinned))
            self.flash.read(self.arrays.per_row, self.slabs, step.read_rows, step.read_slots)
        if self._library is not None:
            per_row = self.arrays.per_row
            # the C++ step copies misses at logical offsets; a reordered file (``RowArray.position``) is read
            # by the Flash store, which maps logical rows to file rows
            mapping = self.flash.mapping if all(a.position is None for a in per_row) else None
            self._native = NativeCache(self._library, self._cache, self._table, self.slabs,
                                       [a.offset for a in per_row], [a.row_bytes for a in per_row],
                                       mapping, self._selected, self._slots)
            self._native_owns = True

    @property
    def cache(self) -> RowCache:
        """The group's RowCache (numpy), up to date."""
        self._to_numpy()
        return self._cache

    @property
    def table(self) -> SlotTable:
        """The group's SlotTable (numpy), up to date."""
        self._to_numpy()
        return self._table

    def _to_numpy(self) -> None:
        if self._native_owns:
            self._native.pull(self._cache, self._table)
            self._native_owns = False

    @property
    def resident(self) -> np.ndarray:
        """Residency before this token (bool [rows]): the ``cache_*`` input of TopKColumnMask."""
        return self._native.resident if self._native_owns else self._cache.resident[0]

    def native_state(self) -> NativeCache:
        """The native step, owning the state (pushed from numpy if a prefill or a test changed it): what a
        graph that steps the cache itself binds (``dipdeploy.runtime.backends.joined``)."""
        if self._native is None:
            raise RuntimeError("this group has no native cache step (reset it with the op library's path first)")
        if not self._native_owns:
            self._native.push(self._cache, self._table)
            self._native_owns = True
        return self._native

    def select(self, selected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Record the selection [K]; read the misses into their slots. Returns (slots [1, K], hits [K])."""
        self._to_numpy()
        hits = self._cache.access(selected[None])[0]
        step = self._table.assign(selected, hits, self._cache.resident[0])
        self.flash.read(self.arrays.per_row, self.slabs, step.read_rows, step.read_slots)
        self._step = step
        return step.slots[None], hits

    def step(self) -> np.ndarray:
        """``select`` on the bound selection, the slots written into the bound buffer; returns the hits
        [K]. The native path when the group has it (one call into the op library)."""
        if self._native is None:
            slots, hits = self.select(self._selected[0])
            self._slots[...] = slots
            return hits
        nat = self._native
        if not self._native_owns:
            nat.push(self._cache, self._table)
            self._native_owns = True
        hits, n = nat.select()
        if n:
            per_row = self.arrays.per_row
            nbytes, requests = n * sum(a.row_bytes for a in per_row), int(nat.info[1]) * len(per_row)
            if nat.copies:
                self.flash.account(nbytes, requests, float(nat.info[0]) * 1e-9, int(nat.info[2]), int(nat.info[3]))
            else:
                self.flash.read(per_row, self.slabs, nat.read_rows[:n], nat.read_slots[:n])
        return hits

    def settle(self) -> None:
        """After the MLP ran: move staged rows the cache admitted into their freed slots (DRAM copies)."""
        if self._native_owns:
            self._native.settle()
            return
        src, dst = self._table.finish(self._step)
        if len(src):
            for slab in self.slabs:
                slab[dst] = slab[src]
        self._step = None

    def close(self) -> None:
        """Free the native step (it holds the Flash store's mapping)."""
        if self._native is not None:
            self._to_numpy()
            self._native.close()
            self._native = None
