"""Node builders for both ops, and one-op test models (shared by tests, benchmarks and the exporter).

The exporter calls :func:`topk_column_mask_node` / :func:`sparse_gather_matmul_node` for each layer,
collects the returned variants, and attaches ``fallback.fallback_functions(...)`` once per model.
"""

from __future__ import annotations

import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper

from dipdeploy.ops.fallback import SgmmVariant, TopKVariant, fallback_functions
from dipdeploy.ops.formats import OpWeights, weight_format
from dipdeploy.ops.reference import int8_path
from dipdeploy.ops.schemas import CACHE_OPS, DOMAIN, IR_VERSION, ONNX_OPSET, OPSET_VERSION, SGMM_OP, TOPK_OP


def topk_column_mask_node(
    name: str,
    x: str,
    output: str,
    *,
    k: int | None = None,
    k_input: str | None = None,
    cache: str | None = None,
    colnorm: str | None = None,
    gamma: float = 1.0,
    fixed_top_n: int = 0,
) -> tuple[NodeProto, TopKVariant]:
    """A TopKColumnMask node; k comes from ``k_input`` (a tensor name) or the attribute ``k``.

    ``cache`` names the residency tensor C (DIP-CA), ``colnorm`` the WINA column norms.
    """
    if (k is None) == (k_input is None):
        raise ValueError("give exactly one of k (attribute) and k_input (tensor name)")
    if k is not None and k < 1:
        raise ValueError(f"k={k} must be >= 1")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma={gamma} must lie in [0, 1]")
    if fixed_top_n < 0:
        raise ValueError(f"fixed_top_n={fixed_top_n} must be >= 0")
    variant = TopKVariant(k_input=k_input is not None, score="wina" if colnorm else "abs", cache=cache is not None)
    inputs = [x, k_input or "", cache or "", colnorm or ""]
    while inputs[-1] == "":
        inputs.pop()
    node = helper.make_node(
        TOPK_OP, inputs, [output], name=name, domain=DOMAIN,
        k=int(k or 0), gamma=float(gamma), fixed_top_n=int(fixed_top_n), score=variant.score,
    )
    node.overload = variant.overload
    return node, variant


def sparse_gather_matmul_node(
    name: str,
    x: str,
    indices: str,
    weights: list[str],
    output: str,
    *,
    fmt: str,
    cols: int,
    slots: str | None = None,
    group_rows: int = 0,
    group_cols: int = 0,
    accuracy_level: int = 0,
) -> tuple[NodeProto, SgmmVariant]:
    """A SparseGatherMatMul node over the weight arrays named ``weights`` (format ``fmt``).

    ``group_rows``/``group_cols``: the VQ3 group shape (``OpWeights.attrs``); 0 for other formats.
    ``accuracy_level``: MatMulNBits' scale, 0..4; 4 = int8 coefficients on BQ4, every other level and
    format computes in float32 (as MatMulNBits treats a level it has no kernel for).
    """
    if accuracy_level not in range(5):
        raise ValueError(f"accuracy_level={accuracy_level} must lie in 0..4 (4 = int8 coefficients)")
    spec = weight_format(fmt)
    if not spec.n_required <= len(weights) <= len(spec.dtypes):
        raise ValueError(f"format {fmt!r} takes {spec.n_required}..{len(spec.dtypes)} weight inputs, got {len(weights)}")
    if cols < 1:
        raise ValueError(f"cols={cols} must be >= 1 (the output width O)")
    variant = SgmmVariant(fmt, with_optional=len(weights) > spec.n_required, slab=slots is not None,
                          int8=int8_path(fmt, accuracy_level))
    if spec.grouped and (group_rows < 1 or group_cols < 2 or group_cols % 2):
        raise ValueError(f"{fmt} needs group_rows >= 1 and an even group_cols >= 2, got {group_rows}, {group_cols}")
    node = helper.make_node(
        SGMM_OP, [x, indices, slots or "", *weights], [output], name=name, domain=DOMAIN, format=fmt,
        cols=int(cols), group_rows=int(group_rows), group_cols=int(group_cols),
        **({"accuracy_level": int(accuracy_level)} if accuracy_level else {}),
    )
    node.overload = variant.overload
    return node, variant


def _model(nodes, inputs, outputs, initializers, variants_topk=(), variants_sgmm=()) -> ModelProto:
    graph = helper.make_graph(nodes, "dipdeploy_op", inputs, outputs, initializer=initializers)
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, OPSET_VERSION)],
        functions=fallback_functions(variants_topk, variants_sgmm),
        ir_version=IR_VERSION,
        producer_name="dipdeploy.ops",
    )


def make_topk_model(
    d: int, *, k: int | None = None, cache: bool = False, wina: bool = False, gamma: float = 1.0, fixed_top_n: int = 0
) -> ModelProto:
    """One TopKColumnMask node. Inputs X [N, d] (+ K [1] when ``k`` is None, C [N, d] bool, colnorm [d])."""
    vi = helper.make_tensor_value_info
    inputs = [vi("X", TensorProto.FLOAT, ["N", d])]
    if k is None:
        inputs.append(vi("K", TensorProto.INT64, [1]))
    if cache:
        inputs.append(vi("C", TensorProto.BOOL, ["N", d]))
    if wina:
        inputs.append(vi("colnorm", TensorProto.FLOAT, [d]))
    node, variant = topk_column_mask_node(
        f"/model/{TOPK_OP}", "X", "indices", k=k, k_input=None if k is not None else "K",
        cache="C" if cache else None, colnorm="colnorm" if wina else None, gamma=gamma, fixed_top_n=fixed_top_n,
    )
    out = vi("indices", TensorProto.INT64, ["N", k if k is not None else "k"])
    return _model([node], inputs, [out], [], variants_topk=[variant])


def make_sgmm_model(weights: OpWeights, d: int, *, slab: bool = False, weights_as_inputs: bool = False,
                    accuracy_level: int = 0) -> ModelProto:
    """One SparseGatherMatMul node. Inputs X [N, d], indices [N, k] (+ slots [N, k] when ``slab``).

    The weights are constant initializers, or graph inputs with ``weights_as_inputs`` (a host runtime
    binds a DRAM slab that way, per call, without copying).
    """
    vi = helper.make_tensor_value_info
    names = [f"W{i}" for i in range(len(weights.arrays))]
    inputs = [vi("X", TensorProto.FLOAT, ["N", d]), vi("indices", TensorProto.INT64, ["N", "k"])]
    if slab:
        inputs.append(vi("slots", TensorProto.INT64, ["N", "k"]))
    inits = []
    for name, arr in zip(names, weights.arrays):
        if weights_as_inputs:
            inputs.append(vi(name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
        else:
            inits.append(onnx.numpy_helper.from_array(arr, name))
    node, variant = sparse_gather_matmul_node(
        f"/model/{SGMM_OP}", "X", "indices", names, "Y", fmt=weights.format, cols=weights.cols,
        slots="slots" if slab else None, accuracy_level=accuracy_level, **dict(weights.attrs),
    )
    out = vi("Y", TensorProto.FLOAT, ["N", weights.cols])
    return _model([node], inputs, [out], inits, variants_sgmm=[variant])


MS_DOMAIN = "com.microsoft"


def set_gamma(nodes, gamma: float) -> None:
    """Give every TopKColumnMask among ``nodes`` (ONNX ``NodeProto``s) DIP-CA's ``gamma``, and every
    CachePrefetch (which predicts a selection with its TopKColumnMask's attributes) the same."""
    for node in nodes:
        if node.domain == DOMAIN and node.op_type in (TOPK_OP, CACHE_OPS[4]):
            attrs = [a for a in node.attribute if a.name != "gamma"]
            del node.attribute[:]
            node.attribute.extend(attrs + [helper.make_attribute("gamma", float(gamma))])


def with_accuracy_level(model: ModelProto, level: int) -> ModelProto:
    """A copy of ``model`` whose MatMulNBits and SparseGatherMatMul nodes run at accuracy ``level``.

    The level is a node attribute, so one exported graph serves both: export validates the level-0
    twin of a level-4 graph against torch (which has no int8 activations), and a runtime may pick the
    level when it opens a session. SparseGatherMatMul nodes switch to the matching fallback function
    (``bq4`` ↔ ``bq4_a4``); functions no node uses any more are dropped. Top-level graph only (the
    exported graphs have no subgraphs); external data references are kept as they are.
    """
    if level not in range(5):
        raise ValueError(f"level={level} must lie in 0..4 (MatMulNBits' accuracy levels; 4 = int8)")
    out = ModelProto()
    out.CopyFrom(model)
    variants = []
    for node in out.graph.node:
        is_nbits = node.op_type == "MatMulNBits" and node.domain == MS_DOMAIN
        is_sgmm = node.op_type == SGMM_OP and node.domain == DOMAIN
        if not (is_nbits or is_sgmm):
            continue
        kept = [a for a in node.attribute if a.name != "accuracy_level"]
        del node.attribute[:]
        node.attribute.extend(kept + ([helper.make_attribute("accuracy_level", level)] if level or is_nbits else []))
        if is_sgmm:
            fmt = next(helper.get_attribute_value(a) for a in kept if a.name == "format").decode()
            variant = SgmmVariant(fmt, with_optional="_zp" in node.overload, slab="_slab" in node.overload,
                                  int8=int8_path(fmt, level))
            node.overload = variant.overload
            variants.append(variant)
    used = {(n.domain, n.op_type, n.overload) for n in out.graph.node}
    have = {(f.domain, f.name, f.overload) for f in out.functions}
    needed = [f for f in fallback_functions(sgmm=variants) if (f.domain, f.name, f.overload) not in have]
    kept_fns = [f for f in out.functions if f.name != SGMM_OP or (f.domain, f.name, f.overload) in used]
    del out.functions[:]
    out.functions.extend(kept_fns + needed)
    return out


_MODEL_BUILDERS = {TOPK_OP: make_topk_model, SGMM_OP: make_sgmm_model}


def with_selection_outputs(model: ModelProto, scored: bool = False) -> tuple[ModelProto, dict]:
    """``model`` with every TopKColumnMask output also a graph output, and their names by
    (layer, group): "in" for the up|gate input columns, "glu" for the down columns (the node names of
    ``dipdeploy.export.decoder``, ``/model/layers.{i}/mlp/{up_gate,down}_proj/TopKColumnMask``).
    ``scored``: the nodes' inputs X too, under (layer, group, "x") (|X| is the score of plain DIP)."""
    names = {}
    existing = {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.op_type != TOPK_OP:
            continue
        parts = node.name.split("/")
        layer = int(parts[2].split(".")[1])
        group = {"up_gate_proj": "in", "down_proj": "glu"}[parts[4]]
        names[(layer, group)] = node.output[0]
        outs = [(node.output[0], TensorProto.INT64)]
        if scored:
            names[(layer, group, "x")] = node.input[0]
            outs.append((node.input[0], TensorProto.FLOAT))
        for name, dtype in outs:
            if name not in existing:
                model.graph.output.append(helper.make_tensor_value_info(name, dtype, None))
                existing.add(name)
    return model, names


def make_op_model(op: str, *args, **kwargs) -> ModelProto:
    """One-op model for ``op`` (``TopKColumnMask`` → :func:`make_topk_model`, else :func:`make_sgmm_model`)."""
    if op not in _MODEL_BUILDERS:
        raise ValueError(f"op={op!r} unknown; allowed: {tuple(_MODEL_BUILDERS)}")
    return _MODEL_BUILDERS[op](*args, **kwargs)


__all__ = [
    "make_op_model", "make_sgmm_model", "make_topk_model", "sparse_gather_matmul_node", "topk_column_mask_node",
    "with_accuracy_level", "with_selection_outputs",
]
