"""One layer-group's DRAM slab: preallocated slot arrays, the row cache, the slot table, its Flash rows.

A group is the up|gate rows (one per input feature, R = d) or the down rows (one per GLU unit, R = F)
of one layer. Its per-row arrays (fp32 ``rows``; BQ4 ``qweight``, ``scales``[, ``zeros``]; VQ3
``codes``) get a slab of ``capacity + staging`` rows each, allocated once and bound to the MLP graph
as inputs (zero copy); shared tables (VQ3 codebooks) are read whole and stay resident.

Per token: ``select`` (cache access + slot assignment + Flash reads of the misses) before the MLP
graph runs, ``settle`` (the deferred moves of the slot rule) after. Torch-free (floor 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dipdeploy.cache import RowCache, SlotStep, SlotTable
from dipdeploy.export.manifest import MLP_FILE, REGENERATE, SLAB_DIM, BundleError, open_tensor, row_positions
from dipdeploy.runtime.flash import FlashStore, RowArray


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
    """Slab + RowCache + SlotTable of one group (see the module docstring)."""

    def __init__(self, arrays: GroupArrays, rows: int, k: int, capacity: int, flash: FlashStore):
        self.arrays, self.rows, self.k, self.flash = arrays, rows, k, flash
        self.capacity = capacity
        self.slabs = [np.zeros((capacity + k, *a.row_shape), dtype=a.dtype) for a in arrays.per_row]
        self.cache: RowCache | None = None
        self.table: SlotTable | None = None
        self._step: SlotStep | None = None

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        """Graph inputs that never change: the slab arrays and the shared tables."""
        return {**{a.name: s for a, s in zip(self.arrays.per_row, self.slabs)}, **self.arrays.shared}

    @property
    def slab_bytes(self) -> int:
        return sum(s.nbytes for s in self.slabs)

    def reset(self, policy: str, future: np.ndarray | None = None, pinned: np.ndarray | None = None) -> None:
        """A new sequence: an empty cache (``static``: the pinned rows, read now)."""
        self.cache = RowCache(self.rows, self.capacity, policy, future=future, pinned=pinned)
        self.table = SlotTable(self.rows, self.cache.capacity, self.k)
        if pinned is not None:
            step = self.table.preload(np.flatnonzero(pinned))
            self.flash.read(self.arrays.per_row, self.slabs, step.read_rows, step.read_slots)

    @property
    def resident(self) -> np.ndarray:
        """Residency before this token (bool [rows]): the ``cache_*`` input of TopKColumnMask."""
        return self.cache.resident[0]

    def select(self, selected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Record the selection [K]; read the misses into their slots. Returns (slots [1, K], hits [K])."""
        hits = self.cache.access(selected[None])[0]
        step = self.table.assign(selected, hits, self.cache.resident[0])
        self.flash.read(self.arrays.per_row, self.slabs, step.read_rows, step.read_slots)
        self._step = step
        return step.slots[None], hits

    def settle(self) -> None:
        """After the MLP ran: move staged rows the cache admitted into their freed slots (DRAM copies)."""
        src, dst = self.table.finish(self._step)
        if len(src):
            for slab in self.slabs:
                slab[dst] = slab[src]
        self._step = None
