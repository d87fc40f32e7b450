"""What ``dipdeploy run`` takes: :class:`EngineConfig`, its defaults and its checks (made before any
bundle is opened). The engine (``dipdeploy.runtime.engine``) resolves the options left None when it opens
a bundle. Torch-free (floor 5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from dipdeploy.cache import POLICIES
from dipdeploy.cache.split import CACHE_SPLIT, CACHE_SPLITS
from dipdeploy.flash import MAX_GAP
from dipdeploy.limits import MAX_THREADS, MAX_TOKENS
from dipdeploy.ops.schemas import BUNDLE_ACCURACY_LEVELS
from dipdeploy.runtime.blockio import IO_ENGINE, IO_ENGINE_CHOICES, IO_GAP
from dipdeploy.runtime.budget import DramBudget
from dipdeploy.runtime.flash import IO_AUTO, IO_CHOICES, emulation
from dipdeploy.runtime.threadpool import THREAD_POOLS, physical_cores
from dipdeploy.sparsity.plan import SparsityConfig

if TYPE_CHECKING:
    from dipdeploy.sim.devices import FlashModel

#: how ``extend`` feeds the tokens it is given (docs/runtime.md: the batched prefill)
PREFILL_MODES = ("batch", "token")
#: the batched prefill's most tokens per graph run (llama.cpp's n_ubatch): its activations are in the
#: plan, ORT's intermediates of one chunk (attention scores: heads × chunk × context floats) in the fixed
#: overhead; 128 peaked lower than 256 on a long prompt for a slightly slower prefill than one chunk on a
#: short one (benchmarks/results/memory.md, the chunk sweep)
PREFILL_CHUNK = 128
#: --speculate: the most draft tokens one verification pass checks (each costs a row of logits)
MAX_SPECULATE = 16
#: --io-threads: reads in flight; a device's queue holds fewer, and without io_uring each is a thread
MAX_IO_THREADS = 1024
#: --io-gap: ``dipdeploy.flash.MAX_GAP`` (wider gaps read more than the request they save costs)
MAX_IO_GAP = MAX_GAP


class FieldError(ValueError):
    """One field's value refused by :class:`EngineConfig`: the message is the field's name in words, then
    ``rest``; a front end names its own option instead (``named``: ``--io-gap must be >= 0 blocks``)."""

    def __init__(self, field: str, rest: str):
        self.field, self.rest = field, rest
        super().__init__(f"{field.replace('_', ' ')} {rest}")

    def named(self, name: str) -> str:
        return f"{name} {self.rest}"


def _cap(name: str, value, cap: int, unit: str) -> None:
    """Refuse a count above its cap (a None count is the engine's own choice, never over it)."""
    if value is not None and value > cap:
        raise FieldError(name, f"{value} is over the cap of {cap} {unit}; give {cap} or less")


@dataclass
class EngineConfig:
    """What ``dipdeploy run`` takes. ``gamma`` None keeps the bundle's γ (1 for a DIP bundle);
    ``accuracy_level`` None keeps the bundle's (0 or 4, see custom_ops/README.md).
    ``pinned_counts``: per layer, (up|gate, down) row-use counts from calibration for ``static``
    (``--pin-from TRACE``); without them ``static`` pins the lowest-index rows, which is what the
    uniform counts of a ρ = 1 (dense) bundle give anyway.
    ``context``: the KV-cache tokens reserved in the budget, so the longest prompt plus answer of
    ``run`` and the longest conversation of ``chat`` (one default for both); None: ``DEFAULT_CONTEXT``, or
    the bundle's positions (:func:`bundle_positions`) if fewer; a larger one is refused when the bundle opens.
    ``dram_budget`` and ``policy`` default to the torch DIP-CA reference's ``cache_frac`` and ``policy``
    (``SparsityConfig``), so a bundle run as it comes matches what ``eval`` measured (docs/runtime.md, "Budget").
    ``prefill``: "batch" runs the tokens ``extend`` is given (a prompt, a chat turn) as one batch per
    layer, plain DIP per token with the layer's selected rows read once, then warms the caches from those
    selections in token order; "token" feeds them one by one as decode does, the exact torch DIP-CA
    reference (docs/runtime.md).
    ``prefill_chunk``: "batch" runs at most this many tokens per graph run (a longer prompt in chunks,
    each attending to the earlier ones through the KV cache), so the prefill's working set is bounded
    by the chunk, not by the prompt (its buffers are in the plan: ``Residency.prefill``).
    ``io``: how missed rows are read (``dipdeploy.runtime.flash``): "mmap", "pread", "direct", or "auto",
    which the engine turns into "direct" where its plan leaves rows on Flash and the filesystem takes
    ``O_DIRECT``, else "mmap" (``flash.choose_io``: only direct reads keep a budget under a memory limit).
    ``native_cache``: each token's cache lookup/update, slot assignment and mmap reads of the misses in
    the op library (custom_ops/src/cache/, the rules of ``dipdeploy.cache``, decision for decision);
    False keeps them in numpy (the reference); None: whenever the native kernels are used
    (dipdeploy/runtime/DESIGN.md).
    ``threads``: ORT intra-op threads of every session (None: the physical cores); above 1, ``thread_pool`` says whose pool runs
    them: each session's own, not spinning ("per-session"), or ORT's one pool for the process
    ("shared", sized once per process): ``dipdeploy.runtime.threadpool``.
    ``shared_staging``: every group's staging slots on the same pages (``dipdeploy.runtime.staging``), so
    the plan reserves the largest group's staging instead of the sum; False gives each group its own;
    None: wherever the platform can (Linux).
    ``cache_split``: how the caches' bytes are shared among the groups: ``even`` (the same fraction of
    every group's rows, as the torch DIP-CA reference) or ``reads`` (the groups whose misses cost the
    most reading per byte first, ``dipdeploy.cache.split``; the same bytes in all).
    ``single_session``: run the bundle's ``model.onnx`` in one ORT session per token instead of the
    per-layer graphs and the host cache step (``dipdeploy.runtime.backends.whole``: at a budget that holds every
    MLP row all rows are resident from the start, so DIP-CA is plain DIP); None: whenever the budget
    holds every row (``whole.why_not``), True: insist (an error where it cannot), False: always the
    per-layer path (empty caches at the start; traces, selections).
    ``fused``: join the per-layer graphs into one session per token with the cache step inside the graph
    (``dipdeploy.runtime.backends.joined``: the same native step, at any budget; faster than the per-layer path on
    real reads, benchmarks/results/fused.md); needs ``--io mmap`` or ``direct``, the op library and the
    natural row order, takes no Belady and records no selections (traces, ``teacher_forced``); its
    batched prefill runs each chunk through the same graph, with the per-layer path's semantics.
    None: whenever it can (``backends.joined.why_not``), else the per-layer graphs with the host cache step;
    True: insist (an error where it cannot); False: always the host cache step.
    ``overlap_reads``: the joined decoder with ``--io direct`` reads a group's misses while it multiplies
    the group's resident rows (``CacheBegin``/``CacheEnd``, custom_ops/README.md); False reads them
    first, as the per-layer path does (benchmarks/fused.py measures both).
    ``prefetch``: with ``overlap_reads``, each pre-norm layer's up|gate selection is predicted from the
    layer's input and the predicted misses are read while its attention runs (``CachePrefetch``,
    docs/decisions/0005-prefetch-auto.md); the decisions and logits do not change, a wrong guess costs
    reads. None: on or off, whichever decodes faster on the first tokens (``readahead.ReadAheadProbe``).
    ``speculate``: the most draft tokens one verification pass checks (``dipdeploy.runtime.speculate``);
    the plan reserves that pass's logits (``speculate`` + 1 rows of the vocabulary); 0: no speculation."""

    dram_budget: str | float = f"{SparsityConfig.cache_frac:.0%}"
    policy: str = SparsityConfig.policy
    gamma: float | None = None
    accuracy_level: int | None = None
    native: bool | None = None
    native_cache: bool | None = None  # the per-token cache step in the op library; None: with `native`
    threads: int | None = None  # None: the physical cores (threadpool.physical_cores), llama.cpp's default
    thread_pool: str = "per-session"  # "shared": ORT's one global pool for the process (threadpool.py)
    flash_bandwidth: float | None = None  # emulate a device of this bandwidth on top of the real reads
    flash_device: str | None = None  # ... or a device profile's (dipdeploy.sim.devices), with its request cost
    cold: bool = False
    io: str = IO_AUTO  # resolved when the engine opens (Engine.io_why)
    io_threads: int | None = None  # --io direct: reads in flight; None: the engine's (blockio.in_flight)
    io_engine: str = IO_ENGINE  # --io direct: auto (the ring where granted, else the threads) | threads | io_uring
    io_gap: int = IO_GAP  # --io direct: blocks read through between wanted rows to save a request
    context: int | None = None
    verify: bool = False
    prefill: str = "batch"  # "batch": the prompt as one batch per layer; "token": one token at a time
    prefill_chunk: int = PREFILL_CHUNK  # "batch": at most this many tokens per graph run
    pinned_counts: list[tuple[np.ndarray, np.ndarray]] | None = None
    shared_staging: bool | None = None  # None: where the platform can (staging.supported)
    cache_split: str = CACHE_SPLIT
    single_session: bool | None = None  # model.onnx once per token; None: when the budget holds every row
    fused: bool | None = None  # the per-layer graphs joined, the cache step in the graph; None: where it can
    overlap_reads: bool = True  # joined, --io direct: the misses read while the resident rows are multiplied
    prefetch: bool | None = None  # ... and a layer's predicted up|gate misses read while its attention runs
    speculate: int = 0  # draft tokens per verification pass (dipdeploy.runtime.speculate); 0: none
    emulate: FlashModel | None = field(init=False, default=None, repr=False)  # flash_bandwidth or flash_device as a pacing

    def __post_init__(self) -> None:
        if self.prefill not in PREFILL_MODES:
            raise FieldError("prefill", f"{self.prefill}: choose one of {', '.join(PREFILL_MODES)}")
        if type(self.prefill_chunk) is not int:
            raise FieldError("prefill_chunk", f"must be a whole number of tokens >= 1, got {self.prefill_chunk!r}")
        if self.prefill_chunk < 1:
            raise FieldError("prefill_chunk", f"must be >= 1 token, got {self.prefill_chunk}")
        _cap("prefill_chunk", self.prefill_chunk, MAX_TOKENS, "tokens")
        if type(self.speculate) is not int or self.speculate < 0:
            raise FieldError("speculate", f"must be a whole number of draft tokens >= 0, got {self.speculate!r}")
        _cap("speculate", self.speculate, MAX_SPECULATE, "draft tokens")
        if self.speculate and (self.prefill != "batch" or self.speculate + 1 > self.prefill_chunk):
            raise FieldError("speculate", f"{self.speculate} verifies {self.speculate + 1} tokens in one batched run: "
                                          f"it needs --prefill batch and --prefill-chunk {self.speculate + 1} or more")
        if self.policy not in POLICIES:
            raise FieldError("policy", f"{self.policy!r} unknown; choose one of {', '.join(POLICIES)}")
        if self.gamma is not None and not 0.0 <= self.gamma <= 1.0:
            raise FieldError("gamma", f"must lie in [0, 1], got {self.gamma}")
        if self.context is not None and self.context < 1:
            raise FieldError("context", f"must be >= 1 token, got {self.context}")
        _cap("context", self.context, MAX_TOKENS, "tokens")
        if self.accuracy_level is not None and self.accuracy_level not in BUNDLE_ACCURACY_LEVELS:
            raise FieldError("accuracy_level", f"must be 0 (float32) or 4 (int8), got {self.accuracy_level}")
        if self.threads is None:
            self.threads = min(physical_cores(), MAX_THREADS)
        if self.threads < 1:
            raise FieldError("threads", f"must be >= 1, got {self.threads}")
        _cap("threads", self.threads, MAX_THREADS, "threads")
        if self.thread_pool not in THREAD_POOLS:
            raise FieldError("thread_pool", f"{self.thread_pool}: choose one of {', '.join(THREAD_POOLS)}")
        if self.io not in IO_CHOICES:
            raise FieldError("io", f"{self.io}: choose one of {', '.join(IO_CHOICES)}")
        if self.io_threads is not None and self.io_threads < 1:
            raise FieldError("io_threads", f"must be >= 1, got {self.io_threads}")
        _cap("io_threads", self.io_threads, MAX_IO_THREADS, "reads in flight")
        if self.io_engine not in IO_ENGINE_CHOICES:
            raise FieldError("io_engine", f"{self.io_engine}: choose one of {', '.join(IO_ENGINE_CHOICES)}")
        if type(self.io_gap) is not int:
            raise FieldError("io_gap", f"must be a whole number of blocks >= 0, got {self.io_gap!r}")
        if self.io_gap < 0:
            raise FieldError("io_gap", f"must be >= 0 blocks, got {self.io_gap}")
        _cap("io_gap", self.io_gap, MAX_IO_GAP, "blocks")
        if self.cache_split not in CACHE_SPLITS:
            raise FieldError("cache_split", f"{self.cache_split}: choose one of {', '.join(CACHE_SPLITS)}")
        if self.fused and self.single_session:
            raise ValueError("fused and single_session are two one-session modes: choose one")
        DramBudget.parse(self.dram_budget)  # a malformed budget is refused before the bundle is opened
        # both emulations, or an unknown profile, are refused here; the engine's Flash store paces to this one
        self.emulate = emulation(self.flash_bandwidth, self.flash_device)
