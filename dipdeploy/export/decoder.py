"""The whole decoder as one ONNX graph with a KV cache, I/O named as onnxruntime-genai expects.

Inputs ``input_ids`` [B,S], ``attention_mask`` [B,T], ``position_ids`` [B,S],
``past_key_values.{i}.key|value`` [B,Hkv,P,Dh]; outputs ``logits`` [B,S,V] and
``present.{i}.key|value`` [B,Hkv,T,Dh] (T = P + S). The MLPs are dense MatMuls or DIP's
TopKColumnMask/SparseGatherMatMul pairs with K per layer from the plan, fallback functions attached.
Layers are read from the source one at a time, so peak memory is about one layer plus the graph.
Torch-free (the source object does the torch work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from onnx import ModelProto, TensorProto

from dipdeploy.export.blocks import embed, shared_for_layers, write_embedding
from dipdeploy.export.graph import Graph
from dipdeploy.export.layer import (Rows, Selection, attention_segment, head_segment, mlp_down_segment, mlp_output,
                                    mlp_up_segment, residual_add)
from dipdeploy.export.mlp import MlpTensors, dense_mlp, write_mlp
from dipdeploy.export.weights import WeightStore
from dipdeploy.ops.formats import weight_format

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


@dataclass(frozen=True)
class LayerK:
    """K_in, K_glu of one layer (None = dense MLP)."""

    k_in: int | None
    k_glu: int | None

    @property
    def dense(self) -> bool:
        return self.k_in is None


def kv_names(i: int) -> tuple[str, str, str, str]:
    return (f"past_key_values.{i}.key", f"past_key_values.{i}.value", f"present.{i}.key", f"present.{i}.value")


def _initializer(g: Graph, store: WeightStore, name: str | None) -> str | None:
    return g.weight(store.proto(name)) if name else None


def _file_rows(g: Graph, store: WeightStore, i: int, t: MlpTensors, group: str, indices: str) -> str | None:
    """The file row of each selected row (SparseGatherMatMul's slots) where the group is reordered."""
    if group not in t.position:
        return None
    proj = "up_gate_proj" if group == "up_gate" else "down_proj"
    return g.op(f"/model/layers.{i}/mlp/{proj}/position/Gather", "Gather",
                [g.weight(store.proto(t.position[group])), indices], axis=0)


def build_decoder(source, store: WeightStore, ks: list[LayerK], accuracy_level: int = 0,
                  on_layer: Callable[[int, object, MlpTensors], None] | None = None,
                  attention_op: str = "standard", fuse_norms: bool = True,
                  missed: list[tuple] | None = None) -> ModelProto:
    """The decoder graph. ``on_layer(i, layer_weights, mlp_tensors)`` runs after each layer is written
    (the per-layer graphs hook in there, reusing the bytes already in the store). ``attention_op``:
    ``standard`` (opset-21 ops) or ``gqa`` (one com.microsoft::GroupQueryAttention per layer).
    ``fuse_norms``: every residual add and the norm after it as one SkipSimplifiedLayerNormalization
    (``blocks.skip_rms_norm``); the first norm, on the embedding alone, stays ``blocks.rms_norm``.
    ``missed``: per layer, the calibration miss matrices of its two groups (``mlp.write_mlp``): their rows
    are written in the calibrated order, and this graph finds a selected row at its file position
    (``Gather(position, indices)`` as SparseGatherMatMul's slots), so it computes what the logical
    order computes.

        input_ids ─Gather(embed)─► h ─┬─ for each layer i: h += out(attn(norm(h))); h += out(mlp(norm(h)))
        position_ids, attention_mask ─┘  (RoPE rows and the mask bias built once per layer type)
        h ─norm─lm_head─► logits
    ``out`` is ``blocks.sublayer_output`` (the family's sandwich norm and residual multiplier, if any). A
    layer is ``layer.py``'s three segments, as in the per-layer graphs; a dense fp32 MLP is one MatMul pair.
    """
    spec = source.spec
    g = Graph("dipdeploy_decoder", accuracy_level)
    ids = g.input("input_ids", INT64, ["batch_size", "sequence_length"])
    mask = g.input("attention_mask", INT64, ["batch_size", "total_sequence_length"])
    pos = g.input("position_ids", INT64, ["batch_size", "sequence_length"])
    kv_shape = ["batch_size", spec.num_kv_heads, "past_sequence_length", spec.head_dim]
    for i in range(spec.num_layers):
        g.input(kv_names(i)[0], FLOAT, kv_shape)
        g.input(kv_names(i)[1], FLOAT, kv_shape)
    write_embedding(store, source.embedding())
    h = embed(g, store, spec, ids)
    shared, attend = shared_for_layers(g, store, spec, source.rope(), attention_op, ids, mask, pos)
    present_shape = ["batch_size", spec.num_kv_heads, "total_sequence_length", spec.head_dim]
    pending = None  # a sub-layer output not yet added to h (fused norms add it inside the next norm)
    for i in range(spec.num_layers):
        lw = source.layer(i)
        t = write_mlp(store, i, lw.mlp, missed[i] if missed else None)
        dense = ks[i].dense and weight_format(lw.mlp.format).matmul
        past_k, past_v, pres_k, pres_v = kv_names(i)
        seg = attention_segment(g, store, spec, i, lw, h, pending, shared[spec.layer_types[i]], attend, past_k,
                                past_v, fuse_norms, None if dense else ks[i].k_in or spec.hidden_size,
                                _initializer(g, store, t.colnorm_in), Selection())
        g.output(seg.present_k, pres_k, FLOAT, present_shape)
        g.output(seg.present_v, pres_v, FLOAT, present_shape)
        h = seg.residual
        if dense:
            pending = mlp_output(g, store, spec, i, lw, dense_mlp(g, store, i, seg.x, t, spec.intermediate_size,
                                                                   spec.arch.activation))
        else:
            up = Rows([g.weight(store.proto(n)) for n in t.up_gate], t.up_gate_attrs,
                      _file_rows(g, store, i, t, "up_gate", seg.in_indices))
            glu, glu_idx = mlp_up_segment(g, spec, i, seg.x, seg.in_indices, up,
                                          ks[i].k_glu or spec.intermediate_size,
                                          _initializer(g, store, t.colnorm_glu), Selection())
            down = Rows([g.weight(store.proto(n)) for n in t.down], t.down_attrs,
                        _file_rows(g, store, i, t, "down", glu_idx))
            pending = mlp_down_segment(g, store, spec, i, lw, glu, glu_idx, down, h)
        if not fuse_norms:
            h, pending = residual_add(g, i, h, pending), None
        if on_layer is not None:
            on_layer(i, lw, t)
        del lw
    out = head_segment(g, store, spec, h, pending, source.final_norm(), source.lm_head(), fuse_norms)
    g.output(out, "logits", FLOAT, ["batch_size", "sequence_length", spec.vocab_size])
    return g.model(doc="dipdeploy decoder: DIP sparse MLPs (ai.dipdeploy ops with fallback functions)")
