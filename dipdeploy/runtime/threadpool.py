"""How an engine's ORT sessions get their intra-op threads (docs/runtime.md: threads).

An engine runs 3 L + 1 sessions one after another (91 on SmolLM2). ORT's default gives each session its
own pool of ``threads`` − 1 workers that spin on after the session's run, so with ``--threads 2`` 91
spinning workers competed for 2 cores (decode and prefill slower than on one thread:
benchmarks/results/prefill.md). Two ways out, ``EngineConfig.thread_pool``:

- ``"per-session"`` (the default): each session keeps its own pool, with spinning off
  (``session.intra_op.allow_spinning = 0``): idle workers sleep, and as the sessions run one at a time at
  most ``threads`` threads are ever runnable. The faster of the two when other jobs share the cores:
  there the shared pool fell below one thread (benchmarks/results/prefill.md, runs A and B).
- ``"shared"``: every session draws on onnxruntime's global intra-op pool
  (``use_per_session_threads = False``), one set of workers for the process. What onnxruntime (1.32)
  forces on it: the pool belongs to the process's one ORT environment and is created once
  (``set_global_thread_pool_sizes`` creates it the first time and refuses every later call); once it
  exists, its Python binding refuses every session that keeps per-session threads, ours or not (export
  validation, ``model.onnx`` sessions); and its spinning is fixed at creation, on (the Python API passes
  only the sizes; ``session.intra_op.allow_spinning`` and ``session.force_spinning_stop`` act on
  per-session pools only), which costs a core whenever another job wants it. On idle cores it is the
  faster: a sleeping per-session worker wakes too late for these short kernels (benchmarks/results/
  prefill.md, run C).

So the rule: the first shared engine of a process creates the pool with its ``threads``; from then on
every engine of the process must be shared at that size, and any other is refused in one line (it needs
another process). ``run`` and ``chat`` open one engine, so ``--thread-pool shared`` always holds there.
One thread per-session needs no pool at all (ORT runs every node on the calling thread).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: ``EngineConfig.thread_pool`` values (see the module docstring)
THREAD_POOLS = ("per-session", "shared")


def physical_cores(root: str | Path = "/") -> int:
    """The physical cores this process may run on: ``EngineConfig.threads``' default, as llama.cpp's
    ``-t`` defaults to them. SMT siblings share a core's execution units, so a second thread per core
    adds synchronisation and no arithmetic. Counted as the distinct (package, core) pairs of the CPUs in
    the process's affinity mask, from sysfs; where the topology is not readable, the CPUs of the mask.
    ``root`` re-roots the sysfs paths (tests give a folder of fake files)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topo = Path(root) / f"sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            return max(1, len(cpus))
    return max(1, len(cores))


class ThreadPoolConflict(ValueError):
    """An engine asks for threads that the process's ORT environment can no longer give."""


@dataclass
class GlobalPool:
    """The size of the process's global intra-op pool once this module created it: ORT keeps the pool
    and cannot be asked its size. ``claim`` is the only writer."""

    threads: int | None = None

    def claim(self, threads: int) -> None:
        """Create the pool with ``threads`` threads, or check that it has them."""
        if self.threads == threads:
            return
        if self.threads is not None:
            raise ThreadPoolConflict(
                f"this process's shared onnxruntime thread pool already has {self.threads} threads (the first "
                f"engine's; onnxruntime cannot resize it): give threads={self.threads}, or open this engine in "
                f"another process")
        from onnxruntime.capi import _pybind_state as C

        try:
            C.set_global_thread_pool_sizes(threads, 1)
        except Exception as e:  # onnxruntime raises its own Fail type
            raise ThreadPoolConflict(f"onnxruntime's global thread pool was created outside dipdeploy ({e}); open "
                                     f"the engine in a process that has not created it") from None
        self.threads = threads


#: the process's pool: one, as ORT's environment is one
PROCESS_POOL = GlobalPool()


def pool_options(options, threads: int, pool: str, process_pool: GlobalPool = PROCESS_POOL):
    """``options`` (built with ``threads`` intra-op threads) set for ``pool`` (one of ``THREAD_POOLS``)."""
    if pool == "shared":
        process_pool.claim(threads)
        options.use_per_session_threads = False
        options.intra_op_num_threads = 0  # the pool's size rules; ORT warns per session otherwise
        return options
    if process_pool.threads is not None:
        raise ThreadPoolConflict(
            f"this process created onnxruntime's shared thread pool ({process_pool.threads} threads), and "
            f"onnxruntime then refuses per-session pools: give thread_pool='shared' and "
            f"threads={process_pool.threads}, or open this engine in another process")
    if threads > 1:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options
