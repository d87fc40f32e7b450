"""Calibration: turn a :class:`SparsityConfig` into a :class:`SparsityPlan` on calibration text.

Named steps (docs/design.md §4), each its own function:

1. ``search_split`` — the split between ρ_in and ρ_glu at the target ρ (docs/method.md: the split matters a
   lot). A few candidate input shares are tried with plain DIP; the one with the lowest calibration NLL
   wins. ``rho_in`` given by the user skips this step; a search asked before of the same weights, text,
   density and score is answered from the cache (:mod:`dipdeploy.sparsity.splitcache`).
2. ``allocate_greedy`` — per-layer density under the global budget, from each layer's end-to-end loss
   sensitivity (KL of the final logits to the dense model), chosen on held-out calibration tokens; or
   ``allocate_joint_plan`` — per-layer density and split together, from Fisher-weighted per-layer error
   curves (:mod:`dipdeploy.sparsity.allocate`), kept only if it beats uniform on held-out tokens (it
   replaces step 1); or ``split_allocated`` after the greedy one (``greedy-split``): each greedy density
   kept, each layer's split from its own curve, kept only if it beats greedy on held-out tokens.
3. ``fit_thresholds`` — CATS / TEAL thresholds per layer: the (1−share) quantile of the observed
   magnitudes, so each layer hits its density in expectation on calibration text; after an allocation,
   each layer's own shares.

Calibration text must never be the evaluation split (use WikiText-2 validation or a user file).

``progress`` (a ``dipdeploy.progress.Stage``, or None) counts the forward passes over the calibration
windows of steps 1 and 3, the ones whose number is known when they start: each step adds its passes to
the total (``expect``) then counts them (``advance``), so a caller's bar has a total and a time left
instead of a bare clock. An allocation (step 2) runs between them uncounted.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import torch

from dipdeploy.sparsity.allocate import ErrorCurves, allocate_joint, error_curves, exact_budget, split_per_layer
from dipdeploy.sparsity.methods import decoder_layers, sparse_mlps, sparsify_, unsparsify_
from dipdeploy.sparsity.nll import summed_nll
from dipdeploy.sparsity.plan import LayerPlan, SparsityConfig, SparsityPlan, split_for, uniform_plan

_SAMPLES_PER_LAYER = 200_000  # magnitudes kept per layer for a quantile: plenty for a 1e-3 quantile error


def _nll(model, windows: torch.Tensor, progress=None) -> float:
    """Log of the evaluation's perplexity (``eval.perplexity``) of ``windows``, one window at a time; taken
    through exp as that is, so the recorded ``split_nll`` is its log to the bit."""
    total, count = summed_nll(model, windows, batch_size=1, on_batch=progress.advance if progress else None)
    return math.log(math.exp(total / count))


def _shape(lm) -> tuple[int, int, int]:
    c = lm.model.config
    return c.num_hidden_layers, c.hidden_size, c.intermediate_size


#: Input shares ρ_in/ρ tried by the split search (plain DIP at the target ρ).
SPLIT_RATIOS = (1.0, 1.1, 1.2, 1.3)


def split_probes(cfg: SparsityConfig, name: str, L: int, d: int, f: int,
                 ratios: tuple[float, ...]) -> dict[str, SparsityPlan]:
    """The split search's candidates: ρ_in (as its key, 3 decimals) → the uniform plain-DIP plan at
    ``cfg.density`` with that input share; shares that round to the same ρ_in or leave no GLU are skipped.
    The eager search and the streamed one (``dipdeploy.sparsity.streamed``) try exactly these."""
    rho = cfg.density
    out: dict[str, SparsityPlan] = {}
    for r in ratios:
        rho_in, rho_glu = split_for("dip", rho, r * rho)
        key = f"{rho_in:.3f}"
        if key in out or rho_glu <= 0:
            continue
        probe = SparsityConfig(method="dip", density=rho, rho_in=rho_in, score=cfg.score)
        out[key] = uniform_plan(probe, name, L, d, f)
    return out


def search_split(lm, cfg: SparsityConfig, windows: torch.Tensor,
                 ratios: tuple[float, ...] = SPLIT_RATIOS, progress=None) -> tuple[float, dict]:
    """Best ρ_in for DIP at ``cfg.density`` among ``ratios``·ρ (valid ones), by calibration NLL."""
    L, d, f = _shape(lm)
    tried: dict[str, float] = {}
    probes = split_probes(cfg, lm.name, L, d, f, ratios)
    if progress is not None:
        progress.expect(len(probes) * int(windows.shape[0]))
    for key, plan in probes.items():
        sparsify_(lm.model, plan)
        tried[key] = _nll(lm.model, windows, progress)
    unsparsify_(lm.model)
    best = min(tried, key=tried.get)
    return float(best), {"split_nll": tried}


def _observe(model, windows: torch.Tensor, progress=None) -> dict[tuple[int, str], np.ndarray]:
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
                if progress is not None:
                    progress.advance()
    finally:
        for mlp in sparse_mlps(model):
            mlp.observer = None
    return {k: torch.cat(v).cpu().numpy() for k, v in seen.items()}


def fit_thresholds(lm, plan: SparsityPlan, windows: torch.Tensor, rho_in: float | None = None,
                   rho_glu: float | None = None, progress=None) -> SparsityPlan:
    """Per-layer thresholds for CATS (on |act(W_g x)|) and TEAL (on |x|, then |GLU~|).

    Each layer's threshold is the quantile that keeps ``rho_in`` (``rho_glu``) of its magnitudes; where
    one is None, each layer's own share in the plan (K_in/d, K_glu/F), so an allocated plan's per-layer
    densities become per-layer thresholds (TEAL's per-layer sparsity levels)."""
    d, f = plan.hidden_size, plan.intermediate_size
    sparsify_(lm.model, plan)
    names = ("in", "glu") if plan.method == "teal" else ("gate",)
    if progress is not None:
        progress.expect(len(names) * int(windows.shape[0]))
    for name in names:  # TEAL's GLU threshold is fitted with the input threshold already active
        obs = _observe(lm.model, windows, progress)
        for i, lp in enumerate(plan.layers):
            if name == "in":
                share = lp.k_in / d if rho_in is None else rho_in
                lp.thr_in = float(np.quantile(obs[(i, name)], 1 - share))
            else:
                share = lp.k_glu / f if rho_glu is None else rho_glu
                lp.thr_glu = float(np.quantile(obs[(i, name)], 1 - share))
    unsparsify_(lm.model)
    return plan


def _layer_at(rho: float, ratio: float, d: int, f: int) -> LayerPlan:
    """(K_in, K_glu) of one layer at density ρ with the plan's input share ρ_in = ratio·ρ."""
    r_in, r_glu = split_for("dip", rho, ratio * rho)
    return LayerPlan(max(1, min(d, round(r_in * d))), max(1, min(f, round(r_glu * f))))


def _logprobs(model, x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(model(x, use_cache=False).logits.float(), dim=-1)


def _kl(model, x: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean KL(dense ‖ sparse) of the next-token distributions: the end-to-end error a layer's density
    causes, after every later layer has amplified or damped it (what the perplexity sees)."""
    return _kl_of(_logprobs(model, x), ref)


def _allocation_windows(windows: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split calibration windows into a search half (first ``tokens``) and a held-out half (the rest),
    so the choice among candidate allocations is not made on the tokens that shaped them."""
    search = windows[:, :tokens]
    rest = windows[:, tokens:2 * tokens]
    return search, (rest if rest.shape[1] >= 16 else search)


class _Suffix:
    """One sparse forward's decoder-layer inputs, so the logits after a change to layer i come from
    re-running layers i.. only (on average half the work of a full forward per sensitivity probe)."""

    def __init__(self, model, x: torch.Tensor):
        self.model, self.layers, self.calls = model, decoder_layers(model), []
        hooks = [layer.register_forward_pre_hook(lambda mod, a, kw: self.calls.append((a, kw)), with_kwargs=True)
                 for layer in self.layers]
        try:
            self.full = _logprobs(model, x)
        finally:
            for h in hooks:
                h.remove()

    def logprobs_from(self, i: int) -> torch.Tensor:
        args, kw = self.calls[i]
        h = args[0] if args else kw["hidden_states"]
        for layer, (args, kw) in zip(self.layers[i:], self.calls[i:]):
            out = layer(h, *args[1:], **kw) if args else layer(**{**kw, "hidden_states": h})
            h = out[0] if isinstance(out, tuple) else out
        logits = self.model.get_output_embeddings()(self.model.model.norm(h))
        return torch.log_softmax(logits.float(), dim=-1)


def _kl_of(logp: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ref.exp() * (ref - logp)).sum(-1).mean())


def _sensitivity(lm, probe: SparsityPlan, x: torch.Tensor, ref: torch.Tensor, low: float,
                 ratio: float) -> np.ndarray:
    """s[i] = rise of the KL when layer i alone drops to density ``low`` (the floor) and every other layer
    stays at the uniform ρ. One probe per layer, at the floor: probes one step either side of ρ move the KL
    by no more than the noise of the probe's tokens, while the floor probe separates the layers
    (benchmarks/results/accuracy-smollm2.md, "The allocation's probes")."""
    L, d, f = _shape(lm)
    sparsify_(lm.model, probe)
    suffix = _Suffix(lm.model, x)
    base = _kl_of(suffix.full, ref)
    rise = np.zeros(L)
    for i, mlp in enumerate(sparse_mlps(lm.model)):
        uniform, mlp.layer = mlp.layer, _layer_at(low, ratio, d, f)
        rise[i] = _kl_of(suffix.logprobs_from(i), ref) - base
        mlp.layer = uniform
    unsparsify_(lm.model)
    return rise


def _densities(rise: np.ndarray, strength: float, target: float, floor: float) -> np.ndarray:
    """ρ_i = ρ + strength·ρ·(log s_i − mean log s) + δ, clipped to [floor, 1], δ found by bisection so the
    mean is ρ. Why log s: if a layer's KL falls like a_i·exp(−β ρ_i), the budget-constrained optimum
    equalises a_i β exp(−β ρ_i), i.e. ρ_i = const + log(a_i)/β, and s_i ∝ a_i; ``strength`` ~ 1/β."""
    log_s = np.log(np.maximum(rise, 1e-6))
    raw = target + strength * target * (log_s - log_s.mean())
    lo, hi = floor - raw.max(), 1.0 - raw.min()  # all at the floor … all at 1
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.clip(raw + mid, floor, 1.0).mean() < target else (lo, mid)
    return np.clip(raw + (lo + hi) / 2, floor, 1.0)


def _layers_for(rhos: np.ndarray, target: float, floor: float, ratio: float, d: int, f: int) -> list[LayerPlan]:
    layers = [_layer_at(float(r), ratio, d, f) for r in rhos]
    exact_budget(layers, target, floor, d, f)
    return layers


@torch.no_grad()
def allocate_greedy(lm, plan: SparsityPlan, windows: torch.Tensor, tokens: int = 256,
                    strengths: tuple[float, ...] = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4), floor: float = 0.5,
                    density_target: float | None = None) -> SparsityPlan:
    """Per-layer densities that lower the end-to-end KL to the dense model at the global budget.

    Each layer's loss sensitivity s_i is measured on the first ``tokens`` of each calibration window
    (:func:`_sensitivity`), densities follow log s_i at each of ``strengths`` (:func:`_densities`;
    0 is uniform), and the strength with the lowest KL on the held-out rest of the windows wins, so the
    plan is never worse than uniform on calibration text. The mean density is the target within half
    a W_d row (:func:`dipdeploy.sparsity.allocate.exact_budget`) and every layer keeps at least ``floor``·ρ. Deterministic.

    Why end to end and with a floor: a per-layer criterion (‖MLP_ρ(x) − MLP(x)‖²) ignores how later
    layers amplify or damp an error, and without a floor a layer can be starved; a knapsack over
    per-layer KL at a few levels is sound but its steps move the KL by no more than the probe's noise.
    The allocations tried before this one and how each fared: benchmarks/results/accuracy-smollm2.md,
    "The allocation's probes".
    """
    L, d, f = _shape(lm)
    target = plan.density if density_target is None else density_target
    ratio, low = plan.rho_in / target, floor * target
    search, held = _allocation_windows(windows, tokens)
    unsparsify_(lm.model)
    ref_search, ref_held = _logprobs(lm.model, search), _logprobs(lm.model, held)
    probe = SparsityPlan(lm.name, "dip", target, d, f, [_layer_at(target, ratio, d, f) for _ in range(L)],
                         score=plan.score, rho_in=plan.rho_in)
    rise = _sensitivity(lm, probe, search, ref_search, low, ratio)
    tried = {}
    for strength in strengths:
        probe.layers = _layers_for(_densities(rise, strength, target, low), target, low, ratio, d, f)
        sparsify_(lm.model, probe)
        tried[strength] = (_kl(lm.model, held, ref_held), probe.layers)
    unsparsify_(lm.model)
    choice = min(tried, key=lambda k: (tried[k][0], k))
    plan.layers = [LayerPlan(lp.k_in, lp.k_glu) for lp in tried[choice][1]]
    plan.allocation = "greedy"
    plan.calibration.update(
        greedy_sensitivity=[round(float(r), 5) for r in rise], greedy_strength=choice,
        greedy_held_kl={str(k): round(v[0], 5) for k, v in tried.items()},
        layer_density=[round(plan.layer_density(i), 4) for i in range(L)])
    plan.density = plan.mean_density()
    return plan


def _curves_for(lm, search: torch.Tensor, score: str, curves: dict | None) -> ErrorCurves:
    """The error curves of ``score`` on the search tokens, memoised in ``curves`` (per score)."""
    curves = {} if curves is None else curves
    if score not in curves:
        curves[score] = error_curves(lm, search, score)
    return curves[score]


def _held_kl(lm, plan: SparsityPlan, candidates: dict[str, list[LayerPlan]], held: torch.Tensor) -> dict[str, float]:
    """KL of the final logits to the dense model's on ``held`` for each candidate set of layers (plain DIP
    at ``plan``'s score), so candidate allocations are compared on tokens that did not shape them."""
    L, d, f = _shape(lm)
    unsparsify_(lm.model)
    ref = _logprobs(lm.model, held)
    out = {}
    for name, layers in candidates.items():  # sparsify_ per candidate: each SparseMLP keeps its LayerPlan
        sparsify_(lm.model, SparsityPlan(lm.name, "dip", plan.density, d, f, layers, score=plan.score))
        out[name] = _kl(lm.model, held, ref)
    unsparsify_(lm.model)
    return out


@torch.no_grad()
def allocate_joint_plan(lm, plan: SparsityPlan, windows: torch.Tensor, curves: dict | None = None,
                        tokens: int = 256) -> SparsityPlan:
    """Per-layer densities and splits from the error curves (:mod:`dipdeploy.sparsity.allocate`), kept
    only where they beat the uniform plan on held-out calibration tokens.

    Candidates: ``uniform`` (the plan as given), ``split`` (uniform densities, each layer's best split on
    its own curve) and ``lagrange`` (densities and splits together). The curves are measured on the first
    ``tokens`` of each calibration window and the candidates compared by the KL of the final logits to the
    dense model's on the rest, so the choice is not made on the tokens that shaped them. ``curves``
    memoises the curves per score across densities and methods."""
    L, d, f = _shape(lm)
    search, held = _allocation_windows(windows, tokens)
    found = _curves_for(lm, search, plan.score, curves)
    candidates = {"uniform": [LayerPlan(lp.k_in, lp.k_glu) for lp in plan.layers],
                  "split": split_per_layer(found, np.full(L, plan.density), d, f),
                  "lagrange": allocate_joint(found, plan.density, d, f)}
    held_kl = _held_kl(lm, plan, candidates, held)
    choice = min(held_kl, key=lambda k: (held_kl[k], k != "uniform"))
    plan.calibration.update(joint_held_kl={k: float(f"{v:.5g}") for k, v in held_kl.items()},
                            joint_choice=choice, curve_tokens=found.tokens)
    if choice != "uniform":
        plan.layers = [LayerPlan(lp.k_in, lp.k_glu) for lp in candidates[choice]]
        plan.allocation = "joint"
        plan.rho_in = sum(lp.k_in for lp in plan.layers) / (L * d)
    plan.calibration["layer_split"] = [[round(lp.k_in / d, 4), round(lp.k_glu / f, 4)] for lp in plan.layers]
    plan.density = plan.mean_density()
    return plan


@torch.no_grad()
def split_allocated(lm, plan: SparsityPlan, windows: torch.Tensor, curves: dict | None = None,
                    tokens: int = 256) -> SparsityPlan:
    """Each layer of an allocated plan (the greedy one) keeps its density and takes the in/glu split its
    own error curve prefers there (:func:`dipdeploy.sparsity.allocate.split_per_layer`), kept only where
    that beats the plan as given on held-out calibration tokens (as in :func:`allocate_joint_plan`).

    The greedy allocation measures how much density each layer needs end to end but gives every layer the
    global split; the curves compare splits within one layer only, so this uses the robust half of the
    joint search on top of the greedy densities. On SmolLM2-135M it does not pay (benchmarks/results/
    accuracy-smollm2.md, greedy-split against greedy): plans this close are not separated by the KL of the
    held-out calibration tokens, so ``greedy`` stays the recommended allocation."""
    L, d, f = _shape(lm)
    search, held = _allocation_windows(windows, tokens)
    found = _curves_for(lm, search, plan.score, curves)
    dens = np.array([plan.layer_density(i) for i in range(L)])
    candidates = {"as-given": [LayerPlan(lp.k_in, lp.k_glu) for lp in plan.layers],
                  "split": split_per_layer(found, dens, d, f)}
    held_kl = _held_kl(lm, plan, candidates, held)
    choice = min(held_kl, key=lambda k: (held_kl[k], k != "as-given"))
    plan.calibration.update(split_held_kl={k: float(f"{v:.5g}") for k, v in held_kl.items()},
                            split_choice=choice, curve_tokens=found.tokens)
    if choice == "split":
        plan.layers = [LayerPlan(lp.k_in, lp.k_glu) for lp in candidates["split"]]
        plan.allocation = f"{plan.allocation}-split"
        plan.rho_in = sum(lp.k_in for lp in plan.layers) / (L * d)
    plan.calibration["layer_split"] = [[round(lp.k_in / d, 4), round(lp.k_glu / f, 4)] for lp in plan.layers]
    plan.density = plan.mean_density()
    return plan


def calibrate(lm, cfg: SparsityConfig, windows: torch.Tensor, splits: dict | None = None,
              curves: dict | None = None, search=search_split, progress=None) -> SparsityPlan:
    """The whole calibration: split search → allocation → thresholds, as the config asks.

    ``splits`` memoises the split search per (density, score) across calls: DIP, DIP-CA and TEAL at the
    same density share it (the search itself runs plain DIP). ``allocation = "joint"`` chooses every
    layer's split itself, but its ``uniform`` candidate, the fallback when no per-layer plan beats it, is
    the searched split (with the default split instead, TEAL joint at ρ = 0.4 fell back to a worse split
    than uniform TEAL's searched one: benchmarks/results/accuracy-smollm2.md); ``curves``
    memoises its error curves per score. ``search`` runs the split search: a streamed model
    passes ``dipdeploy.sparsity.streamed.search_split_streamed``. ``progress``: the module docstring.
    """
    L, d, f = _shape(lm)
    info: dict = {"windows": int(windows.shape[0]), "seqlen": int(windows.shape[1])}
    rho_in = cfg.rho_in
    if cfg.method in ("teal", "dip", "dip-ca") and rho_in is None:
        splits = {} if splits is None else splits
        key = (round(cfg.density, 6), cfg.score)
        if key not in splits:  # memoised in the call's dict, and on disk across runs (splitcache)
            from dipdeploy.sparsity.splitcache import cached_split

            counted = partial(search, progress=progress) if progress is not None else search
            splits[key] = cached_split(lm, cfg, windows, counted, SPLIT_RATIOS)
        rho_in, found = splits[key]
        info.update(found)
    plan = uniform_plan(cfg, lm.name, L, d, f, rho_in=rho_in)
    plan.calibration = info
    if cfg.allocation != "uniform":
        allowed = ("dip", "dip-ca", "teal") if cfg.allocation == "joint" else ("dip", "dip-ca")
        if cfg.method not in allowed:
            raise ValueError(f"allocation {cfg.allocation!r} is implemented for {', '.join(allowed)}, not "
                             f"{cfg.method!r}; use --allocation uniform")
    if cfg.allocation in ("greedy", "greedy-split"):
        plan = allocate_greedy(lm, plan, windows, density_target=cfg.density)
    if cfg.allocation == "greedy-split":
        plan = split_allocated(lm, plan, windows, curves)
    elif cfg.allocation == "joint":
        plan = allocate_joint_plan(lm, plan, windows, curves)
    if cfg.method in ("cats", "teal"):
        if plan.allocation == "uniform":
            plan = fit_thresholds(lm, plan, windows, *split_for(cfg.method, cfg.density, rho_in), progress=progress)
        else:
            plan = fit_thresholds(lm, plan, windows, progress=progress)
        plan.density = cfg.density  # thresholds hit it in expectation on calibration text
    return plan


def calibrate_on(lm, cfg: SparsityConfig, windows: torch.Tensor, device: str = "cpu", progress=None) -> SparsityPlan:
    """:func:`calibrate` on a resolved torch ``device`` (``dipdeploy.torchdevice``), for an eager or a
    streamed model alike, so ``dipdeploy calibrate`` and ``dipdeploy export`` calibrate by one path.

    An eager model is moved to ``device`` for the calibration and back to the CPU after (export reads
    and quantises its weights there); a streamed one (``lm.checkpoint``) reads each layer onto ``device``
    in turn (``dipdeploy.sparsity.streamed``), and only the split search streams. The plan holds Python
    numbers only, the same format wherever it was computed."""
    if lm.checkpoint is not None:
        from dipdeploy.sparsity.streamed import check_streamable, search_split_streamed

        check_streamable(cfg)
        return calibrate(lm, cfg, windows, search=partial(search_split_streamed, device=device), progress=progress)
    lm.model.to(device)
    try:
        return calibrate(lm, cfg, windows.to(device), progress=progress)
    finally:
        lm.model.to("cpu")
