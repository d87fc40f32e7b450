"""How many bits each dense weight (attention, lm_head) gets: the one rule, ``--dense-bits auto|4|8``.

``4``: BQ4 blocks; ``8``: 8-bit blocks (``config.Block8QuantConfig``); ``auto``: per weight, never fewer
bits than the file the user brought stored it with, where that file is itself quantised (a GGUF): 8 bits
where the source tensor's codes are wider than 4 bits (Q5_*, Q6_K, Q8_*, F16, BF16, F32 …), else 4. A
source in floating point that is not a GGUF (safetensors in fp16/bf16/fp32) gets 4 under ``auto``, as
before this rule: it has no quantised precision to keep, and 4 bits is the size the bundle is made for.

The width counted is that of a weight's own code, not the block's storage per weight: Q4_1's extra is a
per-block minimum, its weights still take one of 16 levels, as BQ4's do; Q4_K and IQ4_* likewise.

Weights that the bundle stores as one matrix (q, k and v stacked into one MatMulNBits) get the widest of
their sources' bits, so a layer whose v alone is Q6_K stores all three at 8 bits; ``eval --quant-scope
all`` groups them the same way (``fake.py``), so it measures what export ships. The token embedding is
not ruled here (``--embedding``). Floor 2: no numpy, no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from dipdeploy import defaults

#: Bits a dense weight can have (MatMulNBits ``bits``).
BITS = (4, 8)

_FLOAT_BITS = {"F16": 16, "BF16": 16, "F32": 32, "F64": 64, "I8": 8, "I16": 16, "I32": 32, "I64": 64, "MXFP4": 4}
_QUANT = re.compile(r"^(?:I?Q|TQ)(\d)_")


def code_bits(source_type: str) -> int | None:
    """Bits of one weight's code in a GGUF tensor type named as ``gguf.GGMLQuantizationType`` names it
    (``Q4_K`` → 4, ``Q6_K`` → 6, ``IQ4_XS`` → 4, ``F16`` → 16); None for a name this rule does not know."""
    if source_type in _FLOAT_BITS:
        return _FLOAT_BITS[source_type]
    found = _QUANT.match(source_type)
    return int(found.group(1)) if found else None


def source_bits(source_type: str | None) -> int:
    """The bits ``auto`` gives a dense weight whose source tensor has type ``source_type`` (None: the
    source is not a GGUF, or the weight is not in it): 8 where its codes are wider than 4 bits, and for
    a type this rule does not know (never fewer bits than the source), else 4."""
    if source_type is None:
        return 4
    bits = code_bits(source_type)
    return 4 if bits is not None and bits <= 4 else 8


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
            out["rule"] = ("8 bits where the source GGUF tensor's codes are wider than 4 bits, else 4"
                           if self.sources else "4 bits: the source is not a quantised GGUF")
        return out
