"""numpy references of the two ops: the definitions the fallback functions and native kernels match.

They call the project's single definitions: ``dipca_scores``/``topk_indices`` (dipdeploy.cache.score)
for the mask, ``dipdeploy.quant`` for decoding packed rows.
"""

from __future__ import annotations

import numpy as np

from dipdeploy.cache.score import dipca_scores, topk_indices
from dipdeploy.ops.formats import OpWeights, weight_format


def topk_column_mask_ref(
    x: np.ndarray,
    k: int,
    resident: np.ndarray | None = None,
    gamma: float = 1.0,
    fixed_top_n: int = 0,
    colnorm: np.ndarray | None = None,
) -> np.ndarray:
    """indices [N, k] int64 of TopKColumnMask. ``colnorm`` given = WINA score |x|·‖W_{:,i}‖."""
    return topk_indices(topk_column_mask_scores(x, resident, gamma, fixed_top_n, colnorm), k)


def topk_column_mask_scores(
    x: np.ndarray,
    resident: np.ndarray | None = None,
    gamma: float = 1.0,
    fixed_top_n: int = 0,
    colnorm: np.ndarray | None = None,
) -> np.ndarray:
    """The scores [N, R] TopKColumnMask ranks (what ``dipdeploy.agreement.compare_topk`` checks a
    kernel's selection against)."""
    x = np.asarray(x, dtype=np.float32)
    x_abs = np.abs(x)
    if colnorm is not None:
        x_abs = x_abs * np.asarray(colnorm, dtype=np.float32)
    if resident is not None:
        resident = np.broadcast_to(np.asarray(resident, dtype=bool), x.shape)
    return dipca_scores(x_abs, resident, gamma, fixed_top_n)


# Selected rows sharing one int8 coefficient scale at accuracy level 4 (DD_I8_ROWS in custom_ops).
I8_ROWS = 32


def int8_coefficients(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy level 4: one chunk's coefficients c [m, nb] (x_j · s_j,b) → (cq int32 [m, nb], σ [nb]).

    Per output block b, one scale over the chunk's rows: σ = max|c|/127, cq = rint(c · 127/max|c|)
    clipped to ±127, all in float32 (the native kernels do the same operations, so cq is bit-equal).
    ``c`` must be finite: int8 cannot carry NaN or ±Inf, so such rows take the level-0 path instead
    (:func:`level4_takes_int8`).
    """
    c = np.asarray(c, dtype=np.float32)
    amax = np.abs(c).max(axis=0) if len(c) else np.zeros(c.shape[1], np.float32)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    cq = np.clip(np.rint(c * inv), -127, 127).astype(np.int32)
    return cq, (amax / np.float32(127)).astype(np.float32)


def level4_takes_int8(x_sel: np.ndarray, scales: np.ndarray) -> bool:
    """Whether one output row's level-4 coefficients c = s[row_j, b] · x_j (float32) can be quantised:
    all finite, and in every chunk of :data:`I8_ROWS` rows and every block 127 / max|c| finite too.

    A row where they cannot (an activation or a scale of NaN or ±Inf, a product that overflows, or a
    chunk with max|c| below 127 / FLT_MAX) is computed at level 0, so NaN and ±Inf reach Y as they
    do at level 0; quantised, a NaN would become a finite code and an infinite max|c| or 127 / max|c|
    would turn the chunk's codes into NaN or ±127. The native kernels (the int8 kernels flag such a
    row, ``custom_ops/src/ort/`` recomputes it at level 0) and the ``_a4`` fallback apply the same rule per row.
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        c = np.asarray(scales, np.float32) * np.asarray(x_sel, np.float32)[:, None]
        if not np.isfinite(c).all():
            return False
        for g0 in range(0, len(c), I8_ROWS):
            amax = np.abs(c[g0 : g0 + I8_ROWS]).max(axis=0)
            inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
            if not np.isfinite(inv).all():
                return False
    return True


def _sgmm_int8_row(x_sel: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """One output row at level 4: Σ over chunks of I8_ROWS rows of σ_b · Σ_j cq_j,b (q − z)_j (float64)."""
    c = scales * x_sel[:, None]  # float32 [k, nb]
    y = np.zeros(codes.shape[1:], dtype=np.float64)
    for g0 in range(0, len(x_sel), I8_ROWS):
        cq, sigma = int8_coefficients(c[g0 : g0 + I8_ROWS])
        acc = np.einsum("jb,jbc->bc", cq.astype(np.int64), codes[g0 : g0 + I8_ROWS].astype(np.int64))
        y += sigma.astype(np.float64)[:, None] * acc
    return y.reshape(-1)


def _sgmm_coef_row(x_sel: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """One output row at level 0 in the level-4 product order, Σ_j c_j,b · (q − z)_j with c = s · x in
    float32 (float64 sums): the order of the native level-0 BQ4 kernel and of the ``_a4`` fallback's
    level-0 term, so that a non-finite row agrees in all three, also where x · s overflows and
    (q − z) = 0 makes it NaN (level 0 with x · ((q − z) · s) gives 0 there)."""
    with np.errstate(over="ignore", invalid="ignore"):
        c = (scales * x_sel[:, None]).astype(np.float64)
        return np.einsum("jb,jbc->bc", c, codes.astype(np.float64)).reshape(-1)


def sparse_gather_matmul_ref(
    x: np.ndarray,
    indices: np.ndarray,
    weights: OpWeights,
    slots: np.ndarray | None = None,
    accuracy_level: int = 0,
) -> np.ndarray:
    """Y [N, O] float32: Y[n] = Σ_j X[n, indices[n, j]] · W[row(n, j)], row = slots if given else indices.

    The row's values come from W row ``row(n, j)``; VQ3's codebook group from the original row
    ``indices[n, j]`` (a slab keeps only codes per row). Accumulates in float64 so it is a reference
    for every kernel's summation order. ``accuracy_level`` ≥ 4 on BQ4 quantises the coefficients
    x·s to int8 in chunks of :data:`I8_ROWS` selected rows (:func:`int8_coefficients`); other
    formats ignore it, like MatMulNBits ignores a level it has no kernel for. At level 4 a row whose
    coefficients cannot be quantised is computed as at level 0 (:func:`level4_takes_int8`, :func:`_sgmm_coef_row`).
    """
    x = np.asarray(x, dtype=np.float32)
    indices = np.asarray(indices, dtype=np.int64)
    rows = indices if slots is None else np.asarray(slots, dtype=np.int64)
    y = np.empty((x.shape[0], weights.cols), dtype=np.float32)
    int8 = int8_path(weights.format, accuracy_level)
    for n in range(x.shape[0]):
        if int8:
            codes, scales = weights.packed.codes_rows(rows[n])
            row = _sgmm_int8_row if level4_takes_int8(x[n, indices[n]], scales) else _sgmm_coef_row
            y[n] = row(x[n, indices[n]], codes, scales)[: weights.cols]
            continue
        w = weights.rows_float32(rows[n], indices[n]).astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            y[n] = x[n, indices[n]].astype(np.float64) @ w
    return y


def int8_path(fmt: str, accuracy_level: int) -> bool:
    """Whether a SparseGatherMatMul of format ``fmt`` at ``accuracy_level`` takes the int8 path."""
    return weight_format(fmt).int8 and accuracy_level >= 4
