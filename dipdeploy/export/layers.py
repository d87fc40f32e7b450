"""Per-layer graphs for the host runtime: the decoder cut where the host must act.

A host runtime (``dipdeploy.runtime``) keeps a DRAM slab of MLP rows per layer and group, decides which selected
rows are missing, reads them from ``mlp.bin`` (Flash layout, offsets in the manifest), and runs the
sparse MLP on slab slots. So each layer is cut where indices leave the graph:

    embed.onnx              input_ids ─► hidden
    positions.onnx          attention_mask, position_ids ─► what every attention graph of a layer type
                            needs from the positions: the RoPE rows and the additive mask (standard),
                            seqlens_k and the total length (gqa); computed once per token
    layer.{i}.attn.onnx     hidden, mlp_out (i > 0), the positions' values, past kv, cache_in[d]
                            ─► hidden_attn (residual added), x [N,d], in_indices [N,K_in], present kv
    layer.{i}.mlp_up.onnx   x, in_indices, in_slots, up|gate slab arrays, cache_glu[F]
                            ─► glu [N,F], glu_indices [N,K_glu]
    layer.{i}.mlp_down.onnx glu, glu_indices, glu_slots, down slab arrays, hidden_attn ─► mlp_out
    head.onnx               hidden, mlp_out ─► logits

The residual stream crosses a graph boundary as in ``model.onnx``'s layers: ``mlp_out`` is the MLP's
term not yet added to ``hidden`` (layer i − 1's ``hidden_attn``), and the next layer's first norm (the
head's final norm) adds it, one SkipSimplifiedLayerNormalization with ``fuse_norms``.
Each layer's three graphs are the segments of ``layer.py``, which also builds ``model.onnx``'s layers.
The TopKColumnMask nodes take the group's cache residency ``cache_in``/``cache_glu`` (bool [d]/[F])
and the plan's γ and fixed_top_n: this is where DIP-CA happens (all-true residency = plain DIP).
The slab arrays are graph *inputs* (the host binds its DRAM buffers), dense weights are the same
external tensors as in ``model.onnx``: nothing is duplicated on disk. The graphs sit beside
``model.onnx`` (ORT refuses external data outside the model's folder). Torch-free.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from dipdeploy.bundle.names import SLAB_DIM
from dipdeploy.export.blocks import BATCH, SEQ, embed, layer_kinds, per_token_values, shared_for_layers, \
    shared_from_inputs
from dipdeploy.export.decoder import kv_names
from dipdeploy.export.graph import Graph
from dipdeploy.export.layer import Rows, Selection, attention_segment, head_segment, mlp_down_segment, mlp_up_segment
from dipdeploy.export.mlp import MlpTensors
from dipdeploy.export.weights import WeightStore

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


class LayerGraphs:
    """Builds and saves the per-layer graphs while the decoder is built (same weights, same store)."""

    def __init__(self, spec, store: WeightStore, plan, accuracy_level: int, root: Path, rope: dict,
                 attention_op: str = "standard", fuse_norms: bool = True):
        self.spec, self.store, self.plan, self.acc = spec, store, plan, accuracy_level
        self.attention_op, self.fuse = attention_op, fuse_norms
        self.dir = Path(root)
        self.rope = rope  # per layer type: blocks.RopeTable
        self.files: list[str] = []
        self.gamma = plan.gamma if plan.method == "dip-ca" else 1.0

    def _save(self, g: Graph, name: str) -> None:
        onnx.save_model(g.model(doc=f"dipdeploy per-layer graph {name}"), str(self.dir / name))
        self.files.append(name)

    def add_layer(self, i: int, lw, t: MlpTensors) -> None:
        lp = self.plan.layers[i]
        self._attn(i, lw, lp.k_in)
        self._mlp_up(i, t, lp.k_glu)
        self._mlp_down(i, lw, t)

    def _attn(self, i: int, lw, k_in: int) -> None:
        spec, st = self.spec, self.store
        g = Graph(f"layer{i}_attn", self.acc)
        hidden = [BATCH, SEQ, spec.hidden_size]
        h = g.input("hidden", FLOAT, hidden)
        pending = g.input("mlp_out", FLOAT, hidden) if i > 0 else None
        kind = spec.layer_types[i]
        shared, attend = shared_from_inputs(g, st, spec, self.rope[kind], self.attention_op, kind,
                                            layer_kinds(spec)[kind])
        past_k, past_v, pres_k, pres_v = kv_names(i)
        kv = [BATCH, spec.num_kv_heads, "past_sequence_length", spec.head_dim]
        g.input(past_k, FLOAT, kv)
        g.input(past_v, FLOAT, kv)
        cache = g.input("cache_in", BOOL, [spec.hidden_size])
        seg = attention_segment(g, st, spec, i, lw, h, pending, shared, attend, past_k, past_v, self.fuse,
                                k_in, self._norm(g, i, "colnorm_in"), self._selection(cache))
        present = [BATCH, spec.num_kv_heads, "total_sequence_length", spec.head_dim]
        g.output(seg.residual, "hidden_attn", FLOAT, hidden)
        g.output(seg.x, "x", FLOAT, ["N", spec.hidden_size])
        g.output(seg.in_indices, "in_indices", INT64, ["N", k_in])
        g.output(seg.present_k, pres_k, FLOAT, present)
        g.output(seg.present_v, pres_v, FLOAT, present)
        self._save(g, f"layer.{i}.attn.onnx")

    def _selection(self, cache: str) -> Selection:
        return Selection(cache, self.gamma, self.plan.fixed_top_n)

    def _slab_inputs(self, g: Graph, prefix: str, names: list[str], fmt: str) -> list[str]:
        """The group's arrays as graph inputs: per-row arrays get a free ``slab_rows`` first dim (the
        host runtime reads that dim to know what it streams), the format's shared tables (VQ3
        codebooks and their scales) keep their shape."""
        from dipdeploy.ops.formats import weight_format

        shared = weight_format(fmt).shared
        out = []
        for k, n in enumerate(names):
            e = self.store.entries[n]
            shape = list(e.shape) if k in shared else [SLAB_DIM, *e.shape[1:]]
            elem = helper.np_dtype_to_tensor_dtype(np.dtype(e.dtype))
            out.append(g.input(f"{prefix}.{n.rsplit('.', 1)[-1]}", elem, shape))
        return out

    def _norm(self, g: Graph, i: int, key: str) -> str | None:
        name = f"model.layers.{i}.mlp.{key}"
        return g.weight(self.store.proto(name)) if name in self.store.entries else None

    def _mlp_up(self, i: int, t: MlpTensors, k_glu: int) -> None:
        spec = self.spec
        g = Graph(f"layer{i}_mlp_up", self.acc)
        x = g.input("x", FLOAT, ["N", spec.hidden_size])
        k_in = self.plan.layers[i].k_in
        idx = g.input("in_indices", INT64, ["N", k_in])
        slots = g.input("in_slots", INT64, ["N", k_in])
        rows = Rows(self._slab_inputs(g, "up_gate", t.up_gate, t.up_gate_attrs["fmt"]), t.up_gate_attrs, slots)
        cache = g.input("cache_glu", BOOL, [spec.intermediate_size])
        out, gidx = mlp_up_segment(g, spec, i, x, idx, rows, k_glu, self._norm(g, i, "colnorm_glu"),
                                   self._selection(cache))
        g.output(out, "glu", FLOAT, ["N", spec.intermediate_size])
        g.output(gidx, "glu_indices", INT64, ["N", k_glu])
        self._save(g, f"layer.{i}.mlp_up.onnx")

    def _mlp_down(self, i: int, lw, t: MlpTensors) -> None:
        spec = self.spec
        g = Graph(f"layer{i}_mlp_down", self.acc)
        k_glu = self.plan.layers[i].k_glu
        glu = g.input("glu", FLOAT, ["N", spec.intermediate_size])
        idx = g.input("glu_indices", INT64, ["N", k_glu])
        slots = g.input("glu_slots", INT64, ["N", k_glu])
        rows = Rows(self._slab_inputs(g, "down", t.down, t.down_attrs["fmt"]), t.down_attrs, slots)
        h = g.input("hidden_attn", FLOAT, ["batch_size", "sequence_length", spec.hidden_size])
        y = mlp_down_segment(g, self.store, spec, i, lw, glu, idx, rows, h)
        g.output(y, "mlp_out", FLOAT, [BATCH, SEQ, spec.hidden_size])
        self._save(g, f"layer.{i}.mlp_down.onnx")

    def _positions(self) -> None:
        """``positions.onnx``: ``model.onnx``'s shared values (``blocks.shared_for_layers``), one output
        per per-token value of each layer type (``blocks.per_token_values``)."""
        spec = self.spec
        g = Graph("positions", self.acc)
        mask = g.input("attention_mask", INT64, [BATCH, "total_sequence_length"])
        pos = g.input("position_ids", INT64, [BATCH, SEQ])
        shared, _ = shared_for_layers(g, self.store, spec, self.rope, self.attention_op, pos, mask, pos)
        for kind, tag in layer_kinds(spec).items():
            for v in per_token_values(self.attention_op, self.rope[kind], tag):
                g.output(getattr(shared[kind], v.field), v.name, v.elem, list(v.shape))
        # the GQA half tables are the attention graphs' weights: this graph needs none of them
        used = {t for n in g.nodes for t in n.input}
        g.initializers = {k: v for k, v in g.initializers.items() if k in used}
        self._save(g, "positions.onnx")

    def finish(self, source) -> list[str]:
        """Write ``embed.onnx``, ``positions.onnx`` and ``head.onnx`` (after the decoder wrote their weights)."""
        spec, st = self.spec, self.store
        hidden = [BATCH, SEQ, spec.hidden_size]
        g = Graph("embed", self.acc)
        ids = g.input("input_ids", INT64, [BATCH, SEQ])
        h = embed(g, st, spec, ids)
        g.output(h, "hidden", FLOAT, hidden)
        self._save(g, "embed.onnx")
        self._positions()
        g = Graph("head", self.acc)
        h = g.input("hidden", FLOAT, hidden)
        pending = g.input("mlp_out", FLOAT, hidden)
        out = head_segment(g, st, spec, h, pending, source.final_norm(), source.lm_head(), self.fuse)
        g.output(out, "logits", FLOAT, [BATCH, SEQ, spec.vocab_size])
        self._save(g, "head.onnx")
        return list(self.files)
