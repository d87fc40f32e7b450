"""The gated MLP as ONNX nodes: dense (MatMul on the Flash-layout rows) and sparse (DIP); the
activation is the family record's (SiLU for SwiGLU, tanh-GELU for Gemma's GeGLU).

The MLP weights live in the bundle's MLP file in the Flash layout of docs/method.md, one row per selectable
unit: the up|gate group holds row i = [W_u[:, i] ; W_g[:, i]] (2F values) per input feature, the down
group row j = W_d[:, j] (d values) per GLU unit. A dense MatMul reads the same rows as its B matrix
(x·[W_uᵀ | W_gᵀ] = [up | gate]), so dense and sparse graphs share one copy on disk.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dipdeploy.export.graph import Graph
from dipdeploy.export.manifest import MLP_FILE
from dipdeploy.export.weights import WeightStore
from dipdeploy.ops.formats import OpWeights
from dipdeploy.ops.nodes import sparse_gather_matmul_node, topk_column_mask_node

GROUP_LAYOUT = {"up_gate": "flash_rows[d,2F]=[W_u^T|W_g^T]", "down": "flash_rows[F,d]=W_d^T"}


@dataclass
class MlpWeights:
    """One layer's MLP as row matrices in a SparseGatherMatMul format (+ WINA column norms)."""

    up_gate: OpWeights
    down: OpWeights
    colnorm_in: np.ndarray | None = None
    colnorm_glu: np.ndarray | None = None

    @property
    def format(self) -> str:
        return self.up_gate.format


@dataclass
class MlpTensors:
    """Names of one layer's MLP tensors in the bundle (what a node or a per-layer graph refers to)."""

    up_gate: list[str]
    down: list[str]
    up_gate_attrs: dict
    down_attrs: dict
    colnorm_in: str | None = None
    colnorm_glu: str | None = None


_ARRAY_NAMES = {"fp32": ("rows",), "fp16": ("rows",), "bq4": ("qweight", "scales", "zeros"),
                "vq3": ("codes", "codebooks", "codebook_scales")}


def write_mlp(store: WeightStore, i: int, w: MlpWeights) -> MlpTensors:
    """Write one layer's MLP arrays to the MLP file (Flash layout), once."""
    names: dict[str, list[str]] = {}
    for group in ("up_gate", "down"):
        ow: OpWeights = getattr(w, group)
        names[group] = []
        for label, arr in zip(_ARRAY_NAMES[ow.format], ow.arrays):
            name = f"model.layers.{i}.mlp.{group}.{label}"
            store.add(name, arr, MLP_FILE, f"{GROUP_LAYOUT[group]}:{ow.format}.{label}")
            names[group].append(name)
    norms = {}
    for key in ("colnorm_in", "colnorm_glu"):
        arr = getattr(w, key)
        if arr is not None:
            norms[key] = f"model.layers.{i}.mlp.{key}"
            store.add(norms[key], arr.astype(np.float32), MLP_FILE, "vector")
    return MlpTensors(names["up_gate"], names["down"], _attrs(w.up_gate), _attrs(w.down), **norms)


def _attrs(ow: OpWeights) -> dict:
    return {"fmt": ow.format, "cols": ow.cols, **dict(ow.attrs)}


def activation(g: Graph, p: str, gate: str, kind: str) -> str:
    """act(gate) for an activation named by a family record (dipdeploy.arch.ACTIVATIONS)."""
    if kind == "silu":
        return g.op(f"{p}/act_fn/Mul", "Mul", [gate, g.op(f"{p}/act_fn/Sigmoid", "Sigmoid", [gate])])
    if kind == "gelu_tanh":
        return g.op(f"{p}/act_fn/Gelu", "Gelu", [gate], approximate="tanh")
    raise ValueError(f"activation {kind!r} has no ONNX form here; known: silu, gelu_tanh")


def glu(g: Graph, p: str, up_gate: str, f: int, act: str) -> str:
    """[.., 2F] up|gate → act(gate)·up [.., F]."""
    up, gate = g.op(f"{p}/Split", "Split", [up_gate, g.const([f, f])], n_out=2, axis=-1)
    return g.op(f"{p}/Mul", "Mul", [activation(g, p, gate, act), up])


def dense_mlp(g: Graph, store: WeightStore, i: int, x: str, t: MlpTensors, f: int, act: str) -> str:
    """fp32 dense gated MLP on the Flash-layout rows.

        x ─MatMul([W_uᵀ|W_gᵀ])─Split─► up, gate;  act(gate)·up ─MatMul(W_dᵀ)─► y
    """
    p = f"/model/layers.{i}/mlp"
    up_gate = g.op(f"{p}/up_gate_proj/MatMul", "MatMul", [x, g.weight(store.proto(t.up_gate[0]))])
    h = glu(g, p, up_gate, f, act)
    return g.op(f"{p}/down_proj/MatMul", "MatMul", [h, g.weight(store.proto(t.down[0]))])


def sparse_up_gate(g: Graph, i: int, x2: str, k_in: int, weights: list[str], attrs: dict, f: int, act: str, *,
                   colnorm: str | None = None, cache: str | None = None, gamma: float = 1.0,
                   slots: str | None = None) -> tuple[str, str]:
    """DIP's first half on X [N, d]: returns (GLU~ [N, F], selected input columns [N, k_in]).

        X ─TopKColumnMask(k_in; C, γ)─► idx ─SparseGatherMatMul(up|gate rows[, slots])─► [N, 2F]
          ─Split─► up, gate;  act(gate)·up ─► GLU~
    """
    p = f"/model/layers.{i}/mlp"
    idx = g.add_custom(topk_column_mask_node(f"{p}/up_gate_proj/TopKColumnMask", x2,
                                             f"{p}/up_gate_proj/TopKColumnMask/output_0", k=k_in,
                                             cache=cache, colnorm=colnorm, gamma=gamma))
    ug = g.add_custom(sparse_gather_matmul_node(f"{p}/up_gate_proj/SparseGatherMatMul", x2, idx, weights,
                                                f"{p}/up_gate_proj/SparseGatherMatMul/output_0", slots=slots,
                                                accuracy_level=g.accuracy_level, **attrs))
    return glu(g, p, ug, f, act), idx


def sparse_down(g: Graph, i: int, glu: str, k_glu: int, weights: list[str], attrs: dict, *,
                colnorm: str | None = None, cache: str | None = None, gamma: float = 1.0,
                slots: str | None = None) -> tuple[str, str]:
    """DIP's second half on GLU~ [N, F]: returns (y [N, d], selected GLU units [N, k_glu]).

        GLU~ ─TopKColumnMask(k_glu; C, γ)─► idx ─SparseGatherMatMul(W_dᵀ rows[, slots])─► y
    """
    p = f"/model/layers.{i}/mlp/down_proj"
    idx = g.add_custom(topk_column_mask_node(f"{p}/TopKColumnMask", glu, f"{p}/TopKColumnMask/output_0",
                                             k=k_glu, cache=cache, colnorm=colnorm, gamma=gamma))
    y = g.add_custom(sparse_gather_matmul_node(f"{p}/SparseGatherMatMul", glu, idx, weights,
                                               f"{p}/SparseGatherMatMul/output_0", slots=slots,
                                               accuracy_level=g.accuracy_level, **attrs))
    return y, idx


def sparse_mlp(g: Graph, store: WeightStore, i: int, x: str, t: MlpTensors, k_in: int, k_glu: int,
               d: int, f: int, act: str) -> str:
    """The whole DIP MLP inside the decoder graph (weights as initializers, full mode).

        x [B,S,d] ─Reshape[-1,d]─► X ─sparse_up_gate─► GLU~ ─sparse_down─► Y ─Reshape(Shape(x))─► y
    """
    p = f"/model/layers.{i}/mlp"
    x2 = g.op(f"{p}/Reshape", "Reshape", [x, g.const([-1, d])])
    ug = [g.weight(store.proto(n)) for n in t.up_gate]
    dn = [g.weight(store.proto(n)) for n in t.down]
    cn_in = g.weight(store.proto(t.colnorm_in)) if t.colnorm_in else None
    cn_glu = g.weight(store.proto(t.colnorm_glu)) if t.colnorm_glu else None
    glu, _ = sparse_up_gate(g, i, x2, k_in, ug, t.up_gate_attrs, f, act, colnorm=cn_in)
    y, _ = sparse_down(g, i, glu, k_glu, dn, t.down_attrs, colnorm=cn_glu)
    return g.op(f"{p}/Reshape_1", "Reshape", [y, g.op(f"{p}/Shape", "Shape", [x])])
