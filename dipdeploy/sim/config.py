"""``SimConfig``: every knob of one simulation, with its default defined only here (docs/design.md §1)."""

from __future__ import annotations

from dataclasses import dataclass

from dipdeploy.cache import POLICIES, POLICY_RECORDS, policy_of
from dipdeploy.cache.split import CACHE_SPLITS
from dipdeploy.flash import MAX_GAP
from dipdeploy.limits import MAX_TOKENS, MAX_WIDTH
from dipdeploy.sim.memory import SIM_CACHE_SPLIT
from dipdeploy.sim.precision import PRECISIONS
from dipdeploy.sparsity.plan import SparsityConfig

#: How the simulator obtains each token's selected rows.
#:   traced  replay the trace's selections as recorded
#:   dense   every row every token (the dense-static baseline with policy ``static``)
#:   dip     re-mask from the recorded magnitudes with γ = 1 (needs x_abs, glu_abs)
#:   dip-ca  re-mask with DIP-CA against the simulator's own cache state (needs x_abs, glu_abs)
SIM_METHODS = ("traced", "dense", "dip", "dip-ca")


@dataclass(frozen=True)
class SimConfig:
    """One simulated configuration.

    ``dram_budget``: bytes of DRAM the model may use (None: half the device's DRAM — assumption: the OS
    and other apps keep the rest). ``context``: KV-cache tokens reserved in DRAM and read per token
    (0 = ignored, as in the paper's simulator). ``warmup``: first tokens replayed but not measured; the
    ``static`` policy pins the most used rows of those tokens (of the whole trace when 0: in-sample,
    optimistic for static). ``preload``: dynamic caches (lru, lfu, belady) start filled with those same
    most used rows, as a runtime would load them at start-up (False: cold, empty caches — a short trace
    then mostly measures the cold start). ``model``: target shape from the registry (None: the trace's
    own model). ``cache_split``: how the MLP caches' bytes are shared among the two groups
    (``dipdeploy.cache.split``; the runtime's ``--cache-split``; default ``memory.SIM_CACHE_SPLIT``).
    ``io_gap``: on a device with a read unit, model the runtime's reads (``--io-gap`` blocks read through
    between touched ones, requests cut at ``dipdeploy.flash.MAX_REQUEST``, ``dipdeploy.flash.flash_reads``); 0: touching blocks coalesce
    only, uncut (the paper's model).
    """

    device: str = "a18"
    model: str | None = None
    dram_budget: float | None = None
    precision: str = "bq4"
    method: str = "traced"
    policy: str = SparsityConfig.policy  # γ and policy: the torch reference's (one definition)
    gamma: float = SparsityConfig.gamma
    gamma_warmup: int = 0
    fixed_top_n: int = 0
    context: int = 0
    kv_bytes_per_value: float = 2.0
    warmup: int = 0
    preload: bool = True
    seed: int = 0
    cache_split: str = SIM_CACHE_SPLIT
    io_gap: int = 0

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} unknown; choose one of {', '.join(PRECISIONS)}")
        if self.method not in SIM_METHODS:
            raise ValueError(f"method {self.method!r} unknown; choose one of {', '.join(SIM_METHODS)}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} unknown; choose one of {', '.join(POLICIES)}")
        if self.cache_split not in CACHE_SPLITS:
            raise ValueError(f"cache split {self.cache_split!r} unknown; choose one of {', '.join(CACHE_SPLITS)}")
        if type(self.io_gap) is not int or self.io_gap < 0:
            raise ValueError(f"io gap must be a whole number of blocks >= 0, got {self.io_gap!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1], got {self.gamma}")
        if self.dram_budget is not None and self.dram_budget <= 0:
            raise ValueError(f"dram_budget must be > 0 bytes, got {self.dram_budget}")
        if self.io_gap > MAX_GAP:
            raise ValueError(f"io gap {self.io_gap} is over the cap of {MAX_GAP} blocks; give {MAX_GAP} or less")
        for name, cap in (("gamma_warmup", MAX_TOKENS), ("fixed_top_n", MAX_WIDTH), ("context", MAX_TOKENS),
                          ("warmup", MAX_TOKENS)):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
            if getattr(self, name) > cap:  # tokens or inputs: no trace or model has more
                raise ValueError(f"{name} {getattr(self, name)} is over the cap of {cap}; give {cap} or less")
        if self.kv_bytes_per_value <= 0:
            raise ValueError(f"kv_bytes_per_value must be > 0, got {self.kv_bytes_per_value}")
        if self.method == "dense" and policy_of(self.policy).updates:
            fixed = " or ".join(f"{p.name!r} (pinned subset)" if p.pinned else repr(p.name)  # pinned first
                                for p in sorted(POLICY_RECORDS.values(), key=lambda p: not p.pinned) if not p.updates)
            raise ValueError(f"method 'dense' reads every row every token, so only policy {fixed} apply, "
                             f"got {self.policy!r}")
        if self.method == "dip-ca" and policy_of(self.policy).needs_future:
            raise ValueError(f"policy {self.policy!r} needs the future selections, but DIP-CA's selections depend "
                             f"on the cache itself; use {self.policy} with method 'traced' or 'dip'")
