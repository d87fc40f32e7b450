"""BQ4, RTN3 and the 8-bit dense blocks: scalar block-wise integer weights along each row of the sparse layout.

Packed layout of a row matrix of R rows × C cols (``BlockQuantTensor``), bits n = 4 (BQ4), 3 (RTN3) or 8
(``Block8QuantConfig``, attention and lm_head only),
block size B, nb = ceil(C / B) blocks per row, Cp = nb·B:

| array     | dtype   | shape                                  | meaning                                   |
|-----------|---------|----------------------------------------|-------------------------------------------|
| ``qweight`` | uint8   | [R, ceil(Cp·n / 8)]                  | unsigned codes q ∈ [0, 2^n), bit stream (``bits.py``): n=4 → low nibble = even element |
| ``scales``  | float16 | [R, nb]                              | scale s of block b of row r               |
| ``zeros``   | uint8   | [R, ceil(nb·n / 8)] (asymmetric only)| n-bit zero point z per block, same bit stream |

Decode element c of row r: b = c // B, q = code c of the row's stream,
``w = (q − 2^(n−1)) · s[r, b]`` (symmetric) or ``w = (q − z[r, b]) · s[r, b]`` (asymmetric), in float32.

Padding (documented and tested): when C is not a multiple of B the row is padded to Cp with copies of
its last weight (the range of the last block is unchanged); the padded codes are stored and ignored on
decode, and counted in ``bits_per_weight``. A row never shares a block with another row, so any subset
of rows decodes on its own. For the MLP up|gate rows, blocks never straddle the u/g boundary when F is a
multiple of B (true for every registered model).
Floor 2: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dipdeploy.quant.api import register_quantizer, register_tensor
from dipdeploy.quant.bits import pack_bits, unpack_bits
from dipdeploy.quant.config import Block4QuantConfig, Block8QuantConfig, RTN3QuantConfig, _BlockIntConfig


@register_tensor
@dataclass
class BlockQuantTensor:
    """A row matrix in a scalar block format (BQ4, RTN3 or 8-bit); the layout is in the module docstring."""

    config: _BlockIntConfig
    rows: int
    cols: int
    qweight: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray | None = None

    @property
    def n_blocks(self) -> int:
        return -(-self.cols // self.config.block_size)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"qweight": self.qweight, "scales": self.scales}
        if self.zeros is not None:
            out["zeros"] = self.zeros
        return out

    def meta(self) -> dict:
        return {}

    @classmethod
    def from_arrays(cls, config, rows: int, cols: int, arrays: dict[str, np.ndarray], **meta) -> "BlockQuantTensor":
        return cls(config, rows, cols, arrays["qweight"], arrays["scales"], arrays.get("zeros"))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())

    @property
    def bits_per_weight(self) -> float:
        """Exact: every stored bit (codes + scales + zero points + padding) over R·C weights."""
        return 8 * self.nbytes / (self.rows * self.cols)

    def codes_rows(self, row_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(q − z) int32 [m, nb, B] and the scales float32 [m, nb] of rows ``row_idx``: w = (q − z)·s.

        The integer half is what an int8 kernel multiplies (SparseGatherMatMul at accuracy level 4).
        """
        cfg, n = self.config, self.config.bits
        B, nb = cfg.block_size, self.n_blocks
        q = unpack_bits(self.qweight[row_idx], n, nb * B).reshape(len(row_idx), nb, B).astype(np.int32)
        if self.zeros is None:
            z = np.int32(1 << (n - 1))
        else:
            z = unpack_bits(self.zeros[row_idx], n, nb).astype(np.int32)[:, :, None]
        return q - z, self.scales[row_idx].astype(np.float32)

    def dequantize_rows(self, row_idx: np.ndarray) -> np.ndarray:
        codes, s = self.codes_rows(row_idx)
        w = codes.astype(np.float32) * s[:, :, None]
        return w.reshape(len(row_idx), self.n_blocks * self.config.block_size)[:, : self.cols]


def _codes_sym(x: np.ndarray, scale: np.ndarray, n: int) -> np.ndarray:
    half = 1 << (n - 1)
    safe = np.where(scale == 0, 1, scale)
    return np.clip(np.rint(x / safe), -half, half - 1) + half


def _codes_asym(x: np.ndarray, scale: np.ndarray, zero: np.ndarray, n: int) -> np.ndarray:
    safe = np.where(scale == 0, 1, scale)
    return np.clip(np.rint(x / safe) + zero, 0, (1 << n) - 1)


def _sym_params(x: np.ndarray, n: int, ratio: float) -> tuple[np.ndarray, None]:
    """Scale = signed extreme / −2^(n−1) (times a clipping ratio), rounded to fp16."""
    idx = np.abs(x).argmax(axis=2)[..., None]
    extreme = np.take_along_axis(x, idx, axis=2)
    scale = (extreme * ratio / -(1 << (n - 1))).astype(np.float16).astype(np.float32)
    return scale, None


def _asym_params(x: np.ndarray, n: int, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """Range [min, max] shrunk by ``ratio``; fp16 scale and an n-bit integer zero point."""
    lo = np.minimum(x.min(axis=2, keepdims=True), 0) * ratio
    hi = np.maximum(x.max(axis=2, keepdims=True), 0) * ratio
    scale = ((hi - lo) / ((1 << n) - 1)).astype(np.float16).astype(np.float32)
    safe = np.where(scale == 0, 1, scale)
    zero = np.clip(np.rint(-lo / safe), 0, (1 << n) - 1)
    return scale, zero


def _encode(x: np.ndarray, cfg: _BlockIntConfig, ratio: float):
    n = cfg.bits
    if cfg.symmetric:
        scale, zero = _sym_params(x, n, ratio)
        q = _codes_sym(x, scale, n)
        deq = (q - (1 << (n - 1))) * scale
    else:
        scale, zero = _asym_params(x, n, ratio)
        q = _codes_asym(x, scale, zero, n)
        deq = (q - zero) * scale
    return q, scale, zero, deq


#: Input bytes quantised at a time: every step works per row (each block's scale, codes and packed bytes
#: depend on that row alone), so row chunks give the same bytes while bounding the temporaries (about
#: eight input-sized arrays with the scale search) to a few times the chunk instead of eight times a whole
#: 7B MLP matrix ([4096, 28672] fp32) or a large vocabulary's lm_head.
CHUNK_BYTES = 8 << 20


def quantize_block(rows: np.ndarray, cfg: _BlockIntConfig, row_weight: np.ndarray | None = None) -> BlockQuantTensor:
    """Round-to-nearest (or, with ``cfg.scale_search``, the per-block best clipping ratio), in row chunks
    of about :data:`CHUNK_BYTES`, each written into the packed arrays as it is done (no second copy of
    them from joining the chunks).

    ``row_weight`` is ignored: it is constant within a block in the sparse row layout, so it cannot
    change any per-block choice.
    """
    R, C = rows.shape
    if R == 0:
        return BlockQuantTensor(cfg, R, C, *_quantize_rows(rows, cfg))
    step = max(1, CHUNK_BYTES // max(1, 4 * C))
    out = None
    for i in range(0, R, step):
        parts = _quantize_rows(rows[i:i + step], cfg)
        if out is None:  # the packed widths are known from the first chunk
            out = [None if a is None else np.empty((R, a.shape[1]), dtype=a.dtype) for a in parts]
        for whole, part in zip(out, parts):
            if whole is not None:
                whole[i:i + len(part)] = part
    return BlockQuantTensor(cfg, R, C, *out)


def _quantize_rows(rows: np.ndarray, cfg: _BlockIntConfig):
    """(packed codes, fp16 scales, packed zero points or None) of a row chunk."""
    R, C = rows.shape
    B, n = cfg.block_size, cfg.bits
    nb = -(-C // B)
    x = np.pad(rows, ((0, 0), (0, nb * B - C)), mode="edge").reshape(R, nb, B)
    q, scale, zero, deq = _encode(x, cfg, 1.0)
    if cfg.scale_search:
        best = ((deq - x) ** 2).sum(axis=2, keepdims=True)
        for ratio in np.linspace(1.0, 0.5, cfg.search_grid)[1:]:
            q2, s2, z2, d2 = _encode(x, cfg, float(ratio))
            err = ((d2 - x) ** 2).sum(axis=2, keepdims=True)
            better = err < best
            best = np.where(better, err, best)
            q = np.where(better, q2, q)
            scale = np.where(better, s2, scale)
            if zero is not None:
                zero = np.where(better, z2, zero)
    qweight = pack_bits(q.reshape(R, nb * B).astype(np.uint8), n)
    zeros = None if zero is None else pack_bits(zero.reshape(R, nb).astype(np.uint8), n)
    return qweight, scale.reshape(R, nb).astype(np.float16), zeros


register_quantizer(Block4QuantConfig)(quantize_block)
register_quantizer(RTN3QuantConfig)(quantize_block)
register_quantizer(Block8QuantConfig)(quantize_block)
