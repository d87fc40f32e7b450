"""Weight-aware DIP scores: their static per-row weights (one definition), and their fold into the weights.

Dropping input feature i from W·x loses x_i·W[:, i], of size |x_i|·‖W[:, i]‖, so ranking by |x_i|·s_i^α
with s_i = sqrt(‖W_u[:, i]‖² + ‖W_g[:, i]‖²) loses less at the same K_in; likewise glu_j by
|glu_j|·t_j^α with t_j = ‖W_d[:, j]‖ (docs/method.md, "Scores"). ``wina`` weights both groups (α = 1),
computed at run time (a ``colnorm`` input of the top-K op); ``wina-in`` weights the input group only and
is folded into the weights, so every op, graph and runtime stays plain top-|·|:

- input: x is the output of the MLP's own RMSNorm, read by nothing else, so x' = x ⊙ s^α is that norm
  with scale (offset + γ) ⊙ s^α, and W_u, W_g take columns W[:, i] / s_i^α: W'x' = Wx.
- GLU (measured, not shipped): glu_j = act(gate_j)·up_j, so up's output row j times t_j^α (and its bias)
  scales glu_j by t_j^α, and W_d's column j divided by t_j^α keeps W_d·glu.

Only the MLP's input norm, up/gate and down change; attention, the embedding and a tied head do not.
In the stored sparse layout (``dipdeploy.quant.layout``: one row per input feature of [W_u; W_g]ᵀ and
per GLU unit of W_dᵀ) 1/s^α and 1/t^α scale whole stored rows, which BQ4 blocks absorb in their scale (up
to its fp16 rounding); t^α on up's rows scales across a stored row's blocks and is not
quantisation-invariant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dipdeploy.arch import Arch, arch_of_model

#: The smallest column norm a score multiplies by or a fold divides by: an all-zero column ranks last.
_TINY = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class Fold:
    """Exponents of the folded column norms: 0 leaves a group's score |·| (no fold)."""

    alpha_in: float = 1.0
    alpha_glu: float = 1.0


#: The exponent α of ``wina-in``'s |x_i|·s_i^α, chosen on WikiText-2 validation text
#: (benchmarks/results/accuracy-smollm2-2x1024.md, "Weighted input score").
WINA_IN_ALPHA = 0.5
#: Scores that export folds into the weights (``fold_layer``); the bundle then runs plain top-|·|.
FOLDED: dict[str, Fold] = {"wina-in": Fold(alpha_in=WINA_IN_ALPHA, alpha_glu=0.0)}


def input_norms(w_up: torch.Tensor, w_gate: torch.Tensor) -> torch.Tensor:
    """s [d]: the norm of each input feature's column over up and gate together (each [F, d])."""
    return (w_up.float().square().sum(0) + w_gate.float().square().sum(0)).sqrt().clamp_min(_TINY)


def glu_norms(w_down: torch.Tensor) -> torch.Tensor:
    """t [F]: the norm of each GLU unit's column of W_d [d, F]."""
    return w_down.float().square().sum(0).sqrt().clamp_min(_TINY)


def score_weights(score: str, w_up: torch.Tensor, w_gate: torch.Tensor, w_down: torch.Tensor
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(a [d], b [F]) of a score that ranks |x|·a and |GLU~|·b; None where a group ranks plain |·|."""
    if score == "wina":
        return input_norms(w_up, w_gate), glu_norms(w_down)
    fold = FOLDED.get(score)
    if fold is None:
        return None, None
    return (input_norms(w_up, w_gate).pow(fold.alpha_in) if fold.alpha_in else None,
            glu_norms(w_down).pow(fold.alpha_glu) if fold.alpha_glu else None)


def _projections(mlp: nn.Module, arch: Arch) -> tuple[nn.Linear | None, nn.Linear | None, nn.Linear | None, nn.Linear]:
    """(gate, up, fused gate_up, down) modules of one HF MLP (the fused one None for split layouts)."""
    names = arch.mlp
    base = getattr(mlp, "base", mlp)  # a SparseMLP wraps the HF module
    down = getattr(base, names.down)
    if names.gate_up:
        return None, None, getattr(base, names.gate_up), down
    return getattr(base, names.gate), getattr(base, names.up), None, down


@torch.no_grad()
def fold_layer(layer: nn.Module, arch: Arch, fold: Fold) -> None:
    """Fold one decoder layer's column norms (to the powers ``fold`` names) into its MLP, in place."""
    gate, up, gate_up, down = _projections(layer.mlp, arch)
    F = down.weight.shape[1]
    if fold.alpha_in:
        if arch.norms.mlp_in is None:
            raise ValueError(f"{arch.name} has no norm before its MLP, so the weighted input score cannot be "
                             f"folded into the weights; use score abs for this model")
        w_up, w_gate = (gate_up.weight[F:], gate_up.weight[:F]) if gate_up is not None else (up.weight, gate.weight)
        s = input_norms(w_up, w_gate).pow(fold.alpha_in)
        norm = getattr(layer, arch.norms.mlp_in)
        norm.weight.copy_(((arch.norm_offset + norm.weight.float()) * s - arch.norm_offset).to(norm.weight.dtype))
        for m in (gate_up,) if gate_up is not None else (up, gate):
            m.weight.div_(s.to(m.weight.dtype))
    if fold.alpha_glu:
        t = glu_norms(down.weight).pow(fold.alpha_glu)
        down.weight.div_(t.to(down.weight.dtype))
        if gate_up is not None:  # up is the last F output rows of the fused matrix
            rows, bias = gate_up.weight[F:], None if gate_up.bias is None else gate_up.bias[F:]
        else:
            rows, bias = up.weight, up.bias
        rows.mul_(t.to(rows.dtype)[:, None])
        if bias is not None:
            bias.mul_(t.to(bias.dtype))


def fold_scores(model: nn.Module, fold: Fold) -> nn.Module:
    """Fold the weighted scores into every layer of an HF decoder, in place (after any LoRA merge, before
    quantisation): plain DIP on the result selects by |x|·s^α and |GLU~|·t^α of the original model, and its
    dense output is the original one up to fp rounding."""
    arch = arch_of_model(model)
    for layer in model.model.layers:
        fold_layer(layer, arch, fold)
    return model
