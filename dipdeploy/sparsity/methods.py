"""The sparse gated-MLP methods in torch: one definition each, used by evaluation, calibration, LoRA
training, tracing and as the export reference.

    MLP(x)  = W_d · (act(W_g x) ⊙ (W_u x))                           x ∈ R^d, W_u, W_g ∈ R^{F×d}
    DIP(x)  = W_d · (m_glu ⊙ GLU~),  GLU~ = act(W_g (m_in ⊙ x)) ⊙ (W_u (m_in ⊙ x))
              m_in = top-K_in(|x|),  m_glu = top-K_glu(|GLU~|)

``act`` is the family record's activation (:mod:`dipdeploy.arch`): SiLU (SwiGLU: Llama, Qwen, Phi-3,
Granite) or tanh-approximated GELU (GeGLU: Gemma). Every method is defined on act(W_g x), so under GeGLU
CATS thresholds |GELU(W_g x)| and ``gate`` ranks it (docs/method.md).

``predictor`` is the Deja Vu / LLM in a flash baseline: the top-K_glu of a trained low-rank predictor of x
(:mod:`dipdeploy.sparsity.predictor`, which trains and attaches it) gate the whole MLP by unit.

Masking an input feature is the same as not reading that column of W_u and W_g, so the dense matmul on a
masked input *is* the sparse computation, numerically. LoRA adapters on the projections act on the full
weight before this selection, as docs/method.md requires (``W + AB``, then columns chosen).

DIP-CA's mask at token t depends on the layer's cache after token t−1. That cache depends only on the
same layer's selections at earlier positions, which a causal forward pass computes before token t, so
one forward over a whole window with a sequential loop *inside* each MLP is exactly token-by-token
decoding with a KV cache (a test holds the two equal), and much faster. The scores and the cache rule
come from :mod:`dipdeploy.cache` (numpy), the one definition shared with the runtime and simulator.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch
from torch import nn

from dipdeploy.arch import Arch, arch_of_model
from dipdeploy.cache import RowCache, dipca_scores, gamma_at, topk_rows
from dipdeploy.sparsity.plan import LayerPlan, SparsityConfig, SparsityPlan, uniform_plan
from dipdeploy.sparsity.scores import score_weights

MethodFn = Callable[["SparseMLP", torch.Tensor], torch.Tensor]
_METHODS: dict[str, MethodFn] = {}

#: The torch function of each activation a family record may name (dipdeploy.arch.ACTIVATIONS).
ACTIVATION_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": nn.functional.silu,
    "gelu_tanh": lambda t: nn.functional.gelu(t, approximate="tanh"),
}


def method(name: str):
    """Register a sparse MLP forward under a method name (no if/elif on strings)."""

    def deco(fn: MethodFn) -> MethodFn:
        _METHODS[name] = fn
        return fn

    return deco


def topk_mask(score: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the k largest entries along the last dim, ties to the lower index.

    The project's one tie rule (``dipdeploy.cache.score``, ONNX ``TopK``): every entry above the K-th
    value, then as many entries equal to it as are still wanted, lowest index first. ``torch.topk``
    leaves ties to its kernel. Same arithmetic as ``topk_rows`` (numpy), without a full sort. The K-th
    value is the least of the K largest, which an unsorted ``topk`` finds at half the cost of a sorted one
    on the CPU (SmolLM2's shapes; the sorted ``topk`` was a quarter of a distillation step).
    """
    kth = score.topk(k, dim=-1, sorted=False).values.amin(dim=-1, keepdim=True)
    above = score > kth
    tied = score == kth
    want = k - above.sum(-1, keepdim=True)
    return above | (tied & (tied.cumsum(-1) <= want))


def topk_indices(score: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries, largest first, ties to the lower index (a stable sort, as
    ``dipdeploy.cache.score.topk_indices``); for traces, where the order is recorded."""
    return score.sort(dim=-1, descending=True, stable=True).indices[..., :k]


def mask_from_indices(idx: np.ndarray, shape: tuple[int, ...], device) -> torch.Tensor:
    mask = torch.zeros(shape, dtype=torch.bool, device=device)
    return mask.scatter_(-1, torch.as_tensor(idx, device=device), True)


class SparseMLP(nn.Module):
    """Wraps one HF gated MLP (``base``) and runs it with one layer of a sparsity plan.

    The projections stay the base module's own ``nn.Linear`` objects, found by the family record's
    module names (so peft's LoRA targets ``gate_proj``/``up_proj``/``down_proj``/``gate_up_proj`` still
    find them).
    """

    def __init__(self, base: nn.Module, arch: Arch, plan: SparsityPlan, index: int):
        super().__init__()
        self.base = base
        self.arch = arch
        self._act = ACTIVATION_FNS[arch.activation]
        self.method = plan.method
        self.layer: LayerPlan = plan.layers[index]
        self.index = index
        self.plan = plan
        self.caches: tuple[RowCache, RowCache] | None = None
        self.recorder = None  # callable(index, record dict) while tracing
        self.observer = None  # callable(index, name, tensor) while calibrating
        self.selector = None  # callable(index, group, scores [N, R] numpy, k) -> indices [N, k] (sparsity.twin)
        self.recall = None  # callable(index, hits, wanted) while a recall meter runs (dipdeploy.eval.meter)
        self.predictor = None  # the predictor method's trained module (dipdeploy.sparsity.predictor)
        # a score's static weights on |x| and |GLU~| (dipdeploy.sparsity.scores), None for plain |·|
        with torch.no_grad():
            norm_in, norm_glu = score_weights(plan.score, *self.weights_in(), self.down_weight())
        for name, t in (("norm_in", norm_in), ("norm_glu", norm_glu)):
            if t is None:
                setattr(self, name, None)
            else:
                self.register_buffer(name, t.to(self.down_weight().dtype))

    # -- the dense pieces ---------------------------------------------------------------------------
    def act(self, t: torch.Tensor) -> torch.Tensor:
        return self._act(t)

    def _proj(self, name: str) -> nn.Module:
        return getattr(self.base, name)

    def gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.arch.mlp
        if m.gate_up:
            gate, up = self._proj(m.gate_up)(x).chunk(2, dim=-1)  # [.., F] each
            return gate, up
        return self._proj(m.gate)(x), self._proj(m.up)(x)

    def down(self, h: torch.Tensor) -> torch.Tensor:
        return self._proj(self.arch.mlp.down)(h)

    def weights_in(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_u, W_g), each [F, d]."""
        m = self.arch.mlp
        if m.gate_up:
            gate, up = self._proj(m.gate_up).weight.chunk(2, dim=0)
            return up, gate
        return self._proj(m.up).weight, self._proj(m.gate).weight

    def down_weight(self) -> torch.Tensor:
        return self._proj(self.arch.mlp.down).weight  # [d, F]

    def score_in(self, x: torch.Tensor) -> torch.Tensor:
        return x.abs() if self.norm_in is None else x.abs() * self.norm_in

    def score_glu(self, g: torch.Tensor) -> torch.Tensor:
        return g.abs() if self.norm_glu is None else g.abs() * self.norm_glu

    def observe(self, name: str, t: torch.Tensor) -> None:
        if self.observer is not None:
            self.observer(self.index, name, t)

    def record(self, **arrays) -> None:
        if self.recorder is not None:
            self.recorder(self.index, arrays)

    def choose(self, group: str, scores: np.ndarray, k: int) -> np.ndarray | None:
        """Another implementation's top-K for this call, when a ``selector`` is installed (the twin of
        ``dipdeploy.sparsity.twin``, which checks it against ``scores`` first); else None."""
        if self.selector is None:
            return None
        return self.selector(self.index, group, scores.reshape(-1, scores.shape[-1]), k)

    def note_recall(self, x: torch.Tensor, chosen: torch.Tensor, glu: torch.Tensor | None = None) -> None:
        """While a recall meter runs: how many of the true top-K GLU units (by |GLU| of the *dense*
        computation on ``x``, K the layer's K_glu) ``chosen`` holds. ``glu``: that dense GLU when the
        method computed it already; else it is computed here (one extra dense up/gate pass)."""
        if self.recall is None:
            return
        with torch.no_grad():
            if glu is None:
                gate, up = self.gate_up(x)
                glu = self.act(gate) * up
            true = topk_mask(glu.abs(), self.layer.k_glu)
            self.recall(self.index, int((true & chosen.bool()).sum()), int(true.sum()))

    def reset(self) -> None:
        """Forget the DIP-CA cache state (a new sequence, or a new batch of windows)."""
        self.caches = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, d]
        return _METHODS[self.method](self, x)


@method("dense")
def _dense(m: SparseMLP, x: torch.Tensor) -> torch.Tensor:
    gate, up = m.gate_up(x)
    return m.down(m.act(gate) * up)


@method("glu")
def _glu(m: SparseMLP, x: torch.Tensor) -> torch.Tensor:
    """Oracle GLU pruning: the dense GLU, then only the top-K_glu columns of W_d."""
    gate, up = m.gate_up(x)
    g = m.act(gate) * up  # [B, T, F]
    chosen = topk_mask(m.score_glu(g), m.layer.k_glu)
    m.note_recall(x, chosen, g)
    return m.down(g * chosen)


@method("gate")
def _gate(m: SparseMLP, x: torch.Tensor) -> torch.Tensor:
    """Gate pruning: top-K_glu of |act(W_g x)| selects rows of W_u and columns of W_d."""
    gate, up = m.gate_up(x)
    a = m.act(gate)
    return m.down(a * up * topk_mask(a.abs(), m.layer.k_glu))


@method("up")
def _up(m: SparseMLP, x: torch.Tensor) -> torch.Tensor:
    """Up pruning: top-K_glu of |W_u x| selects rows of W_g and columns of W_d."""
    gate, up = m.gate_up(x)
    return m.down(m.act(gate) * up * topk_mask(up.abs(), m.layer.k_glu))


def _threshold(m: SparseMLP, name: str) -> float:
    thr = getattr(m.layer, name)
    if thr is None:
        raise ValueError(f"method {m.method!r} needs calibrated thresholds ({name} of layer {m.index}); "
                         f"run `dipdeploy calibrate --method {m.method}`")
    return thr


@method("cats")
def _cats(m: SparseMLP, x: torch.Tensor) -> torch.Tensor:
    """CATS: a per-layer calibrated threshold on |act(W_g x)| (|SiLU(W_g x)|; |GELU(W_g x)| under GeGLU)."""
    gate, up = m.gate_up(x)
    a = m.act(gate)
    m.observe("gate", a.abs())
    if m.observer is not None and m.layer.thr_glu is None:
        return m.down(a * up)
    return m.down(a * up * (a.abs() > _threshold(m, "thr_glu")))


@method("teal")
def _teal(m: SparseMLP, x: torch.Tensor) -> torch.Tensor:
    """TEAL-style: calibrated thresholds on |x| (input columns) and on |GLU~| (columns of W_d)."""
    m.observe("in", x.abs())
    if m.observer is not None and m.layer.thr_in is None:
        return _dense(m, x)
    gate, up = m.gate_up(x * (x.abs() > _threshold(m, "thr_in")))
    g = m.act(gate) * up
    m.observe("glu", g.abs())
    if m.observer is not None and m.layer.thr_glu is None:
        return m.down(g)
    return m.down(g * (g.abs() > _threshold(m, "thr_glu")))


@method("dip")
def _dip(m: SparseMLP, x: torch.Tensor) -> torch.Tensor:
    """DIP: top-K_in of |x| (or a weighted score, ``sparsity.scores``), then top-K_glu of |GLU~|."""
    s_in = m.score_in(x)
    m_in = _dip_mask(m, "in", s_in, m.layer.k_in)
    gate, up = m.gate_up(x * m_in)
    g = m.act(gate) * up
    s_glu = m.score_glu(g)
    m_glu = _dip_mask(m, "glu", s_glu, m.layer.k_glu)
    if m.recorder is not None:
        m.record(sel_in=topk_indices(s_in, m.layer.k_in), sel_glu=topk_indices(s_glu, m.layer.k_glu),
                 x_abs=s_in, glu_abs=s_glu)
    m.note_recall(x, m_glu)
    return m.down(g * m_glu)


def _dip_mask(m: SparseMLP, group: str, score: torch.Tensor, k: int) -> torch.Tensor:
    if m.selector is None:
        return topk_mask(score, k)
    chosen = m.choose(group, score.detach().float().cpu().numpy(), k)
    return mask_from_indices(chosen.reshape(*score.shape[:-1], k), score.shape, score.device)


def _ca_select(m: SparseMLP, group: str, cache: RowCache, scores: np.ndarray, k: int) -> np.ndarray:
    """Token-sequential DIP-CA selection for scores [B, T, R] against one group's cache."""
    B, T, _ = scores.shape
    plan = m.plan
    out = np.empty((B, T, k), dtype=np.int64)
    for t in range(T):
        g = gamma_at(plan.gamma, cache.step, plan.gamma_warmup)
        s = dipca_scores(scores[:, t], cache.resident, g, plan.fixed_top_n)
        chosen = m.choose(group, s, k)
        out[:, t] = topk_rows(s, k) if chosen is None else np.sort(chosen, axis=-1)
        cache.access(out[:, t])
    return out


@method("dip-ca")
def _dip_ca(m: SparseMLP, x: torch.Tensor) -> torch.Tensor:
    """DIP-CA: DIP with scores re-weighted by what the layer's cache holds (docs/method.md)."""
    B, T, d = x.shape
    F = m.plan.intermediate_size
    if m.caches is None or m.caches[0].batch != B:
        from dipdeploy.flash import miss_cost

        cap_in, cap_glu = m.plan.cache_capacity(miss_cost)[m.index]
        m.caches = (RowCache(d, cap_in, m.plan.policy, batch=B), RowCache(F, cap_glu, m.plan.policy, batch=B))
    s_in = m.score_in(x)
    sel_in = _ca_select(m, "in", m.caches[0], s_in.detach().float().cpu().numpy(), m.layer.k_in)
    gate, up = m.gate_up(x * mask_from_indices(sel_in, x.shape, x.device))
    g = m.act(gate) * up
    s_glu = m.score_glu(g)
    sel_glu = _ca_select(m, "glu", m.caches[1], s_glu.detach().float().cpu().numpy(), m.layer.k_glu)
    m.record(sel_in=sel_in, sel_glu=sel_glu, x_abs=s_in, glu_abs=s_glu)
    m_glu = mask_from_indices(sel_glu, g.shape, g.device)
    m.note_recall(x, m_glu)
    return m.down(g * m_glu)


@method("predictor")
def _predictor(m: SparseMLP, x: torch.Tensor) -> torch.Tensor:
    """Deja Vu / LLM in a flash: a trained low-rank predictor's top-K_glu units of x gate the whole MLP (the
    rows of W_u and W_g and the columns of W_d of those units); masking the dense GLU is numerically that."""
    if m.predictor is None:
        raise ValueError("method 'predictor' needs its trained predictors, which `dipdeploy eval --method "
                         "predictor` trains; it cannot be calibrated, traced, fine-tuned or exported")
    chosen = topk_mask(m.predictor(x), m.layer.k_glu)
    gate, up = m.gate_up(x)
    g = m.act(gate) * up
    m.note_recall(x, chosen, g)
    return m.down(g * chosen)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.model.layers


def sparsify_(model: nn.Module, plan: SparsityPlan) -> nn.Module:
    """Wrap every layer's MLP with the plan's method, in place (the model's family record says where
    its projections are and which activation it uses). Undo with :func:`unsparsify_`."""
    unsparsify_(model)
    cfg = model.config
    plan.check_model(cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size)
    arch = arch_of_model(model)
    for i, layer in enumerate(decoder_layers(model)):
        layer.mlp = SparseMLP(layer.mlp, arch, plan, i)
    return model


def unsparsify_(model: nn.Module) -> nn.Module:
    for layer in decoder_layers(model):
        if isinstance(layer.mlp, SparseMLP):
            layer.mlp = layer.mlp.base
    return model


@contextmanager
def uniform_dip(model: nn.Module, density: float) -> Iterator[nn.Module]:
    """``model`` under a uniform DIP plan of ``density`` (ρ_in from ``plan.default_rho_in``), unsparsified
    on the way out: how ``quant.calib.row_statistics(kind="dip")`` runs its pass (quant lies below
    sparsity, so its callers hand it this)."""
    try:
        c = model.config
        sparsify_(model, uniform_plan(SparsityConfig(method="dip", density=density), "calibration",
                                      c.num_hidden_layers, c.hidden_size, c.intermediate_size))
        yield model
    finally:
        unsparsify_(model)


def sparse_mlps(model: nn.Module) -> list[SparseMLP]:
    return [layer.mlp for layer in decoder_layers(model) if isinstance(layer.mlp, SparseMLP)]


def reset_caches(model: nn.Module) -> None:
    for mlp in sparse_mlps(model):
        mlp.reset()
