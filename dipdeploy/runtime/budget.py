"""The DRAM budget: what must stay resident, and how many MLP rows each layer's caches may hold.

As in the paper (§5, "memory budget"), the non-MLP weights and the KV cache come first; what is left
is split evenly across the per-layer MLP caches, the same fraction of rows for every group, so each
layer gets the same share of its bytes (split ``even``). Split ``reads`` gives the same bytes to the
groups whose misses cost the most reading per cached byte first (``dipdeploy.cache.split``). A budget is given either as a fraction of the MLP bytes
("50%": the caches hold half of each group's rows; the same ``cache_frac`` the torch DIP-CA reference
and ``dipdeploy eval`` use, so the three agree) or as total bytes ("120MB"), from which the fraction
follows after the resident part. Staging slots (rows a token needs that the cache does not admit)
are resident too and counted.

Torch-free (floor 5).
"""

from __future__ import annotations

import math

import re
from dataclasses import dataclass

from dipdeploy.cache import policy_of
from dipdeploy.cache.split import CACHE_SPLIT, CACHE_SPLITS, spend
from dipdeploy.flash import miss_cost

DEFAULT_CONTEXT = 1024  # `run` and `chat`: KV-cache tokens reserved in the budget, when the bundle has that many positions
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_bytes(text: str, what: str = "size") -> int:
    """'120MB' → 120·10⁶, '1.5GiB' → 1.5·2³⁰ (KB/MB/GB decimal, KiB/MiB/GiB binary)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{what} {text!r} is not a size; write e.g. 120MB, 1.5GiB or 50%")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_bandwidth(text: str) -> float:
    """'1GB/s' → 1e9 bytes per second."""
    t = str(text).strip()
    if not t.lower().endswith("/s"):
        raise ValueError(f"flash bandwidth {text!r} needs a rate such as 1GB/s or 500MB/s")
    value = parse_bytes(t[:-2], "flash bandwidth")
    if value <= 0:
        raise ValueError(f"flash bandwidth {text!r} must be positive")
    return float(value)


@dataclass(frozen=True)
class DramBudget:
    """``--dram-budget``: ``cache_frac`` of each MLP group's rows, or ``total_bytes`` for everything."""

    cache_frac: float | None = None
    total_bytes: int | None = None

    @classmethod
    def parse(cls, text: str | float | int) -> "DramBudget":
        if isinstance(text, (int, float)) and not isinstance(text, bool):
            return cls(cache_frac=_frac(float(text), str(text)))
        t = str(text).strip()
        if t.endswith("%"):
            try:
                share = float(t[:-1]) / 100.0
            except ValueError as exc:
                raise ValueError(f"DRAM budget {text!r} is not a percentage; write e.g. 50%") from exc
            return cls(cache_frac=_frac(share, t))
        if t in ("inf", "unlimited"):
            return cls(cache_frac=1.0)
        if re.fullmatch(r"[0-9]*\.?[0-9]+", t):  # 50 or 0.5: a share or a size? say which
            raise ValueError(f"DRAM budget {text!r} needs a unit: a share of the MLP rows such as 50%, or a size "
                             "such as 200MB")
        return cls(total_bytes=parse_bytes(t, "DRAM budget"))

    def __str__(self) -> str:
        return f"{100 * self.cache_frac:g}% of MLP rows" if self.cache_frac is not None else f"{self.total_bytes / 1e6:.1f} MB"


def _frac(value: float, text: str) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"DRAM budget {text!r}: a cache fraction must lie in [0%, 100%]")
    return value


@dataclass(frozen=True)
class GroupShape:
    """One MLP group of one layer: its rows, the bytes of one row, K (the staging rows it needs) and
    ``window``, the bytes of those K rows in a shared staging arena (``runtime/staging.py``: each per-row
    array's share rounded up to a page)."""

    rows: int
    row_bytes: int
    k: int
    window: int = 0


@dataclass
class Residency:
    """The resident bytes by kind, and the cache capacity (rows) of every group [layer][group]."""

    dense: int
    kv: int
    staging: int
    caches: int
    cache_frac: float
    capacity: list[list[int]]
    prefill: int = 0  # the batched prefill's buffers: one layer's MLP rows and one chunk's activations
    read: int = 0  # --io direct: the bounce buffer the block-aligned reads land in (dipdeploy.flash.bounce_bytes)
    split: str = CACHE_SPLIT  # how the caches' bytes were shared among the groups (dipdeploy.cache.split)

    @property
    def total(self) -> int:
        return self.dense + self.kv + self.staging + self.prefill + self.read + self.caches

    def as_dict(self) -> dict:
        return {"dense": self.dense, "kv": self.kv, "staging": self.staging, "prefill": self.prefill,
                "read": self.read, "caches": self.caches, "total": self.total, "cache_frac": self.cache_frac,
                "split": self.split}


def plan_residency(budget: DramBudget, groups: list[list[GroupShape]], dense_bytes: int, kv_bytes: int,
                   policy: str, prefill_bytes: int = 0, shared_staging: bool = False,
                   read_bytes: int = 0, split: str = CACHE_SPLIT) -> Residency:
    """Cache capacities under ``budget``; raises with the minimum when the resident part does not fit.

    A fraction uses ``round(frac · rows)`` per group, exactly like ``RowCache`` in the torch reference.
    Policy ``none`` keeps no cache at all (capacity 0, everything streams through staging). With
    ``shared_staging`` every group's staging slots are one arena, as large as the largest window;
    otherwise each group holds its own K rows. ``split`` ``reads`` spends the bytes the ``even`` split
    would give the caches by ``split_by_reads`` instead, each miss costing ``dipdeploy.flash.miss_cost``.
    """
    if split not in CACHE_SPLITS:
        raise ValueError(f"cache split {split!r} unknown; choose one of {', '.join(CACHE_SPLITS)}")
    if shared_staging:
        staging = max((g.window for layer in groups for g in layer), default=0)
    else:
        staging = sum(g.k * g.row_bytes for layer in groups for g in layer)
    mlp = sum(g.rows * g.row_bytes for layer in groups for g in layer)
    fixed = dense_bytes + kv_bytes + staging + prefill_bytes + read_bytes
    if budget.cache_frac is not None:
        frac = budget.cache_frac
        cap = [[round(frac * g.rows) for g in layer] for layer in groups]
    else:
        if budget.total_bytes < fixed:
            least = math.ceil(fixed / 1e5) / 10  # rounded up: the figure given back must itself be accepted
            raise ValueError(
                f"DRAM budget {budget} is below the resident minimum of {least:.1f} MB (dense weights "
                f"{dense_bytes / 1e6:.1f} MB + KV cache {kv_bytes / 1e6:.1f} MB + staging {staging / 1e6:.1f} MB"
                f"{f' + prefill buffers {prefill_bytes / 1e6:.1f} MB' if prefill_bytes else ''}"
                f"{f' + read buffer {read_bytes / 1e6:.1f} MB' if read_bytes else ''}); "
                f"give at least {least:.1f}MB, a smaller --context{', a smaller --prefill-chunk' if prefill_bytes else ''}"
                f", or a percentage such as 25%")
        frac = min(1.0, (budget.total_bytes - fixed) / mlp) if mlp else 0.0
        cap = [[int(frac * g.rows) for g in layer] for layer in groups]
    if policy_of(policy).zero_capacity:
        cap = [[0 for _ in layer] for layer in cap]
    else:
        cap = spend(split, cap, groups, miss_cost)
    caches = sum(c * g.row_bytes for cl, gl in zip(cap, groups) for c, g in zip(cl, gl))
    return Residency(dense_bytes, kv_bytes, staging, caches, frac, cap, prefill_bytes, read_bytes, split)
