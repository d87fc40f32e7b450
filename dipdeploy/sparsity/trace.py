"""Record a trace (``dipdeploy.trace`` format) from the torch reference: which rows every token of every
layer selected, plus the magnitudes the simulator needs to re-derive DIP-CA masks.

The text runs as one sequence (batch 1) through the sparsified model in one causal forward; for DIP-CA
the per-MLP sequential loop makes that identical to token-by-token decoding (see ``methods``).
"""

from __future__ import annotations

import torch

from dipdeploy.sparsity.methods import reset_caches, sparse_mlps, sparsify_, unsparsify_
from dipdeploy.sparsity.plan import SparsityPlan
from dipdeploy.trace import Trace, TraceRecorder

TRACEABLE = ("dense", "dip", "dip-ca")


def _np(t):
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t


@torch.no_grad()
def record_trace(lm, plan: SparsityPlan, ids: torch.Tensor, meta: dict | None = None) -> Trace:
    """Run ``ids`` [1, T] through ``lm`` under ``plan`` (a dip or dip-ca plan; a dense trace is a DIP
    plan with K = d and F) and return the trace."""
    label = "dense" if plan.method == "dip" and plan.mean_density() >= 1.0 else plan.method
    if plan.method not in ("dip", "dip-ca"):
        raise ValueError(f"tracing supports {', '.join(TRACEABLE)}, not {plan.method!r}")
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"trace one sequence: ids must be [1, T], got {tuple(ids.shape)}")
    rec = TraceRecorder(
        source="torch", model=lm.name, hidden_size=plan.hidden_size, intermediate_size=plan.intermediate_size,
        num_layers=len(plan.layers), method=label, density=plan.mean_density(),
        gamma=plan.gamma if plan.method == "dip-ca" else None, score=plan.score,
        policy=plan.policy if plan.method == "dip-ca" else None,
        meta={**(meta or {}), "cache_frac": plan.cache_frac if plan.method == "dip-ca" else None},
    )

    def keep(i: int, arrays: dict) -> None:
        rec.record(i, **{k: _np(v)[0] for k, v in arrays.items()})

    sparsify_(lm.model, plan)
    try:
        for mlp in sparse_mlps(lm.model):
            mlp.recorder = keep
        reset_caches(lm.model)
        lm.model(ids, use_cache=False)
    finally:
        unsparsify_(lm.model)
    return rec.finish()
