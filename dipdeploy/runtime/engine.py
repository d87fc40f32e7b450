"""The host engine: a bundle's per-layer graphs under a DRAM budget, MLP rows streamed from Flash.

Per decoded token (and per prompt token with ``prefill="token"``: DIP-CA's mask depends on the cache
after the previous token, exactly as in the torch reference), the token's embedding row is read from
``dense.bin`` (``embedding.py``: the table is never resident), ``positions.onnx`` computes what every
layer's attention needs from the positions (``positions.py``), then per layer::

    layer.i.attn      hidden, mlp_out, positions' values, KV, cache_in = up|gate residency
                      ─► hidden_attn, x, in_indices
    host              RowCache.access → hits; SlotTable.assign → slots; Flash reads of the misses
    layer.i.mlp_up    x, in_indices, in_slots, up|gate slab, cache_glu ─► glu, glu_indices
    host              the same for the down rows
    layer.i.mlp_down  glu, glu_indices, glu_slots, down slab, hidden_attn ─► mlp_out

then ``head.onnx`` → logits → the sampler. A batched prefill (``Engine.prefill``, the default) runs the
same graphs on the prompt's tokens at once (their inputs are symbolic in the sequence length), in chunks
of at most ``EngineConfig.prefill_chunk`` tokens, so its buffers are bounded and planned.
The KV cache is allocated once for the context and written
in place (``kv.py``). γ = 1 with an all-resident cache is plain DIP; the cache
rule, the DIP-CA score and the slot rule are ``dipdeploy.cache`` (one definition, shared with the torch
reference and the simulator). At a budget that holds every MLP row the engine runs the bundle's
``model.onnx`` once per token instead (``dipdeploy.runtime.whole``, ``EngineConfig.single_session``).
Torch-free (floor 5).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from dipdeploy.bundle.manifest import REGENERATE, BundleError, Manifest, read_manifest
from dipdeploy.bundle.names import MLP_FILE
from dipdeploy.cache import static_rows
from dipdeploy.flash import BLOCK, MAX_REQUEST, bounce_bytes
from dipdeploy.runtime import record as recording
from dipdeploy.runtime import staging
from dipdeploy.runtime.budget import DEFAULT_CONTEXT, DramBudget, GroupShape, Residency, plan_residency
from dipdeploy.runtime.cgroup import check_fits, memory_limit
from dipdeploy.runtime.config import EngineConfig
from dipdeploy.runtime.embedding import EmbeddingRows, embedding_table_bytes
from dipdeploy.runtime.flash import IO_AUTO, FlashStore, choose_io
from dipdeploy.runtime.kv import KvCache, KvShape
from dipdeploy.runtime.native_cache import read_ahead
from dipdeploy.runtime.positions import PositionValues
from dipdeploy.runtime.readahead import ReadAheadProbe
from dipdeploy.runtime.sampler import Sampler
from dipdeploy.runtime.sessions import Bound, SharedInitializers, open_session, shared_arena
from dipdeploy.runtime.slab import GroupSlab, group_arrays
from dipdeploy.runtime.stats import RunStats, Timer, memory_now
from dipdeploy.runtime.threadpool import pool_options


@dataclass
class Generation:
    """``text`` is what was streamed: complete characters, cut before a stop string, no EOS token.
    ``finish`` says why it ended: "eos", "stop" (a stop string), "length" (``max_new_tokens``) or
    "interrupted" (``should_stop``), as a host reports it to its user."""

    prompt: str | None
    text: str
    tokens: list[int]
    stats: RunStats
    logits: list[np.ndarray] = field(default_factory=list)
    finish: str = "length"


def open_bundle(path: str | Path, full_verify: bool = False) -> Manifest:
    """The manifest, after ``read_manifest``'s structure checks (paths inside the bundle, tensor ranges,
    plan against graphs, sizes, the small files' checksums) and, if asked, every file's checksum."""
    path = Path(path)
    manifest = read_manifest(path, checksums="all" if full_verify else "small")
    if "layers" not in manifest.graphs:
        raise BundleError(f"{path} has no per-layer graphs (exported with --no-per-layer or as dense); "
                          "export it again with `dipdeploy export --method dip|dip-ca` (per-layer graphs are the default)")
    problems = _settings_problems(manifest)
    if problems:
        raise BundleError(f"bundle {path}: {'; '.join(problems)}; {REGENERATE}")
    return manifest


def bundle_positions(path: str | Path, manifest: Manifest | None = None) -> int:
    """Positions the bundle can run: the model's ``max_position_embeddings`` (the manifest's config), or
    fewer when the export built a shorter RoPE table (``context_length`` of genai_config.json). A longer
    context would fail inside onnxruntime at that position, after minutes of work."""
    path = Path(path)
    m = manifest or read_manifest(path)
    found = [(m.source.get("config") or {}).get("max_position_embeddings")]
    genai = path / "genai_config.json"
    if genai.is_file():
        found.append(json.loads(genai.read_text()).get("model", {}).get("context_length"))
    found = [int(n) for n in found if isinstance(n, int) and n > 0]
    if not found:
        raise BundleError(f"{path}: the manifest's config has no max_position_embeddings; {REGENERATE}")
    return min(found)


def _prefill_buffers(arrays, rows: tuple[int, int]) -> set[tuple[tuple, str]]:
    """The (shape, dtype) of every buffer the batched prefill needs: each per-row array of a group at
    full height, one buffer per distinct shape, shared by all layers (a layer runs after the other)."""
    return {((n, *a.row_shape), str(np.dtype(a.dtype))) for pair in arrays
            for group, n in zip(pair, rows) for a in group.per_row}


def _chunk_buffers(chunk: int, d: int, f: int, k: list[tuple[int, int]]) -> dict[str, tuple[int, str]]:
    """Name → (elements, dtype) of the batched prefill's activations for one chunk, allocated once and
    reused by every layer and chunk (a layer's are dead once the next layer's attention has run): the
    two residual-stream buffers a layer's attention reads and writes (``hidden``, ``hidden_attn``:
    they alternate layer by layer), x, the GLU, the MLP's term ``mlp_out`` and the two selections at
    the largest K."""
    return {"hidden": (chunk * d, "float32"), "hidden_attn": (chunk * d, "float32"), "x": (chunk * d, "float32"),
            "mlp_out": (chunk * d, "float32"),
            "glu": (chunk * f, "float32"), "in_indices": (chunk * max(a for a, _ in k), "int64"),
            "glu_indices": (chunk * max(b for _, b in k), "int64")}


def _settings_problems(m: Manifest) -> list[str]:
    """The manifest values the engine computes with (beyond ``verify``'s structure) have their types."""
    def number(v, lo, hi):
        return type(v) in (int, float) and lo <= v <= hi

    dipca, level = m.dipca or {}, (m.export_config or {}).get("accuracy_level", 0)
    checks = [(number(dipca.get("gamma", 1.0), 0, 1), "dipca.gamma must be a number in [0, 1]"),
              (number(dipca.get("gamma_warmup", 0) or 0, 0, float("inf")), "dipca.gamma_warmup must be >= 0"),
              (level in (0, 4) and type(level) is int, "export_config.accuracy_level must be 0 or 4")]
    return [message for ok, message in checks if not ok]


class Engine:
    """Generation from a bundle under a DRAM budget (see the module docstring and ``EngineConfig``)."""

    def __init__(self, bundle: str | Path, config: EngineConfig | None = None, **overrides):
        import onnxruntime  # noqa: F401  (fail early with the import error, before any work)

        from dipdeploy.ops.native import kernel_set, library_path, session_options

        if config is not None and overrides:
            raise TypeError("give either an EngineConfig or keyword options, not both")
        self.cfg = config or EngineConfig(**overrides)
        self.path = Path(bundle)
        self.manifest = m = open_bundle(self.path, self.cfg.verify)
        if m.plan is None:
            raise BundleError(f"{self.path} carries no sparsity plan; {REGENERATE}")
        plan = m.plan
        self.num_layers = len(plan["layers"])
        self.d, self.f = plan["hidden_size"], plan["intermediate_size"]
        self.k = [(lp["k_in"], lp["k_glu"]) for lp in plan["layers"]]
        self.baked_gamma = (m.dipca or {}).get("gamma", 1.0) if m.method == "dip-ca" else 1.0
        self.gamma = self.baked_gamma if self.cfg.gamma is None else self.cfg.gamma
        if (m.dipca or {}).get("gamma_warmup", 0):
            warnings.warn("the bundle's plan has a γ warm-up; the runtime applies γ from the first token",
                          stacklevel=2)
        native = self.cfg.native
        if native is None:
            native = library_path() is not None
            if not native:
                warnings.warn("the native op library is not built: running the ONNX fallback functions "
                              "(slower); `make ops` builds it", stacklevel=2)
        self.native = native
        self.kernel_set = kernel_set() if native else None
        self._cache_library = self._native_cache_library(native)
        baked = int((m.export_config or {}).get("accuracy_level", 0)) if m.quant else 0
        self.accuracy_level = baked if self.cfg.accuracy_level is None else self.cfg.accuracy_level
        self.decoder = json.loads((self.path / "genai_config.json").read_text())["model"]
        limit = bundle_positions(self.path, m)
        if self.cfg.context is None:
            self.cfg = dataclasses.replace(self.cfg, context=min(DEFAULT_CONTEXT, limit))
        elif self.cfg.context > limit:
            raise ValueError(f"--context {self.cfg.context} exceeds the {limit} positions of {self.path.name}'s "
                             f"model (max_position_embeddings, or the bundle's RoPE table); give --context {limit} "
                             f"or less")
        dec = self.decoder["decoder"]
        self.kv = KvCache(KvShape(self.num_layers, dec["num_key_value_heads"], dec["head_size"], self.cfg.context),
                          (m.export_config or {}).get("attention", "standard"))
        self._check_memory_limit()
        self.fused = None
        self.read_ahead = None  # --prefetch auto on the joined decoder: the probe that chooses
        self.whole = None if self.cfg.fused else self._open_whole(session_options, native)
        self.io_why = "given"  # why the engine reads with cfg.io: given, or what --io auto saw
        if self.cfg.io == IO_AUTO:
            io, self.io_why = choose_io(self.path / MLP_FILE, rows_on_flash=self.whole is None)
            self.cfg = dataclasses.replace(self.cfg, io=io)
        if self.whole is None:
            from dipdeploy.arch import arch_of

            config = (m.source or {}).get("config") or {}
            self.embedding = EmbeddingRows(self.path, m, arch_of(config).embedding_multiplier(config))
            reason = None if self.cfg.fused is False else self._why_not_fused(native)
            if self.cfg.fused and reason is not None:
                raise ValueError(f"--fused: {reason}; or run the per-layer graphs (drop --fused)")
            if self.cfg.fused is not False and reason is None:
                self._open_fused(session_options, native)
            else:
                self._open_sessions(session_options, native)
        self.flash = FlashStore(self.path / MLP_FILE, io=self.cfg.io, cold=self.cfg.cold,
                                emulate=self.cfg.emulate,
                                io_threads=self.cfg.io_threads,
                                io_engine=self.cfg.io_engine, io_gap=self.cfg.io_gap)
        if self.whole is None:
            self._build_slabs()
        self._tokenizer = None
        self._state = None

    # -- construction -------------------------------------------------------------------------
    def _open_whole(self, session_options, native: bool):
        """The one-session mode's ``WholeModel`` with its plan, or None for the per-layer path
        (``EngineConfig.single_session``; the rule is ``whole.why_not``)."""
        from dipdeploy.runtime.whole import WholeModel, mlp_row_bytes, whole_residency, why_not

        cfg, m = self.cfg, self.manifest
        if cfg.single_session is False:
            return None
        chunk = min(cfg.prefill_chunk, cfg.context) if cfg.prefill == "batch" else 1
        vocab = self.decoder["vocab_size"]
        plan = whole_residency(m, self.kv.nbytes, vocab, chunk, [(self.d, self.f)] * self.num_layers)
        reason = why_not(m, DramBudget.parse(cfg.dram_budget), cfg.policy, plan)
        if reason is not None:
            if cfg.single_session:
                raise ValueError(f"one session per token: {reason}; or run the per-layer graphs (--per-layer)")
            return None
        options = pool_options(session_options(cfg.threads, native), cfg.threads, cfg.thread_pool)
        whole = WholeModel(self.path, shared_arena(options), self.kv, cfg.context, chunk, vocab, cfg.accuracy_level)
        self.residency: Residency = plan
        self.slabs, self.shared_staging, self.embedding = [], None, None
        self.row_bytes = [mlp_row_bytes(m, i) for i in range(self.num_layers)]
        self.dram_dense_per_token = m.sizes.get("bytes_dense", 0) - self._embedding_bytes()
        return whole

    def _why_not_fused(self, native: bool) -> str | None:
        """Why the joined decoder cannot run this engine (``EngineConfig.fused``), None when it can."""
        from dipdeploy.runtime import fused
        from dipdeploy.runtime.native_cache import graph_step_library

        reason = fused.why_not(self.cfg, self.manifest, self.num_layers)
        if reason is None and importlib.util.find_spec("onnx") is None:
            reason = "joining the per-layer graphs needs the onnx package (pip install onnx)"
        if reason is None and not native:
            reason = "the cache step in the graph is the op library's: build it (make ops)"
        if reason is None and (self._cache_library is None or graph_step_library(self._cache_library) is None):
            reason = "the op library predates the cache step in the graph: rebuild it (make ops)"
        return reason

    def _open_fused(self, session_options, native: bool) -> None:
        """The joined decoder (``dipdeploy.runtime.fused``)."""
        from dipdeploy.runtime import fused

        options = pool_options(session_options(self.cfg.threads, native), self.cfg.threads, self.cfg.thread_pool)
        self.shared = SharedInitializers(self.path, self.manifest)
        gamma = None if self.gamma == self.baked_gamma else self.gamma
        chunk = min(self.cfg.prefill_chunk, self.cfg.context) if self.cfg.prefill == "batch" else 1
        self.fused = fused.FusedModel(self.path, self.shared.apply(shared_arena(options)), self.kv, self.cfg.context,
                                      self.d, self.decoder["vocab_size"], self.num_layers, gamma,
                                      self.cfg.accuracy_level, chunk,
                                      overlap=self.cfg.io == "direct" and self.cfg.overlap_reads,
                                      prefetch=self.cfg.prefetch is not False)
        if self.cfg.prefetch is None and self.fused.reads_ahead:
            self.read_ahead = ReadAheadProbe()

    @property
    def read_ahead_setting(self) -> str | None:
        """The joined decoder's read-ahead with ``--io direct``: "on", "off", or the auto probe's choice
        (``ReadAheadProbe.describe``); None where there is none to have."""
        if self.read_ahead is not None:
            return self.read_ahead.describe()
        if self.fused is not None and self.fused.reads_ahead:
            return "on"
        return "off" if self.fused is not None and self.fused.overlap else None

    @property
    def single_session(self) -> bool:
        """Whether this engine runs ``model.onnx`` once per token (``dipdeploy.runtime.whole``)."""
        return self.whole is not None

    def _per_layer_only(self, what: str) -> str:
        """The one line for what only the per-layer path has (``dipdeploy.runtime.whole`` and ``fused``)."""
        if self.fused is not None:
            return (f"{what} need the per-layer graphs with the host cache step, and this engine runs them joined "
                    f"(the cache step in the graph): give fused=False (--no-fused)")
        return (f"{what} need the per-layer graphs, and this engine runs model.onnx in one session (the budget "
                f"holds every row): give single_session=False (--per-layer)")

    def _native_cache_library(self, native: bool) -> str | None:
        """The op library for the native cache step, or None for the numpy one (see ``EngineConfig``)."""
        from dipdeploy.ops.native import require_library
        from dipdeploy.runtime.native_cache import cache_library

        wanted = native if self.cfg.native_cache is None else self.cfg.native_cache
        if not wanted:
            return None
        path = str(require_library())
        if cache_library(path) is None:
            if self.cfg.native_cache:
                raise RuntimeError(f"{path} predates the native cache step (no dd_cache_select): rebuild it "
                                   "with `make ops`")
            warnings.warn(f"{path} predates the native cache step: running it in numpy; `make ops` rebuilds "
                          "the library", stacklevel=3)
            return None
        return path

    @property
    def native_cache(self) -> bool:
        """Whether the per-token cache step runs in the op library."""
        return self._cache_library is not None

    def _check_memory_limit(self) -> None:
        """Refuse, before any session is opened, a budget that cannot fit under the cgroup memory limit.

        Both figures are lower bounds from the manifest, so only what certainly cannot fit is refused:
        the budget is the total given, or the dense bytes (the embedding table excluded: it is read
        row by row) + the KV cache + the cached share of the MLP bytes (staging excluded); the overhead is what this process holds now (interpreter and
        libraries) plus the graph files the sessions will parse."""
        limit = memory_limit()
        if limit is None:
            return
        m = self.manifest
        budget = DramBudget.parse(self.cfg.dram_budget)
        if budget.total_bytes is not None:
            need = budget.total_bytes
        else:
            dense = m.sizes.get("bytes_dense", 0) - self._embedding_bytes()
            need = int(dense + self.kv.nbytes + budget.cache_frac * m.sizes.get("bytes_mlp", 0))
        graphs = sum(m.files[name]["size"] for name in m.graphs["layers"] if name in m.files)
        check_fits(need, memory_now().get("VmRSS", 0) + graphs, limit, str(self.cfg.dram_budget))

    def _open_sessions(self, session_options, native: bool) -> None:
        files = self.manifest.graphs["layers"]
        gamma = None if self.gamma == self.baked_gamma else self.gamma  # rewrite the graphs only when it differs

        self.shared = SharedInitializers(self.path, self.manifest)

        def sess(name: str, g: float | None = None) -> Bound:
            if name not in files:
                raise BundleError(f"{self.path}: graph {name} is missing from the manifest; {REGENERATE}")
            options = pool_options(session_options(self.cfg.threads, native), self.cfg.threads, self.cfg.thread_pool)
            options = self.shared.apply(shared_arena(options))
            return Bound(open_session(self.path / name, options, g, self.cfg.accuracy_level))

        self.head = sess("head.onnx")
        self.positions = sess("positions.onnx")
        self.attn = [sess(f"layer.{i}.attn.onnx", gamma) for i in range(self.num_layers)]
        self.up = [sess(f"layer.{i}.mlp_up.onnx", gamma) for i in range(self.num_layers)]
        self.down = [sess(f"layer.{i}.mlp_down.onnx") for i in range(self.num_layers)]

    def _build_slabs(self) -> None:
        m, cfg = self.manifest, self.cfg
        arrays = []
        for i in range(self.num_layers):
            if self.fused is not None:
                up_args, down_args = self.fused.slab_inputs(i, "up_gate"), self.fused.slab_inputs(i, "down")
            else:
                up_args = [a for a in self.up[i].session.get_inputs() if a.name.startswith("up_gate.")]
                down_args = [a for a in self.down[i].session.get_inputs() if a.name.startswith("down.")]
            arrays.append((group_arrays(m, self.path, i, "up_gate", up_args),
                           group_arrays(m, self.path, i, "down", down_args)))
        def shape(rows: int, group, k: int) -> GroupShape:
            return GroupShape(rows, group.row_bytes, k, staging.window_bytes([a.row_bytes for a in group.per_row], k))

        shapes = [[shape(self.d, a, k_in), shape(self.f, b, k_glu)] for (a, b), (k_in, k_glu) in zip(arrays, self.k)]
        share = staging.supported() if cfg.shared_staging is None else cfg.shared_staging
        if share and not staging.supported():
            raise ValueError("shared staging needs memfd_create (Linux); leave shared_staging unset")
        shared = sum(a.shared_bytes + b.shared_bytes for a, b in arrays)
        dense = m.sizes.get("bytes_dense", 0) - self._embedding_bytes() + self.embedding.nbytes + shared
        batch = cfg.prefill == "batch"  # the joined graph's activations for a chunk are ORT's, of the same sizes
        self._prefill_shapes = _prefill_buffers(arrays, (self.d, self.f)) if batch else {}
        self._chunk_shapes = _chunk_buffers(min(cfg.prefill_chunk, cfg.context), self.d, self.f, self.k) if batch else {}
        prefill = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in self._prefill_shapes)
        prefill += sum(n * np.dtype(dtype).itemsize for n, dtype in self._chunk_shapes.values())
        read = 0
        if cfg.io == "direct":
            read = max(bounce_bytes([x.offset for x in g.per_row], [x.row_bytes for x in g.per_row], rows,
                                    max_gap=cfg.io_gap)
                       for pair in arrays for g, rows in zip(pair, (self.d, self.f)))
        self.residency: Residency = plan_residency(DramBudget.parse(cfg.dram_budget), shapes, dense,
                                                   self.kv.nbytes, cfg.policy, prefill, share, read,
                                                   cfg.cache_split)
        self.shared_staging = staging.SharedStaging(self.residency.staging) if share else None
        self._prefill_arrays: dict | None = None
        self._chunk_arrays: dict = {}
        self.slabs = [tuple(GroupSlab(arr, rows, k, cap, self.flash, self._cache_library, self.shared_staging)
                            for arr, rows, k, cap in zip(pair, (self.d, self.f), k_pair, caps))
                      for pair, k_pair, caps in zip(arrays, self.k, self.residency.capacity)]
        self.row_bytes = [(a.row_bytes, b.row_bytes) for a, b in arrays]
        self.dram_dense_per_token = m.sizes.get("bytes_dense", 0) - self._embedding_bytes()
        if self.fused is None:
            self._bind_buffers()
        else:  # the graph steps the cache itself: the native steps get scratch selection/slot buffers
            for pair, ks in zip(self.slabs, self.k):
                for slab, k in zip(pair, ks):
                    slab.bind(np.zeros((1, k), np.int64), np.zeros((1, k), np.int64))
            self._graph_reader = self.flash.native_reader(read) if cfg.io == "direct" else None
            if cfg.io == "direct" and self._graph_reader is None:
                raise ValueError("--fused --io direct reads with the op library's reader, which this library lacks: "
                                 "rebuild it (make ops)")

    def _bind_buffers(self) -> None:
        """Allocate every fixed-shape tensor of the decode loop once and bind it to its sessions.

        Each layer's ``hidden_attn`` and ``mlp_out`` outputs are the next layer's ``hidden`` and
        ``mlp_out`` inputs (the same buffers); a buffer is only rewritten by its producer after its
        consumers of the same token have run.
        """
        d, f = self.d, self.f
        vocab = self.decoder["vocab_size"]
        self.buf = b = {"pos": np.zeros((1, 1), np.int64),
                        "logits": np.zeros((1, 1, vocab), np.float32)}
        self.embedded = h = np.zeros((1, 1, d), np.float32)
        self._mask = np.ones((1, self.cfg.context), np.int64)  # batch 1, no padding
        self.per_token = PositionValues(self.positions, self.attn, self._mask, b["pos"])
        pending = None
        self.layer_buf = []
        for i, ((ug, dn), (k_in, k_glu)) in enumerate(zip(self.slabs, self.k)):
            lb = {"cache_in": np.zeros(d, bool), "hidden_attn": np.zeros((1, 1, d), np.float32),
                  "x": np.zeros((1, d), np.float32), "in_indices": np.zeros((1, k_in), np.int64),
                  "in_slots": np.zeros((1, k_in), np.int64), "cache_glu": np.zeros(f, bool),
                  "glu": np.zeros((1, f), np.float32), "glu_indices": np.zeros((1, k_glu), np.int64),
                  "glu_slots": np.zeros((1, k_glu), np.int64), "mlp_out": np.zeros((1, 1, d), np.float32)}
            a, u, w = self.attn[i], self.up[i], self.down[i]
            ug.bind(lb["in_indices"], lb["in_slots"])
            dn.bind(lb["glu_indices"], lb["glu_slots"])
            a.input("hidden", h)
            if pending is not None:
                a.input("mlp_out", pending)
            a.input("cache_in", lb["cache_in"])
            for name in ("hidden_attn", "x", "in_indices"):
                a.output(name, lb[name])
            for name in ("x", "in_indices", "in_slots", "cache_glu"):
                u.input(name, lb[name])
            for name in ("glu", "glu_indices"):
                u.output(name, lb[name])
            for name in ("glu", "glu_indices", "glu_slots", "hidden_attn"):
                w.input(name, lb[name])
            w.output("mlp_out", lb["mlp_out"])
            for name, value in ug.feeds.items():
                u.input(name, value)
            for name, value in dn.feeds.items():
                w.input(name, value)
            self.layer_buf.append(lb)
            h, pending = lb["hidden_attn"], lb["mlp_out"]
        self.head.input("hidden", h)
        self.head.input("mlp_out", pending)
        self.head.output("logits", b["logits"])

    def _embedding_bytes(self) -> int:
        return embedding_table_bytes(self.manifest)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        return self._tokenizer

    # -- one sequence ---------------------------------------------------------------------------
    def reset(self, future: list[tuple[np.ndarray, np.ndarray]] | None = None, policy: str | None = None) -> None:
        """Start a new sequence: empty KV cache, fresh caches (``static`` pins its rows now).
        ``policy`` overrides the configured one for this sequence (Belady's recording pass uses none)."""
        policy = policy or self.cfg.policy
        if policy == "belady" and future is None and self.whole is None:
            raise ValueError("policy 'belady' needs the future selections: use Engine.generate, which records "
                             "them in a first pass, or pass future=")
        for i, pair in enumerate(self.slabs):
            for g, slab in enumerate(pair):
                pinned = None
                if policy == "static":
                    counts = (self.cfg.pinned_counts[i][g] if self.cfg.pinned_counts is not None
                              else np.zeros(slab.rows))
                    pinned = static_rows(np.asarray(counts), slab.capacity)
                slab.reset(policy, future=None if future is None else future[i][g], pinned=pinned)
        if self.fused is not None:
            if self._graph_reader is not None:
                for pair in self.slabs:
                    for slab in pair:
                        slab.native_state().read_through(self._graph_reader, MAX_REQUEST, self.cfg.io_gap, BLOCK)
            self.fused.bind_groups(self.slabs, self._full_buffers if self.fused.prefill_bound is not None else None)
        self.kv.reset()
        self._state = {"pos": 0, "ids": []}

    @property
    def sequence(self) -> list[int]:
        """The token ids the KV cache holds, in order (a copy)."""
        return list(self._state["ids"]) if self._state else []

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens of the sequence in the KV cache (a chat re-reads from there when its
        history changes). The DRAM row caches keep their rows: they are a cache, not the sequence."""
        st = self._state
        if st is None or not 0 <= n <= st["pos"]:
            raise ValueError(f"cannot keep {n} tokens of a sequence of {st['pos'] if st else 0}")
        self.kv.truncate(n)
        st["pos"], st["ids"] = n, st["ids"][:n]

    def step(self, token: int, timer: Timer, record=None) -> np.ndarray:
        """Feed one token; returns the logits [V] of the next one. ``record(layer, sel_in, sel_glu,
        hits_in, hits_glu)`` gets each layer's selections as views of the graph buffers, which the next
        token overwrites: a recorder that keeps them copies them."""
        if self.whole is not None:
            return self._whole_run([int(token)], timer, record)
        if self.fused is not None:
            return self._fused_step(int(token), timer, record)
        st, b = self._state, self.buf
        pos = st["pos"]
        if pos >= self.cfg.context:
            raise ValueError(f"context of {self.cfg.context} tokens is full; raise --context")
        b["pos"][0, 0] = pos
        lap = timer.lap  # one clock read per phase: the decode loop's own cost is what DESIGN.md measures
        timer.start()
        self.embedding.read(int(token), self.embedded)
        lap("embed+head")
        self.per_token.step(pos + 1)  # the mask and RoPE rows, once for every layer's attention
        lap("attention")
        # each group's step, MLP graph and settle run back to back, one group at a time: the groups'
        # staging rows are the same pages (dipdeploy.runtime.staging)
        for i in range(self.num_layers):
            ug, dn = self.slabs[i]
            lb, a = self.layer_buf[i], self.attn[i]
            np.copyto(lb["cache_in"], ug.resident)
            self.kv.bind(a, i)
            a.run()
            self.kv.commit(i)
            lap("attention")
            hits_in = ug.step()
            np.copyto(lb["cache_glu"], dn.resident)
            lap("cache")
            self.up[i].run()
            lap("mlp")
            ug.settle()
            hits_glu = dn.step()
            lap("cache")
            self.down[i].run()
            lap("mlp")
            dn.settle()
            if record is not None:
                record(i, lb["in_indices"][0], lb["glu_indices"][0], hits_in, hits_glu)
            lap("cache")
        self.head.run()
        lap("embed+head")
        self.flash.settle()
        lap("cache")
        self.kv.advance()
        st["pos"] = pos + 1
        st["ids"].append(int(token))
        return b["logits"][0, -1].copy()

    def prefill(self, ids: list[int], timer: Timer, record=None,
                progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Feed ``ids`` in chunks of at most ``EngineConfig.prefill_chunk`` tokens, each one batch per
        layer (``_prefill_chunk``); returns the logits [V] after the last token. A chunk attends to the
        earlier ones through the KV cache, as a decoded token does, so chunking changes only the
        floating-point summation, and bounds the working set by the chunk instead of the prompt.
        ``progress(done, total)`` follows each chunk. The joined decoder (``fused``) runs each chunk through
        its one graph (``_fused_chunk``), with the same semantics."""
        st, n = self._state, len(ids)
        if st["pos"] + n > self.cfg.context:
            raise ValueError(f"context of {self.cfg.context} tokens is full; raise --context")
        if self.fused is not None:
            if record is not None:
                raise ValueError(self._per_layer_only("per-layer selections"))
            size = self.fused.chunk
            slabs = [slab for pair in self.slabs for slab in pair]
            if size > 1:
                for slab in slabs:
                    full = self._full_buffers(slab)
                    slab.native_state().prefill([full[a.name] for a in slab.arrays.per_row])
            try:
                for start in range(0, n, size):
                    chunk = ids[start:start + size]
                    logits = self._fused_chunk(chunk, timer) if size > 1 else self._fused_step(int(chunk[0]), timer, None)
                    if progress is not None:
                        progress(min(start + size, n), n)
            finally:
                if size > 1:
                    for slab in slabs:
                        slab.native_state().prefill(None)
            return logits
        if self.whole is not None:
            size = self.whole.chunk
            for start in range(0, n, size):
                logits = self._whole_run(ids[start:start + size], timer, record)
                if progress is not None:
                    progress(min(start + size, n), n)
            return logits
        if not self._chunk_arrays:  # the full-height buffers: ``_full_buffers``
            self._chunk_arrays = {name: np.zeros(size, dtype) for name, (size, dtype) in self._chunk_shapes.items()}
            self._prefill_bound = [tuple(Bound(s.session) for s in (self.attn[i], self.up[i], self.down[i]))
                                   for i in range(self.num_layers)]
            self._prefill_positions = Bound(self.positions.session)
        size = min(self.cfg.prefill_chunk, self.cfg.context)  # what _chunk_buffers was sized for
        for start in range(0, n, size):
            self._prefill_chunk(ids[start:start + size], timer, record, last=start + size >= n)
            if progress is not None:
                progress(min(start + size, n), n)
        return self.buf["logits"][0, -1].copy()

    def _prefill_chunk(self, ids: list[int], timer: Timer, record, last: bool) -> None:
        """Feed ``ids`` (at most one chunk) as one batch per layer; the head runs after the ``last`` chunk.

        Each token selects by plain DIP (every row counted resident: the cache cannot change inside one
        graph run), the union of the batch's selected rows is placed once in a full-height buffer at
        their row index (rows the cache holds are copied from DRAM, the rest read from Flash), and the
        MLP graphs run on it. Then each group's cache takes the batch's selections in token order by its
        policy's rule, as if decoded, and the slab gets the newly resident rows from the buffer. A
        token's hits are its rows the cache held before the batch: what the batch found in DRAM
        (README, "The host runtime": batched prefill). The activations are the chunk buffers, views of
        their first ``n`` rows, the same for every layer."""
        st, n = self._state, len(ids)
        pos = st["pos"]
        c = self._chunk_arrays

        def rows(name: str, width: int, lead: tuple = ()) -> np.ndarray:
            return c[name][: n * width].reshape(*lead, n, width)

        h, hidden_attn, x, glu = rows("hidden", self.d, (1,)), rows("hidden_attn", self.d, (1,)), \
            rows("x", self.d), rows("glu", self.f)
        out, pending = rows("mlp_out", self.d, (1,)), None
        with timer("embed+head"):
            for j, t in enumerate(ids):
                self.embedding.read(int(t), h[0, j])
        with timer("attention"):
            values = self.per_token.batch(self._prefill_positions, pos, n)
        everything = (np.ones(self.d, bool), np.ones(self.f, bool))
        for i in range(self.num_layers):
            a, u, w = self._prefill_bound[i]
            k_in, k_glu = self.k[i]
            ug, dn = self.slabs[i]
            sel_in, sel_glu = rows("in_indices", k_in), rows("glu_indices", k_glu)
            with timer("attention"):
                for name, v in (("hidden", h), ("cache_in", everything[0]),
                                *((name, values[name]) for name in self.per_token.names[i])):
                    a.input(name, v)
                if pending is not None:
                    a.input("mlp_out", pending)
                for name, v in (("hidden_attn", hidden_attn), ("x", x), ("in_indices", sel_in)):
                    a.output(name, v)
                self.kv.bind(a, i, n)
                a.run()
                self.kv.commit(i)
            with timer("cache"):
                rows_ug = self._fill_prefill(ug, sel_in)
            with timer("mlp"):
                for name, v in (("x", x), ("in_indices", sel_in), ("in_slots", sel_in), ("cache_glu", everything[1]),
                                *rows_ug.items()):
                    u.input(name, v)
                u.output("glu", glu)
                u.output("glu_indices", sel_glu)
                u.run()
            with timer("cache"):
                hits_in = self._warm(ug, sel_in, rows_ug)
                rows_dn = self._fill_prefill(dn, sel_glu)
            with timer("mlp"):
                for name, v in (("glu", glu), ("glu_indices", sel_glu), ("glu_slots", sel_glu),
                                ("hidden_attn", hidden_attn), *rows_dn.items()):
                    w.input(name, v)
                w.output("mlp_out", out)  # read by the next layer's attention, a run earlier
                w.run()
            with timer("cache"):
                hits_glu = self._warm(dn, sel_glu, rows_dn)
            if record is not None:
                for j in range(n):
                    record(i, sel_in[j].copy(), sel_glu[j].copy(), hits_in[j], hits_glu[j])
            # the attention reads ``hidden`` and writes ``hidden_attn`` in one run: the two buffers alternate
            h, hidden_attn, pending = hidden_attn, h, out
        if last:
            with timer("embed+head"):
                np.copyto(self.layer_buf[-1]["hidden_attn"], h[:, -1:])
                np.copyto(self.layer_buf[-1]["mlp_out"], pending[:, -1:])
                self.head.run()
        with timer("cache"):
            self.flash.settle()
        self.kv.advance(n)
        st["pos"] = pos + n
        st["ids"].extend(int(t) for t in ids)

    def _whole_run(self, ids: list[int], timer: Timer, record) -> np.ndarray:
        """One ``model.onnx`` run on ``ids``; the logits [V] after the last of them."""
        if record is not None:
            raise ValueError(self._per_layer_only("per-layer selections"))
        st = self._state
        timer.start()
        logits = self.whole.run(ids, st["pos"])[-1].copy()
        timer.lap("model.onnx")
        st["pos"] += len(ids)
        st["ids"].extend(int(t) for t in ids)
        return logits

    def _fused_step(self, token: int, timer: Timer, record) -> np.ndarray:
        """One token through the joined decoder; its reads are counted from the native groups' totals."""
        if record is not None:
            raise ValueError(self._per_layer_only("per-layer selections"))
        st, probe = self._state, self.read_ahead
        if probe is not None:  # every token: a cache reset makes new groups, which read ahead
            on = probe.next()
            read_ahead(self._cache_library, self.fused.handles, on)
        timer.start()
        self.embedding.read(token, self.fused.hidden)
        timer.lap("embed+head")
        logits = self.fused.run(st["pos"]).copy()
        graph_s = timer.lap("fused graph")
        if probe is not None:
            probe.record(on, graph_s)
        self._drain_graph_reads()
        timer.lap("cache")
        st["pos"] += 1
        st["ids"].append(token)
        return logits

    def _fused_chunk(self, ids: list[int], timer: Timer) -> np.ndarray:
        """A chunk of the prompt through the joined decoder in one run, the groups in prefill mode (set by
        ``prefill``): the per-layer path's batched prefill (``_prefill_chunk``) inside the graph."""
        st, n = self._state, len(ids)
        timer.start()
        hidden = self.fused.chunk_hidden.array[: n * self.d].reshape(n, self.d)
        for j, t in enumerate(ids):
            self.embedding.read(int(t), hidden[j])
        timer.lap("embed+head")
        logits = self.fused.run_chunk(st["pos"], n).copy()
        timer.lap("fused graph")
        self._drain_graph_reads()
        timer.lap("cache")
        st["pos"] += n
        st["ids"].extend(int(t) for t in ids)
        return logits

    def _drain_graph_reads(self) -> None:
        """The CacheStep nodes' reads since the last run, into the Flash store's counters."""
        from dipdeploy.runtime.native_cache import drain

        reads = drain(self._cache_library, self.fused.handles)
        if reads.misses or reads.ahead:  # a read-ahead that no step then missed still read its rows
            self.flash.account(reads.wanted, reads.requests, reads.seconds, reads.blocks, reads.block_requests)
            self.flash.counters.ahead_rows += reads.ahead
            self.flash.counters.ahead_used += reads.ahead_used
        self.flash.settle()

    def _full_buffers(self, slab: GroupSlab) -> dict[str, np.ndarray]:
        """``slab``'s per-row arrays' names → the batched prefill's full-height buffers (one per shape,
        shared by every layer: ``_prefill_buffers``), allocated on first use."""
        if self._prefill_arrays is None:
            self._prefill_arrays = {key: np.zeros(key[0], key[1]) for key in self._prefill_shapes}
        return {a.name: self._prefill_arrays[((slab.rows, *a.row_shape), str(np.dtype(a.dtype)))]
                for a in slab.arrays.per_row}

    def native_hits(self) -> np.ndarray:
        """[layer, group, (hits, lookups)] since the caches' reset, from the native state (the joined
        graph's steps)."""
        out = np.zeros((self.num_layers, 2, 2), np.int64)
        for i, pair in enumerate(self.slabs):
            for g, slab in enumerate(pair):
                c = slab.native_state().state.counters
                out[i, g] = (c[1], c[1] + c[2])
        return out

    def _fill_prefill(self, slab: GroupSlab, selected: np.ndarray) -> dict[str, np.ndarray]:
        """The prefill buffers of ``slab``'s arrays, holding every row of ``selected`` at its row index:
        rows resident in the slab copied from it, the others read from Flash (once, coalesced)."""
        bufs = self._full_buffers(slab)
        rows = np.unique(selected)
        slots = slab.table.slot_of[rows]
        held = slots >= 0
        for a, s in zip(slab.arrays.per_row, slab.slabs):
            bufs[a.name][rows[held]] = s[slots[held]]
        missing = rows[~held]
        self.flash.read(slab.arrays.per_row, list(bufs.values()), missing, missing)
        return {**bufs, **slab.arrays.shared}

    @staticmethod
    def _warm(slab: GroupSlab, selected: np.ndarray, bufs: dict[str, np.ndarray]) -> np.ndarray:
        """``slab``'s cache takes ``selected`` [n, K] in token order by its policy's rule
        (``RowCache.access_steps``); the newly resident rows are copied from the prefill buffers into their
        slots. Returns the hits [n, K]: the rows the cache held before the batch."""
        hits = slab.cache.access_steps(selected)
        rows, slots = slab.table.rebase(slab.cache.resident[0])
        for a, s in zip(slab.arrays.per_row, slab.slabs):
            s[slots] = bufs[a.name][rows]
        return hits

    def trace_recorder(self):
        """A ``TraceRecorder`` for ``generate(trace=...)`` (``dipdeploy.runtime.record.trace_recorder``)."""
        return recording.trace_recorder(self)

    # -- generation -----------------------------------------------------------------------------
    def encode(self, prompt: str, special_tokens: bool = True) -> list[int]:
        """Token ids of ``prompt`` as Hugging Face's tokenizer gives them: a raw prompt gets the tokenizer's
        special tokens (Gemma's ``<bos>``; SmolLM2's tokenizer adds none), a rendered chat template does not
        (it writes them itself, as ``apply_chat_template`` does: ``special_tokens=False``)."""
        return self.tokenizer.encode(prompt, add_special_tokens=special_tokens).ids

    def generate(self, prompt: str | list[int], max_new_tokens: int = 32, *, sampler: Sampler | None = None,
                 on_text: Callable[[str], None] | None = None, trace=None, keep_logits: bool = False,
                 stop_at_eos: bool = True, should_stop: Callable[[], bool] | None = None,
                 on_prefill: Callable[[int, int], None] | None = None) -> Generation:
        """Feed ``prompt`` (batched or token by token: ``EngineConfig.prefill``), then sample up to
        ``max_new_tokens`` (see ``extend``).

        ``trace``: a ``dipdeploy.trace.TraceRecorder`` that receives every token's selections and hits.
        ``on_prefill(done, total)`` follows the prompt (once per token in token mode, once per chunk in
        batch mode).
        Policy ``belady`` runs the sequence twice: once with no cache to record the selections (DIP's
        selection does not depend on the cache when γ = 1), then with Belady over that future.
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty: give at least one token")
        if len(ids) + max_new_tokens > self.cfg.context:
            raise ValueError(f"prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceed the context of "
                             f"{self.cfg.context}; raise --context")
        future = None
        if self.cfg.policy == "belady" and self.whole is None:  # every row resident: nothing to foresee
            future = recording.record_future(self, ids, max_new_tokens, sampler, stop_at_eos)
        if self.cfg.cold:  # every run starts from the disk (also after Belady's recording pass)
            self.flash.drop_page_cache()
        sampler = sampler or Sampler()
        sampler.reset()
        self.reset(future)
        return self.extend(ids, max_new_tokens, sampler, on_text, trace, keep_logits, stop_at_eos,
                           prompt if isinstance(prompt, str) else None, should_stop=should_stop,
                           on_prefill=on_prefill)

    def teacher_forced(self, prompt: list[int], tokens: list[int]) -> tuple[list[np.ndarray], list[dict]]:
        """Logits and selections of a new sequence fed ``prompt`` then ``tokens[:-1]``
        (``dipdeploy.runtime.record.teacher_forced``)."""
        return recording.teacher_forced(self, prompt, tokens)

    def eos_ids(self) -> set[int]:
        """The bundle's end-of-sequence ids (genai_config.json's ``eos_token_id``: one id or a list)."""
        eos = self.decoder.get("eos_token_id")
        return set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()

    def extend(self, ids, max_new_tokens, sampler, on_text=None, trace=None, keep_logits=False,
               stop_at_eos=True, prompt=None, record=None, should_stop=None, on_prefill=None) -> Generation:
        """Feed ``ids`` after what the sequence holds (no reset: the KV cache and the caches continue),
        then sample until EOS (``stop_at_eos``), one of ``sampler.stop``, ``max_new_tokens`` or
        ``should_stop()`` (asked before every token: a host's Ctrl-C, which must not cut a token's
        cache update in half). The last sampled token is not fed; a caller that continues feeds it first.

        ``on_text(piece)`` receives the answer's text as it becomes final (``dipdeploy.runtime.stream``:
        whole UTF-8 characters, never a stop string); ``on_prefill(done, total)`` follows ``ids``."""
        from dipdeploy.runtime.stream import TextStream

        timer = Timer()
        eos = self.eos_ids() if stop_at_eos else set()
        hits = np.zeros((self.num_layers, 2, 2), np.int64)  # [layer, group, (hits, lookups)]
        stopped = should_stop or (lambda: False)

        def show(piece: str) -> None:
            if piece and on_text is not None:
                on_text(piece)

        def note(i, s_in, s_glu, h_in, h_glu):
            hits[i, 0] += (np.count_nonzero(h_in), h_in.size)
            hits[i, 1] += (np.count_nonzero(h_glu), h_glu.size)
            if trace is not None:
                trace.record(i, s_in[None], s_glu[None], hits_in=h_in[None], hits_glu=h_glu[None])
            if record is not None:
                record(i, s_in, s_glu, h_in, h_glu)

        feed = note
        if self.whole is not None or self.fused is not None:
            if trace is not None or record is not None:
                raise ValueError(self._per_layer_only("traces and recorded selections"))
            feed = None
        resident = np.array(self.k, np.int64)[:, :, None]  # one-session mode: every lookup is a hit
        base = self.native_hits() if self.fused is not None else None

        def fed(n: int) -> None:
            if self.whole is not None:
                hits[...] += n * resident

        def counted() -> None:  # the joined graph's lookups, from the native counters (not per token)
            if self.fused is not None:
                hits[...] = self.native_hits() - base

        stream = TextStream(self.tokenizer, sampler.stop)
        new, kept, finish = [], [], "length"
        t0, flash0 = time.perf_counter(), self.flash.counters.snapshot()
        logits = None
        by_token = self.cfg.prefill == "token"
        if not by_token and ids:
            if stopped():
                finish = "interrupted"
            else:
                logits = self.prefill([int(t) for t in ids], timer, feed, on_prefill)
                fed(len(ids))
        for n, t in enumerate(ids if by_token else []):
            if stopped():
                finish = "interrupted"
                break
            logits = self.step(int(t), timer, feed)
            fed(1)
            if on_prefill is not None:
                on_prefill(n + 1, len(ids))
        t1, flash1 = time.perf_counter(), self.flash.counters.snapshot()
        counted()
        hits_prefill = hits.copy()
        for n in range(max_new_tokens if finish != "interrupted" else 0):
            if stopped():
                finish = "interrupted"
                break
            if keep_logits:
                kept.append(logits.copy())
            tok = sampler(logits, self._state["ids"])  # the sampled tokens before it are fed already
            new.append(tok)
            if tok not in eos:
                show(stream.push(tok))
            if tok in eos or stream.stopped is not None:
                finish = "eos" if tok in eos else "stop"
                break
            if n == max_new_tokens - 1:
                break
            logits = self.step(tok, timer, feed)
            fed(1)
        show(stream.finish())
        t2 = time.perf_counter()
        counted()
        stats = RunStats.collect(self, len(ids), len(new), t1 - t0, t2 - t1, timer, hits, hits_prefill,
                                 flash1 - flash0, self.flash.counters - flash1, memory_now())
        return Generation(prompt, stream.text, new, stats, kept, finish)

    def close(self) -> None:
        for pair in self.slabs:
            for slab in pair:
                slab.close()
        self.flash.close()
        if self.embedding is not None:
            self.embedding.close()
        if self.shared_staging is not None:
            self.shared_staging.close()
