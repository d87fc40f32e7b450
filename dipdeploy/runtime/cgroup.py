"""The memory limit this process runs under (its cgroup), so a budget that cannot fit is refused with
the figures instead of the kernel's OOM killer ending the run without a word.

cgroup v2: ``memory.max`` (``max`` = unlimited) of the process's group and of every ancestor (the
tightest applies). cgroup v1: ``memory.limit_in_bytes`` of the memory hierarchy, the same way; v1
writes "unlimited" as a huge page-rounded number, so anything from :data:`V1_UNLIMITED` up counts as
no limit. The group comes from ``/proc/self/cgroup``; inside a container its path is often not
visible under the mount (cgroup namespace), and then the mount's root files are the process's own.
``root`` re-roots every path (tests give a directory of fake files). Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from dipdeploy.runtime.budget import DramBudget
from dipdeploy.runtime.embedding import embedding_table_bytes
from dipdeploy.runtime.stats import memory_now

# What opening the sessions adds beyond the planned bytes (:func:`runtime_overhead`), fitted with a margin to
# the peaks benchmarks/memory_check.py measures (benchmarks/results/memory-check.md).
RUNTIME_BASE = 40 << 20  # bytes, once per run: onnxruntime's sessions, arenas and kernels
RUNTIME_DENSE_SHARE = 1.0  # of the dense file's bytes: the initializers onnxruntime holds beside the plan's

#: v1's "no limit" is PAGE_COUNTER_MAX pages (about 2⁶³ bytes); no machine has 2⁶⁰ bytes.
V1_UNLIMITED = 2**60


def _groups(root: Path) -> dict[str, str]:
    """controller ('' for v2) → group path, from ``/proc/self/cgroup``."""
    out = {}
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            out[controller] = parts[2]
    return out


def _chain(mount: Path, group: str) -> list[Path]:
    """The group's directory under ``mount`` and its ancestors up to the mount (the mount alone when
    the group is not visible there)."""
    rel = PurePosixPath(group or "/").relative_to("/")
    here = mount / rel
    if not here.is_dir():
        return [mount]
    dirs = [here]
    while dirs[-1] != mount:
        dirs.append(dirs[-1].parent)
    return dirs


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def memory_limit(root: str | Path = "/") -> int | None:
    """The tightest cgroup memory limit over the process's group and its ancestors, in bytes; None when
    there is none (or no cgroup files to read)."""
    root = Path(root)
    groups = _groups(root)
    limits = []
    v2 = root / "sys/fs/cgroup"
    if (v2 / "cgroup.controllers").is_file():
        for d in _chain(v2, groups.get("", "/")):
            value = _read(d / "memory.max")
            if value and value != "max":
                limits.append(int(value))
    else:
        v1 = root / "sys/fs/cgroup/memory"
        for d in _chain(v1, groups.get("memory", "/")) if v1.is_dir() else []:
            value = _read(d / "memory.limit_in_bytes")
            if value and value.lstrip("-").isdigit() and 0 < int(value) < V1_UNLIMITED:
                limits.append(int(value))
    return min(limits) if limits else None


class MemoryLimitError(ValueError):
    """The DRAM budget plus the overhead (:class:`MemoryEstimate`) exceeds the cgroup memory limit."""


@dataclass(frozen=True)
class MemoryEstimate:
    """What a run will hold, in bytes: ``budget`` (the DRAM budget's resident part), ``process`` (what
    this process holds now: interpreter, libraries), ``graphs`` (the graph files the sessions parse) and
    ``runtime`` (what onnxruntime and the native cache add on top: :func:`runtime_overhead`)."""

    budget: int
    process: int
    graphs: int
    runtime: int

    @property
    def overhead(self) -> int:
        return self.process + self.graphs + self.runtime

    @property
    def total(self) -> int:
        return self.budget + self.overhead

    def as_dict(self) -> dict:
        return {**asdict(self), "overhead": self.overhead, "total": self.total}


def runtime_overhead(manifest) -> int:
    """What the sessions hold beyond the bytes the budget plans and the graph files: onnxruntime's state
    (arenas, kernel registries, thread pools) and the dense file's initializers as the sessions hold
    them (mapped or copied, prepacked for MatMulNBits), the embedding table among them, which the plan
    counts row by row. Measured peaks exceeded the plan by about one dense file and a fixed part; the
    coefficients above hold both with a margin (the figures: benchmarks/results/memory-check.md)."""
    return RUNTIME_BASE + int(RUNTIME_DENSE_SHARE * manifest.sizes.get("bytes_dense", 0))


def check_fits(need: MemoryEstimate, limit: int | None, budget_text: str) -> None:
    """Refuse (one line, the figures) when the estimate does not fit under ``limit``."""
    if limit is None or need.total <= limit:
        return
    raise MemoryLimitError(
        f"DRAM budget {budget_text} ({need.budget / 1e6:.1f} MB resident) + overhead "
        f"{need.overhead / 1e6:.1f} MB (this process {need.process / 1e6:.1f}, its graphs {need.graphs / 1e6:.1f}, "
        f"onnxruntime and caches {need.runtime / 1e6:.1f}) = {need.total / 1e6:.1f} MB exceeds the cgroup memory "
        f"limit of {limit / 1e6:.1f} MB; give a smaller --dram-budget, a smaller --context, or raise the limit")


def estimate(manifest, dram_budget: str | float, kv_bytes: int) -> MemoryEstimate:
    """What a run of ``manifest``'s bundle under ``dram_budget`` will hold (:class:`MemoryEstimate`): the
    budget is the total given, or the dense bytes (the embedding table excluded: it is read row by row)
    + the KV cache + the cached share of the MLP bytes (staging excluded); the overhead is what this
    process holds now, the graph files the sessions will parse and :func:`runtime_overhead`."""
    m = manifest
    budget = DramBudget.parse(dram_budget)
    if budget.total_bytes is not None:
        need = budget.total_bytes
    else:
        dense = m.sizes.get("bytes_dense", 0) - embedding_table_bytes(m)
        need = int(dense + kv_bytes + budget.cache_frac * m.sizes.get("bytes_mlp", 0))
    graphs = sum(m.files[name]["size"] for name in m.graphs["layers"] if name in m.files)
    return MemoryEstimate(need, memory_now().get("VmRSS", 0), graphs, runtime_overhead(m))


def check_budget(manifest, dram_budget: str | float, kv_bytes: int, limit: int | None) -> None:
    """Refuse, before any session is opened, a budget whose run would not fit under the cgroup memory
    ``limit`` (:func:`estimate`)."""
    if limit is None:
        return
    check_fits(estimate(manifest, dram_budget, kv_bytes), limit, str(dram_budget))
