"""Joint allocation: each layer's density *and* its in/glu split, chosen together under the global ρ.

Why (docs/method.md, "Joint allocation"): one global split and one density for every layer leave much
of DIP's accuracy on the table. Layers differ both in how much pruning costs them and in which group
(input features or GLU units) is cheaper to prune, and the two choices interact through the budget, so
they are searched together:

1. :func:`error_curves` — for every layer i and every point p = (ρ_in, ρ_glu) of a grid, the
   Fisher-weighted squared error of that layer's DIP output,

       E_i(p) = Σ_t Σ_j  g_tj² · (y_tj − ŷ_tj(p))²,       g = ∂NLL/∂y  (dense model, calibration text),

   the empirical-Fisher (second-order) estimate of the NLL rise that pruning layer i alone at p causes.
   Unlike a plain output MSE it is in one unit for every layer, since the gradient carries how much later
   layers amplify or damp an error, so layers can be traded against each other. One backward pass of
   the dense model, then only MLP products per layer: the curves are measured once per model and score
   and serve every density.
2. :func:`allocate_joint` — minimise Σ_i E_i(p_i) subject to mean_i ρ(p_i) = ρ by a Lagrangian: each layer
   takes argmin_p E_i(p) + λ·ρ(p) on a fine grid (the curves interpolated), λ bisected so the mean
   density meets the target, then single W_d rows are moved so it is exact (:func:`exact_budget`).

The scores stay DIP's own (top-K of |x| or WINA's |x|·‖W_{:,i}‖, top-K of |GLU~|); only how many rows each
layer keeps, per group, changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from dipdeploy.sparsity.methods import decoder_layers, sparse_mlps, sparsify_, unsparsify_
from dipdeploy.sparsity.plan import LayerPlan, SparsityPlan, density

#: Measured grid of input shares and GLU shares (the fine grid interpolates between its points).
GRID = tuple(round(0.1 * i, 2) for i in range(1, 11))
FINE_STEP = 0.0125
#: Calibration positions whose MLP inputs and gradients are kept per layer (spread over all windows).
CURVE_TOKENS = 128


@dataclass
class ErrorCurves:
    """E_i(ρ_in, ρ_glu) of every layer on the grid ``rho_in`` × ``rho_glu`` (module docstring, step 1)."""

    rho_in: np.ndarray  # [n_in]
    rho_glu: np.ndarray  # [n_glu]
    cost: np.ndarray  # [L, n_in, n_glu]
    tokens: int
    score: str


def _rows(share: float, n: int) -> int:
    return max(1, min(n, round(share * n)))


def _capture(model, windows: torch.Tensor, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer: the MLP inputs x [N, d] and the NLL gradients g [N, d] at its output, at ``tokens``
    positions drawn (seed 0) from every window but its last position (whose output no loss sees).

    Each MLP output is replaced by a leaf tensor, so ``autograd.grad`` returns ∂NLL/∂y for every layer in
    one backward pass without touching the parameters."""
    layers = decoder_layers(model)
    gen = torch.Generator().manual_seed(0)
    n_win, T = windows.shape
    per = max(1, tokens // n_win)
    xs: list[list[torch.Tensor]] = [[] for _ in layers]
    gs: list[list[torch.Tensor]] = [[] for _ in layers]
    for w in windows.split(1):
        pos = torch.randperm(T - 1, generator=gen)[:per].sort().values
        ins, outs = {}, {}

        def hook(i):
            def fn(mod, args, out):
                ins[i] = args[0].detach()[0, pos]
                outs[i] = out.detach().requires_grad_(True)
                return outs[i]
            return fn

        handles = [layer.mlp.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
        try:
            with torch.enable_grad():
                logits = model(w, use_cache=False).logits[0, :-1].float()
                loss = F.cross_entropy(logits, w[0, 1:], reduction="sum")
                grads = torch.autograd.grad(loss, [outs[i] for i in range(len(layers))])
        finally:
            for h in handles:
                h.remove()
        for i, g in enumerate(grads):
            xs[i].append(ins[i])
            gs[i].append(g[0, pos])
    return [(torch.cat(x), torch.cat(g)) for x, g in zip(xs, gs)]


def _ranks(score: torch.Tensor) -> torch.Tensor:
    """Rank of every entry along the last dim, largest first, ties to the lower index: ``rank < k`` is
    exactly ``methods.topk_mask(score, k)`` (the project's one tie rule), for every k at once."""
    order = score.sort(dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    return ranks.scatter_(-1, order, torch.arange(score.shape[-1], device=score.device).expand_as(order))


@torch.no_grad()
def _layer_curve(m, x: torch.Tensor, g: torch.Tensor, grid_in, grid_glu, d: int, f: int) -> np.ndarray:
    """E(p) of one layer (a :class:`SparseMLP` ``m``, used for its projections and scores) on the grid:
    the DIP forward of ``methods._dip`` taken apart so GLU~ is computed once per input share."""
    weight = g.square()
    gate, up = m.gate_up(x)
    y = m.down(m.act(gate) * up)
    rank_in = _ranks(m.score_in(x))
    out = np.zeros((len(grid_in), len(grid_glu)))
    for a, r_in in enumerate(grid_in):
        gate, up = m.gate_up(x * (rank_in < _rows(r_in, d)))
        glu = m.act(gate) * up
        rank_glu = _ranks(m.score_glu(glu))
        for b, r_glu in enumerate(grid_glu):
            y_hat = m.down(glu * (rank_glu < _rows(r_glu, f)))
            out[a, b] = float((weight * (y - y_hat).square()).sum())
    return out


def error_curves(lm, windows: torch.Tensor, score: str = "abs", tokens: int = CURVE_TOKENS,
                 grid: tuple[float, ...] = GRID) -> ErrorCurves:
    """Step 1 of the module docstring, on calibration ``windows`` (never the evaluation split)."""
    c = lm.model.config
    L, d, f = c.num_hidden_layers, c.hidden_size, c.intermediate_size
    unsparsify_(lm.model)
    captured = _capture(lm.model, windows, tokens)
    probe = SparsityPlan(lm.name, "dip", 1.0, d, f, [LayerPlan(d, f) for _ in range(L)], score=score)
    sparsify_(lm.model, probe)
    try:
        cost = np.stack([_layer_curve(m, x, g, grid, grid, d, f)
                         for m, (x, g) in zip(sparse_mlps(lm.model), captured)])
    finally:
        unsparsify_(lm.model)
    return ErrorCurves(np.array(grid), np.array(grid), cost, int(captured[0][0].shape[0]), score)


def _fine(curves: ErrorCurves, step: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The curves linearly interpolated onto a grid of ``step`` over the measured range, both axes."""
    lo_in, lo_glu = curves.rho_in[0], curves.rho_glu[0]
    r_in = np.round(np.arange(lo_in, curves.rho_in[-1] + step / 2, step), 6)
    r_glu = np.round(np.arange(lo_glu, curves.rho_glu[-1] + step / 2, step), 6)
    along_glu = np.stack([[np.interp(r_glu, curves.rho_glu, row) for row in layer] for layer in curves.cost])
    cost = np.stack([[np.interp(r_in, curves.rho_in, col) for col in layer.T] for layer in along_glu])
    return r_in, r_glu, cost.transpose(0, 2, 1)  # [L, n_in, n_glu]


def allocate_joint(curves: ErrorCurves, target: float, d: int, f: int, step: float = FINE_STEP) -> list[LayerPlan]:
    """Step 2 of the module docstring: per-layer (K_in, K_glu) with mean density ``target`` within half
    a W_d row."""
    r_in, r_glu, cost = _fine(curves, step)
    dens = (2 * r_in[:, None] + r_glu[None, :]) / 3
    if target < dens.min() - 1e-9:
        raise ValueError(f"density {target} is below the joint allocation's lowest point {dens.min():.3f} "
                         f"(ρ_in = {r_in[0]}, ρ_glu = {r_glu[0]}); use a higher density or --allocation uniform")
    flat_cost, flat_dens = cost.reshape(len(cost), -1), dens.reshape(-1)

    def pick(lam: float) -> np.ndarray:
        return np.argmin(flat_cost + lam * flat_dens[None, :], axis=1)

    scale = max(float(flat_cost.max()), 1e-30)
    lo, hi = np.log(scale * 1e-12), np.log(scale * 1e6)  # λ = e^lo keeps (nearly) everything, e^hi nothing
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if flat_dens[pick(np.exp(mid))].mean() > target else (lo, mid)
    idx = np.unravel_index(pick(np.exp(hi)), dens.shape)
    layers = [LayerPlan(_rows(r_in[a], d), _rows(r_glu[b], f)) for a, b in zip(*idx)]
    exact_budget(layers, target, 0.0, d, f)
    return layers


def split_per_layer(curves: ErrorCurves, densities: np.ndarray, d: int, f: int,
                    step: float = FINE_STEP) -> list[LayerPlan]:
    """Each layer keeps its density ρ_i and takes the split on its own curve that costs least there.

    Only costs of the same layer are compared, so this needs no common unit across layers: the
    robust half of the joint search. The mean density is then made exact (:func:`exact_budget`)."""
    r_in, r_glu, cost = _fine(curves, step)
    layers = []
    for i, rho in enumerate(densities):
        want = 3 * rho - 2 * r_in  # ρ_glu that keeps ρ_i at each input share
        ok = (want >= r_glu[0] - 1e-9) & (want <= r_glu[-1] + 1e-9)
        if not ok.any():
            raise ValueError(f"density {rho:.3f} of layer {i} lies outside the curves' grid")
        on_line = np.array([np.interp(w, r_glu, row) for w, row in zip(want, cost[i])])
        a = int(np.argmin(np.where(ok, on_line, np.inf)))
        layers.append(LayerPlan(_rows(r_in[a], d), _rows(float(np.clip(want[a], r_glu[0], 1.0)), f)))
    exact_budget(layers, float(np.mean(densities)), 0.0, d, f)
    return layers


def exact_budget(layers: list[LayerPlan], target: float, floor: float, d: int, f: int) -> None:
    """Add or remove single W_d rows (K_glu ± 1) until the mean density is the target within half a row.

    Rows are taken from the densest layers and given to the sparsest, so no layer drops below the floor."""
    L = len(layers)
    rows = round((3 * d * f * L * target - sum(2 * lp.k_in * f + lp.k_glu * d for lp in layers)) / d)
    step = 1 if rows > 0 else -1
    while rows:
        order = sorted(range(L), key=lambda i: (step * density(layers[i].k_in, layers[i].k_glu, d, f), i))
        moved = False
        for i in order:
            lp = layers[i]
            ok = lp.k_glu + step <= f if step > 0 else density(lp.k_in, lp.k_glu - 1, d, f) >= floor - 1e-12
            if rows and ok and lp.k_glu + step >= 1:
                lp.k_glu += step
                rows -= step
                moved = True
        if not moved:
            raise ValueError(f"cannot meet density {target} within the per-layer floor {floor}")
