"""The joined backend: the per-layer graphs joined into one session per token with the cache step inside
the graph (``dipdeploy.runtime.fused``: the same native step, at any budget; ``EngineConfig.fused``).
Its batched prefill runs each chunk through the same graph with the per-layer path's semantics; it records
no per-layer selections (traces, Belady, ``teacher_forced``), and its lookups and reads are counted from
the native groups' totals. Torch-free (floor 5).
"""

from __future__ import annotations

import importlib.util
from typing import Callable

import numpy as np

from dipdeploy.flash import BLOCK, MAX_REQUEST
from dipdeploy.runtime.backends.per_layer import SlabDecoder
from dipdeploy.runtime.native_cache import read_ahead
from dipdeploy.runtime.readahead import ReadAheadProbe
from dipdeploy.runtime.sessions import shared_arena
from dipdeploy.runtime.stats import Timer
from dipdeploy.runtime.threadpool import pool_options


def why_not(host, native: bool) -> str | None:
    """Why the joined decoder cannot run ``host``'s engine (``EngineConfig.fused``), None when it can."""
    from dipdeploy.runtime import fused
    from dipdeploy.runtime.native_cache import graph_step_library

    reason = fused.why_not(host.cfg, host.manifest, host.num_layers)
    if reason is None and importlib.util.find_spec("onnx") is None:
        reason = "joining the per-layer graphs needs the onnx package (pip install onnx)"
    if reason is None and not native:
        reason = "the cache step in the graph is the op library's: build it (make ops)"
    if reason is None and (host._cache_library is None or graph_step_library(host._cache_library) is None):
        reason = "the op library predates the cache step in the graph: rebuild it (make ops)"
    return reason


class JoinedDecoder(SlabDecoder):
    """One ``fused.FusedModel`` session per token (and per prefill chunk) over the slabs."""

    records_selections = False

    def __init__(self, host, session_options, native: bool):
        from dipdeploy.runtime import fused

        super().__init__(host)
        self.read_ahead = None  # --prefetch auto: the probe that chooses
        options = pool_options(session_options(self.cfg.threads, native), self.cfg.threads, self.cfg.thread_pool)
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

    def prefill(self, ids: list[int], timer: Timer, record=None,
                progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Each chunk of ``ids`` through the joined graph in one run (``_chunk``), the groups in prefill
        mode; the logits [V] after the last token."""
        n = len(ids)
        if record is not None:
            raise ValueError(self.per_layer_only("per-layer selections"))
        size = self.fused.chunk
        slabs = [slab for pair in self.slabs for slab in pair]
        if size > 1:
            for slab in slabs:
                full = self._full_buffers(slab)
                slab.native_state().prefill([full[a.name] for a in slab.arrays.per_row])
        try:
            for start in range(0, n, size):
                chunk = ids[start:start + size]
                logits = self._chunk(chunk, timer) if size > 1 else self.step(int(chunk[0]), timer, None)
                if progress is not None:
                    progress(min(start + size, n), n)
        finally:
            if size > 1:
                for slab in slabs:
                    slab.native_state().prefill(None)
        return logits

    def step(self, token: int, timer: Timer, record=None) -> np.ndarray:
        """One token through the joined decoder; its reads are counted from the native groups' totals."""
        if record is not None:
            raise ValueError(self.per_layer_only("per-layer selections"))
        token = int(token)
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
