"""The mask rule of DIP and DIP-CA (docs/method.md, "DIP-CA"), in numpy.

    s^(t) = |x^(t)| ⊙ (c^(t-1) + γ (1 − c^(t-1))) / ‖x^(t)‖∞          (DIP-CA score)
    mask  = top-K(s)                                                   (ties → lower index first)

γ = 1 (or no cache) is plain DIP. Two refinements from the authors' related code are optional:
``fixed_top_n`` exempts the n largest raw |x| from the re-weighting (a few huge activations dominate the
output and must never lose to a resident row), and ``gamma_at`` warms γ up from 1 over the first tokens.

Tie-breaking is part of the contract: ONNX ``TopK`` returns equal values lower index first, and so does
this reference (a stable sort of −s), so the torch reference, the ONNX fallback, the native kernel and the
Java engine pick the same rows.
"""

from __future__ import annotations

import numpy as np


def dipca_scores(
    x_abs: np.ndarray, resident: np.ndarray | None, gamma: float, fixed_top_n: int = 0
) -> np.ndarray:
    """Scores [B, R] from magnitudes ``x_abs`` [B, R] and the cache state ``resident`` [B, R] (bool).

    ``x_abs`` may already be a weighted magnitude (e.g. WINA's |x_i|·‖W_{:,i}‖₂); the re-weighting is
    the same. Rows with ``x_abs`` all zero get score 0 (no division by zero).
    """
    x_abs = np.asarray(x_abs, dtype=np.float32)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    peak = x_abs.max(axis=-1, keepdims=True)
    s = x_abs / np.where(peak > 0, peak, 1.0)
    if resident is None or gamma == 1.0:
        return s
    weight = np.where(resident, np.float32(1.0), np.float32(gamma))
    if fixed_top_n > 0:
        top = topk_indices(x_abs, min(fixed_top_n, x_abs.shape[-1]))
        np.put_along_axis(weight, top, np.float32(1.0), axis=-1)
    return s * weight


def topk_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices [B, k] of the k largest scores per row, largest first, ties broken by lower index."""
    if not 0 < k <= scores.shape[-1]:
        raise ValueError(f"k must lie in [1, {scores.shape[-1]}], got {k}")
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k].astype(np.int64)


def topk_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """The row *set* of :func:`topk_indices` (same ties rule), in ascending index order, [B, k].

    A partition instead of a full stable sort: the mask only needs the set, and this is several times
    faster, which matters in the token-sequential DIP-CA loops of the torch reference and the simulator.
    """
    if not 0 < k <= scores.shape[-1]:
        raise ValueError(f"k must lie in [1, {scores.shape[-1]}], got {k}")
    kth = -np.partition(-scores, k - 1, axis=-1)[..., k - 1 : k]
    above = scores > kth
    tied = scores == kth
    keep = above | (tied & (np.cumsum(tied, axis=-1) <= k - above.sum(axis=-1, keepdims=True)))
    return np.nonzero(keep)[-1].reshape(*scores.shape[:-1], k)


def gamma_at(gamma: float, step: int, warmup: int) -> float:
    """γ warm-up: plain DIP (γ = 1) at step 0, linearly down to ``gamma`` at step ``warmup``."""
    if warmup <= 0 or step >= warmup:
        return gamma
    return 1.0 - (1.0 - gamma) * step / warmup
