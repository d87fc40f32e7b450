"""GPTQ-style error feedback in the sparse row layout (optional; needs calibration activations).

In the row layout, row r multiplies one activation x_r (an input feature for the up|gate rows, a GLU
unit for the down rows), so the rows play the part of GPTQ's *columns*: with H = Σ x xᵀ over calibration
tokens, quantising row r with error δ_r is compensated by moving the rows not yet quantised,
``W[s] -= U[r, s] / U[r, r] · δ_r`` for s > r, where U is the upper Cholesky factor of H⁻¹ (Frantar et
al., GPTQ; applied in lazy batches of rows). Each row is still coded on its own, so the packed layouts
and ``dequantize_rows`` are exactly those of the plain formats.

- BQ4 / RTN3: every row is quantised with its own scales at its turn (``block.quantize_block``).
- VQ3 (GPTVQ-style): for each band of ``group_rows`` rows the band's codebooks are fitted on the
  current, already corrected rows, weighting each row by 1 / U[r, r]² (its error cost); then its rows are
  assigned to their nearest centroids one by one with feedback.

Rows are processed in their natural order (no act-order), which keeps the VQ bands contiguous.
Floor 2: numpy only.
"""

from __future__ import annotations

import numpy as np

from dipdeploy.quant.api import register_feedback_quantizer
from dipdeploy.quant.bits import pack_bits
from dipdeploy.quant.block import BlockQuantTensor, quantize_block
from dipdeploy.quant.config import Block4QuantConfig, RTN3QuantConfig, VQ3QuantConfig, _BlockIntConfig
from dipdeploy.quant.vq import VQTensor, _gather_groups, fit_codebooks, group_shape

_LAZY_ROWS = 128  # rows per lazy batch for the scalar formats


def inverse_hessian_factor(hessian: np.ndarray, damp: float) -> np.ndarray:
    """Upper Cholesky factor U of (H + λI)⁻¹ (λ = damp · mean diag H); rows with no signal get H_rr = 1."""
    H = np.array(hessian, dtype=np.float64)
    dead = np.diag(H) <= 0
    H[dead, dead] = 1.0
    H[np.diag_indices_from(H)] += damp * float(np.mean(np.diag(H)))
    return np.linalg.cholesky(np.linalg.inv(H)).T.astype(np.float32)


def _feedback(rows: np.ndarray, U: np.ndarray, bands, begin, code) -> None:
    """Run the sequential loop: ``begin(W_band, r0)`` once per band, ``code(r, w) -> dequantised row``."""
    W = rows.astype(np.float32, copy=True)
    for r0, r1 in bands:
        band = W[r0:r1].copy()
        err = np.zeros_like(band)
        begin(band, r0)
        for k in range(r1 - r0):
            r = r0 + k
            e = (band[k] - code(r, band[k])) / U[r, r]
            band[k + 1 :] -= U[r, r + 1 : r1, None] * e[None, :]
            err[k] = e
        W[r1:] -= U[r0:r1, r1:].T @ err


def gptq_block(rows: np.ndarray, cfg: _BlockIntConfig, hessian: np.ndarray) -> BlockQuantTensor:
    """BQ4 / RTN3 with error feedback; the result packs exactly like ``quantize_block``."""
    R, _ = rows.shape
    U = inverse_hessian_factor(hessian, cfg.damp)
    parts: list[BlockQuantTensor] = [None] * R  # type: ignore[list-item]

    def code(r: int, w: np.ndarray) -> np.ndarray:
        parts[r] = quantize_block(w[None, :], cfg)
        return parts[r].dequantize_rows(np.array([0]))[0]

    bands = [(r0, min(R, r0 + _LAZY_ROWS)) for r0 in range(0, R, _LAZY_ROWS)]
    _feedback(rows, U, bands, lambda band, r0: None, code)
    zeros = None if cfg.symmetric else np.concatenate([p.zeros for p in parts])
    return BlockQuantTensor(cfg, R, rows.shape[1], np.concatenate([p.qweight for p in parts]),
                            np.concatenate([p.scales for p in parts]), zeros)


def gptq_vq(rows: np.ndarray, cfg: VQ3QuantConfig, hessian: np.ndarray) -> VQTensor:
    """VQ3 with GPTVQ-style band-wise codebooks and row-by-row error feedback."""
    R, C = rows.shape
    if C % 2:
        raise ValueError(f"VQ3 needs an even row length (2-D vectors inside one row), got C={C}")
    gr, gc = group_shape(R, C, cfg)
    ngr, ngc, P = -(-R // gr), -(-C // gc), C // 2
    U = inverse_hessian_factor(hessian, cfg.damp)
    importance = 1.0 / np.diag(U).astype(np.float64) ** 2
    rng = np.random.default_rng(cfg.seed)
    cb_dtype = np.int8 if cfg.codebook_dtype == "int8" else np.float16
    codebooks = np.empty((ngr, ngc, cfg.n_centroids, 2), cb_dtype)
    scales = np.empty((ngr, ngc), np.float16) if cfg.codebook_dtype == "int8" else None
    codes = np.empty((R, P), np.uint8)
    strip = 2 * np.arange(P) // gc
    state: dict[str, np.ndarray] = {}

    def begin(band: np.ndarray, r0: int) -> None:
        x, w, _ = _gather_groups(band, importance[r0 : r0 + band.shape[0]].astype(np.float32), band.shape[0], gc)
        cb, sc, _ = fit_codebooks(x, w, cfg, rng)
        codebooks[r0 // gr] = cb
        cq = cb.astype(np.float32)
        if scales is not None:
            scales[r0 // gr] = sc
            cq = cq * sc.astype(np.float32)[:, None, None]
        state["c"] = cq[strip]  # [P, 64, 2]: the codebook each vector of a row uses
        state["half"] = 0.5 * (state["c"] ** 2).sum(axis=2)

    def code(r: int, w: np.ndarray) -> np.ndarray:
        pairs, c = w.reshape(P, 2), state["c"]
        score = pairs[:, 0, None] * c[:, :, 0] + pairs[:, 1, None] * c[:, :, 1] - state["half"]
        k = score.argmax(axis=1)
        codes[r] = k
        return c[np.arange(P), k].reshape(C)

    _feedback(rows, U, [(r0, min(R, r0 + gr)) for r0 in range(0, R, gr)], begin, code)
    return VQTensor(cfg, R, C, gr, gc, pack_bits(codes, cfg.index_bits), codebooks, scales)


register_feedback_quantizer(Block4QuantConfig)(gptq_block)
register_feedback_quantizer(RTN3QuantConfig)(gptq_block)
register_feedback_quantizer(VQ3QuantConfig)(gptq_vq)
