"""The dense pieces of a decoder as ONNX nodes: RMSNorm, linear layers, RoPE, the mask, GQA attention.

Weights arrive as numpy (:class:`Linear`), are written once to the bundle's dense file and referenced
as external initializers. Standard ops only (opset 21), except ``com.microsoft::MatMulNBits`` (4 or 8
bits) for quantised linear layers (ORT prepacks it; docs/onnxruntime.md). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from onnx import TensorProto

from dipdeploy.bundle.names import BATCH, EMBEDDING, SEQ, TOTAL
from dipdeploy.export.graph import MS_DOMAIN, Graph
from dipdeploy.export.spec import ArchSpec
from dipdeploy.export.weights import WeightStore

DENSE_FILE = "dense.bin"
NEG = float(np.finfo(np.float32).min)


@dataclass
class Linear:
    """y = x·Wᵀ + b for an ``nn.Linear`` weight W [out, in], in one of three stored forms.

    - ``fp32``: ``arrays["weight"]`` is Wᵀ [in, out] (a MatMul B);
    - ``nbits``: MatMulNBits blocks of ``bits`` (4 or 8) along ``in``: ``qweight`` uint8 [out, in/B, B·bits/8]
      (4 bits: low nibble = even element; 8 bits: one byte each, zero point 128), ``scales`` float32
      [out·in/B], optional ``zeros`` uint8 [out, ⌈(in/B)/2⌉] (4 bits only);
    - ``tied``: the lm_head shares the embedding table [vocab, in] named ``tied_to`` (Gemm transB=1).

    An ``nbits`` lm_head with ``tied_to`` (an int4 embedding, :class:`Embedding`) writes nothing: its
    ``qweight`` and ``scales`` are views of the embedding's blocks (``WeightStore.view``).
    """

    kind: str
    in_features: int
    out_features: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    bias: np.ndarray | None = None
    block_size: int = 0
    tied_to: str = ""
    bits: int = 4  # of an ``nbits`` weight's codes (``quant.dense``)


def rms_norm(g: Graph, store: WeightStore, prefix: str, x: str, weight: np.ndarray, eps: float, tensor: str) -> str:
    """HF RMSNorm in fp32.

        x ─Mul(x)─ReduceMean(-1)─Add(eps)─Sqrt─► r;   x / r · w ─► y

    Written with Mul, not Pow(2): ORT would fuse Pow(2)… into SimplifiedLayerNormalization, whose
    rounding differs from torch's; in a sparse graph that flips top-K near-ties and the validation
    against torch diverged (SmolLM2 DIP BQ4: tokens differed on stock ORT). Torch's order is kept.
    """
    w = g.weight(store.add(tensor, weight.astype(np.float32), DENSE_FILE, "vector"))
    sq = g.op(f"{prefix}/Mul_1", "Mul", [x, x])
    mean = g.op(f"{prefix}/ReduceMean", "ReduceMean", [sq, g.const([-1])], keepdims=1)
    root = g.op(f"{prefix}/Sqrt", "Sqrt", [g.op(f"{prefix}/Add", "Add", [mean, g.const(eps, np.float32)])])
    return g.op(f"{prefix}/Mul", "Mul", [g.op(f"{prefix}/Div", "Div", [x, root]), w])


def skip_rms_norm(g: Graph, store: WeightStore, prefix: str, x: str, skip: str, weight: np.ndarray, eps: float,
                  tensor: str) -> tuple[str, str]:
    """(RMSNorm(x + skip), x + skip): a residual add and the next norm as one
    com.microsoft::SkipSimplifiedLayerNormalization (what onnxruntime-genai's builder emits; one node
    instead of seven per norm)."""
    w = g.weight(store.add(tensor, weight.astype(np.float32), DENSE_FILE, "vector"))
    normed, _, _, summed = g.op(f"{prefix}/SkipSimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
                                [x, skip, w], n_out=4, domain=MS_DOMAIN, unused=(1, 2), epsilon=float(eps))
    return normed, summed


def residual_then_norm(g: Graph, store: WeightStore, eps: float, prefix: str, add_name: str, pending: str | None,
                       h: str, weight: np.ndarray | None, tensor: str, fuse: bool) -> tuple[str, str]:
    """(input of the next sub-layer, residual): ``pending`` (a sub-layer output not yet added, or None)
    is added to ``h``, then normalised by ``weight``; fused into one SkipSimplifiedLayerNormalization
    when asked; with no norm there (OLMo2 normalises outputs only) the input is the residual itself."""
    if pending is not None and weight is not None and fuse:
        return skip_rms_norm(g, store, prefix, pending, h, weight, eps, tensor)
    if pending is not None:
        h = g.op(add_name, "Add", [h, pending])
    return (h if weight is None else rms_norm(g, store, prefix, h, weight, eps, tensor)), h


def linear(g: Graph, store: WeightStore, prefix: str, x: str, lin: Linear, tensor: str) -> str:
    """x [.., in] → [.., out]: MatMul (fp32), MatMulNBits (4 or 8 bits) or Gemm on a tied table; then + bias."""
    if lin.kind == "fp32":
        w = g.weight(store.add(f"{tensor}.weight", lin.arrays["weight"], DENSE_FILE, "matmul_b[in,out]"))
        y = g.op(f"{prefix}/MatMul", "MatMul", [x, w])
    elif lin.kind == "nbits":
        if lin.tied_to:
            names = [g.weight(store.view(f"{tensor}.{k}", f"{lin.tied_to}.{k}", lin.arrays[k].shape,
                                         f"matmulnbits.{k}")) for k in ("qweight", "scales")]
        else:
            names = [g.weight(store.add(f"{tensor}.{k}", lin.arrays[k], DENSE_FILE, f"matmulnbits.{k}"))
                     for k in ("qweight", "scales", "zeros") if k in lin.arrays]
        y = g.op(f"{prefix}/MatMulNBits", "MatMulNBits", [x, *names], domain=MS_DOMAIN, K=lin.in_features,
                 N=lin.out_features, bits=lin.bits, block_size=lin.block_size, accuracy_level=g.accuracy_level)
    elif lin.kind == "tied":
        flat = g.op(f"{prefix}/Reshape", "Reshape", [x, g.const([-1, lin.in_features])])
        y2 = g.op(f"{prefix}/Gemm", "Gemm", [flat, g.weight(store.proto(lin.tied_to))], transB=1)
        shape = g.op(f"{prefix}/Concat", "Concat", [
            g.op(f"{prefix}/Slice", "Slice", [g.op(f"{prefix}/Shape", "Shape", [x]), g.const([0]), g.const([-1])]),
            g.const([lin.out_features])], axis=0)
        y = g.op(f"{prefix}/Reshape_1", "Reshape", [y2, shape])
    else:
        raise ValueError(f"Linear.kind={lin.kind!r} is not one of ('fp32', 'nbits', 'tied')")
    if lin.bias is not None:
        b = g.weight(store.add(f"{tensor}.bias", lin.bias.astype(np.float32), DENSE_FILE, "vector"))
        y = g.op(f"{prefix}/Add", "Add", [y, b])
    return y


@dataclass(frozen=True)
class RopeTable:
    """Precomputed RoPE cos/sin [max_len, r] of one layer type, stored as ``{name}.cos``/``{name}.sin``."""

    name: str
    cos: np.ndarray
    sin: np.ndarray

    @property
    def rot(self) -> int:
        return self.cos.shape[-1]


@dataclass(frozen=True)
class PerToken:
    """One value the attention of a layer type needs from the step's positions alone: its graph I/O name
    (``positions.onnx`` outputs it, each attention graph of the type takes it; layers.py), type, shape."""

    field: str
    name: str
    elem: int
    shape: tuple


@dataclass
class Shared:
    """Per-graph values every layer of one type reuses: RoPE cos/sin (for q [B,Hkv,rep,S,r] and k
    [B,Hkv,S,r]), mask bias, the rotary width."""

    cos_q: str
    sin_q: str
    cos_k: str
    sin_k: str
    bias: str
    rot: int

    @staticmethod
    def per_token(rot: int, tag: str = "") -> tuple[PerToken, ...]:
        """Every field but ``rot``: the positions' RoPE rows and the additive mask."""
        f = TensorProto.FLOAT
        return (PerToken("cos_q", f"rope{tag}.cos_q", f, (BATCH, 1, 1, SEQ, rot)),
                PerToken("sin_q", f"rope{tag}.sin_q", f, (BATCH, 1, 1, SEQ, rot)),
                PerToken("cos_k", f"rope{tag}.cos_k", f, (BATCH, 1, SEQ, rot)),
                PerToken("sin_k", f"rope{tag}.sin_k", f, (BATCH, 1, SEQ, rot)),
                PerToken("bias", f"attention_bias{tag}", f, (BATCH, 1, 1, SEQ, TOTAL)))


def rope_tables(g: Graph, store: WeightStore, table: RopeTable, position_ids: str, tag: str = "") -> list[str]:
    """Gather the precomputed cos/sin [max_len, r] rows at ``position_ids`` [B, S] → [B, S, r].

    The tables come from the HF model's own rotary module, so every RoPE variant it implements
    (default, llama3, linear, yarn's static scaling, Gemma's per-layer-type bases) is exported exactly.
    """
    out = []
    for name, arr in (("cos", table.cos), ("sin", table.sin)):
        t = g.weight(store.add(f"{table.name}.{name}", arr.astype(np.float32), DENSE_FILE, "rope_table[pos,r]"))
        out.append(g.op(f"/model/rope{tag}/{name}/Gather", "Gather", [t, position_ids], axis=0))
    return out


def shared_values(g: Graph, store: WeightStore, table: RopeTable, window: int | None,
                  tokens: str, attention_mask: str, position_ids: str, tag: str = "") -> Shared:
    """RoPE rows and the additive attention bias [B,1,1,S,T], built once per graph and layer type
    (``tag`` tells the node names of one layer type from another's).

        T = len(attention_mask), S = len(tokens), P = T − S
        k ∈ [0,T) ≤ q ∈ [P,T)  (and k > q − window)  ∧ attention_mask[b,k] ─Where(0, −max)─► bias
    """
    c, s = rope_tables(g, store, table, position_ids, tag)
    r = f"/model/rope{tag}"
    cos_k = g.op(f"{r}/cos/Unsqueeze", "Unsqueeze", [c, g.const([1])])
    sin_k = g.op(f"{r}/sin/Unsqueeze", "Unsqueeze", [s, g.const([1])])
    cos_q = g.op(f"{r}/cos/Unsqueeze_1", "Unsqueeze", [cos_k, g.const([1])])
    sin_q = g.op(f"{r}/sin/Unsqueeze_1", "Unsqueeze", [sin_k, g.const([1])])
    p = f"/model/attn_mask{tag}"
    total = g.op(f"{p}/Gather", "Gather", [g.op(f"{p}/Shape", "Shape", [attention_mask]), g.const(1)], axis=0)
    seq = g.op(f"{p}/Gather_1", "Gather", [g.op(f"{p}/Shape_1", "Shape", [tokens]), g.const(1)], axis=0)
    past = g.op(f"{p}/Sub", "Sub", [total, seq])
    kpos = g.op(f"{p}/Range", "Range", [g.const(0), total, g.const(1)])
    kpos = g.op(f"{p}/Unsqueeze", "Unsqueeze", [kpos, g.const([0])])  # [1, T]
    qpos = g.op(f"{p}/Range_1", "Range", [past, total, g.const(1)])
    qpos = g.op(f"{p}/Unsqueeze_1", "Unsqueeze", [qpos, g.const([1])])  # [S, 1]
    allowed = g.op(f"{p}/LessOrEqual", "LessOrEqual", [kpos, qpos])  # [S, T]
    if window:
        lo = g.op(f"{p}/Sub_1", "Sub", [qpos, g.const(window)])
        allowed = g.op(f"{p}/And", "And", [allowed, g.op(f"{p}/Greater", "Greater", [kpos, lo])])
    pad = g.op(f"{p}/Cast", "Cast", [attention_mask], to=TensorProto.BOOL)
    pad = g.op(f"{p}/Unsqueeze_2", "Unsqueeze", [pad, g.const([1, 2, 3])])  # [B,1,1,1,T]
    both = g.op(f"{p}/And_1", "And", [allowed, pad])  # [B,1,1,S,T]
    bias = g.op(f"{p}/Where", "Where", [both, g.const(0.0, np.float32), g.const(NEG, np.float32)])
    return Shared(cos_q, sin_q, cos_k, sin_k, bias, table.rot)


def apply_rope(g: Graph, prefix: str, x: str, cos: str, sin: str, rot: int, head_dim: int) -> str:
    """HF ``apply_rotary_pos_emb`` on the last axis: x·cos + rotate_half(x)·sin over the first ``rot``.

        x ─Split[rot/2, rot/2, pass]─► x1, x2, xp;  Concat(−x2, x1)·sin + x_rot·cos ─Concat(xp)─► y
    """
    half = rot // 2
    sizes = [half, half] + ([head_dim - rot] if rot < head_dim else [])
    parts = g.op(f"{prefix}/Split", "Split", [x, g.const(sizes)], n_out=len(sizes), axis=-1)
    x_rot = x if rot == head_dim else g.op(f"{prefix}/Concat_rot", "Concat", parts[:2], axis=-1)
    rotated = g.op(f"{prefix}/Concat", "Concat", [g.op(f"{prefix}/Neg", "Neg", [parts[1]]), parts[0]], axis=-1)
    y = g.op(f"{prefix}/Add", "Add", [g.op(f"{prefix}/Mul", "Mul", [x_rot, cos]),
                                      g.op(f"{prefix}/Mul_1", "Mul", [rotated, sin])])
    if rot < head_dim:
        y = g.op(f"{prefix}/Concat_pass", "Concat", [y, parts[2]], axis=-1)
    return y


@dataclass
class AttentionWeights:
    qkv: Linear  # fused [q | k | v] outputs
    o: Linear
    q_norm: np.ndarray | None = None  # per-head RMSNorm scale [Dh] (Qwen3, Gemma 3)
    k_norm: np.ndarray | None = None


def _head_norm(g: Graph, store: WeightStore, spec: ArchSpec, p: str, x: str, weight: np.ndarray | None,
               tensor: str) -> str:
    """RMSNorm over the last axis (one head's Dh values) when the family has q/k norms."""
    return x if weight is None else rms_norm(g, store, p, x, weight, spec.rms_norm_eps, tensor)


def _qk_norms(g: Graph, store: WeightStore, spec: ArchSpec, i: int, p: str, q: str, k: str,
              w: AttentionWeights) -> tuple[str, str]:
    """q [.., H·Dh] and k [.., Hkv·Dh] each normalised over the whole projection (OLMo2)."""
    names = spec.arch.attn
    return (_head_norm(g, store, spec, f"{p}/q_norm", q, w.q_norm, f"model.layers.{i}.self_attn.{names.q_norm}.weight"),
            _head_norm(g, store, spec, f"{p}/k_norm", k, w.k_norm, f"model.layers.{i}.self_attn.{names.k_norm}.weight"))


def attention(g: Graph, store: WeightStore, spec: ArchSpec, i: int, x: str, w: AttentionWeights, shared: Shared,
              past_k: str, past_v: str) -> tuple[str, str, str]:
    """GQA self-attention with a KV cache; returns (output [B,S,d], present key, present value).

        x ─qkv─Split─► q ─Reshape[B,S,Hkv,rep,Dh]─[q_norm]─Transpose─► [B,Hkv,rep,S,Dh] ─[RoPE]─► q
                       k ─Reshape[B,S,Hkv,Dh]─[k_norm]─Transpose─[RoPE]─Concat(past_k)─► K [B,Hkv,T,Dh] = present.key
                       v ─Reshape─Transpose─Concat(past_v)─► V = present.value
        softmax([softcap](q·Kᵀ·scale) + bias) · V ─Transpose─Reshape[B,S,H·Dh]─o_proj─► y
    K and V are broadcast over the ``rep`` axis by MatMul: no copies for GQA. ``scale`` is the
    family's (Dh^-½, Granite's attention_multiplier, Gemma's query_pre_attn_scalar^-½); RoPE is left
    out on the layers the family runs without it (SmolLM3's NoPE layers).
    """
    p = f"/model/layers.{i}/attn"
    hkv, rep, dh, rot = spec.num_kv_heads, spec.num_heads // spec.num_kv_heads, spec.head_dim, shared.rot
    names = spec.arch.attn
    qkv = linear(g, store, f"{p}/qkv_proj", x, w.qkv, f"model.layers.{i}.attn.qkv_proj")
    q, k, v = g.op(f"{p}/Split", "Split", [qkv, g.const([spec.q_size, spec.kv_size, spec.kv_size])], n_out=3, axis=-1)
    wide = spec.arch.qk_norm_span == "projection"
    if wide:
        q, k = _qk_norms(g, store, spec, i, p, q, k, w)
    q = g.op(f"{p}/q/Reshape", "Reshape", [q, g.const([0, 0, hkv, rep, dh])])
    if not wide:
        q = _head_norm(g, store, spec, f"{p}/q_norm", q, w.q_norm, f"model.layers.{i}.self_attn.{names.q_norm}.weight")
    q = g.op(f"{p}/q/Transpose", "Transpose", [q], perm=[0, 2, 3, 1, 4])
    if spec.rope_layers[i]:
        q = apply_rope(g, f"{p}/q/rope", q, shared.cos_q, shared.sin_q, rot, dh)
    k = g.op(f"{p}/k/Reshape", "Reshape", [k, g.const([0, 0, hkv, dh])])
    if not wide:
        k = _head_norm(g, store, spec, f"{p}/k_norm", k, w.k_norm, f"model.layers.{i}.self_attn.{names.k_norm}.weight")
    k = g.op(f"{p}/k/Transpose", "Transpose", [k], perm=[0, 2, 1, 3])
    if spec.rope_layers[i]:
        k = apply_rope(g, f"{p}/k/rope", k, shared.cos_k, shared.sin_k, rot, dh)
    v = g.op(f"{p}/v/Reshape", "Reshape", [v, g.const([0, 0, hkv, dh])])
    v = g.op(f"{p}/v/Transpose", "Transpose", [v], perm=[0, 2, 1, 3])
    present_k = g.op(f"{p}/k/Concat", "Concat", [past_k, k], axis=2)
    present_v = g.op(f"{p}/v/Concat", "Concat", [past_v, v], axis=2)
    kt = g.op(f"{p}/k/Transpose_1", "Transpose", [g.op(f"{p}/k/Unsqueeze", "Unsqueeze", [present_k, g.const([2])])],
              perm=[0, 1, 2, 4, 3])  # [B,Hkv,1,Dh,T]
    scores = g.op(f"{p}/MatMul", "MatMul", [q, kt])
    scores = g.op(f"{p}/Mul", "Mul", [scores, g.const(spec.attention_scale, np.float32)])
    if spec.attn_softcap:
        scores = softcap(g, f"{p}/softcap", scores, spec.attn_softcap)
    probs = g.op(f"{p}/Softmax", "Softmax", [g.op(f"{p}/Add", "Add", [scores, shared.bias])], axis=-1)
    vv = g.op(f"{p}/v/Unsqueeze", "Unsqueeze", [present_v, g.const([2])])
    ctx = g.op(f"{p}/MatMul_1", "MatMul", [probs, vv])  # [B,Hkv,rep,S,Dh]
    ctx = g.op(f"{p}/Transpose", "Transpose", [ctx], perm=[0, 3, 1, 2, 4])
    ctx = g.op(f"{p}/Reshape", "Reshape", [ctx, g.const([0, 0, spec.q_size])])
    y = linear(g, store, f"{p}/o_proj", ctx, w.o, f"model.layers.{i}.attn.o_proj")
    return y, present_k, present_v


@dataclass
class GqaShared:
    """Per-graph inputs of com.microsoft GroupQueryAttention for one layer type: past lengths, the RoPE
    half tables, the rotary width and the sliding window (None: full attention)."""

    seqlens_k: str
    total_len: str
    cos_half: str
    sin_half: str
    rot: int
    window: int | None = None

    @staticmethod
    def per_token(rot: int, tag: str = "") -> tuple[PerToken, ...]:
        """The lengths (the half tables are weights, gathered inside the op)."""
        i32 = TensorProto.INT32
        return (PerToken("seqlens_k", f"seqlens_k{tag}", i32, (BATCH,)),
                PerToken("total_len", f"total_length{tag}", i32, ()))


def gqa_lengths(g: Graph, attention_mask: str, tag: str = "") -> tuple[str, str]:
    """seqlens_k = Σ attention_mask − 1 (int32 [B]), total length (int32 scalar).

        attention_mask ─ReduceSum(1)─Sub(1)─Cast(int32)─► seqlens_k;  Shape[1]─Cast─► total_len
    """
    p = f"/model/attn_mask{tag}"
    total = g.op(f"{p}/ReduceSum", "ReduceSum", [attention_mask, g.const([1])], keepdims=0)
    seqlens = g.op(f"{p}/Cast_seqlens", "Cast", [g.op(f"{p}/Sub_seqlens", "Sub", [total, g.const(1)])],
                   to=TensorProto.INT32)
    shape = g.op(f"{p}/Shape_total", "Shape", [attention_mask])
    t = g.op(f"{p}/Gather_total", "Gather", [shape, g.const(1)], axis=0)
    return seqlens, g.op(f"{p}/Cast_total", "Cast", [t], to=TensorProto.INT32)


def gqa_tables(g: Graph, store: WeightStore, table: RopeTable) -> tuple[str, str]:
    """The RoPE cos/sin tables' first halves [max_len, r/2], as GroupQueryAttention takes them."""
    half = table.rot // 2
    names = []
    for name, arr in (("cos", table.cos), ("sin", table.sin)):
        arr = np.ascontiguousarray(arr[:, :half], dtype=np.float32)
        names.append(g.weight(store.add(f"{table.name}.{name}_half", arr, DENSE_FILE, "rope_table[pos,r/2]")))
    return names[0], names[1]


def gqa_shared(g: Graph, store: WeightStore, table: RopeTable, window: int | None, attention_mask: str,
               tag: str = "") -> GqaShared:
    """The lengths (:func:`gqa_lengths`) and the half tables (:func:`gqa_tables`) of one layer type."""
    return GqaShared(*gqa_lengths(g, attention_mask, tag), *gqa_tables(g, store, table), table.rot, window)


def attention_gqa(g: Graph, store: WeightStore, spec: ArchSpec, i: int, x: str, w: AttentionWeights,
                  shared: GqaShared, past_k: str, past_v: str) -> tuple[str, str, str]:
    """GQA self-attention as one com.microsoft::GroupQueryAttention node (RoPE inside, KV cache
    [B,Hkv,T,Dh] as in the standard-op version; ORT's fused CPU kernel, far fewer nodes per layer).

        x ─qkv_proj─► [q|k|v] ─GroupQueryAttention(past kv, seqlens_k, total, cos/sin halves)─► ctx, K, V
        ctx ─o_proj─► y
    With per-head q/k norms, q and k are normalised first and passed as separate inputs; a layer
    without RoPE sets do_rotary=0 and passes no tables. Partial RoPE (Phi-4-mini) is the cos/sin halves'
    width: ORT rotates that many dims of each head and passes the rest through.
    """
    rotary = spec.rope_layers[i]
    if spec.gqa_refusal() or (rotary and shared.rot != spec.rotary_dim):
        raise ValueError(spec.gqa_refusal() or f"RoPE table of {shared.rot} dims, config says {spec.rotary_dim}")
    p = f"/model/layers.{i}/attn"
    qkv = linear(g, store, f"{p}/qkv_proj", x, w.qkv, f"model.layers.{i}.attn.qkv_proj")
    inputs = [qkv, "", ""]
    if w.q_norm is not None and spec.arch.qk_norm_span == "projection":
        q, k, v = g.op(f"{p}/Split", "Split", [qkv, g.const([spec.q_size, spec.kv_size, spec.kv_size])], n_out=3,
                       axis=-1)
        inputs = [*_qk_norms(g, store, spec, i, p, q, k, w), v]
    elif w.q_norm is not None:
        names, dh = spec.arch.attn, spec.head_dim
        q, k, v = g.op(f"{p}/Split", "Split", [qkv, g.const([spec.q_size, spec.kv_size, spec.kv_size])], n_out=3,
                       axis=-1)
        normed = []
        for tag, t, heads, wt, mod in (("q", q, spec.num_heads, w.q_norm, names.q_norm),
                                       ("k", k, spec.num_kv_heads, w.k_norm, names.k_norm)):
            t = g.op(f"{p}/{tag}/Reshape", "Reshape", [t, g.const([0, 0, heads, dh])])
            t = _head_norm(g, store, spec, f"{p}/{tag}_norm", t, wt, f"model.layers.{i}.self_attn.{mod}.weight")
            normed.append(g.op(f"{p}/{tag}/Reshape_1", "Reshape", [t, g.const([0, 0, heads * dh])]))
        inputs = [*normed, v]
    ctx, k, v = g.op(f"{p}/GroupQueryAttention", "GroupQueryAttention",
                     [*inputs, past_k, past_v, shared.seqlens_k, shared.total_len,
                      *((shared.cos_half, shared.sin_half) if rotary else ())], n_out=3, domain=MS_DOMAIN,
                     num_heads=spec.num_heads, kv_num_heads=spec.num_kv_heads, do_rotary=int(rotary),
                     rotary_interleaved=0,
                     local_window_size=shared.window or -1, scale=float(spec.attention_scale),
                     softcap=float(spec.attn_softcap or 0.0))
    y = linear(g, store, f"{p}/o_proj", ctx, w.o, f"model.layers.{i}.attn.o_proj")
    return y, k, v


# -- the pieces every graph of a decoder shares (model.onnx and the per-layer graphs) -------------------
def layer_kinds(spec: ArchSpec) -> dict[str, str]:
    """Layer type → the tag its shared values' node and I/O names carry ("" for a single type)."""
    kinds = list(dict.fromkeys(spec.layer_types))
    return {k: "" if len(kinds) == 1 else f"_{k}" for k in kinds}


def shared_for_layers(g: Graph, store: WeightStore, spec: ArchSpec, rope: dict[str, RopeTable], attention_op: str,
                      tokens: str, attention_mask: str, position_ids: str) -> tuple[dict, Callable]:
    """Per layer type, the shared values (RoPE rows, mask bias or GQA inputs) computed from the step's
    positions (``tokens``: any [B, S] tensor of the step, for its length), and the attention builder that
    takes them. ``model.onnx`` computes them once per run; ``positions.onnx`` computes them once per token
    for every per-layer attention graph (layers.py)."""
    tags = layer_kinds(spec)
    if attention_op == "gqa":
        return ({k: gqa_shared(g, store, rope[k], spec.window(k), attention_mask, t) for k, t in tags.items()},
                attention_gqa)
    return ({k: shared_values(g, store, rope[k], spec.window(k), tokens, attention_mask, position_ids, t)
             for k, t in tags.items()}, attention)


def per_token_values(attention_op: str, table: RopeTable, tag: str) -> tuple[PerToken, ...]:
    """The values of one layer type that ``positions.onnx`` hands to its attention graphs."""
    return (GqaShared if attention_op == "gqa" else Shared).per_token(table.rot, tag)


def shared_from_inputs(g: Graph, store: WeightStore, spec: ArchSpec, table: RopeTable, attention_op: str,
                       kind: str, tag: str) -> tuple[Shared | GqaShared, Callable]:
    """A per-layer attention graph's shared values: the per-token ones as graph inputs (what
    ``positions.onnx`` computed for this token), the rest as ``shared_for_layers`` has them."""
    fields = {v.field: g.input(v.name, v.elem, list(v.shape)) for v in per_token_values(attention_op, table, tag)}
    if attention_op == "gqa":
        return GqaShared(**fields, **dict(zip(("cos_half", "sin_half"), gqa_tables(g, store, table))),
                         rot=table.rot, window=spec.window(kind)), attention_gqa
    return Shared(**fields, rot=table.rot), attention


@dataclass
class Embedding:
    """The token embedding table [vocab, dim] as stored: ``fp32`` (``arrays["weight"]``) or ``nbits``, the
    int4 blocks of a MatMulNBits weight laid out for com.microsoft::GatherBlockQuantized: ``qweight``
    uint8 [vocab, nb·B/2] (low nibble = even element, zero point 8) and ``scales`` float32 [vocab, nb],
    blocks of ``block_size`` along dim (the last block zero-padded). One row is what a token reads, so the
    table costs 4.25 bits per weight on disk instead of 32 (as onnxruntime-genai's int4 export)."""

    kind: str
    vocab: int
    dim: int
    arrays: dict[str, np.ndarray]
    block_size: int = 0


def write_embedding(store: WeightStore, emb: Embedding) -> None:
    if emb.kind == "fp32":
        store.add(f"{EMBEDDING}.weight", emb.arrays["weight"], DENSE_FILE, "embedding[vocab,d]")
    elif emb.kind == "nbits":
        for k in ("qweight", "scales"):
            store.add(f"{EMBEDDING}.{k}", emb.arrays[k], DENSE_FILE, f"gatherblockquantized.{k}")
    else:
        raise ValueError(f"Embedding.kind={emb.kind!r} is not one of ('fp32', 'nbits')")


def embed(g: Graph, store: WeightStore, spec: ArchSpec, input_ids: str) -> str:
    """input_ids ─Gather(embedding)─[×embedding multiplier: √d Gemma, Granite's]─► hidden.

    An int4 table (``write_embedding``) is gathered by GatherBlockQuantized, which dequantises the rows
    ((q − 8)·s in float32, bit-equal to ``quant.block``'s decode), then cut to d when the last block pads.
    """
    if f"{EMBEDDING}.qweight" in store.entries:
        qweight, scales = store.entries[f"{EMBEDDING}.qweight"], store.entries[f"{EMBEDDING}.scales"]
        block = 2 * qweight.shape[1] // scales.shape[1]
        h = g.op("/model/embed_tokens/GatherBlockQuantized", "GatherBlockQuantized",
                 [g.weight(store.proto(qweight.name)), input_ids, g.weight(store.proto(scales.name))],
                 domain=MS_DOMAIN, gather_axis=0, quantize_axis=1, block_size=block, bits=4)
        if 2 * qweight.shape[1] != spec.hidden_size:
            h = g.op("/model/embed_tokens/Slice", "Slice", [h, g.const([0]), g.const([spec.hidden_size]),
                                                             g.const([-1])])
    else:
        h = g.op("/model/embed_tokens/Gather", "Gather", [g.weight(store.proto(f"{EMBEDDING}.weight")), input_ids],
                 axis=0)
    if spec.embedding_multiplier != 1.0:
        h = g.op("/model/embed_tokens/Mul", "Mul", [h, g.const(spec.embedding_multiplier, np.float32)])
    return h


def sublayer_output(g: Graph, store: WeightStore, spec: ArchSpec, prefix: str, y: str, norm: np.ndarray | None,
                    tensor: str) -> str:
    """What a sub-layer adds to the residual: [RMSNorm (Gemma's sandwich norm)] then [× residual
    multiplier (Granite)]; y itself for most families."""
    if norm is not None:
        y = rms_norm(g, store, prefix, y, norm, spec.rms_norm_eps, tensor)
    if spec.residual_multiplier != 1.0:
        y = g.op(f"{prefix}/residual_multiplier/Mul", "Mul", [y, g.const(spec.residual_multiplier, np.float32)])
    return y


def softcap(g: Graph, prefix: str, x: str, cap: float) -> str:
    """cap · tanh(x / cap), in HF's order (Div, Tanh, Mul): Gemma 2 bends attention scores and logits
    smoothly into (−cap, cap).

        x ─Div(cap)─Tanh─Mul(cap)─► y
    """
    c = g.const(cap, np.float32)
    return g.op(f"{prefix}/Mul", "Mul", [g.op(f"{prefix}/Tanh", "Tanh", [g.op(f"{prefix}/Div", "Div", [x, c])]), c])


def logits(g: Graph, store: WeightStore, spec: ArchSpec, h: str, head: Linear) -> str:
    """normed hidden ─lm_head─[× 1/logits_scaling (Granite)]─[soft-cap (Gemma 2)]─► logits."""
    y = linear(g, store, "/lm_head", h, head, "lm_head")
    if spec.logits_multiplier != 1.0:
        y = g.op("/lm_head/Mul", "Mul", [y, g.const(spec.logits_multiplier, np.float32)])
    if spec.final_softcap:
        y = softcap(g, "/lm_head/softcap", y, spec.final_softcap)
    return y
