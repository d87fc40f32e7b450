"""Synthetic traces with a known, tunable access pattern: for tests and for quick benchmark runs when no
model was traced.

Row popularity is Zipf-like, as in real SwiGLU activations (a few input features carry huge
magnitudes, the mid-range is interchangeable, docs/method.md "DIP-CA"): each layer draws a fixed per-row scale
``w_r ∝ 1/(rank_r + 1)^zipf`` over a random permutation of the rows, and each token's magnitude is
``|x_r| = w_r · LogNormal(0, noise)``. The selection is top-K of those magnitudes (``topk_indices``), so
the trace carries both the rows and the magnitudes DIP-CA needs for re-masking.
"""

from __future__ import annotations

import numpy as np

from dipdeploy.cache import topk_indices
from dipdeploy.trace import Trace, mlp_density


def _magnitudes(rng: np.random.Generator, tokens: int, rows: int, zipf: float, noise: float) -> np.ndarray:
    scale = 1.0 / (np.arange(rows) + 1.0) ** zipf
    scale = scale[rng.permutation(rows)]
    return (scale[None, :] * rng.lognormal(0.0, noise, size=(tokens, rows))).astype(np.float32)


def synthetic_trace(
    hidden_size: int = 64,
    intermediate_size: int = 192,
    num_layers: int = 2,
    tokens: int = 64,
    rho_in: float = 0.5,
    rho_glu: float = 0.5,
    zipf: float = 0.8,
    noise: float = 1.0,
    seed: int = 0,
    model: str = "synthetic",
    magnitudes: bool = True,
) -> Trace:
    """A DIP trace (γ = 1) of ``tokens`` tokens; ``rho_in``/``rho_glu`` are K_in/d and K_glu/F."""
    if not 0.0 < rho_in <= 1.0 or not 0.0 < rho_glu <= 1.0:
        raise ValueError(f"rho_in and rho_glu must lie in (0, 1], got {rho_in}, {rho_glu}")
    rng = np.random.default_rng(seed)
    d, F = hidden_size, intermediate_size
    k_in, k_glu = max(1, round(rho_in * d)), max(1, round(rho_glu * F))
    x_abs, glu_abs, sel_in, sel_glu = [], [], [], []
    for _ in range(num_layers):
        xa = _magnitudes(rng, tokens, d, zipf, noise)
        ga = _magnitudes(rng, tokens, F, zipf, noise)
        sel_in.append(topk_indices(xa, k_in).astype(np.int32))
        sel_glu.append(topk_indices(ga, k_glu).astype(np.int32))
        x_abs.append(xa.astype(np.float16))
        glu_abs.append(ga.astype(np.float16))
    return Trace(
        source="synthetic", model=model, hidden_size=d, intermediate_size=F, num_layers=num_layers,
        method="dip", density=mlp_density(k_in, k_glu, d, F), sel_in=sel_in, sel_glu=sel_glu,
        x_abs=x_abs if magnitudes else None, glu_abs=glu_abs if magnitudes else None,
        meta={"zipf": zipf, "noise": noise, "seed": seed},
    )
