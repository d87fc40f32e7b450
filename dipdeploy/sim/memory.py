"""Where the DRAM budget goes (docs/method.md, "The HW simulator"; paper Appendix A).

1. Non-MLP weights (attention, norms, embeddings, lm_head) and the KV cache are placed first.
2. The rest is split evenly across the per-layer MLP caches.
3. Within a layer it is split across the two row groups in proportion to their bytes, i.e. the same
   fraction f of rows in each: an input-feature row of the bundled [W_uᵀ | W_gᵀ] holds 2F weights
   (d rows), a GLU row of W_dᵀ holds d weights (F rows). Split ``reads`` (the runtime's
   ``--cache-split reads``, ``dipdeploy.cache.split``) spends the same bytes on the group whose misses
   cost the device more per cached byte first, by the device's Flash model.

A budget below step 1 is an error that names the minimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dipdeploy.cache.split import CACHE_SPLITS, split_by_reads
from dipdeploy.registry import ModelShape


@dataclass(frozen=True)
class MemoryPlan:
    budget: float
    non_mlp_bytes: float  # resident non-MLP weights
    non_mlp_read_bytes: float  # of those, read per token (an untied input embedding reads one row)
    kv_bytes: float
    mlp_bytes: float  # all MLP weights, all layers
    cache_fraction: float  # f: share of each group's rows resident
    capacity_in: int  # rows per layer (input-feature group)
    capacity_glu: int  # rows per layer (GLU group)
    row_bytes_in: float
    row_bytes_glu: float
    layers: int

    @property
    def mlp_cache_bytes(self) -> float:
        return self.layers * (self.capacity_in * self.row_bytes_in + self.capacity_glu * self.row_bytes_glu)

    @property
    def used_bytes(self) -> float:
        return self.non_mlp_bytes + self.kv_bytes + self.mlp_cache_bytes

    def breakdown(self) -> dict:
        return {"budget": self.budget, "non_mlp": self.non_mlp_bytes, "kv_cache": self.kv_bytes,
                "mlp_cache": self.mlp_cache_bytes, "unused": self.budget - self.used_bytes,
                "mlp_total": self.mlp_bytes, "cache_fraction": self.cache_fraction}


def kv_cache_bytes(shape: ModelShape, context: int, bytes_per_value: float) -> float:
    """K and V of every layer for ``context`` tokens."""
    return 2.0 * shape.num_hidden_layers * shape.num_key_value_heads * shape.head_dim * context * bytes_per_value


def minimum_budget(shape: ModelShape, bytes_per_weight: float, context: int = 0, kv_bytes_per_value: float = 2.0) -> float:
    return shape.non_mlp_params() * bytes_per_weight + kv_cache_bytes(shape, context, kv_bytes_per_value)


@dataclass(frozen=True)
class _Group:
    rows: int
    row_bytes: float
    k: float


#: The simulator's cache split: the paper's (``even``), as its other defaults are the paper's model; the
#: runtime's default, ``reads``, is ``simulate --cache-split reads``.
SIM_CACHE_SPLIT = "even"


def plan_memory(shape: ModelShape, budget: float, bytes_per_weight: float, context: int = 0,
                kv_bytes_per_value: float = 2.0, split: str = SIM_CACHE_SPLIT, k: tuple[float, float] = (0.0, 0.0),
                flash=None) -> MemoryPlan:
    """``split`` ``reads`` needs ``k`` (rows selected per token and layer, input and GLU group) and ``flash``
    (the device's ``FlashModel``) to price a miss."""
    d, F, L = shape.hidden_size, shape.intermediate_size, shape.num_hidden_layers
    non_mlp = shape.non_mlp_params() * bytes_per_weight
    unread = 0 if shape.tie_word_embeddings else (shape.vocab_size - 1) * d
    kv = kv_cache_bytes(shape, context, kv_bytes_per_value)
    if budget < non_mlp + kv:
        raise ValueError(
            f"DRAM budget {budget / 1e9:.3f} GB is below the resident part: non-MLP weights "
            f"{non_mlp / 1e9:.3f} GB + KV cache {kv / 1e9:.3f} GB; the minimum is {(non_mlp + kv) / 1e9:.3f} GB "
            f"(raise --dram, lower --context, or choose a smaller --precision)")
    row_in, row_glu = 2 * F * bytes_per_weight, d * bytes_per_weight
    layer_bytes = shape.mlp_params_per_layer() * bytes_per_weight
    per_layer = (budget - non_mlp - kv) / L
    f = min(1.0, per_layer / layer_bytes)
    cap_in, cap_glu = math.floor(f * d + 1e-9), math.floor(f * F + 1e-9)
    if split not in CACHE_SPLITS:
        raise ValueError(f"cache split {split!r} unknown; choose one of {', '.join(CACHE_SPLITS)}")
    if split == "reads":
        if flash is None or not all(k):
            raise ValueError("cache split 'reads' needs the rows selected per token (k) and the device's flash model")
        unit = flash.read_unit

        def miss_cost(row_bytes: float) -> float:
            return float(flash.read_time(1, math.ceil(row_bytes / unit) * unit))

        groups = [[_Group(d, row_in, k[0]), _Group(F, row_glu, k[1])]]
        [[cap_in, cap_glu]] = split_by_reads(groups, cap_in * row_in + cap_glu * row_glu, miss_cost)
    return MemoryPlan(
        budget=budget, non_mlp_bytes=non_mlp, non_mlp_read_bytes=non_mlp - unread * bytes_per_weight, kv_bytes=kv,
        mlp_bytes=L * layer_bytes, cache_fraction=f, capacity_in=cap_in,
        capacity_glu=cap_glu, row_bytes_in=row_in, row_bytes_glu=row_glu, layers=L,
    )
