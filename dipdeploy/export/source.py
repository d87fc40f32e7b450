"""The torch side of export: read a loaded HF model layer by layer into numpy, quantising as we go.

Everything the graph builder sees is numpy (``blocks.Linear``, ``mlp.MlpWeights``); this is the only
export module that touches torch besides validation. Quantisation happens here, once, and the
dequantised values are written back into the torch model, so the torch reference of validation runs
exactly the numbers the bundle decodes (the fake-quant of ``dipdeploy.quant.fake``, scope ``all``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from dipdeploy.bundle.names import EMBEDDING
from dipdeploy.export.blocks import AttentionWeights, Embedding, Linear, RopeTable
from dipdeploy.export.mlp import MlpWeights
from dipdeploy.export.spec import ArchSpec
from dipdeploy.ops.formats import OpWeights
from dipdeploy.quant.api import dequantize_rows, quantize_dense, quantize_embedding
from dipdeploy.quant.config import Block4QuantConfig, QuantConfig, config_to_dict, dense_config
from dipdeploy.quant.dense import DenseBits
from dipdeploy.quant.fake import mlp_weights, quantize_group, set_mlp_weights
from dipdeploy.quant.layout import mlp_to_rows, rows_to_mlp
from dipdeploy.sparsity.scores import Fold, fold_layer


def _np(t: torch.Tensor) -> np.ndarray:
    return _view(t).copy()


def _view(t: torch.Tensor) -> np.ndarray:
    """``t`` as float32 numpy, sharing its memory where it is float32 on the CPU already (a copy of a
    large table would double it while it is quantised)."""
    return t.detach().to(dtype=torch.float32, device="cpu").numpy()


#: Bytes of fp32 rows dequantised at a time when quantised values are written back into the torch model:
#: each row decodes alone, so blocks give the whole matrix's values without its integer codes and fp32
#: copy beside the weight.
WRITE_BACK_BYTES = 32 << 20


@dataclass
class LayerWeights:
    """One decoder layer; norm weights already include the family's offset ((1 + w) for Gemma)."""

    ln_attn: np.ndarray | None  # None: no norm before the sub-layer (OLMo2)
    attn: AttentionWeights
    ln_mlp: np.ndarray | None
    mlp: MlpWeights
    ln_attn_out: np.ndarray | None = None  # sandwich norms (Gemma): on a sub-layer's output
    ln_mlp_out: np.ndarray | None = None


@dataclass
class QuantState:
    """Bits actually stored, summed while layers are read (for the manifest)."""

    mlp_bits: int = 0
    mlp_params: int = 0
    dense_bits: int = 0
    dense_params: int = 0
    #: attention and lm_head weights by the bits of their codes (``quant.dense``): {4: params, 8: params}
    dense_by_bits: dict[int, int] = field(default_factory=dict)


class ModelSource:
    """Numpy views of one HF decoder, layer by layer, optionally quantised (MLP in ``quant``,
    attention and lm_head in 4- or 8-bit blocks, as ``dense_bits`` rules each, → MatMulNBits)."""

    def __init__(self, lm, mlp_cfg: QuantConfig | None = None, wina: bool = False, max_length: int = 2048,
                 embedding: str = "int4", calib: list[dict] | None = None, fold: Fold | None = None,
                 dense_bits: DenseBits | None = None):
        self.lm = lm
        self.model = lm.model
        self.checkpoint = lm.checkpoint  # streamed weights: read per module, released after use
        # The dequantised values go back into the torch model only where it is validation's reference; a
        # streamed module is released right after it is read (a 7B layer's copies would not fit).
        self.write_back = self.checkpoint is None
        self.spec = ArchSpec.from_config(self.model.config.to_dict())
        self.mlp_cfg = mlp_cfg
        # per layer and row group, the statistics a calibrated format quantises with (fake.calibration_statistics)
        self.calib = calib
        self.dense_cfg: Block4QuantConfig | None = None  # the 4-bit dense blocks (and the int4 embedding's)
        if self.mlp_cfg is not None:
            self.dense_cfg = dense_config(self.mlp_cfg)
        self.dense_bits = dense_bits or DenseBits()
        self._names = {id(m): name for name, m in self.model.named_modules()}
        self.wina = wina
        self.fold = fold  # a folded score (sparsity.scores.FOLDED): applied to each layer as it is read
        self._folded: set[int] = set()
        self.max_length = self.spec.context_length(max_length)
        self.stats = QuantState()
        self._head: Linear | None = None
        # int4 embedding rows (GatherBlockQuantized) whenever the dense weights are quantised and asked for
        self.int4_embedding = self.dense_cfg is not None and embedding == "int4"
        # the lm_head's bits (None unquantised): a tied head shares an int4 table's blocks only at 4 bits
        self.head_bits = (None if self.dense_cfg is None
                          else self.dense_bits.bits([self._weight_name(self.model.get_output_embeddings())]))
        self._embedding: Embedding | None = None
        self._untie_if_quantised()
        # decided once: a streamed export releases the embedding (and a tied head with it) once it is quantised
        self._tied = self.model.get_output_embeddings().weight is self.model.get_input_embeddings().weight

    def quant_dict(self) -> dict | None:
        if self.mlp_cfg is None:
            return None
        by_bits = self.stats.dense_by_bits
        out = {"mlp": config_to_dict(self.mlp_cfg), "dense": config_to_dict(self.dense_cfg),
               "dense_bits": {**self.dense_bits.record(), "lm_head": self.head_bits,
                              "params": {str(b): n for b, n in sorted(by_bits.items())}}}
        if 8 in by_bits:
            out["dense_8bit"] = config_to_dict(dense_config(self.mlp_cfg, 8))
        return out

    def _weight_name(self, module: torch.nn.Module) -> str:
        """The HF name of ``module``'s weight (``model.layers.0.self_attn.q_proj.weight``)."""
        return f"{self._names[id(module)]}.weight"

    def _untie_if_quantised(self) -> None:
        """A quantised lm_head must not change an fp32 embedding table: untie them.
        An int4 embedding stays tied to a 4-bit head: head and table are the same int4 blocks, stored once;
        an 8-bit head is stored apart from the int4 table."""
        head, emb = self.model.get_output_embeddings(), self.model.get_input_embeddings()
        apart = not self.int4_embedding or self.head_bits != 4
        if self.dense_cfg is not None and apart and head.weight is emb.weight:
            head.weight = torch.nn.Parameter(head.weight.detach().clone())
            self.model.config.tie_word_embeddings = False

    @property
    def tied(self) -> bool:
        return self._tied

    # -- pieces ------------------------------------------------------------------------------------
    @torch.no_grad()
    def rope(self) -> dict[str, RopeTable]:
        """Per layer type, cos/sin [max_length, r] from the model's own rotary module (r = rotary dims):
        one table shared by every layer, or one per layer type (Gemma 3's local and global bases)."""
        rotary = self.model.model.rotary_emb
        pos = torch.arange(self.max_length)[None]
        x = torch.zeros(1, 1, self.spec.head_dim, dtype=torch.float32)
        kinds = sorted(set(self.spec.layer_types))
        if self.spec.arch.rope != "per_layer_type":
            cos, sin = rotary(x, pos)
            table = RopeTable("model.rope", _np(cos[0]), _np(sin[0]))
            return {kind: table for kind in kinds}
        out = {}
        for kind in kinds:
            cos, sin = rotary(x, pos, kind)
            out[kind] = RopeTable(f"model.rope.{kind}", _np(cos[0]), _np(sin[0]))
        return out

    def embedding(self) -> Embedding:
        """The table as the bundle stores it (``blocks.Embedding``), quantised once: an int4 table's
        dequantised rows are written back into the model (and so into a tied lm_head), as every other
        quantised weight is; a streamed model's table (and a tied head) is released instead, since
        nothing reads it again. The fp32 table is not copied: an fp32 bundle stores the model's own."""
        if self._embedding is None:
            module = self.model.get_input_embeddings()
            w = _view(module.weight)
            vocab, dim = w.shape
            if not self.int4_embedding:
                self._embedding = Embedding("fp32", vocab, dim, {"weight": w})
            else:
                packed = quantize_embedding(w, self.mlp_cfg)
                del w
                if self.write_back:
                    self._assign([module], packed)
                else:
                    self._drop([module, self.model.get_output_embeddings()] if self.tied else [module])
                self.stats.dense_bits += 8 * packed.nbytes
                self.stats.dense_params += vocab * dim
                self._embedding = Embedding("nbits", vocab, dim, {
                    "qweight": packed.qweight.reshape(vocab, -1), "scales": packed.scales.astype(np.float32)},
                    block_size=self.dense_cfg.block_size)
        return self._embedding

    def _linear(self, weights: list[torch.nn.Linear]) -> Linear:
        """Rows of several nn.Linear stacked ([q; k; v]) as one Linear, quantised if asked."""
        # [out, in]: the torch weight itself (an lm_head: vocab × d fp32), or one copy of several stacked
        views = [_view(m.weight) for m in weights]
        w = views[0] if len(views) == 1 else np.concatenate(views, axis=0)
        del views
        biases = [m.bias for m in weights]
        bias = np.concatenate([_np(b) for b in biases]) if all(b is not None for b in biases) else None
        out_f, in_f = w.shape
        if self.dense_cfg is None:
            return Linear("fp32", in_f, out_f, {"weight": np.ascontiguousarray(w.T)}, bias)
        bits = self.dense_bits.bits([self._weight_name(m) for m in weights])
        self._drop(weights)
        packed = quantize_dense(w, self.mlp_cfg, bits)
        del w  # a streamed module's storage, kept until now by this view of it
        if self.write_back:
            self._assign(weights, packed)
        self.stats.dense_bits += 8 * packed.nbytes
        self.stats.dense_params += out_f * in_f
        self.stats.dense_by_bits[bits] = self.stats.dense_by_bits.get(bits, 0) + out_f * in_f
        B, nb = packed.config.block_size, packed.n_blocks
        arrays = {"qweight": packed.qweight.reshape(out_f, nb, B * bits // 8),
                  "scales": packed.scales.astype(np.float32).reshape(-1)}
        if packed.zeros is not None:
            arrays["zeros"] = packed.zeros.reshape(-1)
        return Linear("nbits", in_f, out_f, arrays, bias, block_size=B, bits=bits)

    def _drop(self, modules: list[torch.nn.Module]) -> None:
        """A streamed module's torch weights, released once their numpy copy is taken (nothing reads them
        again: no write-back), so a layer's fp32 tensors and their quantiser inputs are not held together."""
        if not self.write_back:
            self.checkpoint.release(*modules)

    @staticmethod
    @torch.no_grad()
    def _assign(modules: list[torch.nn.Module], packed) -> None:
        """The dequantised rows of ``packed`` into the weights of ``modules`` (stacked in this order), a
        block of rows at a time (:data:`WRITE_BACK_BYTES`)."""
        step = max(1, WRITE_BACK_BYTES // (4 * packed.cols))
        start = 0
        for m in modules:
            n = m.weight.shape[0]
            for i in range(0, n, step):
                rows = dequantize_rows(packed, np.arange(start + i, start + min(n, i + step)))
                m.weight[i:i + len(rows)].copy_(torch.from_numpy(rows).to(m.weight.dtype))
            start += n

    def _norm(self, module) -> np.ndarray:
        """A norm's effective scale: w, or (offset + w) for families that scale by (1 + w)."""
        return _np(module.weight) + np.float32(self.spec.arch.norm_offset)

    def _attention(self, attn) -> AttentionWeights:
        names = self.spec.arch.attn
        qkv = [getattr(attn, n) for n in ((names.qkv,) if names.qkv else (names.q, names.k, names.v))]
        want = self.spec.arch.attention_bias(self.model.config)
        if any((m.bias is not None) != want for m in qkv):
            raise ValueError(f"{self.spec.arch.name}: the checkpoint's q/k/v biases disagree with the family record "
                             f"(bias expected: {want}); the record in dipdeploy/arch/ is wrong for this checkpoint")
        norms = [self._norm(getattr(attn, n)) if n else None for n in (names.q_norm, names.k_norm)]
        return AttentionWeights(self._linear(qkv), self._linear([getattr(attn, names.o)]), *norms)

    def _mlp(self, mlp, i: int) -> MlpWeights:
        arch = self.spec.arch
        w_up, w_gate, w_down = mlp_weights(mlp, arch)
        if self.mlp_cfg is not None:
            self._drop([mlp])
        up_gate, down = mlp_to_rows(w_up, w_gate, w_down)
        del w_up, w_gate, w_down
        if self.mlp_cfg is None:
            ug, dn = OpWeights.from_matrix(up_gate), OpWeights.from_matrix(down)
        else:
            stat = {"up_gate": None, "down": None} if self.calib is None else self.calib[i]
            p_ug = quantize_group(up_gate, self.mlp_cfg, stat["up_gate"])
            p_dn = quantize_group(down, self.mlp_cfg, stat["down"])
            del up_gate, down
            if self.write_back or self.wina:
                up_gate, down = dequantize_rows(p_ug), dequantize_rows(p_dn)
            if self.write_back:
                set_mlp_weights(mlp, arch, *rows_to_mlp(up_gate, down))
            for p in (p_ug, p_dn):
                self.stats.mlp_bits += 8 * p.nbytes
                self.stats.mlp_params += p.rows * p.cols
            ug, dn = OpWeights.from_packed(p_ug), OpWeights.from_packed(p_dn)
        norms = {}
        if self.wina:  # the torch reference's norm_in / norm_glu, from the (dequantised) weights
            norms = {"colnorm_in": np.sqrt(np.square(up_gate).sum(1)).astype(np.float32),
                     "colnorm_glu": np.sqrt(np.square(down).sum(1)).astype(np.float32)}
        return MlpWeights(ug, dn, **norms)

    @contextmanager
    def _resident(self, module: torch.nn.Module, prefix: str):
        """``module``'s weights in memory for the block: streamed ones are read now, released after."""
        if self.checkpoint is None:
            yield module
            return
        self.checkpoint.materialise(module, prefix)
        try:
            yield module
        finally:
            self.checkpoint.release(module)

    def layer(self, i: int) -> LayerWeights:
        """Layer ``i``'s weights; a folded score is folded in first, in the fp32 weights before they are
        quantised (in place: an eager export's torch reference is the folded model, which plain top-|·|
        runs as the score; a streamed layer is folded as it is read, by the same arithmetic)."""
        norms = self.spec.arch.norms
        with self._resident(self.model.model.layers[i], f"model.layers.{i}.") as layer:
            if self.fold is not None and i not in self._folded:
                fold_layer(layer, self.spec.arch, self.fold)
                self._folded.add(i)
            out = {k: self._norm(getattr(layer, n)) if n else None
                   for k, n in (("ln_attn", norms.attn_in), ("ln_mlp", norms.mlp_in),
                                ("ln_attn_out", norms.attn_out), ("ln_mlp_out", norms.mlp_out))}
            return LayerWeights(attn=self._attention(layer.self_attn), mlp=self._mlp(layer.mlp, i), **out)

    def final_norm(self) -> np.ndarray:
        name = self.spec.arch.norms.final
        with self._resident(getattr(self.model.model, name), f"model.{name}.") as norm:
            return self._norm(norm)

    def lm_head(self) -> Linear:
        """The lm_head, quantised once however often it is asked for (model.onnx and head.onnx)."""
        if self._head is None:
            if self.tied and self.int4_embedding:  # a 4-bit head (an 8-bit one was untied)
                emb = self.embedding()
                self.stats.dense_by_bits[4] = self.stats.dense_by_bits.get(4, 0) + emb.vocab * emb.dim
                B = emb.block_size
                self._head = Linear("nbits", emb.dim, emb.vocab, {
                    "qweight": emb.arrays["qweight"].reshape(emb.vocab, -1, B // 2),
                    "scales": emb.arrays["scales"].reshape(-1)}, block_size=B, tied_to=EMBEDDING)
            elif self.tied:
                self._head = Linear("tied", self.spec.hidden_size, self.spec.vocab_size,
                                    tied_to=f"{EMBEDDING}.weight")
            else:
                with self._resident(self.model.get_output_embeddings(), "lm_head.") as head:
                    self._head = self._linear([head])
        return self._head
