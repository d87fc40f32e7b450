"""Free disk space, checked before an export starts: a full disk should be refused in a second with
the figures, not minutes later with a traceback.

The estimate is an upper bound from the model's config (no weights are read): every weight at the
larger of the MLP's and the dense layers' bits per weight; the embedding at the same bits with
``--embedding int4`` (a tied lm_head shares its blocks), else in fp32 with, when the checkpoint ties
them, a quantised lm_head of its own (unquantised, the two stay one tensor); one alignment gap per
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


def model_shape(model: str) -> ModelShape:
    """Parameter counts from the config alone (the model is built on ``meta``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from dipdeploy.loading import config_of

    config, _ = config_of(model)  # a GGUF's own metadata: no fp32 copy is written to decide
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config, trust_remote_code=False).parameters())
    return ModelShape(params, config.vocab_size * config.hidden_size,
                      bool(getattr(config, "tie_word_embeddings", False)), config.num_hidden_layers)


def bits_per_weight(quant: str) -> float:
    """The bits of the widest quantised weight of the bundle (32 unquantised)."""
    if quant == "none":
        return 32.0
    from dipdeploy.quant.config import Block4QuantConfig, quant_config_from_name

    mlp = quant_config_from_name(quant)
    dense = mlp if isinstance(mlp, Block4QuantConfig) else Block4QuantConfig()
    return max(mlp.bits_per_weight(), dense.bits_per_weight())


def expected_bytes(shape: ModelShape, cfg: ExportConfig) -> int:
    bpw = bits_per_weight(cfg.quant)
    if cfg.quant != "none" and cfg.embedding == "int4":
        weights = shape.params * bpw / 8
    else:
        lm_head = shape.embedding if shape.tied and cfg.quant != "none" else 0  # quantised apart from the embedding
        weights = 4 * shape.embedding + (shape.params - shape.embedding + lm_head) * bpw / 8
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
