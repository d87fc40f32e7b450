"""The sparse row layout of a gated MLP (docs/method.md, Flash layout): the units DIP selects.

- up|gate group: row i = [W_u[:, i] ; W_g[:, i]] — the bundled row of [W_uᵀ | W_gᵀ], 2F values
  (first F = up, last F = gate), one row per input feature i ∈ [0, d).
- down group: row j = W_d[:, j] — row j of W_dᵀ, d values, one row per GLU unit j ∈ [0, F).

Weights follow the PyTorch ``nn.Linear`` convention: W_u, W_g ∈ R^{F×d}, W_d ∈ R^{d×F}.
Floor 2: numpy only.
"""

from __future__ import annotations

import numpy as np

GROUPS = ("up_gate", "down")


def mlp_to_rows(w_up: np.ndarray, w_gate: np.ndarray, w_down: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(W_u, W_g [F, d], W_d [d, F]) → (up|gate rows [d, 2F], down rows [F, d])."""
    F, d = w_up.shape
    if w_gate.shape != (F, d) or w_down.shape != (d, F):
        raise ValueError(
            f"gated MLP shapes disagree: W_u {w_up.shape}, W_g {w_gate.shape} must be [F, d] and "
            f"W_d {w_down.shape} must be [d, F]"
        )
    return np.concatenate([w_up.T, w_gate.T], axis=1), np.ascontiguousarray(w_down.T)


def rows_to_mlp(up_gate: np.ndarray, down: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of :func:`mlp_to_rows`: → (W_u [F, d], W_g [F, d], W_d [d, F])."""
    d, two_f = up_gate.shape
    if two_f % 2 or down.shape != (two_f // 2, d):
        raise ValueError(f"row shapes disagree: up|gate {up_gate.shape} must be [d, 2F], down {down.shape} [F, d]")
    F = two_f // 2
    return (np.ascontiguousarray(up_gate[:, :F].T), np.ascontiguousarray(up_gate[:, F:].T),
            np.ascontiguousarray(down.T))
