"""The address-space limit this process runs under (``RLIMIT_AS``, ``ulimit -v``), so a run that would map
more than it is refused in one line instead of ending in ``std::bad_alloc`` and SIGABRT inside
onnxruntime, or a MemoryError half way through opening.

Address space is not memory: every mapping counts whole, touched or not: the files mapped (the bundle's
weight files, the libraries), each thread's stack reservation and glibc's per-thread malloc arenas, which
reserve far more than they use. So the estimate is the process's ``VmSize`` now plus what the run will
add: the planned resident bytes, each map of a bundle weight file the run makes (:func:`mapped_files`), and
a reservation per thread onnxruntime and the reader start. Torch-free (floor 5).
"""

from __future__ import annotations

import resource
from dataclasses import asdict, dataclass

from dipdeploy.bundle.names import MLP_FILE
from dipdeploy.runtime.cgroup import estimate
from dipdeploy.runtime.stats import proc_fields

# What a run maps beyond VmSize now and the files (benchmarks/memory_check.py measures it; the figures are
# in benchmarks/results/memory-check.md), rounded up.
AS_BASE = 64 << 20  # bytes: onnxruntime's sessions and the libraries loaded when they open
AS_PER_THREAD = 8 << 20  # bytes per thread: its stack and its malloc arena's reservation
AS_OTHER_THREADS = 2  # threads beside the intra-op pool's and the reader's (the main thread, onnxruntime's own)


def run_threads(threads: int | None, io_threads: int | None) -> int:
    """The threads a run will have: the intra-op pool's, the reader's, and :data:`AS_OTHER_THREADS`."""
    return (threads or 1) + (io_threads or 0) + AS_OTHER_THREADS


#: the weight file every backend's graphs keep their dense tensors in (``sessions.open_session`` maps it)
DENSE_FILE = "dense.bin"


def mapped_files(manifest, whole: bool, io: str) -> list[str]:
    """The bundle files the run maps whole, one entry per map: ``dense.bin`` by the sessions
    (``BundleDir.map``: every backend's graphs keep weights there), ``mlp.bin`` by the session of
    ``model.onnx`` where ``whole`` (the one-session mode keeps every row there) and again by the Flash
    store under ``--io mmap`` (its own map). ``direct`` and ``pread`` read ``mlp.bin`` into buffers the
    plan counts; ``auto`` must be resolved first (``backends.choose_backend``)."""
    maps = [DENSE_FILE] + [MLP_FILE] * (whole + (io == "mmap"))
    return [name for name in maps if name in manifest.files]


def address_space_limit() -> int | None:
    """The soft ``RLIMIT_AS`` in bytes, None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


@dataclass(frozen=True)
class AddressSpace:
    """Bytes: ``now`` (VmSize), ``planned`` (the resident estimate beyond what is mapped now), ``files``
    (the maps of the bundle's weight files, :func:`mapped_files`), ``threads`` (their stacks and arenas),
    ``base``."""

    now: int
    planned: int
    files: int
    threads: int
    base: int

    @property
    def total(self) -> int:
        return self.now + self.planned + self.files + self.threads + self.base

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def address_space_estimate(manifest, dram_budget, kv_bytes: int, threads: int = 1,
                           maps: list[str] | None = None) -> AddressSpace:
    """What the run of ``manifest``'s bundle will map (:class:`AddressSpace`), ``threads`` the threads it
    will start (onnxruntime's and the reader's), ``maps`` the bundle files it maps (:func:`mapped_files`;
    None: every map any backend and ``--io`` mode makes)."""
    need = estimate(manifest, dram_budget, kv_bytes)
    if maps is None:
        maps = mapped_files(manifest, True, "mmap")
    files = sum(int(manifest.files[name]["size"]) for name in maps)
    vm_size = proc_fields("/proc/self/status", ("VmSize",)).get("VmSize", 0)
    return AddressSpace(vm_size, need.budget + need.graphs + need.runtime, files, threads * AS_PER_THREAD, AS_BASE)


class AddressSpaceError(ValueError):
    """The run would map more than ``RLIMIT_AS`` allows."""


def check_address_space(manifest, dram_budget, kv_bytes: int, threads: int = 1, limit: int | None = None,
                        maps: list[str] | None = None) -> None:
    """Refuse in one line, before any session is opened, a run whose address space exceeds ``limit``
    (default: this process's ``RLIMIT_AS``); ``maps`` as in :func:`address_space_estimate`."""
    limit = address_space_limit() if limit is None else limit
    if limit is None:
        return
    need = address_space_estimate(manifest, dram_budget, kv_bytes, threads, maps)
    if need.total <= limit:
        return
    raise AddressSpaceError(
        f"the run would map {need.total / 1e6:.1f} MB of address space (this process {need.now / 1e6:.1f} MB, "
        f"the budget and sessions {need.planned / 1e6:.1f}, the bundle's weight files mapped {need.files / 1e6:.1f}, "
        f"{threads} threads {need.threads / 1e6:.1f}) but `ulimit -v` allows {limit / 1e6:.1f} MB; raise it "
        f"(ulimit -v unlimited, or a larger figure) or give a smaller --dram-budget or --context")
