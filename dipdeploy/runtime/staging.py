"""One staging area for every group: the same physical pages behind every slab's staging slots.

A group's staging slots (``SlotTable``: slots ``[capacity, capacity + K)``) hold rows only from its
``step`` to its ``settle``, and ``Engine.step`` runs each group's step, MLP graph and settle back to
back, one group at a time. No two groups' staging is ever live at once, so each slab is mapped as one
contiguous virtual array (what ``SparseGatherMatMul`` and the slot rule see) whose cache slots are
private anonymous pages and whose staging slots are a window onto one shared ``memfd``. Staging then
costs the largest group's window instead of the sum over groups: on the 32-layer Mistral-7B bundle the
sum alone exceeded what the scale run's memory limit leaves (docs/decisions/0006-reads.md;
``benchmarks/results/scale.md``).

Linux only (``memfd_create``); elsewhere :func:`supported` is false and each slab keeps staging of its
own. ``VmRSS`` counts a shared page once per mapping, so it overstates a process that shares staging; the
cgroup's usage and ``Pss`` count it once (docs/runtime.md). Torch-free (floor 5).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass

import numpy as np

PAGE = mmap.PAGESIZE


def page_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def window_offsets(row_bytes: list[int], k: int) -> list[int]:
    """Where each per-row array's K staging rows start in a group's window, and (last) its end: each
    array's share starts on a page (it is mapped on its own)."""
    out = [0]
    for rb in row_bytes:
        out.append(out[-1] + page_up(k * rb))
    return out


def window_bytes(row_bytes: list[int], k: int) -> int:
    """Bytes of one group's staging window (:func:`window_offsets`' end)."""
    return window_offsets(row_bytes, k)[-1]


def supported() -> bool:
    return hasattr(os, "memfd_create") and _libc() is not None


def _libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mm = libc.mmap
    except (OSError, AttributeError):
        return None
    mm.restype = ctypes.c_void_p
    mm.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.restype, libc.munmap.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
    return libc


_FAILED = ctypes.c_void_p(-1).value
_FIXED = 0x10  # MAP_FIXED, the same value on every Linux architecture


class _Mapping:
    """A slab's virtual range; numpy arrays over it keep it alive (``base``), and it is unmapped when
    the last of them goes."""

    def __init__(self, libc, address: int, length: int, array: dict):
        self._libc, self._address, self._length = libc, address, length
        self.__array_interface__ = array

    def __del__(self) -> None:
        self._libc.munmap(self._address, self._length)


@dataclass
class SharedStaging:
    """The shared staging pages (a memfd of ``nbytes``), over which every slab maps its staging rows."""

    nbytes: int

    def __post_init__(self) -> None:
        self._libc = _libc()
        self._fd = os.memfd_create("dipdeploy-staging", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, page_up(self.nbytes))

    def slab(self, capacity: int, k: int, row_shape: tuple, dtype, offset: int) -> np.ndarray:
        """A ``[capacity + k, *row_shape]`` array whose first ``capacity`` rows are zeroed pages of its
        own and whose last ``k`` rows are the shared bytes ``[offset, offset + page_up(k · row_bytes))``
        (holding whatever the last group staged there). The cache part is padded in front so that the
        staging part starts on a page."""
        dtype = np.dtype(dtype)
        row_bytes = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
        cache, stage = capacity * row_bytes, page_up(k * row_bytes)
        if stage == 0 or row_bytes == 0:
            return np.zeros((capacity + k, *row_shape), dtype)
        if offset % PAGE or offset + stage > page_up(self.nbytes):
            raise ValueError(f"staging window [{offset}, {offset + stage}) does not lie on pages of the "
                             f"{self.nbytes}-byte shared staging")
        pad = -cache % PAGE
        length = pad + cache + stage
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        address = self._libc.mmap(None, length, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if address in (None, _FAILED):
            raise MemoryError(f"mmap of a {length}-byte slab failed: {os.strerror(ctypes.get_errno())}")
        window = self._libc.mmap(address + pad + cache, stage, prot, mmap.MAP_SHARED | _FIXED, self._fd, offset)
        if window in (None, _FAILED):
            self._libc.munmap(address, length)
            raise MemoryError(f"mmap of a staging window failed: {os.strerror(ctypes.get_errno())}")
        owner = _Mapping(self._libc, address, length, {
            "shape": (capacity + k, *row_shape), "typestr": dtype.str, "data": (address + pad, False),
            "version": 3})
        return np.asarray(owner)

    def resident_bytes(self) -> int:
        """The shared pages in memory (counted once, however many slabs map them)."""
        return os.fstat(self._fd).st_blocks * 512

    def close(self) -> None:
        """Close the memfd; the pages live on while a slab maps them."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
