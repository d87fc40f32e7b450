"""Block-aligned reads of rows with many requests in flight: the Flash store's ``direct`` path.

The requests are those :func:`dipdeploy.flash.plan_reads` plans (block ranges of the wanted rows,
coalesced across gaps of at most :data:`IO_GAP` blocks, cut at ``MAX_REQUEST`` bytes; the cost model
lives in ``dipdeploy/flash.py``). The ranges land back to back in one aligned bounce buffer; the wanted
rows are then gathered from it into their slab slots in one numpy step per array.

The reads run in the native op library (custom_ops/src/io/, through ctypes) when it is built: an
io_uring ring (``dd_io_ring_read``: the kernel keeping up to :data:`IO_RING_DEPTH` requests in flight,
submitted in one syscall, with no thread of its own) or a pool of pread threads (``dd_io_read``); without
the library in a ``ThreadPoolExecutor`` of ``os.preadv`` calls. Same requests, same bytes; ``--io-engine``
chooses, by default the ring where the kernel grants one (:data:`IO_ENGINE`).
Torch-free (floor 5).
"""

from __future__ import annotations

import ctypes
import errno
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dipdeploy.flash import BLOCK, BlockPlan

IO_THREADS = 16  # pread threads, reads in flight (benchmarks/results/flash.md measures 1, 4, 16 and 32)
#: io_uring entries, reads in flight: the ring needs no thread per read, so it can keep far more in flight
#: than the pool, and a deeper ring decoded DIP-CA faster (docs/decisions/0006-reads.md)
IO_RING_DEPTH = 256
IO_GAP = 4  # blocks: a request saved is worth more than the blocks read through (benchmarks/results/read-gaps.md)
IO_ENGINES = ("threads", "io_uring")  # the op library's readers
IO_ENGINE_AUTO = "auto"  # the ring where the library has one and the kernel grants it, else the pread threads
IO_ENGINE_CHOICES = (IO_ENGINE_AUTO,) + IO_ENGINES  # what a user may name (EngineConfig.io_engine, --io-engine)
#: the ring decoded the 1 B model faster than the threads on both machines measured (an Intel Xeon and an
#: AMD EPYC; docs/decisions/0006-reads.md); a kernel or sandbox that refuses io_uring gets the threads
IO_ENGINE = IO_ENGINE_AUTO


class AlignedBuffer:
    """A growable bounce buffer whose start is block-aligned (``O_DIRECT`` needs aligned memory)."""

    def __init__(self, block: int = BLOCK):
        self.block = block
        self._raw = np.empty(0, dtype=np.uint8)
        self.view = self._raw

    def get(self, size: int) -> np.ndarray:
        if len(self.view) < size:
            self._raw = np.empty(size + self.block, dtype=np.uint8)
            skip = -self._raw.ctypes.data % self.block
            self.view = self._raw[skip:skip + size]
        return self.view[:size]


def _short(path: str, plan: BlockPlan, i: int, err: int) -> OSError:
    if err == errno.EIO:
        return OSError(f"{path}: short read at offset {int(plan.offset[i])} (wanted {int(plan.need[i])} bytes): the "
                       "bundle's MLP file is truncated; re-export it or run `dipdeploy inspect --verify`")
    return OSError(err, f"{path}: read at offset {int(plan.offset[i])} failed: {os.strerror(err)}")


class NativeReader:
    """The op library's readers (custom_ops/src/io/): an io_uring ring of ``threads`` entries
    (``kind`` "io_uring") or a pool of ``threads`` pread threads ("threads")."""

    def __init__(self, library: str, threads: int, engine: str):
        lib = ctypes.CDLL(library)
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        read_args = [p, ctypes.c_int, i64, p, p, p, p, p, ctypes.POINTER(i64)]
        ring = None
        if engine == "io_uring" and hasattr(lib, "dd_io_ring_new"):
            lib.dd_io_ring_new.restype, lib.dd_io_ring_new.argtypes = p, [ctypes.c_int]
            lib.dd_io_ring_free.restype, lib.dd_io_ring_free.argtypes = None, [p]
            lib.dd_io_ring_read.restype, lib.dd_io_ring_read.argtypes = i64, read_args
            ring = lib.dd_io_ring_new(threads)
        if engine == "io_uring" and not ring:
            raise ValueError("--io-engine io_uring: this kernel has no io_uring or refuses it (kernel.io_uring_disabled, "
                             "a seccomp filter) or the op library predates it; use --io-engine threads")
        self.threads, self._lib = threads, lib
        if ring:
            self.kind, self._handle = "io_uring", ring
            self._read, self._free = lib.dd_io_ring_read, lib.dd_io_ring_free
        else:
            lib.dd_io_pool_new.restype, lib.dd_io_pool_new.argtypes = p, [ctypes.c_int]
            lib.dd_io_pool_free.restype, lib.dd_io_pool_free.argtypes = None, [p]
            lib.dd_io_read.restype, lib.dd_io_read.argtypes = i64, read_args
            self.kind, self._handle = "threads", lib.dd_io_pool_new(threads)
            self._read, self._free = lib.dd_io_read, lib.dd_io_pool_free
            if not self._handle:
                raise RuntimeError(f"dd_io_pool_new({threads}) failed")

    @property
    def handle(self) -> int | None:
        """The reader in the op library (a dd_io pool or ring), for C++ that reads through it."""
        return self._handle

    def read(self, fd: int, path: str, plan: BlockPlan, dest: np.ndarray) -> int:
        failed = ctypes.c_int64(-1)
        got = self._read(self._handle, fd, plan.requests, plan.offset.ctypes.data, plan.length.ctypes.data,
                         plan.need.ctypes.data, dest.ctypes.data, plan.place.ctypes.data, ctypes.byref(failed))
        if got < 0:
            raise _short(path, plan, failed.value, -got)
        return int(got)

    def close(self) -> None:
        if self._handle:
            self._free(self._handle)
            self._handle = None


class PythonReader:
    """``os.preadv`` calls from a thread pool: the same requests when the op library is not built."""

    kind = "python"

    def __init__(self, threads: int):
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="dipdeploy-io")

    def read(self, fd: int, path: str, plan: BlockPlan, dest: np.ndarray) -> int:
        mv = memoryview(dest)

        def one(i: int) -> int:
            off, length, at = int(plan.offset[i]), int(plan.length[i]), int(plan.place[i])
            done = 0
            while done < length:
                got = os.preadv(fd, [mv[at + done:at + length]], off + done)
                if got == 0:
                    break
                done += got
            if done < plan.need[i]:
                raise _short(path, plan, i, errno.EIO)
            return done

        return sum(self._pool.map(one, range(plan.requests)))

    def close(self) -> None:
        self._pool.shutdown()


def in_flight(engine: str, threads: int | None = None) -> int:
    """Reads in flight: ``threads`` where given (``--io-threads``), else the reader's own default."""
    if threads is not None:
        return threads
    return IO_RING_DEPTH if engine == "io_uring" else IO_THREADS


def make_reader(threads: int | None = None, native: bool = True, engine: str = IO_ENGINE):
    """The native reader when the op library is built and has ``dd_io_read`` (its pread threads, or its
    io_uring ring for ``engine`` "io_uring", refused where there is none), else the Python one; ``engine``
    "auto" takes the ring where it can be had and the threads otherwise. ``threads`` reads in flight
    (None: :func:`in_flight`'s default for the reader that runs)."""
    if engine not in IO_ENGINE_CHOICES:
        raise ValueError(f"io engine {engine!r}: choose one of {', '.join(IO_ENGINE_CHOICES)}")
    if threads is not None and threads < 1:
        raise ValueError(f"io threads={threads} must be >= 1")
    if native:
        from dipdeploy.ops.native import library_path

        lib = library_path()
        if lib is not None:
            for kind in (("io_uring", "threads") if engine == IO_ENGINE_AUTO else (engine,)):
                try:
                    return NativeReader(str(lib), in_flight(kind, threads), kind)
                except AttributeError:  # a library older than its reader: no dd_io_read symbol
                    break
                except ValueError:  # no ring here: auto goes on to the threads
                    if engine != IO_ENGINE_AUTO:
                        raise
    if engine == "io_uring":
        from dipdeploy.ops.native import missing_library_hint

        raise ValueError(f"--io-engine io_uring needs the op library ({missing_library_hint()}); "
                         "use --io-engine threads")
    return PythonReader(in_flight("threads", threads))


def direct_fd(fd: int, path: str, block: int = BLOCK) -> str | None:
    """Switch the open ``fd`` of ``path`` to ``O_DIRECT`` (``fcntl``, so the file read is the one already
    opened and checked, not a name looked up again; probed with one aligned read); where the filesystem
    refuses it, ``fd`` is left as it was and the one-line note of :func:`open_direct` is returned."""
    import fcntl

    flag = getattr(os, "O_DIRECT", 0)
    if flag:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | flag)
            os.preadv(fd, [memoryview(AlignedBuffer(block).get(block))], 0)
            return None
        except OSError as err:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
            if err.errno != errno.EINVAL:
                raise
    return _direct_note(path, flag)


def _direct_note(path: str, flag: int) -> str:
    why = "this platform has no O_DIRECT" if not flag else "its filesystem refuses O_DIRECT"
    return (f"--io direct: {path}: {why}; reading the same block-aligned requests through the OS page cache "
            "instead (put the bundle on a disk filesystem such as ext4 or xfs for reads from the device)")


def open_direct(path: str, block: int = BLOCK) -> tuple[int, str | None]:
    """``path`` opened with ``O_DIRECT`` (probed with one aligned read), or, where the filesystem
    refuses it (tmpfs, some overlay and network filesystems), opened plainly with a one-line note."""
    flag = getattr(os, "O_DIRECT", 0)
    if flag:
        try:
            fd = os.open(path, os.O_RDONLY | flag)
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
        else:
            probe = AlignedBuffer(block).get(block)
            try:
                os.preadv(fd, [memoryview(probe)], 0)
                return fd, None
            except OSError as err:
                os.close(fd)
                if err.errno != errno.EINVAL:
                    raise
    return os.open(path, os.O_RDONLY), _direct_note(path, flag)
