"""VQ3: GPTVQ-style 2-D vector quantisation with one 64-entry codebook per group of weights.

Packed layout of a row matrix of R rows × C cols (C even), ``VQTensor``. A *vector* is a pair of
consecutive weights of one row (cols 2p, 2p+1); a row has P = C/2 vectors. Groups are rectangles of
``group_rows`` (gr) rows × ``group_cols`` (gc, even) cols, stored in the tensor; ngr = ceil(R/gr),
ngc = ceil(C/gc) (the last group row/column may be partial).

| array              | dtype   | shape               | meaning                                       |
|--------------------|---------|---------------------|-----------------------------------------------|
| ``codes``            | uint8   | [R, ceil(6·P / 8)]  | 6-bit index per vector, bit stream (``bits.py``): 4 vectors → 3 bytes, LSB first |
| ``codebooks``        | int8 or float16 | [ngr, ngc, 64, 2] | centroids of group (i, j)             |
| ``codebook_scales``  | float16 | [ngr, ngc] (int8 codebooks only) | centroid = int8 value × scale  |

Decode row r: i = r // gr; for vector p, j = (2p) // gc, k = code p of row r;
``w[r, 2p:2p+2] = codebooks[i, j, k] · codebook_scales[i, j]`` (float32).
A row needs only its own codes plus the ngc codebooks of its group row, which a runtime keeps resident
(≈ 0.13 bits per weight), so DIP reads 3 bits per weight per selected row.
Floor 2: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dipdeploy.quant.api import register_quantizer, register_tensor
from dipdeploy.quant.bits import pack_bits, unpack_bits
from dipdeploy.quant.config import VQ3QuantConfig

_ASSIGN_GROUPS = 4  # groups per distance batch: temporaries of 4 × 4096 × 64 float32, cache-sized


@register_tensor
@dataclass
class VQTensor:
    """A row matrix in VQ3; the layout is in the module docstring."""

    config: VQ3QuantConfig
    rows: int
    cols: int
    group_rows: int
    group_cols: int
    codes: np.ndarray
    codebooks: np.ndarray
    codebook_scales: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"codes": self.codes, "codebooks": self.codebooks}
        if self.codebook_scales is not None:
            out["codebook_scales"] = self.codebook_scales
        return out

    def meta(self) -> dict:
        return {"group_rows": self.group_rows, "group_cols": self.group_cols}

    @classmethod
    def from_arrays(cls, config, rows: int, cols: int, arrays: dict[str, np.ndarray], **meta) -> "VQTensor":
        return cls(config, rows, cols, meta["group_rows"], meta["group_cols"], arrays["codes"],
                   arrays["codebooks"], arrays.get("codebook_scales"))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())

    @property
    def bits_per_weight(self) -> float:
        """Exact: codes (with row padding) + codebooks + codebook scales over R·C weights."""
        return 8 * self.nbytes / (self.rows * self.cols)

    def centroids(self) -> np.ndarray:
        """float32 [ngr, ngc, 64, 2]: the dequantised codebooks."""
        cb = self.codebooks.astype(np.float32)
        if self.codebook_scales is not None:
            cb = cb * self.codebook_scales.astype(np.float32)[:, :, None, None]
        return cb

    def dequantize_rows(self, row_idx: np.ndarray) -> np.ndarray:
        P = self.cols // 2
        k = unpack_bits(self.codes[row_idx], VQ3QuantConfig.index_bits, P)
        gi = (row_idx // self.group_rows)[:, None]
        gj = (2 * np.arange(P) // self.group_cols)[None, :]
        return self.centroids()[gi, gj, k].reshape(len(row_idx), self.cols)


def group_shape(rows: int, cols: int, cfg: VQ3QuantConfig) -> tuple[int, int]:
    """(group_rows, group_cols): even-width strips of at most ``max_group_cols``, ≈ group_size weights."""
    strips = -(-cols // cfg.max_group_cols)
    gc = -(-cols // strips)
    gc += gc % 2
    gr = max(1, min(rows, round(cfg.group_size / gc)))
    return gr, gc


def _gather_groups(rows: np.ndarray, weight: np.ndarray, gr: int, gc: int):
    """Points [G, N, 2] and weights [G, N] of every group (zero weight pads partial groups)."""
    R, C = rows.shape
    ngr, ngc = -(-R // gr), -(-C // gc)
    xp = np.zeros((ngr * gr, ngc * gc), np.float32)
    xp[:R, :C] = rows
    wp = np.zeros((ngr * gr, ngc * gc), np.float32)
    wp[:R, :C] = weight[:, None]
    to_groups = lambda a: a.reshape(ngr, gr, ngc, gc).transpose(0, 2, 1, 3).reshape(ngr * ngc, gr * gc)
    return to_groups(xp).reshape(ngr * ngc, -1, 2), to_groups(wp)[:, 0::2], (ngr, ngc)


def _assign(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Nearest centroid: argmin ‖x − c‖² = argmax (x·c − ‖c‖²/2); x [G, N, 2], c [G, K, 2] → [G, N].

    Written as two broadcast multiply-adds over a few groups at a time (cache-sized temporaries): for
    2-D vectors a batched matmul with an inner dimension of 2 is far slower (benchmarks/results/notes.md).
    """
    half = 0.5 * (c * c).sum(axis=2)
    out = np.empty(x.shape[:2], np.int64)
    for g in range(0, x.shape[0], _ASSIGN_GROUPS):
        sl = slice(g, g + _ASSIGN_GROUPS)
        score = x[sl, :, 0, None] * c[sl, None, :, 0]
        score += x[sl, :, 1, None] * c[sl, None, :, 1]
        score -= half[sl, None, :]
        out[sl] = score.argmax(axis=2)
    return out


def _update(x: np.ndarray, w: np.ndarray, assign: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Weighted means per cluster (bincount over group·K + k); empty clusters keep their centroid."""
    G, K = c.shape[0], c.shape[1]
    flat = (assign + K * np.arange(G)[:, None]).ravel()
    wsum = np.bincount(flat, weights=w.ravel(), minlength=G * K)
    out = c.copy().reshape(G * K, 2)
    for d in range(2):
        s = np.bincount(flat, weights=(w * x[:, :, d]).ravel(), minlength=G * K)
        out[:, d] = np.where(wsum > 0, s / np.where(wsum > 0, wsum, 1), out[:, d])
    return out.reshape(G, K, 2)


def _init_grid(x: np.ndarray, w: np.ndarray, K: int) -> np.ndarray:
    """8 × 8 product of per-dimension quantiles (of the real points): a non-uniform scalar 3-bit grid."""
    side = int(round(K ** 0.5))
    qs = (np.arange(side) + 0.5) / side
    out = np.empty((x.shape[0], K, 2), np.float32)
    for g in range(x.shape[0]):
        real = x[g][w[g] > 0] if (w[g] > 0).any() else x[g]
        a, b = np.quantile(real[:, 0], qs), np.quantile(real[:, 1], qs)
        out[g] = np.stack(np.meshgrid(a, b, indexing="ij"), axis=-1).reshape(K, 2)
    return out


def _init_kmeanspp(x: np.ndarray, w: np.ndarray, K: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ (sampling ∝ weight · D²), batched over groups, on a random subset of 16·K points per
    group (seeding quality barely depends on the rest; Lloyd then sees every point)."""
    G, N, _ = x.shape
    if N > 16 * K:
        pick = np.sort(rng.random((G, N)).argsort(axis=1)[:, : 16 * K], axis=1)
        x, w = np.take_along_axis(x, pick[:, :, None], axis=1), np.take_along_axis(w, pick, axis=1)
        N = x.shape[1]
    ar = np.arange(G)

    def sample(p: np.ndarray) -> np.ndarray:
        cum = np.cumsum(p, axis=1)
        u = rng.random(G) * cum[:, -1]
        return np.minimum((cum < u[:, None]).sum(axis=1), N - 1)

    c = np.empty((G, K, 2), np.float32)
    c[:, 0] = x[ar, sample(w + 1e-12)]
    d2 = ((x - c[:, :1]) ** 2).sum(axis=2)
    for k in range(1, K):
        c[:, k] = x[ar, sample(w * d2 + 1e-30)]
        d2 = np.minimum(d2, ((x - c[:, k : k + 1]) ** 2).sum(axis=2))
    return c


def _encode_codebook(c: np.ndarray, cfg: VQ3QuantConfig) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Store the codebooks (int8 + fp16 scale, or fp16); return (stored, scales, dequantised)."""
    if cfg.codebook_dtype == "float16":
        cb = c.astype(np.float16)
        return cb, None, cb.astype(np.float32)
    amax = np.abs(c).max(axis=(1, 2))
    scale = (amax / 127).astype(np.float16)
    s32 = np.where(scale == 0, 1, scale.astype(np.float32))[:, None, None]
    cb = np.clip(np.rint(c / s32), -127, 127).astype(np.int8)
    return cb, scale, cb.astype(np.float32) * scale.astype(np.float32)[:, None, None]


def fit_codebooks(x: np.ndarray, w: np.ndarray, cfg: VQ3QuantConfig, rng: np.random.Generator):
    """Weighted k-means on a batch of groups: returns (stored codebooks, scales, assignments)."""
    K = cfg.n_centroids
    c = _init_grid(x, w, K) if cfg.init == "grid" else _init_kmeanspp(x, w, K, rng)
    for _ in range(cfg.n_iter):
        c = _update(x, w, _assign(x, c), c)
    cb, scale, cq = _encode_codebook(c, cfg)
    return cb, scale, _assign(x, cq)


def quantize_vq(rows: np.ndarray, cfg: VQ3QuantConfig, row_weight: np.ndarray | None = None) -> VQTensor:
    """Fit one 64-entry codebook per group and encode every pair of weights as a 6-bit index.

    ``row_weight`` (e.g. the Hessian diagonal of each row's activation) weights the centroid updates;
    the assignment itself is unweighted because both weights of a vector share the row's weight.
    """
    R, C = rows.shape
    if C % 2:
        raise ValueError(f"VQ3 needs an even row length (2-D vectors inside one row), got C={C}")
    gr, gc = group_shape(R, C, cfg)
    weight = np.ones(R, np.float32) if row_weight is None else np.asarray(row_weight, np.float32)
    x, w, (ngr, ngc) = _gather_groups(rows, weight, gr, gc)
    G, N = w.shape
    rng = np.random.default_rng(cfg.seed)
    cb_dtype = np.int8 if cfg.codebook_dtype == "int8" else np.float16
    codebooks = np.empty((G, cfg.n_centroids, 2), cb_dtype)
    scales = np.empty(G, np.float16) if cfg.codebook_dtype == "int8" else None
    assign = np.empty((G, N), np.uint8)
    for start in range(0, G, cfg.batch_groups):
        sl = slice(start, min(G, start + cfg.batch_groups))
        cb, sc, a = fit_codebooks(x[sl], w[sl], cfg, rng)
        codebooks[sl], assign[sl] = cb, a
        if scales is not None:
            scales[sl] = sc
    # back from groups [ngr, ngc, gr, gc/2] to rows [R, C/2]
    per_row = assign.reshape(ngr, ngc, gr, gc // 2).transpose(0, 2, 1, 3).reshape(ngr * gr, ngc * gc // 2)
    codes = pack_bits(per_row[:R, : C // 2], cfg.index_bits)
    return VQTensor(
        cfg, R, C, gr, gc, codes,
        codebooks.reshape(ngr, ngc, cfg.n_centroids, 2),
        None if scales is None else scales.reshape(ngr, ngc),
    )


register_quantizer(VQ3QuantConfig)(quantize_vq)
