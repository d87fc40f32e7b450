"""Calibration statistics of the activations that multiply each row of the sparse layout (imports torch).

Row r of a group multiplies one activation (``layout.py``): up|gate row i the MLP input x_i, down row j
the GLU unit glu_j. The quantisers weight rows by these statistics (``VQ3QuantConfig.hessian``) and
spread errors through them (``error_feedback``, ``gptq.py``):

- ``dense``: H = E[x xᵀ] (diagonal E[x_i²]) from the unpruned model;
- ``dip``: H = E[(m ⊙ x)(m ⊙ x)ᵀ] (diagonal E[x_i² · 1(i selected)]) with the model run under a uniform
  DIP plan (docs/method.md, DIP): a row DIP skips for a token contributes nothing to that token's
  output, so its error should not count, and no error should be pushed onto it.

Both are read at the *inputs of the projections* (up or the fused gate_up, and down): under DIP those
inputs are already masked (``sparsity.methods``, method ``dip``), so one hook serves both kinds. Quant lies
below sparsity (docs/design.md, "Floors"): the caller hands the DIP pass in (``under_dip``,
``sparsity.methods.uniform_dip``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Callable

import numpy as np

STATISTICS = ("dense", "dip")


#: How a ``dip`` pass runs: ``under_dip(model, density)`` puts the model under a uniform DIP plan of
#: ``density`` and restores it on exit (``dipdeploy.sparsity.methods.uniform_dip``).
UnderDip = Callable[[object, float], AbstractContextManager]


def row_statistics(model, calib_ids, *, full: bool, kind: str = "dense", density: float = 0.5,
                   layers: tuple[int, ...] | None = None,
                   under_dip: UnderDip | None = None) -> list[dict[str, np.ndarray | None]]:
    """Per layer and row group ({"up_gate", "down"}), H [R, R] (``full``) or its diagonal [R], averaged
    over the tokens of ``calib_ids`` [B, T], from one forward pass; the model is left as it was.

    ``kind="dip"`` runs the pass inside ``under_dip(model, density)``: a uniform DIP plan of ``density``
    (ρ_in from ``sparsity.plan.default_rho_in``, the split the benchmarks evaluate). ``layers`` restricts the
    statistics to those layer indices (the others get None). Memory when ``full``: L·(d² + F²) float32.
    """
    import torch

    from dipdeploy.arch import arch_of_model

    if kind not in STATISTICS:
        raise ValueError(f"statistics kind {kind!r} unknown; choose one of {STATISTICS}")
    if kind == "dip" and under_dip is None:
        raise ValueError("statistics kind 'dip' runs the model under a DIP plan: pass "
                         "under_dip=dipdeploy.sparsity.methods.uniform_dip")
    arch = arch_of_model(model)
    all_layers = decoder_layers(model)
    wanted = tuple(range(len(all_layers))) if layers is None else tuple(layers)
    stats: list[dict] = [{"up_gate": None, "down": None} for _ in all_layers]
    tokens = int(np.prod(calib_ids.shape))

    def hook(i: int, key: str):
        def fn(_module, args):
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            s = x.T @ x if full else (x * x).sum(0)
            stats[i][key] = s if stats[i][key] is None else stats[i][key] + s
        return fn

    handles = []
    for i in wanted:
        mlp = all_layers[i].mlp
        handles.append(getattr(mlp, arch.mlp.gate_up or arch.mlp.up).register_forward_pre_hook(hook(i, "up_gate")))
        handles.append(getattr(mlp, arch.mlp.down).register_forward_pre_hook(hook(i, "down")))
    try:
        with under_dip(model, density) if kind == "dip" else nullcontext(), torch.no_grad():
            model(input_ids=calib_ids)
    finally:
        for h in handles:
            h.remove()
    return [{k: None if v is None else (v / tokens).cpu().numpy() for k, v in s.items()} for s in stats]


def decoder_layers(model):
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    if not hasattr(decoder, "layers"):
        raise ValueError(f"{type(model).__name__}: no decoder layers found (expected model.model.layers)")
    return decoder.layers
