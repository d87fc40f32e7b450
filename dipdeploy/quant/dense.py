"""How many bits each dense weight (attention, lm_head) gets: the one rule, ``--dense-bits auto|4|8``.

``4``: BQ4 blocks; ``8``: 8-bit blocks (``config.Block8QuantConfig``); ``auto``: per weight, never fewer
bits than the file the user brought stored it with, where that file is itself quantised (a GGUF): 8 bits
where the source tensor takes more than :data:`THRESHOLD` bits per weight (Q4_1, Q5_*, Q6_K, Q8_*, F16,
BF16, F32 …), else 4 (Q4_0, Q4_K, IQ4_*, Q3_K, Q2_K …: no more than BQ4 with its scales stores). A source
in floating point that is not a GGUF (safetensors in fp16/bf16/fp32) gets 4 under ``auto``: it has no
quantised precision to keep, and 4 bits is the size the bundle is made for.

The bits counted are the file's storage per weight, scales and minimums included (a GGUF type's bytes
per block over its weights per block, as ``gguf.GGML_QUANT_SIZES`` gives them): Q4_1's per-block
minimum makes it 5 bits per weight, more than BQ4 keeps, so its tensors get 8 bits.

Weights that the bundle stores as one matrix (q, k and v stacked into one MatMulNBits) get the widest of
their sources' bits, so a layer whose v alone is Q6_K stores all three at 8 bits; ``eval --quant-scope
all`` groups them the same way (``fake.py``), so it measures what export ships. The token embedding is
not ruled here (``--embedding``). Floor 2: no numpy, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from dipdeploy import defaults

#: Bits a dense weight can have (MatMulNBits ``bits``).
BITS = (4, 8)
#: Bits per weight of a source tensor above which ``auto`` gives it 8 bits: Q4_0's and Q4_K's 4.5.
THRESHOLD = 4.5

#: GGUF tensor type name → (weights, bytes) of one block, as ``gguf.GGML_QUANT_SIZES`` (tests hold the two equal)
GGUF_BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "F64": (1, 8),
    "I8": (1, 1), "I16": (1, 2), "I32": (1, 4), "I64": (1, 8),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34), "Q8_1": (32, 40),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
    "Q8_K": (256, 292), "IQ1_S": (256, 50), "IQ1_M": (256, 56), "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74),
    "IQ2_S": (256, 82), "IQ3_XXS": (256, 98), "IQ3_S": (256, 110), "IQ4_NL": (32, 18), "IQ4_XS": (256, 136),
    "TQ1_0": (256, 54), "TQ2_0": (256, 66), "MXFP4": (32, 17), "NVFP4": (64, 36), "Q1_0": (128, 18),
}


def gguf_bits_per_weight(source_type: str) -> float | None:
    """Bits per weight a GGUF tensor of type ``source_type`` (``gguf.GGMLQuantizationType``'s name) is
    stored with, scales included (``Q4_K`` → 4.5, ``Q6_K`` → 6.5625, ``F16`` → 16); None for a type this
    rule does not know."""
    block = GGUF_BLOCKS.get(source_type)
    return None if block is None else 8 * block[1] / block[0]


def source_bits(source_type: str | None) -> int:
    """The bits ``auto`` gives a dense weight whose source tensor has type ``source_type`` (None: the
    source is not a GGUF, or the weight is not in it): 8 where it is stored with more than
    :data:`THRESHOLD` bits per weight, and for a type this rule does not know (never fewer bits than the
    source), else 4."""
    if source_type is None:
        return 4
    bits = gguf_bits_per_weight(source_type)
    return 4 if bits is not None and bits <= THRESHOLD else 8


@dataclass(frozen=True)
class DenseBits:
    """What ``--dense-bits`` asked (``auto``, ``4`` or ``8``) and, for ``auto``, the source's tensor types
    by Hugging Face weight name (``model.layers.0.self_attn.q_proj.weight`` → ``Q4_K``; empty for a
    source that is not a GGUF: ``loading.source_types``)."""

    asked: str = defaults.DENSE_BITS
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.asked not in defaults.DENSE_BITS_CHOICES:
            raise ValueError(f"--dense-bits {self.asked!r} unknown; choose one of "
                             f"{', '.join(defaults.DENSE_BITS_CHOICES)}")

    def bits(self, names: Iterable[str]) -> int:
        """The bits of the one matrix that stores the weights ``names`` (HF names; several when stacked)."""
        if self.asked != "auto":
            return int(self.asked)
        return max((source_bits(self.sources.get(n)) for n in names), default=4)

    def record(self) -> dict:
        """For a manifest or an eval row: what was asked, and the rule ``auto`` applied."""
        out: dict = {"asked": self.asked}
        if self.asked == "auto":
            out["rule"] = (f"8 bits where the source GGUF stores a tensor with more than {THRESHOLD} bits per "
                           "weight, else 4"
                           if self.sources else "4 bits: the source is not a quantised GGUF")
        return out
