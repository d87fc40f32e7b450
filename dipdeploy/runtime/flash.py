"""The Flash store: the bundle's MLP file, read row by row with positioned reads, every byte counted.

The Flash layout (docs/method.md) puts each selectable row of a group contiguously in every array of its
format (BQ4: ``qweight`` and ``scales`` rows), so a row is one read per array, and rows that are
adjacent in the file coalesce into one request (``preadv`` scattering straight into the slab slots, no
bounce buffer). Three read paths (the engine's default, ``auto``, picks ``direct`` or ``mmap``:
:func:`choose_io`):

* ``mmap``: the file mapped read-only with ``MADV_RANDOM`` (no read-ahead), each batch one vectorised
  numpy gather per array into the slab slots; the page cache as llama.cpp uses it.
* ``pread``: positioned reads, one ``preadv`` per run of adjacent rows and array, scattering straight
  into the slots. Same bytes; in Python the per-run loop (thousands of requests per SmolLM2 token) is
  slower than the mmap path (benchmarks/results/flash-smollm2-xeon.md), which is why it is not the default.
* ``direct``: ``O_DIRECT`` reads that bypass the page cache, so every miss really comes from the device:
  block-aligned requests (the blocks holding the wanted rows, neighbours coalesced) read with many in
  flight into a bounce buffer, then gathered into the slots (``dipdeploy/runtime/blockio.py``). Where
  the filesystem refuses ``O_DIRECT`` the same requests go through the page cache and ``note`` says so.

Callers name logical rows (what the caches and graphs use); where the bundle's row order is calibrated
(docs/method.md "Flash layout") each group's ``RowArray``s carry the file row of every logical row and
``read`` goes there, so rows that miss together and were placed together share blocks and runs.

The counters hold the rows' bytes (``bytes``: what the cache asked for), the bytes of the whole 4 KiB
blocks the reads cover (``block_bytes``: for ``direct`` what the device returned, read-through gaps
included; for ``mmap`` and ``pread`` the blocks holding the rows, :func:`dipdeploy.flash.touched_blocks`, which is
what a device returns where the page cache misses) and the requests a device serves them in
(``block_requests``: for ``direct`` the requests read; for the others a run of touching blocks each, up
to ``dipdeploy.flash.MAX_REQUEST``, where ``requests`` counts the reader's own calls, a run of rows per array),
and, for ``direct`` only, ``device_bytes`` (the same as ``block_bytes``); their ratio to ``bytes`` is the
waste of rows smaller than a block. ``mmap`` and ``pread`` leave ``device_bytes`` at 0: whether their
pages came from the device or the page cache is the OS's business (``/proc/self/io`` ``read_bytes``
tells, see benchmarks/flash.py).

With ``cold`` the file is dropped from the OS page cache first (``posix_fadvise(DONTNEED)``) so the
first reads reach the disk; ``POSIX_FADV_RANDOM`` keeps read-ahead from inflating them. Rows evicted
from our cache and read again later may still come from the OS page cache (not with ``direct``; for
the others a cgroup memory limit prevents it, benchmarks/flash.py); that is said, not hidden.

``emulate`` (the simulator's Flash model, ``dipdeploy.sim.devices.FlashModel``: ``--flash-bandwidth``
alone, or a device profile's bandwidth and request cost, ``--flash-device``) emulates a slower device (a
phone's Flash) on top of the real reads: each batch owes the model's ``read_time(block_requests,
block_bytes)``, t = n · request_s + b / seq_bandwidth (a device transfers whole blocks, so a row smaller
than a block owes the block unless it shares one, and each run of blocks its request) minus the time the
real read took (synchronous I/O, no overlap with compute); the debt is paid by sleeping once it passes
``_SLEEP_SLICE``, and ``settle`` pays the rest at the end of each token. The measured sleep is what is
deducted, so the OS's oversleep is credited to the next batch instead of adding up over a token's many
short sleeps (benchmarks/results/notes.md). Reported as emulation.

Torch-free (floor 5).
"""

from __future__ import annotations

import mmap
import os
import stat
import time
from dataclasses import astuple, dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from dipdeploy.bundle.manifest import BundleError
from dipdeploy.flash import plan_reads, touched_blocks
from dipdeploy.runtime.blockio import IO_ENGINE, IO_GAP, AlignedBuffer, direct_fd, make_reader, open_direct

if TYPE_CHECKING:
    from dipdeploy.sim.devices import FlashModel

IO_MODES = ("mmap", "pread", "direct")
IO_AUTO = "auto"  # the engine's default: one of IO_MODES, chosen by choose_io once the plan is known
IO_CHOICES = (IO_AUTO,) + IO_MODES  # what a user may name (EngineConfig.io, --io)
_IOV_MAX = 1024
_SLEEP_SLICE = 1e-3  # pay emulated Flash time in sleeps of at least this
_MAX_CREDIT = 2e-3  # oversleep credited to later reads, at most


@dataclass(frozen=True)
class RowArray:
    """One per-row array of a group in the MLP file: ``rows`` rows of ``row_bytes`` at ``offset``.
    ``position``: the file row of each logical row where the bundle's row order is calibrated (one array
    shared by the group's arrays); None where file rows are logical rows."""

    name: str
    offset: int
    rows: int
    row_bytes: int
    dtype: str
    row_shape: tuple[int, ...]
    position: np.ndarray | None = field(default=None, compare=False, repr=False)


@dataclass
class FlashCounters:
    """Totals since the store opened; a run reports the difference of two ``snapshot``s."""

    bytes: int = 0
    requests: int = 0
    device_bytes: int = 0
    block_bytes: int = 0  # the whole blocks the reads covered: what the emulated Flash paces
    block_requests: int = 0  # ... in the requests a device serves them in (module docstring)
    io_seconds: float = 0.0
    emulated_wait: float = 0.0
    ahead_rows: int = 0  # rows the joined decoder's CachePrefetch nodes read ahead of the selection
    ahead_used: int = 0  # ... that the selection then missed (read during the attention)

    def __sub__(self, other: "FlashCounters") -> "FlashCounters":
        return FlashCounters(*(a - b for a, b in zip(astuple(self), astuple(other))))

    def snapshot(self) -> "FlashCounters":
        return replace(self)


def runs(rows: np.ndarray) -> np.ndarray:
    """Start positions of runs of consecutive rows in an ascending ``rows`` (plus len(rows) at the end)."""
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    return np.concatenate([[0], breaks, [len(rows)]]).astype(np.int64)


def choose_io(path: str | os.PathLike, rows_on_flash: bool, fd: int | None = None) -> tuple[str, str]:
    """What ``--io auto`` reads with, and why in a few words: ``direct`` where the plan leaves MLP rows
    on Flash and the file's filesystem takes ``O_DIRECT``, else ``mmap``.

    A DRAM budget is a promise about memory, and only ``direct`` keeps it: ``mmap`` leaves every page it
    touched in the page cache, which a memory limit counts (cgroups do), so once the file does not fit
    beside the plan the pages are evicted and faulted in again one 4 KiB block at a time: under a limit of
    the plan plus the README's overhead ``mmap`` decoded far slower than ``direct``, and without a limit
    faster, only because the page cache held the whole file beyond the plan (benchmarks/io_auto.py,
    benchmarks/results/io-auto.md). Where every row is resident from the start (``model.onnx`` in one
    session) nothing is read per token, and where the filesystem refuses ``O_DIRECT`` the direct reads
    would go through the page cache anyway: ``mmap`` there. ``fd``: the file already open (and checked),
    probed instead of ``path`` and closed here."""
    if not rows_on_flash:
        if fd is not None:
            os.close(fd)
        return "mmap", "every MLP row resident"
    if fd is None:
        fd, note = open_direct(str(path))
    else:
        try:
            note = direct_fd(fd, str(path))
        except BaseException:
            os.close(fd)
            raise
    os.close(fd)
    if note:
        return "mmap", "the filesystem refuses O_DIRECT"
    return "direct", "rows read from Flash"


def emulation(bandwidth: float | None, device: str | None) -> FlashModel | None:
    """The device a Flash store paces its reads to: ``bandwidth`` bytes/s alone (``--flash-bandwidth``), a
    device profile's bandwidth and request cost (``--flash-device``: a name from ``dipdeploy simulate``'s
    profiles or a .toml path), or none. The runtime's reads are 4 KiB blocks whatever the profile's read
    unit (the simulator's coarser units are its projection, not this disk's)."""
    if bandwidth and device:
        raise ValueError("give --flash-bandwidth or --flash-device, not both (a device profile has its own bandwidth)")
    if not (bandwidth or device):
        return None
    from dipdeploy.sim.devices import FlashModel, get_device  # only when emulating (the simulator's package)

    if device:
        flash = get_device(device).flash
        return FlashModel(flash.seq_bandwidth, flash.request_s)
    return FlashModel(bandwidth, 0.0)


class FlashStore:
    """Positioned, counted, optionally paced reads of rows from one file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, *, io: str = "mmap", cold: bool = False,
                 emulate: FlashModel | None = None, io_threads: int | None = None, native: bool = True,
                 io_engine: str = IO_ENGINE, io_gap: int = IO_GAP, size: int | None = None, fd: int | None = None):
        """``fd``: the file already open (the engine's, checked by ``BundleDir.open``), owned from here on;
        without it ``path`` is opened. ``path`` names the file in messages either way.
        ``size``: the bytes the manifest lists for the file. The descriptor that is read (and mapped)
        is ``fstat``-ed against it right after it opens, so a file truncated since the bundle's checks is
        refused in one line instead of a SIGBUS on the first mapped page past its end. A file truncated
        while a run maps it is outside the contract: a bundle is read-only for as long as a run holds it
        (``export --force`` swaps in a new directory rather than rewriting files in place), and Python
        cannot survive a SIGBUS; ``io="pread"`` or ``"direct"`` turn such a truncation into a short-read
        error instead."""
        if io not in IO_MODES:
            raise ValueError(f"io={io!r}: choose one of {', '.join(IO_MODES)}")
        if io_gap < 0:
            raise ValueError(f"io gap={io_gap} must be >= 0 blocks")
        self.path, self.io, self.emulate, self.io_gap = str(path), io, emulate, io_gap
        self.note: str | None = None  # one line for the user when direct reads fell back to the page cache
        self._reader = self._bounce = self._mmap = self._map = None
        if fd is not None:
            self.fd = fd
            if io == "direct":
                try:
                    self.note = direct_fd(fd, self.path)
                except BaseException:
                    os.close(fd)
                    raise
        elif io == "direct":
            self.fd, self.note = open_direct(self.path)
        else:
            self.fd = os.open(self.path, os.O_RDONLY)
        self._check_size(size)
        if io == "direct":
            self._reader, self._bounce = make_reader(io_threads, native, io_engine), AlignedBuffer()
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
        if cold:
            self.drop_page_cache()
        if io == "mmap":
            self._mmap = mmap.mmap(self.fd, 0, prot=mmap.PROT_READ)
            if hasattr(self._mmap, "madvise"):
                self._mmap.madvise(mmap.MADV_RANDOM)
            self._map = np.frombuffer(self._mmap, dtype=np.uint8)
        self.counters = FlashCounters()
        self._debt = 0.0

    def _check_size(self, size: int | None) -> None:
        """Refuse (closing the descriptor) a file that is not a regular file of at least ``size`` bytes."""
        st = os.fstat(self.fd)
        if size is None or (st.st_size >= size and stat.S_ISREG(st.st_mode)):
            return
        os.close(self.fd)
        self.fd = -1
        raise BundleError(f"{self.path}: {st.st_size} bytes where the manifest lists {size} (changed since the "
                      "bundle was checked); re-export the bundle or run `dipdeploy inspect --verify`")

    def native_reader(self, bounce: int):
        """``--io direct`` with the op library's reader, for a caller that reads through it in C++ (the
        joined decoder's cache steps, ``dipdeploy.runtime.backends.joined``): (fd, reader handle, whether it is an
        io_uring ring, a block-aligned bounce buffer of ``bounce`` bytes); None without one."""
        handle = getattr(self._reader, "handle", None)  # the Python reader has none
        if self.io != "direct" or not handle:
            return None
        return self.fd, handle, self._reader.kind == "io_uring", self._bounce.get(bounce)

    @property
    def reader_kind(self) -> str | None:
        """``--io direct``: which reader runs the requests ("io_uring", "threads" or "python"); else None."""
        return None if self._reader is None else self._reader.kind

    def drop_page_cache(self) -> None:
        """Ask the OS to forget the file's cached pages, so the next reads come from the disk. With
        ``mmap`` the pages this process has mapped are unmapped first: the page cache keeps mapped pages
        whatever ``posix_fadvise`` says."""
        if self._mmap is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._mmap.madvise(mmap.MADV_DONTNEED)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        self._map = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read(self, arrays: list[RowArray], slabs: list[np.ndarray], rows: np.ndarray, slots: np.ndarray) -> None:
        """Copy logical ``rows`` (ascending) of every array (one group's) into ``slabs[a][slots]``; count
        and pace the reads. Where the group's rows are reordered, the reads go to their file rows, in
        file order, so adjacent file rows coalesce as in the natural order."""
        if len(rows) == 0:
            return
        t0 = time.perf_counter()
        position = arrays[0].position
        if any(a.position is not position for a in arrays):
            raise ValueError("FlashStore.read: the arrays of one call must share one row order (one group)")
        if position is not None:
            file_rows = position[rows]
            order = np.argsort(file_rows, kind="stable")
            rows, slots = file_rows[order], np.asarray(slots)[order]
        nbytes = len(rows) * sum(a.row_bytes for a in arrays)
        block_requests = 0  # direct: the device's requests are the reader's (account)
        if self.io == "direct":
            blocks, requests = self._direct(arrays, slabs, rows, slots)
        else:
            starts = runs(rows)
            for arr, slab in zip(arrays, slabs):
                if self.io == "mmap":
                    self._gather(arr, slab, rows, slots)
                else:
                    self._preadv(arr, slab, rows, slots, starts)
            requests = (len(starts) - 1) * len(arrays)
            blocks, block_requests = touched_blocks([a.offset for a in arrays], [a.row_bytes for a in arrays], rows)
        self.account(nbytes, requests, time.perf_counter() - t0, blocks, block_requests)

    @property
    def mapping(self) -> np.ndarray | None:
        """The file's read-only map (uint8) with ``io="mmap"``, for a reader that copies rows itself at
        ``RowArray.offset + row * row_bytes`` (the native cache step, dipdeploy/runtime/native_cache.py)."""
        return self._map

    def account(self, nbytes: int, requests: int, elapsed: float, block_bytes: int, block_requests: int = 0) -> None:
        """Count a batch's reads (``nbytes`` of rows in ``requests`` of the reader, covering ``block_bytes`` of
        whole blocks in ``block_requests`` device requests, which took ``elapsed`` s) and pace them: the
        blocks and their requests owe their time on the emulated device. With ``direct`` the blocks and the
        reader's requests are what the device served, so ``block_requests`` is theirs and not given."""
        if self.io == "direct":
            block_requests = requests
        self.counters.bytes += nbytes
        self.counters.requests += requests
        self.counters.block_bytes += block_bytes
        self.counters.block_requests += block_requests
        if self.io == "direct":
            self.counters.device_bytes += block_bytes
        self.counters.io_seconds += elapsed
        if self.emulate is not None:
            owed = self.emulate.read_time(block_requests, block_bytes)
            self._debt = max(self._debt + owed - elapsed, -_MAX_CREDIT)
            if self._debt > _SLEEP_SLICE:
                self.settle()

    def settle(self) -> None:
        """Pay the emulated Flash time still owed (call at the end of a token)."""
        if self.emulate is not None and self._debt > 0:
            t0 = time.perf_counter()
            time.sleep(self._debt)
            slept = time.perf_counter() - t0
            self._debt -= slept
            self.counters.emulated_wait += slept

    def _direct(self, arrays: list[RowArray], slabs: list[np.ndarray], rows: np.ndarray,
                slots: np.ndarray) -> tuple[int, int]:
        """Block-aligned parallel reads into the bounce buffer, then one gather per array; returns the
        bytes the device returned and the requests."""
        plan = plan_reads([a.offset for a in arrays], [a.row_bytes for a in arrays], rows, max_gap=self.io_gap)
        bounce = self._bounce.get(plan.total)
        got = self._reader.read(self.fd, self.path, plan, bounce)
        for arr, slab, src in zip(arrays, slabs, plan.src):
            windows = np.lib.stride_tricks.sliding_window_view(bounce, arr.row_bytes)
            slab.reshape(slab.shape[0], -1).view(np.uint8)[slots] = windows[src]
        return got, plan.requests

    def _gather(self, arr: RowArray, slab: np.ndarray, rows: np.ndarray, slots: np.ndarray) -> None:
        view = self._map[arr.offset: arr.offset + arr.rows * arr.row_bytes].reshape(arr.rows, arr.row_bytes)
        slab.reshape(slab.shape[0], -1).view(np.uint8)[slots] = view[rows]
        self._unmap_pages(arr.offset + int(rows[0]) * arr.row_bytes, arr.offset + (int(rows[-1]) + 1) * arr.row_bytes)

    def _unmap_pages(self, start: int, end: int) -> None:
        """Drop the gathered span's pages from this process's mapping (``MADV_DONTNEED``; they stay in
        the page cache): the rows now live in the slab, and mapped pages would otherwise stay in RSS
        as file-backed memory, up to the whole file whatever the DRAM budget."""
        if hasattr(self._mmap, "madvise"):
            lo = start - start % mmap.PAGESIZE
            self._mmap.madvise(mmap.MADV_DONTNEED, lo, end - lo)

    def _preadv(self, arr: RowArray, slab: np.ndarray, rows: np.ndarray, slots: np.ndarray,
                starts: np.ndarray) -> None:
        flat = memoryview(slab.reshape(-1).view(np.uint8))
        rb = arr.row_bytes
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
            s = slots[a:b]
            first = int(s[0])
            if b - a == 1 or (int(s[-1]) - first == b - a - 1 and bool((np.diff(s) == 1).all())):
                bufs = [flat[first * rb:(first + b - a) * rb]]
            else:
                bufs = [flat[x * rb:(x + 1) * rb] for x in s.tolist()]
            offset = arr.offset + int(rows[a]) * rb
            for i in range(0, len(bufs), _IOV_MAX):
                chunk = bufs[i:i + _IOV_MAX]
                want = sum(len(c) for c in chunk)
                got = os.preadv(self.fd, chunk, offset)
                if got != want:
                    raise OSError(f"{self.path}: short read of {got} of {want} bytes at offset {offset}: the "
                                  "bundle's MLP file is truncated; re-export it or run `dipdeploy inspect --verify`")
                offset += want
