"""One session per token: the bundle's ``model.onnx`` when the plan holds every MLP row.

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
``single_session=False`` (``backends.whole.WholeDecoder.per_layer_only``). ``--stats`` reports every lookup as a hit (all
rows are resident) and no Flash traffic; ``chat`` state, batched prefill (chunks of ``prefill_chunk``
tokens), token-by-token prefill and streaming text work as in the per-layer path. ORT maps the external
data of ``model.onnx`` (``dense.bin``, ``mlp.bin``) and prepacks MatMulNBits' weights, so the plan counts
both files whole (``whole_residency``).

Torch-free (floor 5).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dipdeploy.bundle.manifest import REGENERATE, BundleError
from dipdeploy.bundle.names import MLP_FILE
from dipdeploy.cache import policy_of
from dipdeploy.runtime.budget import DramBudget, Residency
from dipdeploy.runtime.kv import KvCache
from dipdeploy.runtime.sessions import Bound, Buffer, open_session

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


def check_past_consumers(model_path: Path, layers: int) -> None:
    """Refuse a standard-attention ``model.onnx`` where a past K/V is read by anything but its Concat or a
    Shape: the shifted present buffers (module docstring) would otherwise overwrite a past still to be read."""
    import onnx

    check_past_readers(onnx.load(str(model_path), load_external_data=False).graph, layers, str(model_path))


def check_past_readers(graph, layers: int, where: str) -> None:
    """``check_past_consumers`` on a loaded graph (``where`` names it in the error)."""
    past = {f"past_key_values.{i}.{w}" for i in range(layers) for w in ("key", "value")}
    for node in graph.node:
        for name in set(node.input) & past:
            if node.op_type not in ("Concat", "Shape"):
                raise BundleError(f"{where}: {name} is read by a {node.op_type} node ({node.name}), so the KV "
                                  f"cache cannot be written in place; {REGENERATE}")


class WholeModel:
    """``model.onnx`` in one ORT session bound to preallocated buffers (see the module docstring)."""

    def __init__(self, path: Path, options, kv: KvCache, context: int, chunk: int, vocab: int,
                 accuracy_level: int | None = None):
        model = path / "model.onnx"
        if not model.is_file():
            raise BundleError(f"{path}: model.onnx is missing; {REGENERATE}")
        if kv.attention == "standard":
            check_past_consumers(model, kv.shape.layers)
        self.kv, self.context, self.chunk, self.vocab = kv, context, chunk, vocab
        self.bound = Bound(open_session(model, options, None, accuracy_level))
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
