"""One decoder layer as its three segments, and the head, each emitted by one builder (the embedding is
``blocks.embed``).

    attention segment  [norm(pending + h)] → attention → [out norm] → residual → norm → x ─TopKColumnMask─► in_indices
    MLP up|gate        x, in_indices ─SparseGatherMatMul(up|gate rows)─GLU─TopKColumnMask─► glu, glu_indices
    MLP down           glu, glu_indices ─SparseGatherMatMul(down rows)─[out norm]─► the MLP's residual term

``decoder.build_decoder`` emits all of them into ``model.onnx``; ``layers.LayerGraphs`` emits each into
its own graph, cut where the host runtime acts (layers.py). Both call the same functions with the same
node names, norms (fused ones included: ``ExportConfig.fuse_norms``) and attributes, so the runtime's
graphs compute what ``model.onnx`` computes; they differ only in how a graph sees the MLP rows
(initializers, or the host's slab rows with their slots: :class:`Rows`) and the cache (none: plain DIP,
or the group's residency with the plan's γ: :class:`Selection`; export/DESIGN.md, "DIP-CA: who does the
cache-aware masking"), and in where the
attention's shared values come from (computed in the graph, or ``positions.onnx``'s outputs as inputs:
``blocks.shared_from_inputs``). Where the residual stream crosses a graph boundary (a layer's input, the
head's norm) the MLP's term travels unadded (``mlp_out``) and the next norm adds it, as in ``model.onnx``.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from dipdeploy.export.blocks import Linear, logits, residual_then_norm, sublayer_output
from dipdeploy.export.graph import Graph
from dipdeploy.export.mlp import glu
from dipdeploy.export.spec import ArchSpec
from dipdeploy.export.weights import WeightStore
from dipdeploy.ops.nodes import sparse_gather_matmul_node, topk_column_mask_node


@dataclass(frozen=True)
class Selection:
    """What a layer's TopKColumnMask nodes see of the DRAM cache: nothing (``model.onnx`` runs plain DIP)
    or the group's residency input with the plan's γ and fixed_top_n (the per-layer graphs: DIP-CA)."""

    cache: str | None = None
    gamma: float = 1.0
    fixed_top_n: int = 0


@dataclass(frozen=True)
class Rows:
    """One MLP group's row arrays as a graph sees them (initializers or slab inputs), their format's node
    attributes and the slab slot of each selected row (None: the arrays hold every row)."""

    arrays: list[str]
    attrs: dict
    slots: str | None = None


@dataclass(frozen=True)
class AttnOut:
    """The attention segment's results: the MLP's input x [N, d], its selected columns, the residual
    stream after attention [B, S, d] and the layer's present key/value."""

    x: str
    in_indices: str | None
    residual: str
    present_k: str
    present_v: str


def attention_segment(g: Graph, store: WeightStore, spec: ArchSpec, i: int, lw, h: str, pending: str | None,
                      shared, attend: Callable, past_k: str, past_v: str, fuse: bool, k_in: int | None,
                      colnorm: str | None, sel: Selection) -> AttnOut:
    """Layer i up to the MLP's input selection. ``pending``: the previous MLP's residual term not yet added
    to ``h`` (fused into this layer's first norm), None where ``h`` already holds it; ``k_in`` None: a
    dense MLP follows, so no selection.

        h [+ pending] ─norm─attention─out norm─► a;  h + a ─norm─► x [B,S,d] ─Reshape[-1,d]─TopKColumnMask─► idx
    """
    p, norms, eps = f"/model/layers.{i}", spec.arch.norms, spec.rms_norm_eps
    x, h = residual_then_norm(g, store, eps, f"{p}/{norms.attn_in}", f"/model/layers.{i - 1}/residual_mlp/Add",
                              pending, h, lw.ln_attn, f"model.layers.{i}.{norms.attn_in}.weight", fuse)
    a, k, v = attend(g, store, spec, i, x, lw.attn, shared, past_k, past_v)
    a = sublayer_output(g, store, spec, f"{p}/{norms.attn_out or 'attn_out'}", a, lw.ln_attn_out,
                        f"model.layers.{i}.{norms.attn_out}.weight")
    x, h = residual_then_norm(g, store, eps, f"{p}/{norms.mlp_in}", f"{p}/residual_attn/Add", a, h, lw.ln_mlp,
                              f"model.layers.{i}.{norms.mlp_in}.weight", fuse)
    if k_in is None:
        return AttnOut(x, None, h, k, v)
    x2 = g.op(f"{p}/mlp/Reshape", "Reshape", [x, g.const([-1, spec.hidden_size])])
    idx = g.add_custom(topk_column_mask_node(
        f"{p}/mlp/up_gate_proj/TopKColumnMask", x2, f"{p}/mlp/up_gate_proj/TopKColumnMask/output_0", k=k_in,
        cache=sel.cache, colnorm=colnorm, gamma=sel.gamma, fixed_top_n=sel.fixed_top_n))
    return AttnOut(x2, idx, h, k, v)


def mlp_up_segment(g: Graph, spec: ArchSpec, i: int, x2: str, in_indices: str, rows: Rows, k_glu: int,
                   colnorm_glu: str | None, sel: Selection) -> tuple[str, str]:
    """(GLU~ [N, F], selected GLU units [N, k_glu]) from X [N, d] and its selected columns.

        X, idx ─SparseGatherMatMul(up|gate rows[, slots])─► [N, 2F] ─Split─► up, gate;  act(gate)·up ─► GLU~
        GLU~ ─TopKColumnMask(k_glu; C, γ)─► glu_indices
    """
    p = f"/model/layers.{i}/mlp"
    ug = g.add_custom(sparse_gather_matmul_node(f"{p}/up_gate_proj/SparseGatherMatMul", x2, in_indices, rows.arrays,
                                                f"{p}/up_gate_proj/SparseGatherMatMul/output_0", slots=rows.slots,
                                                accuracy_level=g.accuracy_level, **rows.attrs))
    out = glu(g, p, ug, spec.intermediate_size, spec.arch.activation)
    gidx = g.add_custom(topk_column_mask_node(
        f"{p}/down_proj/TopKColumnMask", out, f"{p}/down_proj/TopKColumnMask/output_0", k=k_glu, cache=sel.cache,
        colnorm=colnorm_glu, gamma=sel.gamma, fixed_top_n=sel.fixed_top_n))
    return out, gidx


def mlp_down_segment(g: Graph, store: WeightStore, spec: ArchSpec, i: int, lw, glu_: str, glu_indices: str,
                     rows: Rows, residual: str) -> str:
    """The MLP's residual term [B, S, d] (not yet added: the caller adds it, or fuses it into the next norm).

        GLU~, idx ─SparseGatherMatMul(down rows[, slots])─Reshape(Shape(residual))─[out norm, ×multiplier]─► y
    """
    p = f"/model/layers.{i}/mlp"
    y = g.add_custom(sparse_gather_matmul_node(f"{p}/down_proj/SparseGatherMatMul", glu_, glu_indices, rows.arrays,
                                               f"{p}/down_proj/SparseGatherMatMul/output_0", slots=rows.slots,
                                               accuracy_level=g.accuracy_level, **rows.attrs))
    y = g.op(f"{p}/Reshape_1", "Reshape", [y, g.op(f"{p}/Shape", "Shape", [residual])])
    return mlp_output(g, store, spec, i, lw, y)


def mlp_output(g: Graph, store: WeightStore, spec: ArchSpec, i: int, lw, y: str) -> str:
    """The MLP's output as the residual stream receives it (the family's out norm and multiplier)."""
    out = spec.arch.norms.mlp_out
    return sublayer_output(g, store, spec, f"/model/layers.{i}/{out or 'mlp_out'}", y, lw.ln_mlp_out,
                           f"model.layers.{i}.{out}.weight")


def residual_add(g: Graph, i: int, h: str, y: str) -> str:
    return g.op(f"/model/layers.{i}/residual_mlp/Add", "Add", [h, y])


def head_segment(g: Graph, store: WeightStore, spec: ArchSpec, h: str, pending: str | None, final_norm: np.ndarray,
                 head: Linear, fuse: bool) -> str:
    """[h + pending] ─final norm─lm_head─► logits (head.onnx, where ``h`` is already summed, and the end
    of model.onnx, where the last MLP's term is fused into the norm)."""
    h, _ = residual_then_norm(g, store, spec.rms_norm_eps, "/model/norm",
                              f"/model/layers.{spec.num_layers - 1}/residual_mlp/Add", pending, h, final_norm,
                              "model.norm.weight", fuse)
    return logits(g, store, spec, h, head)
