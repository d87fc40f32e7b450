"""Free disk space, checked before an export starts: a full disk should be refused in a second with
the figures, not minutes later with a traceback.

The estimate is an upper bound from the model's config (no weights are read): the MLP at its format's
bits per weight, every other weight at the dense layers' (8-bit blocks unless ``--dense-bits 4``: ``auto``
may choose them for any); the embedding in BQ4 blocks with ``--embedding int4`` (a tied 4-bit lm_head
shares its blocks), else in fp32, with, when the checkpoint ties them and the head may not share the
table, a quantised lm_head of its own (unquantised, the two stay one tensor); one alignment gap per
tensor, and a margin for
the tokenizer, the graphs and the native library. The old bundle stays on disk until the new one is in place, so the whole estimate is needed
even when replacing.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from dipdeploy.export.config import ExportConfig

#: Relative margin over the weights, and the files that do not scale with them (tokenizer, graphs, library).
MARGIN = 0.10
FIXED_BYTES = 64 * 2**20
#: Weight tensors per decoder layer, over-counted (attention 4 + MLP 3 + 2 norms + scales), for the gaps.
TENSORS_PER_LAYER = 16


class NoSpace(OSError):
    """The bundle would not fit on the disk of ``--out``."""


@dataclass(frozen=True)
class ModelShape:
    params: int
    embedding: int  # vocab × hidden
    tied: bool
    layers: int
    mlp: int = 0  # the MLPs' weights


def model_shape(model: str) -> ModelShape:
    """Parameter counts from the config alone (the model is built on ``meta``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from dipdeploy.loading import config_of

    config, _ = config_of(model)  # a GGUF's own metadata: no fp32 copy is written to decide
    with torch.device("meta"):
        named = list(AutoModelForCausalLM.from_config(config, trust_remote_code=False).named_parameters())
    params = sum(p.numel() for _, p in named)
    mlp = sum(p.numel() for n, p in named if ".mlp." in n)
    return ModelShape(params, config.vocab_size * config.hidden_size,
                      bool(getattr(config, "tie_word_embeddings", False)), config.num_hidden_layers, mlp)


def bits_per_weight(quant: str, dense_bits: str = "4") -> tuple[float, float]:
    """(MLP, dense) bits per weight of a bundle's quantised weights (32 unquantised); the dense figure
    is an upper bound under ``--dense-bits auto`` (8-bit blocks)."""
    if quant == "none":
        return 32.0, 32.0
    from dipdeploy.quant.config import dense_config, quant_config_from_name

    mlp = quant_config_from_name(quant)
    return mlp.bits_per_weight(), dense_config(mlp, 4 if dense_bits == "4" else 8).bits_per_weight()


def expected_bytes(shape: ModelShape, cfg: ExportConfig) -> int:
    if cfg.quant == "none":
        weights = 4 * shape.params
    else:
        mlp_bpw, dense_bpw = bits_per_weight(cfg.quant, cfg.dense_bits)
        int4 = cfg.embedding == "int4"
        table = bits_per_weight(cfg.quant)[1] / 8 if int4 else 4
        # a tied lm_head stored apart: beside an fp32 table, or in 8-bit blocks beside an int4 one
        head = shape.embedding if shape.tied and (not int4 or cfg.dense_bits != "4") else 0
        other = shape.params - shape.mlp - shape.embedding  # attention, norms and an untied lm_head
        weights = shape.mlp * mlp_bpw / 8 + (other + head) * dense_bpw / 8 + shape.embedding * table
    gaps = cfg.alignment * (TENSORS_PER_LAYER * shape.layers + 4)
    return int(weights * (1 + MARGIN) + gaps + FIXED_BYTES)


def check_free_space(out: Path, need: int) -> None:
    """Raise :class:`NoSpace` naming needed and free bytes when ``need`` exceeds the free space."""
    out = Path(out)
    where = out.parent if not out.is_dir() else out
    free = shutil.disk_usage(where).free
    if free < need:
        raise NoSpace(f"not enough free space for the bundle in {out.parent}: it needs about {need} bytes "
                      f"({need / 1e6:.1f} MB) and {free} bytes ({free / 1e6:.1f} MB) are free; free some "
                      "space or choose another --out")


def check_space_for(cfg: ExportConfig, out: Path) -> None:
    """:func:`check_free_space` for ``cfg``'s model; a model whose config cannot be read is left to the
    loader, which explains what is wrong with it."""
    try:
        shape = model_shape(cfg.model)
    except (OSError, ValueError, KeyError):
        return
    check_free_space(out, expected_bytes(shape, cfg))
