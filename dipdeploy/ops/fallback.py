"""Model-local ONNX functions for both ops, made only of standard ops (docs/onnxruntime.md, "dual path").

Stock ORT inlines a function node that no kernel claims, so a model carrying these functions runs on
any ORT; with the native library registered ORT runs the kernel instead and ignores the body.

One function per input *variant*, told apart by the IR-10 function ``overload`` field, because a body
cannot branch on which optional inputs are present:

- TopKColumnMask: ``<k source>_<score>_<cache>``, e.g. ``kin_abs_dip``, ``kattr_wina_ca``
  (k from input K or attribute k; score |x| or WINA |x|·colnorm; cache-aware or plain DIP).
- SparseGatherMatMul: ``<format>[_zp][_slab][_a4]``, e.g. ``fp32``, ``bq4_zp_slab``, ``bq4_a4``
  (``_a4``: accuracy level 4, int8 coefficients).

Every variant declares the full positional input list of its op (absent optional inputs are "" on the
node and unused in the body), so node inputs map onto function inputs by position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import AttributeProto, FunctionProto, NodeProto, TensorProto, helper

from dipdeploy.ops.formats import FORMATS, weight_format
from dipdeploy.ops.reference import I8_ROWS
from dipdeploy.ops.schemas import DOMAIN, ONNX_OPSET, SCORES, SGMM_OP, TOPK_OP

TOPK_INPUTS = ("X", "K", "C", "colnorm")
TOPK_ATTRS = {"k": 0, "gamma": 1.0, "fixed_top_n": 0, "score": "abs"}
SGMM_FIXED_INPUTS = ("X", "indices", "slots")
SGMM_ATTRS = {"format": "fp32", "cols": 0, "group_rows": 0, "group_cols": 0, "accuracy_level": 0}


@dataclass(frozen=True)
class TopKVariant:
    """Which optional inputs a TopKColumnMask node uses."""

    k_input: bool = True
    score: str = "abs"
    cache: bool = False

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"TopKVariant.score={self.score!r} is not allowed; choose one of {SCORES}")

    @property
    def overload(self) -> str:
        return f"{'kin' if self.k_input else 'kattr'}_{self.score}_{'ca' if self.cache else 'dip'}"


@dataclass(frozen=True)
class SgmmVariant:
    """Which weight format, whether its optional weight array is present, and slab (slots) mode."""

    format: str = "fp32"
    with_optional: bool = False
    slab: bool = False
    int8: bool = False  # accuracy level 4 on BQ4 (``reference.int8_path``)

    def __post_init__(self) -> None:
        fmt = weight_format(self.format)
        if self.with_optional and fmt.n_optional == 0:
            raise ValueError(f"SgmmVariant.with_optional=True but format {self.format!r} has no optional array")
        if self.int8 and not fmt.int8:
            with_int8 = " or ".join(repr(f.name) for f in FORMATS.values() if f.int8)
            raise ValueError(f"SgmmVariant.int8=True needs format {with_int8}, got {self.format!r}")

    @property
    def n_weights(self) -> int:
        fmt = weight_format(self.format)
        return fmt.n_required + (fmt.n_optional if self.with_optional else 0)

    @property
    def overload(self) -> str:
        return (self.format + ("_zp" if self.with_optional else "") + ("_slab" if self.slab else "")
                + ("_a4" if self.int8 else ""))


class _Body:
    """Collects the nodes of one function body with unique value names (``prefix`` keeps a subgraph's
    names apart from its parent's, which it may read but not redefine)."""

    def __init__(self, prefix: str = "") -> None:
        self.nodes: list[NodeProto] = []
        self._n = 0
        self._prefix = prefix

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        self._n += 1
        outs = [f"_{self._prefix}{op_type.lower()}{self._n}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, dtype=np.float32) -> str:
        return self.op("Constant", [], value=onnx.numpy_helper.from_array(np.asarray(value, dtype=dtype)))

    def const_from_attr(self, attr: str, kind: str) -> str:
        """A Constant whose value is the calling node's attribute ``attr`` (value_float / value_int)."""
        ref = AttributeProto()
        ref.name, ref.ref_attr_name = kind, attr
        ref.type = AttributeProto.FLOAT if kind == "value_float" else AttributeProto.INT
        out = self.op("Constant", [])
        self.nodes[-1].attribute.append(ref)
        return out


def _function(name: str, overload: str, inputs, outputs, body: _Body, attrs: dict) -> FunctionProto:
    defaults = [helper.make_attribute(k, v) for k, v in attrs.items()]
    return helper.make_function(
        DOMAIN, name, list(inputs), list(outputs), body.nodes,
        [helper.make_opsetid("", ONNX_OPSET)], attribute_protos=defaults, overload=overload,
    )


def topk_column_mask_function(variant: TopKVariant) -> FunctionProto:
    """TopKColumnMask body; mirrors ``dipca_scores`` then ``topk_indices`` op for op (float32).

        X ─Abs─(·colnorm)─► A ─ReduceMax─► P ─(P>0 ? P : 1)─► A/P = S
        C ─Cast uint8─(>0)─Where(·, 1, γ)─Expand─► w ─ScatterElements(1 at TopK(A, min(n, D)))─► w    (cache only)
        S·w ─TopK(k, largest, sorted)─► indices
    """
    b = _Body()
    a = b.op("Abs", ["X"])
    if variant.score == "wina":
        a = b.op("Mul", [a, "colnorm"])
    peak = b.op("ReduceMax", [a, b.const([-1], np.int64)], keepdims=1)
    safe = b.op("Where", [b.op("Greater", [peak, b.const(0.0)]), peak, b.const(1.0)])
    s = b.op("Div", [a, safe])
    if variant.cache:
        shape = b.op("Shape", ["X"])
        gamma = b.const_from_attr("gamma", "value_float")
        # C's bytes as uint8, nonzero = resident (custom_ops/README.md): ORT hands a bool tensor's bytes over as fed,
        # and its Where reads a byte other than 0 or 1 as neither.
        resident = b.op("Greater", [b.op("Cast", ["C"], to=TensorProto.UINT8), b.const(0, np.uint8)])
        w = b.op("Expand", [b.op("Where", [resident, b.const(1.0), gamma]), shape])
        n_top = b.op("Reshape", [b.const_from_attr("fixed_top_n", "value_int"), b.const([1], np.int64)])
        d = b.op("Slice", [shape, b.const([-1], np.int64), b.const([2], np.int64)])
        _, top = b.op("TopK", [a, b.op("Min", [n_top, d])], n_out=2, axis=-1, largest=1, sorted=1)
        ones = b.op("Expand", [b.const(1.0), b.op("Shape", [top])])
        w = b.op("ScatterElements", [w, top, ones], axis=-1)
        s = b.op("Mul", [s, w])
    k = "K" if variant.k_input else b.const_from_attr("k", "value_int")
    k = b.op("Reshape", [k, b.const([1], np.int64)])
    b.op("TopK", [s, k], n_out=2, axis=-1, largest=1, sorted=1)
    b.nodes[-1].output[1] = "indices"
    return _function(TOPK_OP, variant.overload, TOPK_INPUTS, ["indices"], b, TOPK_ATTRS)


def _rows_fp(b: _Body, rows: str, w: list[str]) -> str:
    return b.op("Cast", [b.op("Gather", [w[0], rows], axis=0)], to=TensorProto.FLOAT)


def _nibbles(b: _Body, packed: str) -> str:
    """uint8 [..., m] → uint8 [..., 2m], low nibble first (the bit order of dipdeploy.quant.bits)."""
    lo = b.op("BitwiseAnd", [packed, b.const(15, np.uint8)])
    hi = b.op("BitShift", [packed, b.const(4, np.uint8)], direction="RIGHT")
    axis = b.const([-1], np.int64)
    pair = b.op("Concat", [b.op("Unsqueeze", [lo, axis]), b.op("Unsqueeze", [hi, axis])], axis=-1)
    return b.op("Reshape", [pair, b.const([0, 0, -1], np.int64)])


def _bq4_codes(b: _Body, rows: str, w: list[str]) -> tuple[str, str]:
    """The selected BQ4 rows as float32 (q − z) [N,k,nb,B] (exact small integers) and scales [N,k,nb,1].

        qweight ─Gather─nibbles─► q [N,k,nb·B] ─Reshape [N,k,nb,B]─Cast─► q
        zeros ─Gather─nibbles─Slice nb─Cast─► z [N,k,nb,1]  (or the constant 8)
        scales ─Gather─Cast─► s [N,k,nb,1]
    """
    q = _nibbles(b, b.op("Gather", [w[0], rows], axis=0))
    nb = b.op("Slice", [b.op("Shape", [w[1]]), b.const([1], np.int64), b.const([2], np.int64)])
    shape4 = b.op("Concat", [b.const([0, 0], np.int64), nb, b.const([-1], np.int64)], axis=0)
    q = b.op("Cast", [b.op("Reshape", [q, shape4])], to=TensorProto.FLOAT)
    axis = b.const([-1], np.int64)
    s = b.op("Unsqueeze", [b.op("Cast", [b.op("Gather", [w[1], rows], axis=0)], to=TensorProto.FLOAT), axis])
    if len(w) > 2:
        z = _nibbles(b, b.op("Gather", [w[2], rows], axis=0))
        z = b.op("Slice", [z, b.const([0], np.int64), nb, axis])
        z = b.op("Unsqueeze", [b.op("Cast", [z], to=TensorProto.FLOAT), axis])
    else:
        z = b.const(8.0)
    return b.op("Sub", [q, z]), s


def _cut_cols(b: _Body, y: str, lead: int = 2) -> str:
    """[``lead`` dims, nb, B] → [``lead`` dims, cols]: merge the blocks, drop the padding past ``cols``."""
    flat = b.op("Reshape", [y, b.const([0] * lead + [-1], np.int64)])
    cols = b.op("Reshape", [b.const_from_attr("cols", "value_int"), b.const([1], np.int64)])
    return b.op("Slice", [flat, b.const([0], np.int64), cols, b.const([-1], np.int64)])


def _rows_bq4(b: _Body, rows: str, w: list[str]) -> str:
    """Decode the selected BQ4 rows to float32 [N, k, cols]: (q − z)·s, blocks merged, padding cut."""
    qz, s = _bq4_codes(b, rows, w)
    return _cut_cols(b, b.op("Mul", [qz, s]))


def _sgmm_bq4_int8(b: _Body, xs: str, rows: str, w: list[str]) -> str:
    """BQ4 at accuracy level 4 (``reference.int8_coefficients``, chunks of I8_ROWS = 32): Y [N, cols].

        c = x_j · s_j,b [N,k,nb] ─Pad k to G·32─Reshape [N,G,32,nb]
        σ = max|c| / 127,  cq = Clip(Round(c · 127/max|c|), ±127)        (per chunk g and block b)
        acc = Σ_j cq · (q − z)   [N,G,nb,B]   (integers below 2^24: exact in float32)
        Y4 = Σ_g σ · acc ─Reshape─Slice cols
        Y = If(any row has a non-finite c or 127/max|c|:                  (``reference.level4_takes_int8``)
               Where(that row, Σ_j c · (q − z) ─Reshape─Slice cols, Y4),  else: Y4)

    The level-0 term Σ_j c · (q − z) is the native level-0 kernel's product order. It sits in an
    ``If`` branch, so a call whose rows are all finite does not pay for it.
    """
    i64 = lambda v: b.const(v, np.int64)  # noqa: E731
    qz, s = _bq4_codes(b, rows, w)
    c = b.op("Mul", [b.op("Unsqueeze", [xs, i64([-1, -2])]), s])  # [N,k,nb,1]
    bad = b.op("Cast", [b.op("Or", [b.op("IsInf", [c]), b.op("IsNaN", [c])])], to=TensorProto.FLOAT)
    bad = b.op("Greater", [b.op("ReduceSum", [bad, i64([1, 2, 3])], keepdims=0), b.const(0.0)])  # [N]
    bad = b.op("Unsqueeze", [bad, i64([-1])])  # [N,1]
    cols = b.op("Reshape", [b.const_from_attr("cols", "value_int"), i64([1])])  # read here: outer scope
    k = b.op("Shape", ["indices"], start=1, end=2)
    groups = b.op("Div", [b.op("Add", [k, i64([I8_ROWS - 1])]), i64([I8_ROWS])])
    pad_k = b.op("Sub", [b.op("Mul", [groups, i64([I8_ROWS])]), k])
    pads4 = b.op("Concat", [i64([0, 0, 0, 0, 0]), pad_k, i64([0, 0])], axis=0)  # [N,k,nb,·]: k's end
    nb = b.op("Shape", [qz], start=2, end=3)
    block = b.op("Shape", [qz], start=3, end=4)
    head = [i64([0]), groups, i64([I8_ROWS]), nb]
    c = b.op("Reshape", [b.op("Pad", [c, pads4]), b.op("Concat", [*head, i64([1])], axis=0)])  # [N,G,32,nb,1]
    qz = b.op("Reshape", [b.op("Pad", [qz, pads4]), b.op("Concat", [*head, block], axis=0)])  # [N,G,32,nb,B]
    c_pad = c
    amax = b.op("ReduceMax", [b.op("Abs", [c]), i64([2])], keepdims=1)  # [N,G,1,nb,1]
    inv = b.op("Where", [b.op("Greater", [amax, b.const(0.0)]), b.op("Div", [b.const(127.0), amax]), b.const(0.0)])
    tiny = b.op("Cast", [b.op("IsInf", [inv])], to=TensorProto.FLOAT)  # max|c| < 127 / FLT_MAX
    tiny = b.op("Greater", [b.op("ReduceSum", [tiny, i64([1, 2, 3, 4])], keepdims=0), b.const(0.0)])  # [N]
    bad = b.op("Or", [bad, b.op("Unsqueeze", [tiny, i64([-1])])])  # [N,1]
    cq = b.op("Clip", [b.op("Round", [b.op("Mul", [c, inv])]), b.const(-127.0), b.const(127.0)])
    acc = b.op("ReduceSum", [b.op("Mul", [cq, qz]), i64([2])], keepdims=0)  # [N,G,nb,B]
    sigma = b.op("Squeeze", [b.op("Div", [amax, b.const(127.0)]), i64([2])])  # [N,G,nb,1]
    y4 = _cut_cols(b, b.op("ReduceSum", [b.op("Mul", [acc, sigma]), i64([1])], keepdims=0), lead=1)  # [N,cols]
    level0 = _Body("level0_")
    c = level0.const
    # over the padded chunks [N,G,32,nb,·]: the padding adds 0 · 0
    y0 = level0.op("ReduceSum", [level0.op("Mul", [c_pad, qz]), c([1, 2], np.int64)], keepdims=0)  # [N,nb,B]
    y0 = level0.op("Reshape", [y0, c([0, -1], np.int64)])
    y0 = level0.op("Slice", [y0, c([0], np.int64), cols, c([-1], np.int64)])
    y_fix = level0.op("Where", [bad, y0, y4])
    keep = _Body("int8_")
    y_keep = keep.op("Identity", [y4])
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, None)  # noqa: E731
    any_bad = b.op("Greater", [b.op("ReduceSum", [b.op("Cast", [bad], to=TensorProto.FLOAT)], keepdims=0),
                               b.const(0.0)])
    return b.op("If", [any_bad],
                then_branch=helper.make_graph(level0.nodes, "level0_rows", [], [vi(y_fix)]),
                else_branch=helper.make_graph(keep.nodes, "int8_rows", [], [vi(y_keep)]))


def _rows_vq3(b: _Body, rows: str, w: list[str], *, original: str) -> str:
    """Decode the selected VQ3 rows (int8 codebooks × fp16 scales) to float32 [N, k, cols].

    The codes come from W's rows (``rows``: slots in slab mode) but the codebook group from the
    ``original`` row index (``indices``): a slab holds only the codes, the codebooks stay whole.

        codes ─Gather─Pad 1 byte─► c [N,k,bytes];  p = 0..cols/2−1, bit = 6p
        code = ((c[bit/8] | c[bit/8+1] << 8) >> bit%8) & 63                [N,k,P]
        entry = ((indices / group_rows)·ngc + 2p / group_cols)·64 + code   [N,k,P]
        codebooks·scales ─Reshape [−1, 2]─Gather(entry)─► [N,k,P,2] ─Reshape─► W [N,k,cols]
    """
    i64 = lambda v: b.const(v, np.int64)  # noqa: E731
    u32 = TensorProto.UINT32
    codes = b.op("Pad", [b.op("Gather", [w[0], rows], axis=0), i64([0, 0, 0, 0, 0, 1])])
    n_vec = b.op("Div", [b.const_from_attr("cols", "value_int"), i64(2)])
    vec = b.op("Range", [i64(0), n_vec, i64(1)])
    bit = b.op("Mul", [vec, i64(6)])
    byte = b.op("Div", [bit, i64(8)])
    lo = b.op("Cast", [b.op("Gather", [codes, byte], axis=2)], to=u32)
    hi = b.op("Cast", [b.op("Gather", [codes, b.op("Add", [byte, i64(1)])], axis=2)], to=u32)
    word = b.op("BitwiseOr", [lo, b.op("BitShift", [hi, b.const(8, np.uint32)], direction="LEFT")])
    shift = b.op("Cast", [b.op("Mod", [bit, i64(8)])], to=u32)
    code = b.op("BitwiseAnd", [b.op("BitShift", [word, shift], direction="RIGHT"), b.const(63, np.uint32)])
    ngc = b.op("Slice", [b.op("Shape", [w[1]]), i64([1]), i64([2])])
    gi = b.op("Div", [original, b.const_from_attr("group_rows", "value_int")])
    gj = b.op("Div", [b.op("Mul", [vec, i64(2)]), b.const_from_attr("group_cols", "value_int")])
    group = b.op("Add", [b.op("Unsqueeze", [b.op("Mul", [gi, ngc]), i64([-1])]), gj])
    entry = b.op("Add", [b.op("Mul", [group, i64(64)]), b.op("Cast", [code], to=TensorProto.INT64)])
    scales = b.op("Unsqueeze", [b.op("Cast", [w[2]], to=TensorProto.FLOAT), i64([2, 3])])
    table = b.op("Reshape", [b.op("Mul", [b.op("Cast", [w[1]], to=TensorProto.FLOAT), scales]), i64([-1, 2])])
    return b.op("Reshape", [b.op("Gather", [table, entry], axis=0), i64([0, 0, -1])])


def sparse_gather_matmul_function(variant: SgmmVariant) -> FunctionProto:
    """SparseGatherMatMul body: gather X values and W rows, decode, one batched MatMul.

        X ─GatherElements(indices)─Unsqueeze─► x [N,1,k]
        W… ─Gather(slots or indices)─decode─► w [N,k,O]   (VQ3 codebook groups by indices, slab or not)
        x @ w ─Squeeze─► Y [N,O]
    """
    decode = weight_format(variant.format).rows_onnx
    w_names = [f"w{i}" for i in range(variant.n_weights)]
    b = _Body()
    axis1 = b.const([1], np.int64)
    xs = b.op("Unsqueeze", [b.op("GatherElements", ["X", "indices"], axis=1), axis1])
    rows = b.op("Identity", ["slots" if variant.slab else "indices"])
    if variant.int8:
        _sgmm_bq4_int8(b, b.op("GatherElements", ["X", "indices"], axis=1), rows, w_names)
        b.nodes[-1].output[0] = "Y"
        return _function(SGMM_OP, variant.overload, [*SGMM_FIXED_INPUTS, *w_names], ["Y"], b, SGMM_ATTRS)
    w = decode(b, rows, w_names, original="indices")
    b.op("Squeeze", [b.op("MatMul", [xs, w]), axis1])
    b.nodes[-1].output[0] = "Y"
    return _function(SGMM_OP, variant.overload, [*SGMM_FIXED_INPUTS, *w_names], ["Y"], b, SGMM_ATTRS)


def fallback_functions(
    topk: list[TopKVariant] | tuple = (), sgmm: list[SgmmVariant] | tuple = ()
) -> list[FunctionProto]:
    """The functions a model needs for the variants it uses (duplicates dropped, order kept)."""
    out, seen = [], set()
    for v in topk:
        if (TOPK_OP, v.overload) not in seen:
            seen.add((TOPK_OP, v.overload))
            out.append(topk_column_mask_function(v))
    for v in sgmm:
        if (SGMM_OP, v.overload) not in seen:
            seen.add((SGMM_OP, v.overload))
            out.append(sparse_gather_matmul_function(v))
    return out


__all__ = [
    "FORMATS", "SgmmVariant", "TopKVariant", "fallback_functions",
    "sparse_gather_matmul_function", "topk_column_mask_function",
]
