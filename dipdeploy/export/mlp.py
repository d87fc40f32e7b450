"""The gated MLP's pieces as ONNX nodes: its tensors in the bundle, the GLU and the dense MLP (MatMul on
the Flash-layout rows); the sparse (DIP) MLP is two segments of ``layer.py``. The activation is the family
record's (SiLU for SwiGLU, tanh-GELU for Gemma's GeGLU).

The MLP weights live in the bundle's MLP file in the Flash layout of docs/method.md, one row per selectable
unit: the up|gate group holds row i = [W_u[:, i] ; W_g[:, i]] (2F values) per input feature, the down
group row j = W_d[:, j] (d values) per GLU unit. A dense MatMul reads the same rows as its B matrix
(x·[W_uᵀ | W_gᵀ] = [up | gate]), so dense and sparse graphs share one copy on disk.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dipdeploy.bundle.names import MLP_FILE, ROW_POSITION
from dipdeploy.export.graph import Graph
from dipdeploy.export.weights import WeightStore
from dipdeploy.ops.formats import OpWeights, weight_format
from dipdeploy.quant.layout import GROUPS
from dipdeploy.quant.roworder import GroupGeometry, GroupOrder, calibrate_order

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
    position: dict[str, str] = field(default_factory=dict)  # group → its row-position tensor (calibrated order)
    orders: dict[str, GroupOrder] = field(default_factory=dict)


def write_mlp(store: WeightStore, i: int, w: MlpWeights, missed: tuple | None = None) -> MlpTensors:
    """Write one layer's MLP arrays to the MLP file (Flash layout), once. With ``missed`` (per group, the
    calibration miss matrix [T, R] or None), each such group's rows are written in their calibrated order
    (``dipdeploy.quant.roworder``) and its position tensor beside them."""
    names: dict[str, list[str]] = {}
    position, orders = {}, {}
    for group, miss in zip(GROUPS, missed or (None, None)):
        ow: OpWeights = getattr(w, group)
        if miss is not None:
            orders[group] = order = calibrate_order(miss, group_geometry(ow))
            ow = ow.slab(np.argsort(order.position, kind="stable"))
            position[group] = ROW_POSITION.format(layer=i, group=group)
            store.add(position[group], order.position, MLP_FILE, "row_position[R]: file row of each logical row")
        names[group] = []
        for label, arr in zip(weight_format(ow.format).arrays, ow.arrays):
            name = f"model.layers.{i}.mlp.{group}.{label}"
            store.add(name, arr, MLP_FILE, f"{GROUP_LAYOUT[group]}:{ow.format}.{label}")
            names[group].append(name)
    norms = {}
    for key in ("colnorm_in", "colnorm_glu"):
        arr = getattr(w, key)
        if arr is not None:
            norms[key] = f"model.layers.{i}.mlp.{key}"
            store.add(norms[key], arr.astype(np.float32), MLP_FILE, "vector")
    return MlpTensors(names["up_gate"], names["down"], _attrs(w.up_gate), _attrs(w.down), **norms,
                      position=position, orders=orders)


def group_geometry(ow: OpWeights) -> GroupGeometry:
    """The group's per-row arrays as the Flash file holds them: every tensor starts block-aligned (the
    store's alignment is a multiple of the 4 KiB block), so only the row bytes matter."""
    shared = weight_format(ow.format).shared
    row_bytes = tuple(a[0].nbytes for k, a in enumerate(ow.arrays) if k not in shared)
    return GroupGeometry((0,) * len(row_bytes), row_bytes)


def stored_row_bytes(mlp_cfg, d: int, f: int) -> list[int]:
    """The Flash file's bytes of one up|gate row (2F values) and one down row (d values) in ``mlp_cfg``'s
    format (fp32 when None), from one row put through the exporter's own quantiser: what a miss of each
    group reads, and what the ``reads`` cache split prices (``SparsityPlan.row_bytes``). A format whose
    rows share tables (VQ3) has no bytes of its own per row: refused."""
    from dataclasses import replace

    from dipdeploy.quant.fake import quantize_group

    if getattr(mlp_cfg, "error_feedback", False):  # the same bytes; feedback would need calibration statistics
        mlp_cfg = replace(mlp_cfg, error_feedback=False)
    out = []
    for cols in (2 * f, d):
        row = np.random.default_rng(0).standard_normal((1, cols)).astype(np.float32)
        ow = OpWeights.from_matrix(row) if mlp_cfg is None else OpWeights.from_packed(quantize_group(row, mlp_cfg, None))
        if weight_format(ow.format).shared:
            raise ValueError(f"{ow.format} rows share codebooks, so a row's bytes are not its own; price the cache "
                             "split in bq4 (--quant bq4) or use --cache-split even")
        out.append(sum(group_geometry(ow).row_bytes))
    return out


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
