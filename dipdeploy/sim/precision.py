"""Bytes per weight of each storage precision: the one table the simulator (and anyone sizing rows)
reads. Block formats include their per-block fp16 scale (method.md, Quantisation):

| name      | bits/weight | what                                                     |
|-----------|-------------|----------------------------------------------------------|
| fp32      | 32          | unquantised                                              |
| fp16      | 16          | half precision                                           |
| bq4       | 4.25        | 4-bit block-wise, block 64 along the row, fp16 scale (the paper's ≈4.25 bits) |
| bq4-b32   | 4.5         | 4-bit block-wise, block 32, fp16 scale                   |
| vq3       | 3.125       | GPTVQ-style 2-D VQ, 64 centroids per group, incl. codebooks (≈)            |
"""

from __future__ import annotations

BITS_PER_WEIGHT: dict[str, float] = {
    "fp32": 32.0,
    "fp16": 16.0,
    "bq4": 4.25,
    "bq4-b32": 4.5,
    "vq3": 3.125,
}
PRECISIONS = tuple(BITS_PER_WEIGHT)


def bytes_per_weight(precision: str) -> float:
    """Bytes per stored weight of ``precision`` (see the module table)."""
    if precision not in BITS_PER_WEIGHT:
        raise ValueError(f"precision {precision!r} unknown; choose one of {', '.join(PRECISIONS)}")
    return BITS_PER_WEIGHT[precision] / 8.0
