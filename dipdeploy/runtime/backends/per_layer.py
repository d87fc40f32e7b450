"""The per-layer backend: a bundle's per-layer graphs in their own sessions with the host cache step.

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

then ``head.onnx`` → logits → the sampler. A batched prefill (``PerLayerDecoder.prefill``, the default)
runs the same graphs on the prompt's tokens at once (their inputs are symbolic in the sequence length),
in chunks of at most ``EngineConfig.prefill_chunk`` tokens, so its buffers are bounded and planned, and
warms the caches from their selections in token order (docs/runtime.md). γ = 1 with an
all-resident cache is plain DIP. :class:`SlabDecoder` holds what this path shares with the joined one
(``backends.joined``): the embedding rows, the DRAM plan and the groups' slabs over the Flash store, the
caches' reset, the prefill's full-height buffers. Torch-free (floor 5).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from dipdeploy.bundle.manifest import REGENERATE, BundleError
from dipdeploy.cache import policy_of, static_rows
from dipdeploy.flash import bounce_bytes
from dipdeploy.runtime import staging
from dipdeploy.runtime.backends import HostBound
from dipdeploy.runtime.budget import DramBudget, GroupShape, Residency, plan_residency
from dipdeploy.runtime.embedding import EmbeddingRows
from dipdeploy.runtime.positions import PositionValues
from dipdeploy.runtime.sessions import Bound, Buffer, SharedInitializers, open_session, shared_arena
from dipdeploy.runtime.slab import GroupSlab, group_arrays
from dipdeploy.runtime.stats import Timer
from dipdeploy.runtime.threadpool import pool_options


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


class SlabDecoder(HostBound):
    """The per-layer graphs' rows in DRAM slabs over the Flash store (``_slab_args`` and ``_bind`` are the
    per-layer and the joined decoders' own)."""

    all_resident = False
    whole = None  # the one-session model: not this one
    fused = None

    def __init__(self, host):
        from dipdeploy.arch import arch_of

        super().__init__(host)
        config = (self.manifest.source or {}).get("config") or {}
        self.embedding = EmbeddingRows(self.files, self.manifest, arch_of(config).embedding_multiplier(config))
        self.shared = SharedInitializers(self.files, self.manifest)

    @property
    def read_ahead_setting(self) -> str | None:
        return None

    def open_slabs(self) -> None:
        """The DRAM plan over the groups' arrays and their slabs, reading misses from the engine's Flash store."""
        m, cfg = self.manifest, self.cfg
        arrays = []
        for i in range(self.num_layers):
            up_args, down_args = self._slab_args(i)
            arrays.append((group_arrays(m, self.files, i, "up_gate", up_args),
                           group_arrays(m, self.files, i, "down", down_args)))
        def shape(rows: int, group, k: int) -> GroupShape:
            return GroupShape(rows, group.row_bytes, k, staging.window_bytes([a.row_bytes for a in group.per_row], k))

        shapes = [[shape(self.d, a, k_in), shape(self.f, b, k_glu)] for (a, b), (k_in, k_glu) in zip(arrays, self.k)]
        share = staging.supported() if cfg.shared_staging is None else cfg.shared_staging
        if share and not staging.supported():
            raise ValueError("shared staging needs memfd_create (Linux); leave shared_staging unset")
        shared = sum(a.shared_bytes + b.shared_bytes for a, b in arrays)
        dense = m.sizes.get("bytes_dense", 0) - self.host._embedding_bytes() + self.embedding.nbytes + shared
        batch = cfg.prefill == "batch"  # the joined graph's activations for a chunk are ORT's, of the same sizes
        self._prefill_shapes = _prefill_buffers(arrays, (self.d, self.f)) if batch else {}
        self._chunk_shapes = _chunk_buffers(min(cfg.prefill_chunk, cfg.context), self.d, self.f, self.k) if batch else {}
        prefill = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in self._prefill_shapes)
        prefill += sum(n * np.dtype(dtype).itemsize for n, dtype in self._chunk_shapes.values())
        prefill += (cfg.speculate + 1) * self.decoder["vocab_size"] * 4 if cfg.speculate else 0  # verify_logits
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
        # a speculative verification's logits, [speculate + 1, vocab] (in the plan above)
        self.verify_logits = Buffer(np.zeros((cfg.speculate + 1) * self.decoder["vocab_size"] if cfg.speculate
                                             else 0, np.float32))
        self._chunk_arrays: dict = {}
        self.slabs = [tuple(GroupSlab(arr, rows, k, cap, self.flash, self._cache_library, self.shared_staging)
                            for arr, rows, k, cap in zip(pair, (self.d, self.f), k_pair, caps))
                      for pair, k_pair, caps in zip(arrays, self.k, self.residency.capacity)]
        self.row_bytes = [(a.row_bytes, b.row_bytes) for a, b in arrays]
        self.dram_dense_per_token = m.sizes.get("bytes_dense", 0) - self.host._embedding_bytes()
        self._bind(read)

    def reset(self, future: list[tuple[np.ndarray, np.ndarray]] | None, policy: str) -> None:
        """Fresh caches for a new sequence (``static`` pins its rows now, ``belady`` takes ``future``)."""
        for i, pair in enumerate(self.slabs):
            for g, slab in enumerate(pair):
                pinned = None
                if policy_of(policy).pinned:
                    counts = (self.cfg.pinned_counts[i][g] if self.cfg.pinned_counts is not None
                              else np.zeros(slab.rows))
                    pinned = static_rows(np.asarray(counts), slab.capacity)
                slab.reset(policy, future=None if future is None else future[i][g], pinned=pinned)

    def _full_buffers(self, slab: GroupSlab) -> dict[str, np.ndarray]:
        """``slab``'s per-row arrays' names → the batched prefill's full-height buffers (one per shape,
        shared by every layer: ``_prefill_buffers``), allocated on first use."""
        if self._prefill_arrays is None:
            self._prefill_arrays = {key: np.zeros(key[0], key[1]) for key in self._prefill_shapes}
        return {a.name: self._prefill_arrays[((slab.rows, *a.row_shape), str(np.dtype(a.dtype)))]
                for a in slab.arrays.per_row}

    def close(self) -> None:
        for pair in self.slabs:
            for slab in pair:
                slab.close()
        self.embedding.close()
        if self.shared_staging is not None:
            self.shared_staging.close()


class PerLayerDecoder(SlabDecoder):
    """The per-layer sessions with the host cache step (numpy or the op library's, ``native_cache``)."""

    records_selections = True

    def __init__(self, host, session_options, native: bool):
        super().__init__(host)
        self._lookups = np.zeros((self.num_layers, 2, 2), np.int64)
        self._open_sessions(session_options, native)

    def _open_sessions(self, session_options, native: bool) -> None:
        files = self.manifest.graphs["layers"]
        gamma = None if self.gamma == self.baked_gamma else self.gamma  # rewrite the graphs only when it differs

        def sess(name: str, g: float | None = None) -> Bound:
            if name not in files:
                raise BundleError(f"{self.path}: graph {name} is missing from the manifest; {REGENERATE}")
            options = pool_options(session_options(self.cfg.threads, native), self.cfg.threads, self.cfg.thread_pool)
            options = self.shared.apply(shared_arena(options))
            return Bound(open_session(self.files, options, g, self.cfg.accuracy_level, name=name,
                                      given=self.shared.values))

        self.head = sess("head.onnx")
        self.positions = sess("positions.onnx")
        self.attn = [sess(f"layer.{i}.attn.onnx", gamma) for i in range(self.num_layers)]
        self.up = [sess(f"layer.{i}.mlp_up.onnx", gamma) for i in range(self.num_layers)]
        self.down = [sess(f"layer.{i}.mlp_down.onnx") for i in range(self.num_layers)]

    def _slab_args(self, i: int) -> tuple[list, list]:
        return ([a for a in self.up[i].session.get_inputs() if a.name.startswith("up_gate.")],
                [a for a in self.down[i].session.get_inputs() if a.name.startswith("down.")])

    def _bind(self, read: int) -> None:
        self._bind_buffers()

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

    def reset(self, future: list[tuple[np.ndarray, np.ndarray]] | None, policy: str) -> None:
        super().reset(future, policy)
        self._lookups[...] = 0

    def lookups(self) -> np.ndarray:
        return self._lookups.copy()

    def per_layer_only(self, what: str) -> str:
        return f"{what}: this engine runs the per-layer graphs"  # never refused here (records_selections)

    def step(self, token: int, timer: Timer, record=None) -> np.ndarray:
        """Feed one token; returns the logits [V] of the next one. ``record(layer, sel_in, sel_glu,
        hits_in, hits_glu)`` gets each layer's selections as views of the graph buffers, which the next
        token overwrites: a recorder that keeps them copies them."""
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
            self._count(i, hits_in, hits_glu)
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

    def verify(self, ids: list[int], timer: Timer) -> np.ndarray:
        raise ValueError("speculative decoding verifies through the joined decoder or model.onnx, and this engine "
                         "runs the per-layer graphs: drop --no-fused / --per-layer")

    def draft_mode(self, on: bool) -> None:
        if on:
            self.verify([], Timer())

    def _count(self, i: int, hits_in: np.ndarray, hits_glu: np.ndarray) -> None:
        """Layer ``i``'s lookups of a token (or a batch of them) into ``lookups``."""
        self._lookups[i, 0] += (np.count_nonzero(hits_in), hits_in.size)
        self._lookups[i, 1] += (np.count_nonzero(hits_glu), hits_glu.size)

    def prefill(self, ids: list[int], timer: Timer, record=None,
                progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Feed ``ids`` in chunks of at most ``EngineConfig.prefill_chunk`` tokens, each one batch per
        layer (``_prefill_chunk``); returns the logits [V] after the last token. A chunk attends to the
        earlier ones through the KV cache, as a decoded token does, so chunking changes only the
        floating-point summation, and bounds the working set by the chunk instead of the prompt.
        ``progress(done, total)`` follows each chunk."""
        n = len(ids)
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
        (docs/runtime.md: batched prefill). The activations are the chunk buffers, views of
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
            self._count(i, hits_in, hits_glu)
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
