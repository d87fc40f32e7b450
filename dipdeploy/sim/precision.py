"""Bytes per weight of each storage precision the simulator accepts.

The quantised formats are not re-described here: their bits per weight come from the quant stage's
configs (``dipdeploy.quant.config.QUANT_PRESETS``; e.g. ``bq4`` = block 64 with an fp16 scale = 4.25 bits,
the paper's ≈4.25; ``bq4-b32`` = 4.5; ``vq3`` ≈ 3.127 incl. codebooks). Only the unquantised ones are
listed below.
"""

from __future__ import annotations

from dipdeploy.ops.formats import FORMATS
from dipdeploy.quant.config import QUANT_PRESETS, quant_config_from_name

_FLOAT_BITS = {f.name: float(f.code_bits) for f in FORMATS.values() if not f.quantised}
PRECISIONS = tuple(_FLOAT_BITS) + tuple(QUANT_PRESETS)


def bits_per_weight(precision: str) -> float:
    if precision in _FLOAT_BITS:
        return _FLOAT_BITS[precision]
    if precision not in QUANT_PRESETS:
        raise ValueError(f"precision {precision!r} unknown; choose one of {', '.join(PRECISIONS)}")
    return float(quant_config_from_name(precision).bits_per_weight())


def bytes_per_weight(precision: str) -> float:
    """Bytes per stored weight of ``precision`` (nominal: rows a multiple of the block/group size)."""
    return bits_per_weight(precision) / 8.0
