"""The one-session backend: the bundle's ``model.onnx`` once per token where the plan holds every MLP row.

At a budget that holds every MLP row nothing is ever evicted, so once a row has been used it stays:
the per-layer path's host cache step has nothing left to decide. The rule of this mode is that **all
rows are resident from the start**, so DIP-CA's score (which only lowers the rows the cache does not
hold) is plain DIP with the plan's K — what ``model.onnx`` computes (its TopKColumnMask nodes have
γ = 1 and no cache input). The per-layer path at the same budget starts with empty caches, so its
DIP-CA selections differ from plain DIP until the rows it needs are resident; ``EngineConfig.
single_session=False`` (``--per-layer``) keeps that behaviour.

``Engine`` then runs ``model.onnx`` once per token (and once per prefill chunk) with IOBinding, as
onnxruntime-genai does: every fixed buffer (token ids, positions, the mask, the logits) bound once by
address, the KV cache preallocated for the context (``kv.KvCache``) and written in place:

* ``gqa``: past and present are one buffer per layer and K/V (GroupQueryAttention shares them).
* ``standard``: ``Concat(past, new)`` cannot write its input, so layer i's present is written into
  the buffer that held layer i − 1's past (layer 0's into the spare), and the ownership shifts by one
  layer after the run (``KvCache.bind_session``): L + 1 buffers, as the per-layer path keeps. This is
  safe because layer i's Concat depends, through the residual stream, on layer i − 1's attention,
  which has read its past by then; ``check_past_consumers`` refuses a graph where anything other than
  a Concat (or a Shape) reads a past.

What this mode does not have is the per-layer path's selections: a trace for ``simulate``, a
``record`` callback, ``teacher_forced`` selections are refused with one line naming
``single_session=False`` (``WholeDecoder.per_layer_only``). ``--stats`` reports every lookup as a hit (all
rows are resident) and no Flash traffic; ``chat`` state, batched prefill (chunks of ``prefill_chunk``
tokens), token-by-token prefill and streaming text work as in the per-layer path. The session reads the
weights of ``model.onnx`` in place from maps of ``dense.bin`` and ``mlp.bin`` (``sessions.open_session``) and
ORT prepacks MatMulNBits' weights, so the plan counts both files whole (``whole_residency``).

Torch-free (floor 5).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from dipdeploy.bundle.manifest import REGENERATE, BundleError
from dipdeploy.bundle.bundledir import BundleDir
from dipdeploy.bundle.names import MLP_FILE

MODEL = "model.onnx"  # the whole decoder (``graphs.model``)
from dipdeploy.cache import policy_of
from dipdeploy.runtime.backends import HostBound
from dipdeploy.runtime.budget import DramBudget, Residency
from dipdeploy.runtime.kv import KvCache
from dipdeploy.runtime.sessions import Bound, Buffer, graph_bytes, open_session, shared_arena
from dipdeploy.runtime.stats import Timer
from dipdeploy.runtime.threadpool import pool_options

#: the graph's head: the ``logits`` output, [1, n, vocab] floats
LOGITS = "logits"


def whole_residency(manifest, kv_bytes: int, vocab: int, chunk: int, rows: list[tuple[int, int]]) -> Residency:
    """The plan of the one-session mode: ``dense.bin`` whole (ORT holds every tensor ``model.onnx``
    names, the embedding table included), ``mlp.bin`` whole as the caches (every row), the KV cache,
    and the logits of one prefill chunk ([chunk, vocab] floats) plus the token/position buffers."""
    sizes = manifest.sizes
    buffers = chunk * vocab * 4 + 2 * chunk * 8
    return Residency(dense=int(sizes.get("bytes_dense", 0)), kv=kv_bytes, staging=0,
                     caches=int(sizes.get("bytes_mlp", 0)), cache_frac=1.0,
                     capacity=[[d, f] for d, f in rows], prefill=buffers)


def why_not(manifest, budget: DramBudget, policy: str, plan: Residency) -> str | None:
    """Why the one-session mode does not apply to this bundle and budget (None: it does): the bundle has
    no ``model.onnx``, policy ``none`` (which holds no row by definition), or a budget that does not hold
    every row (a share below 100 %, or a size below ``plan.total``)."""
    if "model" not in manifest.graphs:
        return f"the manifest names no model.onnx; {REGENERATE}"
    if policy_of(policy).zero_capacity:
        return f"policy {policy!r} keeps no row resident"
    if budget.cache_frac is not None and budget.cache_frac < 1.0:
        return f"the budget {budget} does not hold every MLP row (give 100%)"
    if budget.total_bytes is not None and budget.total_bytes < plan.total:
        return (f"the budget {budget} is below the {plan.total / 1e6:.1f} MB that model.onnx holds (dense.bin "
                f"and mlp.bin whole, KV cache, logits buffer)")
    return None


def check_past_consumers(model: bytes, layers: int, where: str) -> None:
    """Refuse a standard-attention ``model.onnx`` where a past K/V is read by anything but its Concat or a
    Shape (``export.joined.check_past_readers``): the shifted present buffers (module docstring) would
    otherwise overwrite a past still to be read."""
    import onnx

    from dipdeploy.export.joined import check_past_readers

    check_past_readers(onnx.load_from_string(model).graph, layers, where)


class WholeModel:
    """``model.onnx`` in one ORT session bound to preallocated buffers (see the module docstring)."""

    def __init__(self, files: BundleDir, options, kv: KvCache, context: int, chunk: int, vocab: int,
                 accuracy_level: int | None = None):
        if MODEL not in files.files:
            raise BundleError(f"{files.path}: {MODEL} is missing; {REGENERATE}")
        if kv.attention == "standard":
            check_past_consumers(graph_bytes(files, MODEL), kv.shape.layers, str(files.path / MODEL))
        self.kv, self.context, self.chunk, self.vocab = kv, context, chunk, vocab
        self.bound = Bound(open_session(files, options, None, accuracy_level, name=MODEL))
        self.ids = Buffer(np.zeros(chunk, np.int64))
        self.positions = Buffer(np.zeros(chunk, np.int64))
        self.mask = Buffer(np.ones(context, np.int64))  # batch 1, no padding: bound with the total length
        self.logits = Buffer(np.zeros(chunk * vocab, np.float32))

    def run(self, ids: list[int], pos: int) -> np.ndarray:
        """Feed ``ids`` (at most ``chunk``) at positions ``pos``…; the logits [n, vocab] (a view of the
        bound buffer, overwritten by the next run). The KV cache advances by ``len(ids)``."""
        n = len(ids)
        if not 1 <= n <= self.chunk:
            raise ValueError(f"{n} tokens per run; this session was sized for 1 to {self.chunk}")
        if pos + n > self.context:
            raise ValueError(f"context of {self.context} tokens is full; raise --context")
        b = self.bound
        self.ids.array[:n] = ids
        self.positions.array[:n] = np.arange(pos, pos + n)
        b.input_at("input_ids", self.ids, (1, n))
        b.input_at("position_ids", self.positions, (1, n))
        b.input_at("attention_mask", self.mask, (1, pos + n))
        b.output_at(LOGITS, self.logits, (1, n, self.vocab))
        self.kv.bind_session(b, n)
        b.run()
        self.kv.commit_session()
        self.kv.advance(n)
        return self.logits.array[: n * self.vocab].reshape(n, self.vocab)


def mlp_row_bytes(manifest, layer: int) -> tuple[int, int]:
    """Bytes of one up|gate row and one down row of ``layer``: the group's tensors in ``mlp.bin``."""
    out = []
    for group in ("up_gate", "down"):
        prefix = f"model.layers.{layer}.mlp.{group}."
        total = 0
        for name, t in manifest.tensors.items():
            if name.startswith(prefix) and t.get("file") == MLP_FILE:
                shape = t["shape"]
                total += int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(t["dtype"]).itemsize
        out.append(total)
    return out[0], out[1]


def whole_plan(host) -> Residency | None:
    """The one-session mode's plan where it applies, else None for the per-layer graphs
    (``EngineConfig.single_session``; the rule is ``whole.why_not``). Decided before anything opens: the
    memory checks count what the chosen mode maps."""
    cfg, m = host.cfg, host.manifest
    if cfg.single_session is False:
        return None
    chunk = min(cfg.prefill_chunk, cfg.context) if cfg.prefill == "batch" else 1
    plan = whole_residency(m, host.kv.nbytes, host.decoder["vocab_size"], chunk, [(host.d, host.f)] * host.num_layers)
    reason = why_not(m, DramBudget.parse(cfg.dram_budget), cfg.policy, plan)
    if reason is not None:
        if cfg.single_session:
            raise ValueError(f"one session per token: {reason}; or run the per-layer graphs (--per-layer)")
        return None
    return plan


def open_whole(host, session_options, native: bool, plan: Residency) -> WholeDecoder:
    """The one-session mode's decoder with its plan (``whole_plan``)."""
    cfg = host.cfg
    chunk = min(cfg.prefill_chunk, cfg.context) if cfg.prefill == "batch" else 1
    options = pool_options(session_options(cfg.threads, native), cfg.threads, cfg.thread_pool)
    whole = WholeModel(host.files, shared_arena(options), host.kv, cfg.context, chunk, host.decoder["vocab_size"],
                       cfg.accuracy_level)
    return WholeDecoder(host, whole, plan)


class WholeDecoder(HostBound):
    """``model.onnx`` in one session (``WholeModel``) behind the decoder protocol."""

    all_resident = True
    records_selections = False
    fused = None  # the joined decoder's model: not this one
    read_ahead = read_ahead_setting = None
    shared_staging = embedding = None

    def __init__(self, host, whole, plan: Residency):
        super().__init__(host)
        self.whole = whole
        self.residency = plan
        self.slabs = []
        self.row_bytes = [mlp_row_bytes(self.manifest, i) for i in range(self.num_layers)]
        self.dram_dense_per_token = self.manifest.sizes.get("bytes_dense", 0) - host._embedding_bytes()
        self._resident = np.repeat(np.array(self.k, np.int64)[:, :, None], 2, axis=2)  # every lookup a hit
        self._fed = 0

    def open_slabs(self) -> None:
        pass  # every row is in model.onnx's session

    def reset(self, future=None, policy: str | None = None) -> None:
        self._fed = 0

    def lookups(self) -> np.ndarray:
        return self._fed * self._resident

    def step(self, token: int, timer: Timer, record=None) -> np.ndarray:
        return self._run([int(token)], timer, record)

    def prefill(self, ids: list[int], timer: Timer, record=None,
                progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """``ids`` in chunks of the session's chunk, one run each; the logits [V] after the last."""
        size, n = self.whole.chunk, len(ids)
        for start in range(0, n, size):
            logits = self._run(ids[start:start + size], timer, record)
            if progress is not None:
                progress(min(start + size, n), n)
        return logits

    def verify(self, ids: list[int], timer: Timer) -> np.ndarray:
        """One speculative verification pass (``dipdeploy.runtime.speculate``): ``ids`` in one run, the
        logits after every token [n, V] (a view of the session's logits buffer, valid until the next run)."""
        if len(ids) > self.cfg.speculate + 1:
            raise ValueError(f"a verification holds at most {self.cfg.speculate + 1} tokens (speculate + 1), "
                             f"got {len(ids)}")
        return self._feed(ids, timer)

    def draft_mode(self, on: bool) -> None:
        if on:
            raise ValueError("--draft cache: every row is resident at this budget, so the cache draft would be the "
                             "model itself; give --draft MODEL, a lower --dram-budget, or no --speculate")

    def _run(self, ids: list[int], timer: Timer, record) -> np.ndarray:
        """One ``model.onnx`` run on ``ids``; the logits [V] after the last of them."""
        if record is not None:
            raise ValueError(self.per_layer_only("per-layer selections"))
        return self._feed(ids, timer)[-1].copy()

    def _feed(self, ids: list[int], timer: Timer) -> np.ndarray:
        """``ids`` through ``model.onnx`` in one run, the sequence advanced; the logits after each [n, V]
        (a view of the session's buffer, valid until the next run)."""
        st = self._state
        timer.start()
        logits = self.whole.run(ids, st["pos"])
        timer.lap("model.onnx")
        st["pos"] += len(ids)
        st["ids"].extend(int(t) for t in ids)
        self._fed += len(ids)
        return logits

    def per_layer_only(self, what: str) -> str:
        return (f"{what} need the per-layer graphs, and this engine runs model.onnx in one session (the budget "
                f"holds every row): give single_session=False (--per-layer)")

    def close(self) -> None:
        pass
