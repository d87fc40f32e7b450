"""numpy references of the two ops: the definitions the fallback functions and native kernels match.

They call the project's single definitions: ``dipca_scores``/``topk_indices`` (dipdeploy.cache.score)
for the mask, ``dipdeploy.quant`` for decoding packed rows.
"""

from __future__ import annotations

import numpy as np

from dipdeploy.cache.score import dipca_scores, topk_indices
from dipdeploy.ops.formats import OpWeights


def topk_column_mask_ref(
    x: np.ndarray,
    k: int,
    resident: np.ndarray | None = None,
    gamma: float = 1.0,
    fixed_top_n: int = 0,
    colnorm: np.ndarray | None = None,
) -> np.ndarray:
    """indices [N, k] int64 of TopKColumnMask. ``colnorm`` given = WINA score |x|·‖W_{:,i}‖."""
    x = np.asarray(x, dtype=np.float32)
    x_abs = np.abs(x)
    if colnorm is not None:
        x_abs = x_abs * np.asarray(colnorm, dtype=np.float32)
    if resident is not None:
        resident = np.broadcast_to(np.asarray(resident, dtype=bool), x.shape)
    return topk_indices(dipca_scores(x_abs, resident, gamma, fixed_top_n), k)


def sparse_gather_matmul_ref(
    x: np.ndarray, indices: np.ndarray, weights: OpWeights, slots: np.ndarray | None = None
) -> np.ndarray:
    """Y [N, O] float32: Y[n] = Σ_j X[n, indices[n, j]] · W[row(n, j)], row = slots if given else indices.

    The row's values come from W row ``row(n, j)``; VQ3's codebook group from the original row
    ``indices[n, j]`` (a slab keeps only codes per row). Accumulates in float64 so it is a reference
    for every kernel's summation order.
    """
    x = np.asarray(x, dtype=np.float32)
    indices = np.asarray(indices, dtype=np.int64)
    rows = indices if slots is None else np.asarray(slots, dtype=np.int64)
    y = np.empty((x.shape[0], weights.cols), dtype=np.float32)
    for n in range(x.shape[0]):
        w = weights.rows_float32(rows[n], indices[n]).astype(np.float64)
        y[n] = x[n, indices[n]].astype(np.float64) @ w
    return y
