"""The predictor baseline (Deja Vu, LLM in a flash): a small learned predictor per layer chooses the GLU units.

DIP's premise is that such predictors fail on SwiGLU models, whose GLU is not the sparse ReLU output those
papers predicted; this method measures that premise on the real model instead of assuming it
(docs/method.md, "The predictor baseline"). Per layer,

    P(x) = (x A) B + b,    A [d, r], B [r, F], b [F]

is trained on the dense model's MLP inputs over the calibration windows (WikiText-2 validation, never the
test split) to tell which units have the largest |GLU| of the dense computation: binary targets "unit j is
in the top-K_glu of |GLU(x)|", binary cross-entropy, Adam on batches of those tokens, a fixed seed. At
inference the top-K_glu of P(x) gate the whole MLP (``methods._predictor``), and the predictor's own bytes
count in the plan's density (``plan.predictor_share``).

A starts as the leading right singular vectors of W_g and B as the matching part of W_g's row space, so
P(x) starts as the rank-r approximation of the gate's pre-activation (the one input of act(·) that
decides which units are near zero under SiLU) and training only has to correct it. Evaluation only:
nothing here is exported, and a bundle cannot run it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dipdeploy.sparsity.methods import decoder_layers, sparse_mlps, sparsify_, topk_mask, unsparsify_
from dipdeploy.sparsity.plan import SparsityPlan

#: Calibration tokens a layer's predictor trains on at most (a seeded sample): the targets of all of them,
#: one bit per unit, are held at once.
TRAIN_TOKENS = 16384
#: One in this many calibration tokens is held out, to report each layer's recall on tokens it did not fit.
HOLD_OUT = 8
BATCH = 256
LEARNING_RATE = 1e-2


class Predictor(nn.Module):
    """P(x) = (x A) B + b of one layer; buffers, not parameters, so a LoRA trainer never updates them."""

    def __init__(self, a: torch.Tensor, b_mat: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.register_buffer("A", a)
        self.register_buffer("B", b_mat)
        self.register_buffer("b", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(self.A.dtype) @ self.A) @ self.B + self.b

    def elements(self) -> int:
        return self.A.numel() + self.B.numel() + self.b.numel()


@dataclass
class PredictorFit:
    """The trained predictors of one plan (one per layer) and how they fared on held-out calibration tokens."""

    predictors: list[Predictor]
    held_recall: list[float]  # per layer: share of the true top-K units the predictor chose
    seed: int
    steps: int

    def info(self) -> dict:
        n = len(self.held_recall)
        return {"rank": int(self.predictors[0].A.shape[1]), "steps": self.steps, "seed": self.seed,
                "calib_recall": round(sum(self.held_recall) / n, 4),
                "calib_recall_layers": [round(r, 4) for r in self.held_recall]}


@torch.no_grad()
def mlp_inputs(model: nn.Module, windows: torch.Tensor, max_tokens: int, seed: int) -> list[torch.Tensor]:
    """Each layer's MLP input [N, d] on ``windows`` under the dense model (N at most ``max_tokens``, a seeded
    sample of the positions, the same in every layer)."""
    seen: list[list[torch.Tensor]] = [[] for _ in decoder_layers(model)]
    hooks = [layer.mlp.register_forward_pre_hook(lambda mod, args, i=i: seen[i].append(args[0].detach()))
             for i, layer in enumerate(decoder_layers(model))]
    try:
        for w in windows.split(1):
            model(w, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    flat = [torch.cat([t.reshape(-1, t.shape[-1]) for t in xs]).float() for xs in seen]
    n = flat[0].shape[0]
    if n > max_tokens:
        pick = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:max_tokens].sort().values
        flat = [x[pick.to(x.device)] for x in flat]
    return flat


def _init(w_gate: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) of the rank-r SVD of W_g [F, d]: x A B ≈ x W_gᵀ."""
    u, s, vh = torch.linalg.svd(w_gate.float(), full_matrices=False)
    return vh[:rank].T.contiguous(), (u[:, :rank] * s[:rank]).T.contiguous()


def _targets(mlp, x: torch.Tensor, k: int) -> torch.Tensor:
    """The true top-K units of |GLU(x)| of the dense computation, as 0/1 floats [N, F]."""
    gate, up = mlp.gate_up(x.to(mlp.down_weight().dtype))
    return topk_mask((mlp.act(gate) * up).abs(), k).float()


def recall(scores: torch.Tensor, target: torch.Tensor, k: int) -> float:
    """Share of the true top-K units (``target``, 0/1) among the top-K of ``scores``."""
    return float((topk_mask(scores, k) & target.bool()).sum() / target.sum().clamp_min(1))


def train_layer(mlp, x: torch.Tensor, k: int, rank: int, steps: int, seed: int) -> tuple[Predictor, float]:
    """One layer's predictor, trained on its MLP inputs ``x`` [N, d], and its recall on the held-out tokens."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(x.shape[0], generator=gen).to(x.device)
    n_held = max(1, x.shape[0] // HOLD_OUT)  # calibration windows hold at least 16 tokens
    held, train = order[:n_held], order[n_held:]
    with torch.no_grad():
        y = _targets(mlp, x, k)
        a0, b0 = _init(mlp.weights_in()[1], rank)
    a = a0.to(x.device).requires_grad_()
    bm = b0.to(x.device).requires_grad_()
    bias = torch.zeros(y.shape[1], device=x.device, requires_grad=True)
    opt = torch.optim.Adam([a, bm, bias], lr=LEARNING_RATE)
    loss_fn = nn.BCEWithLogitsLoss()
    for _ in range(steps):
        pick = train[torch.randint(train.numel(), (min(BATCH, train.numel()),), generator=gen).to(x.device)]
        opt.zero_grad()
        loss = loss_fn((x[pick] @ a) @ bm + bias, y[pick])
        loss.backward()
        opt.step()
    dtype = mlp.down_weight().dtype  # stored as the MLP's weights are: what plan.predictor_share counts
    pred = Predictor(a.detach().to(dtype), bm.detach().to(dtype), bias.detach().to(dtype))
    with torch.no_grad():
        got = recall(pred(x[held]), y[held], k)
    return pred, got


def fit_predictors(lm, plan: SparsityPlan, windows: torch.Tensor, steps: int, seed: int = 0,
                   progress=None) -> PredictorFit:
    """Train every layer's predictor for ``plan`` (method ``predictor``: its rank and each layer's K_glu) on
    the dense model's MLP inputs over ``windows``; ``progress`` (a ``dipdeploy.progress.Stage``) counts the
    layers. Deterministic for a seed on one device and thread count. Leaves the model unsparsified."""
    if plan.method != "predictor":
        raise ValueError(f"a {plan.method} plan has no predictor to train")
    model = lm.model
    unsparsify_(model)
    xs = mlp_inputs(model, windows, TRAIN_TOKENS, seed)
    sparsify_(model, plan)
    if progress is not None:
        progress.expect(len(xs))
    predictors, held = [], []
    try:
        for i, (mlp, x) in enumerate(zip(sparse_mlps(model), xs)):
            pred, got = train_layer(mlp, x, plan.layers[i].k_glu, plan.predictor_rank, steps, seed + i)
            predictors.append(pred)
            held.append(got)
            if progress is not None:
                progress.advance()
    finally:
        unsparsify_(model)
    return PredictorFit(predictors, held, seed, steps)


def attach(model: nn.Module, fit: PredictorFit) -> None:
    """Give each sparse MLP of ``model`` (sparsified with the plan ``fit`` was trained for) its predictor."""
    mlps = sparse_mlps(model)
    if len(mlps) != len(fit.predictors):
        raise ValueError(f"{len(fit.predictors)} predictors for {len(mlps)} sparse MLPs; sparsify the model with "
                         f"the plan they were trained for")
    for mlp, pred in zip(mlps, fit.predictors):
        mlp.predictor = pred.to(mlp.down_weight().device)
