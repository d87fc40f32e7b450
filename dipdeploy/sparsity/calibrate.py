"""Calibration: turn a :class:`SparsityConfig` into a :class:`SparsityPlan` on calibration text.

Named steps (style.md §4), each its own function:

1. ``search_split`` — the split between ρ_in and ρ_glu at the target ρ (method.md: the split matters a
   lot). A few candidate input shares are tried with plain DIP; the one with the lowest calibration NLL
   wins. ``rho_in`` given by the user skips this step.
2. ``fit_thresholds`` — CATS / TEAL thresholds per layer: the (1−ρ) quantile of the observed magnitudes,
   so each layer hits its density in expectation on calibration text.
3. ``allocate_greedy`` — per-layer density under the global budget: each layer's MLP output error
   ‖MLP_ρ(x) − MLP(x)‖² is measured on captured inputs at a grid of densities, and budget steps go to the
   layer whose error drops most per step (errors are in residual-stream units, so layers compare).

Calibration text must never be the evaluation split (use WikiText-2 validation or a user file).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dipdeploy.sparsity.methods import SparseMLP, decoder_layers, sparse_mlps, sparsify_, unsparsify_
from dipdeploy.sparsity.plan import LayerPlan, SparsityConfig, SparsityPlan, split_for, uniform_plan

_SAMPLES_PER_LAYER = 200_000  # magnitudes kept per layer for a quantile: plenty for a 1e-3 quantile error


def _nll(model, windows: torch.Tensor) -> float:
    from dipdeploy.eval.perplexity import perplexity  # floor 3 utility, imported lazily

    ppl, _ = perplexity(model, windows, batch_size=1, progress=False)
    return math.log(ppl)


def _shape(lm) -> tuple[int, int, int]:
    c = lm.model.config
    return c.num_hidden_layers, c.hidden_size, c.intermediate_size


def search_split(lm, cfg: SparsityConfig, windows: torch.Tensor,
                 ratios: tuple[float, ...] = (1.0, 1.1, 1.2, 1.3)) -> tuple[float, dict]:
    """Best ρ_in for DIP at ``cfg.density`` among ``ratios``·ρ (valid ones), by calibration NLL."""
    L, d, f = _shape(lm)
    rho = cfg.density
    tried: dict[str, float] = {}
    for r in ratios:
        rho_in, rho_glu = split_for("dip", rho, r * rho)
        key = f"{rho_in:.3f}"
        if key in tried or rho_glu <= 0:
            continue
        probe = SparsityConfig(method="dip", density=rho, rho_in=rho_in, score=cfg.score)
        sparsify_(lm.model, uniform_plan(probe, lm.name, L, d, f), lm.mlp_layout)
        tried[key] = _nll(lm.model, windows)
    unsparsify_(lm.model)
    best = min(tried, key=tried.get)
    return float(best), {"split_nll": tried}


def _observe(model, windows: torch.Tensor) -> dict[tuple[int, str], np.ndarray]:
    """Run the windows once, keeping a random sample of each layer's observed magnitudes."""
    gen = torch.Generator().manual_seed(0)
    seen: dict[tuple[int, str], list[torch.Tensor]] = {}

    def keep(i: int, name: str, t: torch.Tensor) -> None:
        flat = t.detach().reshape(-1).float()
        pick = torch.randint(flat.numel(), (min(flat.numel(), _SAMPLES_PER_LAYER),), generator=gen)
        seen.setdefault((i, name), []).append(flat[pick])

    for mlp in sparse_mlps(model):
        mlp.observer = keep
    try:
        with torch.no_grad():
            for w in windows.split(1):
                model(w, use_cache=False)
    finally:
        for mlp in sparse_mlps(model):
            mlp.observer = None
    return {k: torch.cat(v).numpy() for k, v in seen.items()}


def fit_thresholds(lm, plan: SparsityPlan, windows: torch.Tensor, rho_in: float, rho_glu: float) -> SparsityPlan:
    """Per-layer thresholds for CATS (on |SiLU(W_g x)|) and TEAL (on |x|, then |GLU~|)."""
    sparsify_(lm.model, plan, lm.mlp_layout)
    names = ("in", "glu") if plan.method == "teal" else ("gate",)
    for name in names:  # TEAL's GLU threshold is fitted with the input threshold already active
        obs = _observe(lm.model, windows)
        for i, lp in enumerate(plan.layers):
            if name == "in":
                lp.thr_in = float(np.quantile(obs[(i, name)], 1 - rho_in))
            else:
                lp.thr_glu = float(np.quantile(obs[(i, name)], 1 - rho_glu))
    unsparsify_(lm.model)
    return plan


def _capture_mlp_inputs(lm, windows: torch.Tensor, tokens: int) -> list[torch.Tensor]:
    xs: dict[int, torch.Tensor] = {}
    hooks = [layer.mlp.register_forward_pre_hook(lambda mod, args, i=i: xs.__setitem__(i, args[0].detach()))
             for i, layer in enumerate(decoder_layers(lm.model))]
    try:
        with torch.no_grad():
            lm.model(windows[:1, :tokens], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return [xs[i].reshape(-1, xs[i].shape[-1]) for i in range(len(xs))]


@torch.no_grad()
def allocate_greedy(lm, plan: SparsityPlan, windows: torch.Tensor, tokens: int = 256,
                    step: float = 0.05) -> SparsityPlan:
    """Greedy per-layer densities with the plan's mean density and split ratio (see module doc)."""
    L, d, f = _shape(lm)
    ratio = plan.rho_in / plan.density
    levels = np.round(np.arange(step, 1.0 + 1e-9, step), 6)
    xs = _capture_mlp_inputs(lm, windows, tokens)
    err = np.zeros((L, len(levels)))
    probe = SparsityPlan(lm.name, "dip", 1.0, d, f, [LayerPlan(d, f) for _ in range(L)], score=plan.score)
    for i, layer in enumerate(decoder_layers(lm.model)):
        mlp = SparseMLP(layer.mlp, lm.mlp_layout, probe, i)
        y = mlp.base(xs[i])
        for j, rho in enumerate(levels):
            r_in, r_glu = split_for("dip", float(rho), ratio * float(rho))
            mlp.layer = LayerPlan(max(1, round(r_in * d)), max(1, round(r_glu * f)))
            err[i, j] = float((mlp(xs[i][None])[0] - y).square().sum())
    err = np.minimum.accumulate(err[:, ::-1], axis=1)[:, ::-1]  # monotone: more density never hurts
    level = np.zeros(L, dtype=int)
    budget = round(plan.density * L / step) - L  # steps above the lowest level, summed over layers
    for _ in range(max(0, budget)):
        gain = np.where(level + 1 < len(levels), err[np.arange(L), level] - err[np.arange(L), np.minimum(level + 1, len(levels) - 1)], -np.inf)
        level[int(np.argmax(gain))] += 1
    for i, lp in enumerate(plan.layers):
        rho = float(levels[level[i]])
        r_in, r_glu = split_for("dip", rho, ratio * rho)
        lp.k_in, lp.k_glu = max(1, round(r_in * d)), max(1, round(r_glu * f))
    plan.allocation = "greedy"
    plan.calibration["layer_density"] = [float(levels[v]) for v in level]
    plan.density = plan.mean_density()
    return plan


def calibrate(lm, cfg: SparsityConfig, windows: torch.Tensor, splits: dict | None = None) -> SparsityPlan:
    """The whole calibration: split search → thresholds → allocation, as the config asks.

    ``splits`` memoises the split search per (density, score) across calls: DIP, DIP-CA and TEAL at the
    same density share it (the search itself runs plain DIP).
    """
    L, d, f = _shape(lm)
    info: dict = {"windows": int(windows.shape[0]), "seqlen": int(windows.shape[1])}
    rho_in = cfg.rho_in
    if cfg.method in ("teal", "dip", "dip-ca") and rho_in is None:
        splits = {} if splits is None else splits
        key = (round(cfg.density, 6), cfg.score)
        if key not in splits:
            splits[key] = search_split(lm, cfg, windows)
        rho_in, found = splits[key]
        info.update(found)
    plan = uniform_plan(cfg, lm.name, L, d, f, rho_in=rho_in)
    plan.calibration = info
    if cfg.method in ("cats", "teal"):
        r_in, r_glu = split_for(cfg.method, cfg.density, rho_in)
        plan = fit_thresholds(lm, plan, windows, r_in, r_glu)
        plan.density = cfg.density  # thresholds hit it in expectation on calibration text
    if cfg.allocation == "greedy":
        if cfg.method not in ("dip", "dip-ca"):
            raise ValueError(f"allocation 'greedy' is implemented for dip and dip-ca, not {cfg.method!r}; "
                             f"use --allocation uniform")
        plan = allocate_greedy(lm, plan, windows)
    return plan
