"""The joined backend: the bundle's joined decoder graph (``dipdeploy.export.joined``: the per-layer graphs
spliced into one, the cache step as ops; the same native step, at any budget; ``EngineConfig.fused``) in one
session per token.
Its batched prefill runs each chunk through the same graph with the per-layer path's semantics; it records
no per-layer selections (traces, Belady, ``teacher_forced``), and its lookups and reads are counted from
the native groups' totals. Torch-free (floor 5).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from dipdeploy.bundle.bundledir import BundleDir
from dipdeploy.bundle.manifest import REGENERATE, BundleError
from dipdeploy.bundle.names import JOINED, JOINED_LOGITS_FROM, MLP_GROUPS, joined_input
from dipdeploy.cache import policy_of
from dipdeploy.flash import BLOCK, MAX_REQUEST
from dipdeploy.runtime.backends.per_layer import SlabDecoder
from dipdeploy.runtime.native_cache import read_ahead
from dipdeploy.runtime.readahead import ReadAheadProbe
from dipdeploy.runtime.sessions import Bound, Buffer, open_session, shared_arena
from dipdeploy.runtime.stats import Timer
from dipdeploy.runtime.threadpool import pool_options


def _why_not_config(cfg, manifest, layers: int) -> str | None:
    """Why the cache cannot run inside the graph for this engine configuration (None: it can)."""
    if cfg.io not in ("mmap", "direct"):
        return (f"--io {cfg.io}: the cache step in the graph copies the misses from the mapped file (--io mmap) or "
                f"reads them with the op library's reader (--io direct)")
    if policy_of(cfg.policy).needs_future:
        return f"policy {cfg.policy!r} needs the recorded future, which only the per-layer path records"
    if (manifest.row_order or {}).get("order", "natural") != "natural":
        return "the bundle's rows are in a calibrated order, which only the Flash store reads"
    if cfg.native is False or cfg.native_cache is False:
        return "the cache step in the graph is the op library's: it needs the native kernels and cache step"
    if not manifest.graphs.get("decoder"):
        return f"the bundle has no joined decoder graph; {REGENERATE}"
    return None


def why_not(host, native: bool) -> str | None:
    """Why the joined decoder cannot run ``host``'s engine (``EngineConfig.fused``), None when it can."""
    from dipdeploy.runtime.native_cache import graph_step_library

    reason = _why_not_config(host.cfg, host.manifest, host.num_layers)
    if reason is None and not native:
        from dipdeploy.ops.native import missing_library_hint

        reason = f"the cache step in the graph is the op library's: {missing_library_hint()}"
    if reason is None and (host._cache_library is None or graph_step_library(host._cache_library) is None):
        reason = "the op library predates the cache step in the graph: rebuild it (make ops)"
    return reason


class JoinedDecoder(SlabDecoder):
    """One ``JoinedModel`` session per token (and per prefill chunk) over the slabs."""

    records_selections = False

    def __init__(self, host, session_options, native: bool):
        super().__init__(host)
        self.read_ahead = None  # --prefetch auto: the probe that chooses
        self._drafting = False  # draft_mode: every step over the resident rows alone
        options = pool_options(session_options(self.cfg.threads, native), self.cfg.threads, self.cfg.thread_pool)
        gamma = None if self.gamma == self.baked_gamma else self.gamma
        chunk = min(self.cfg.prefill_chunk, self.cfg.context) if self.cfg.prefill == "batch" else 1
        self.fused = JoinedModel(self.files, self.manifest, self.shared.apply(shared_arena(options)), self.kv, self.cfg.context,
                                      self.d, self.decoder["vocab_size"], self.num_layers, gamma,
                                      self.cfg.accuracy_level, chunk,
                                      overlap=self.cfg.io == "direct" and self.cfg.overlap_reads,
                                      prefetch=self.cfg.prefetch is not False, given=self.shared.values)
        if self.cfg.prefetch is None and self.fused.reads_ahead:
            self.read_ahead = ReadAheadProbe()

    @property
    def read_ahead_setting(self) -> str | None:
        """The read-ahead with ``--io direct``: "on", "off", or the auto probe's choice
        (``ReadAheadProbe.describe``); None where there is none to have."""
        if self.read_ahead is not None:
            return self.read_ahead.describe()
        if self.fused.reads_ahead:
            return "on"
        return "off" if self.fused.overlap else None

    def _slab_args(self, i: int) -> tuple[list, list]:
        return self.fused.slab_inputs(i, "up_gate"), self.fused.slab_inputs(i, "down")

    def _bind(self, read: int) -> None:
        """The graph steps the cache itself: the native steps get scratch selection/slot buffers."""
        cfg = self.cfg
        for pair, ks in zip(self.slabs, self.k):
            for slab, k in zip(pair, ks):
                slab.bind(np.zeros((1, k), np.int64), np.zeros((1, k), np.int64))
        self._graph_reader = self.flash.native_reader(read) if cfg.io == "direct" else None
        if cfg.io == "direct" and self._graph_reader is None:
            raise ValueError("--fused --io direct reads with the op library's reader, which this library lacks: "
                             "rebuild it (make ops)")

    def reset(self, future: list[tuple[np.ndarray, np.ndarray]] | None, policy: str) -> None:
        super().reset(future, policy)
        if self._graph_reader is not None:
            for pair in self.slabs:
                for slab in pair:
                    slab.native_state().read_through(self._graph_reader, MAX_REQUEST, self.cfg.io_gap, BLOCK)
        self.fused.bind_groups(self.slabs, self._full_buffers if self.fused.prefill_bound is not None else None)

    def per_layer_only(self, what: str) -> str:
        return (f"{what} need the per-layer graphs with the host cache step, and this engine runs them joined "
                f"(the cache step in the graph): give fused=False (--no-fused)")

    def lookups(self) -> np.ndarray:
        """[layer, group, (hits, lookups)] since the caches' reset, from the native state (the joined
        graph's steps)."""
        out = np.zeros((self.num_layers, 2, 2), np.int64)
        for i, pair in enumerate(self.slabs):
            for g, slab in enumerate(pair):
                c = slab.native_state().state.counters
                out[i, g] = (c[1], c[1] + c[2])
        return out

    native_hits = lookups

    def _prefill_mode(self, on: bool) -> None:
        """Every group in or out of prefill mode (``NativeCache.prefill``): their steps fill the
        full-height buffers with a chunk's rows and warm the caches from its selections."""
        for pair in self.slabs:
            for slab in pair:
                if on:
                    full = self._full_buffers(slab)
                    slab.native_state().prefill([full[a.name] for a in slab.arrays.per_row])
                else:
                    slab.native_state().prefill(None)

    def prefill(self, ids: list[int], timer: Timer, record=None,
                progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Each chunk of ``ids`` through the joined graph in one run (``_chunk``), the groups in prefill
        mode; the logits [V] after the last token."""
        n = len(ids)
        if record is not None:
            raise ValueError(self.per_layer_only("per-layer selections"))
        size = self.fused.chunk
        if size > 1:
            self._prefill_mode(True)
        try:
            for start in range(0, n, size):
                chunk = ids[start:start + size]
                logits = self._chunk(chunk, timer) if size > 1 else self.step(int(chunk[0]), timer, None)
                if progress is not None:
                    progress(min(start + size, n), n)
        finally:
            if size > 1:
                self._prefill_mode(False)
        return logits

    def verify(self, ids: list[int], timer: Timer) -> np.ndarray:
        """One speculative verification pass (``dipdeploy.runtime.speculate``): ``ids`` (at most
        ``EngineConfig.speculate`` + 1) in one run of the joined graph, the groups in prefill mode (the
        union of the tokens' selected rows read once, then the caches warmed from the selections in token
        order), each token selecting against the residency as it stood before the pass; the logits after
        every token, [n, V] (a view of the plan's ``verify_logits``, valid until the next pass)."""
        st, n = self._state, len(ids)
        if n > self.cfg.speculate + 1:
            raise ValueError(f"a verification holds at most {self.cfg.speculate + 1} tokens (speculate + 1), got {n}")
        self._prefill_mode(True)
        try:
            timer.start()
            hidden = self.fused.chunk_hidden.array[: n * self.d].reshape(n, self.d)
            for j, t in enumerate(ids):
                self.embedding.read(int(t), hidden[j])
            timer.lap("embed+head")
            logits = self.fused.verify_chunk(st["pos"], n, self.verify_logits)
            timer.lap("fused graph")
        finally:
            self._prefill_mode(False)
        self._drain_graph_reads()
        timer.lap("cache")
        st["pos"] += n
        st["ids"].extend(int(t) for t in ids)
        return logits

    def draft_mode(self, on: bool) -> None:
        """The target as its own speculative draft (``--draft cache``): in draft mode every step multiplies
        the selection's resident rows only, reads nothing and leaves the caches as they are (the op
        library's ``dd_cache_draft``); it needs the overlap graph, which has a product over the resident
        rows alone."""
        from dipdeploy.runtime.native_cache import draft

        if on and not self.fused.overlap:
            raise ValueError("--draft cache multiplies the resident rows alone, which the joined decoder's overlap "
                             "graph does (--io direct with overlapped reads); give --io direct, or --draft MODEL")
        draft(self._cache_library, self.fused.handles, on)
        self._drafting = on

    def step(self, token: int, timer: Timer, record=None) -> np.ndarray:
        """One token through the joined decoder; its reads are counted from the native groups' totals."""
        if record is not None:
            raise ValueError(self.per_layer_only("per-layer selections"))
        token = int(token)
        st, probe = self._state, None if self._drafting else self.read_ahead
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

    def _chunk(self, ids: list[int], timer: Timer) -> np.ndarray:
        """A chunk of the prompt through the joined decoder in one run, the groups in prefill mode (set by
        ``prefill``): the per-layer path's batched prefill (``PerLayerDecoder._prefill_chunk``) inside the graph."""
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


class JoinedModel:
    """The joined decoder in one ORT session bound to preallocated buffers and to the groups' slabs and
    native state (``bind_groups`` after every cache reset: a reset makes new native groups).

    A batched prefill (``chunk`` > 1 tokens per run) runs the same session through a second binding: the
    slab inputs bound to the engine's full-height prefill buffers, every residency input to all-resident
    (the prompt selects by plain DIP, as the per-layer path's batched prefill does), while the groups are
    in ``NativeCache.prefill`` mode, in which the same CacheStep/CacheSettle nodes fill those buffers
    with a chunk's rows and warm the caches from its selections."""

    def __init__(self, files: BundleDir, manifest, options, kv, context: int, d: int, vocab: int, layers: int,
                 gamma: float | None, accuracy_level: int | None, chunk: int = 1, overlap: bool = False,
                 prefetch: bool = False, given=()):
        graphs = set(manifest.graphs.get("decoder") or [])
        form = "prefetch" if overlap and prefetch and JOINED["prefetch"] in graphs else "overlap" if overlap else "step"
        if JOINED[form] not in graphs:
            raise BundleError(f"the manifest names no joined decoder {JOINED[form]}; {REGENERATE}")
        self.overlap = overlap  # CacheBegin/CacheEnd: the misses read while the resident rows are multiplied
        self.reads_ahead = form == "prefetch"  # a CachePrefetch before the pre-norm layers' attention
        # with standard attention, export checked that only a Concat or a Shape reads each past
        # (``export.joined.check_past_readers``, as ``check_past_consumers`` does for model.onnx)
        # ORT's memory patterns are planned per set of input shapes, and the attention mask grows by one
        # position per token: without them the arena does not keep a plan per length
        # (benchmarks/results/memory.md)
        options.enable_mem_pattern = False
        self.session = open_session(files, options, gamma, accuracy_level, name=JOINED[form], given=given)
        self.bound = Bound(self.session)
        self.kv, self.context, self.layers, self.chunk = kv, context, layers, chunk
        self.hidden = np.zeros((1, 1, d), np.float32)
        self.positions = Buffer(np.zeros(chunk, np.int64))
        self.mask = Buffer(np.ones(context, np.int64))
        self.logits = np.zeros((1, 1, vocab), np.float32)
        self.bound.input("hidden", self.hidden)
        self.bound.output("logits", self.logits)
        # bundles exported before speculation have no logits_from input: their graph cuts to the last position
        self.logits_from = JOINED_LOGITS_FROM in {a.name for a in self.session.get_inputs()}
        last = np.full(1, -1, np.int64)
        if self.logits_from:
            self.bound.input(JOINED_LOGITS_FROM, last)
        self.handles = np.zeros(2 * layers, np.int64)  # bound: the graph reads each group's handle here
        self.prefill_bound = self.chunk_hidden = self.verify_bound = None
        if chunk > 1:
            self.prefill_bound = Bound(self.session)
            self.chunk_hidden = Buffer(np.zeros(chunk * d, np.float32))
            self.prefill_bound.output("logits", self.logits)
            if self.logits_from:
                self.prefill_bound.input(JOINED_LOGITS_FROM, last)
                # a speculative verification: the prefill's buffers, the caches' own residency, every
                # position's logits (dipdeploy.runtime.speculate)
                self.verify_bound = Bound(self.session)
                self.verify_bound.input(JOINED_LOGITS_FROM, np.zeros(1, np.int64))

    def slab_inputs(self, layer: int, group: str) -> list:
        """The session's slab inputs of one group with the per-layer graph's names (``up_gate.qweight``…),
        as ``slab.group_arrays`` takes them."""
        prefix = joined_input(layer, group + ".")
        return [_Arg(a.name[len(joined_input(layer, "")):], a.shape) for a in self.session.get_inputs()
                if a.name.startswith(prefix) and not a.name.endswith(".handle")]

    def bind_groups(self, slabs, full=None) -> None:
        """Bind every group's slab arrays, residency and native handle (``GroupSlab.native_state``); with a
        prefill binding, also its full-height buffers (``full(slab)``: the slab arrays' names → buffers)
        and all-resident residency."""
        b, p = self.bound, self.prefill_bound
        everything = {}
        for i, pair in enumerate(slabs):
            for g, (group, slab) in enumerate(zip(MLP_GROUPS, pair)):
                nat = slab.native_state()
                residency = joined_input(i, ("cache_in", "cache_glu")[g])
                handle = self.handles[2 * i + g: 2 * i + g + 1]
                self.handles[2 * i + g] = nat.handle
                for name, value in slab.feeds.items():
                    b.input(joined_input(i, name), value)
                b.input(residency, nat.state.resident.view(bool))
                b.input(joined_input(i, f"{group}.handle"), handle)
                if p is None:
                    continue
                for name, value in {**slab.arrays.shared, **full(slab)}.items():
                    p.input(joined_input(i, name), value)
                p.input(residency, everything.setdefault(slab.rows, np.ones(slab.rows, bool)))
                p.input(joined_input(i, f"{group}.handle"), handle)
                if self.verify_bound is not None:
                    v = self.verify_bound
                    for name, value in {**slab.arrays.shared, **full(slab)}.items():
                        v.input(joined_input(i, name), value)
                    v.input(residency, nat.state.resident.view(bool))
                    v.input(joined_input(i, f"{group}.handle"), handle)

    def run(self, pos: int) -> np.ndarray:
        """One token (``hidden`` already holds its embedding) at position ``pos``; the logits [V] (a view of
        the bound buffer). The KV cache advances by one."""
        if pos + 1 > self.context:
            raise ValueError(f"context of {self.context} tokens is full; raise --context")
        b = self.bound
        self.positions.array[0] = pos
        b.input_at("position_ids", self.positions, (1, 1))
        b.input_at("attention_mask", self.mask, (1, pos + 1))
        self.kv.bind_session(b, 1)
        b.run()
        self.kv.commit_session()
        self.kv.advance(1)
        return self.logits[0, -1]

    def run_chunk(self, pos: int, n: int) -> np.ndarray:
        """``n`` ≤ ``chunk`` tokens (``chunk_hidden`` holds their embeddings) at positions ``pos``…, through
        the prefill binding, the groups in prefill mode; the logits [V] after the last one."""
        if self.prefill_bound is None or not 1 <= n <= self.chunk:
            raise ValueError(f"a chunk holds 1 to {self.chunk if self.prefill_bound else 0} tokens, got {n}")
        self._run_chunk(self.prefill_bound, pos, n)
        return self.logits[0, -1]

    def verify_chunk(self, pos: int, n: int, logits: Buffer) -> np.ndarray:
        """``n`` ≤ ``chunk`` tokens as ``run_chunk`` runs them, but each selecting against the caches'
        residency as it stood before the run (γ applies, as in decode) and with the logits after every
        one of them, [n, V] in ``logits`` (``dipdeploy.runtime.speculate``: one verification pass)."""
        if self.verify_bound is None:
            raise ValueError(f"speculative decoding verifies through the joined decoder's logits_from input, "
                             f"which this bundle's graph lacks; {REGENERATE}")
        if not 1 <= n <= self.chunk:
            raise ValueError(f"a verification holds 1 to {self.chunk} tokens, got {n}")
        vocab = self.logits.shape[-1]
        self.verify_bound.output_at("logits", logits, (1, n, vocab))
        self._run_chunk(self.verify_bound, pos, n)
        return logits.array[: n * vocab].reshape(n, vocab)

    def _run_chunk(self, b: Bound, pos: int, n: int) -> None:
        if pos + n > self.context:
            raise ValueError(f"context of {self.context} tokens is full; raise --context")
        self.positions.array[:n] = np.arange(pos, pos + n)
        b.input_at("hidden", self.chunk_hidden, (1, n, self.hidden.shape[-1]))
        b.input_at("position_ids", self.positions, (1, n))
        b.input_at("attention_mask", self.mask, (1, pos + n))
        self.kv.bind_session(b, n)
        b.run()
        self.kv.commit_session()
        self.kv.advance(n)




class _Arg:
    """A graph input as ``slab.group_arrays`` reads it (ORT's ``NodeArg``: name and shape)."""

    def __init__(self, name: str, shape):
        self.name, self.shape = name, shape
