"""Validation built into export: ORT on ``model.onnx`` against the torch reference, greedy decoding.

The torch reference is ``dipdeploy.sparsity.methods`` on the same (fake-quantised) weights with the
same plan; for DIP-CA it is plain DIP with the plan's K, because ``model.onnx`` runs plain DIP and
cache-aware masking is the host runtime's job (DESIGN.md). Torch picks each next token greedily; ORT
is fed the same tokens (teacher forcing) and judged by the one rule of :mod:`dipdeploy.agreement`.

A sparse graph is compared with the *twin* of the reference (``dipdeploy.sparsity.twin``): ORT's
top-K selections (the TopKColumnMask outputs, exposed for the check) are first checked against
torch's own scores, swaps allowed only at near-ties of the K-th score, and then used by torch, so the
logits are held to the rounding tolerance and a wrong row, K or kernel cannot hide behind a near-tie.
Run once on stock ORT (fallback functions inlined) and once with the native library when it is built.

A graph at accuracy level 4 (int8 activations in MatMulNBits, int8 coefficients in
SparseGatherMatMul) has no torch twin: export validates its level-0 twin (the same graph and weights,
``dipdeploy.ops.nodes.with_accuracy_level``) strictly, then measures the level-4 graph against the
free-running reference and reports how far it moved (``Level4``), without holding it to the tolerance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

from dipdeploy.agreement import TokenAgreement, compare_logits, next_token_logits, tolerance_for
from dipdeploy.export.generate import KVDecoder
from dipdeploy.ops.nodes import with_selection_outputs
from dipdeploy.sparsity.twin import TwinRun, follow


@dataclass
class PathCheck:
    """One ORT path (stock or native) against the reference: the token rule, the top-K check of the
    twin, and how far the logits moved from the free-running reference (near-ties included)."""

    agrees: bool
    picks: list[int]              # ORT's argmax per step, fed the reference's tokens
    near_ties: list[int]
    mismatches: list[int]
    max_abs_diff: float           # against the twin (the tolerance applies here)
    max_abs_diff_free: float      # against the free-running reference (informative)
    topk: dict | None = None      # TwinRun.as_dict() for a sparse graph

    @classmethod
    def of(cls, token: TokenAgreement, picks: list[int], free: float, twin: TwinRun | None) -> "PathCheck":
        return cls(token.ok and (twin is None or twin.ok), picks, token.near_ties, token.mismatches,
                   token.max_abs_diff, free, None if twin is None else twin.as_dict())


@dataclass
class Validation:
    """The bundle against the torch reference per path; flat keys for the manifest and ``--json``."""

    tokens: int
    reference_tokens: list[int]
    tolerance: float
    tie_margin: float
    max_abs_logit: float
    native_library: str | None
    stock: PathCheck
    native: PathCheck | None
    level4: dict | None = None  # Level4.as_dict() when a level-4 graph was measured

    @property
    def ok(self) -> bool:
        return self.stock.agrees and (self.native is None or self.native.agrees)

    def describe(self) -> str:
        """What disagreed, one clause per failing path."""
        out = []
        for name, p in (("stock ORT", self.stock), ("native library", self.native)):
            if p is None or p.agrees:
                continue
            topk = p.topk or {}
            out.append(f"{name}: top-1 beyond the tie margin {self.tie_margin:.3g} at steps {p.mismatches}, "
                       f"max |Δlogit| {p.max_abs_diff:.3g} (tolerance {self.tolerance:.3g}), "
                       f"{topk.get('topk_mismatch_count', 0)} top-K selections outside the near-ties "
                       f"(first (position, layer, group): {topk.get('topk_mismatches', [])[:3]})")
        return "; ".join(out) or "agrees"

    def as_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("stock", "native")}
        keys = asdict(self.stock).keys()
        for name, path in (("stock", self.stock), ("native", self.native)):
            d.update({f"{k}_{name}": v for k, v in (asdict(path) if path else dict.fromkeys(keys)).items()})
        d["max_abs_diff"] = self.stock.max_abs_diff  # the headline figure: stock ORT against the reference
        return {**d, "ok": self.ok}


@torch.no_grad()
def torch_greedy(model, prompt: np.ndarray, n: int, on_token=None) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens and the logits they came from: [prefill logits [S, V], step logits [1, V]…];
    ``on_token()`` after each token (a progress count)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.from_numpy(prompt)[None]
    out = model(input_ids=ids, cache=cache, use_cache=True)
    logits = [out.logits[0].float().numpy()]
    tokens = []
    for step in range(n):
        tok = int(logits[-1][-1].argmax())
        tokens.append(tok)
        if on_token is not None:
            on_token()
        if step == n - 1:
            break
        out = model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
        logits.append(out.logits[0].float().numpy())
    return tokens, logits


def ort_teacher_forced(session, spec, prompt: np.ndarray, tokens: list[int],
                       on_token=None) -> tuple[list[int], list[np.ndarray]]:
    """ORT fed the prompt, then ``tokens`` one by one; its argmax per step and its logits."""
    picks, logits, _ = ort_teacher_forced_selections(session, spec, prompt, tokens, on_token=on_token)
    return picks, logits


def ort_teacher_forced_selections(session, spec, prompt: np.ndarray, tokens: list[int], selection_outputs=None,
                                  on_token=None):
    """:func:`ort_teacher_forced`, plus the selections per fed position: ``selection_outputs`` maps
    (layer, group) to a TopKColumnMask output name of the graph (``ops.nodes.with_selection_outputs``);
    the third result is ``sel[position][(layer, group)]`` = indices [K]. ``on_token()`` after each step."""
    kv = KVDecoder(session, spec.num_kv_heads, spec.head_dim)
    feed, logits, picks, sel = prompt, [], [], []
    for step in range(len(tokens)):
        logits.append(kv.feed(feed))
        picks.append(int(logits[-1][-1].argmax()))
        if selection_outputs:
            sel += kv.selections(selection_outputs)
        if on_token is not None:
            on_token()
        feed = [tokens[step]]
    return picks, logits, sel


def _same_selections(a: list[dict], b: list[dict]) -> bool:
    """The same row sets at every point (the order within a set does not change a mask)."""
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(np.sort(x[k]), np.sort(y[k])) for k in x) for x, y in zip(a, b))


@dataclass
class Level4:
    """The level-4 graph against the torch reference (reported, not held to the tolerance)."""

    path: str                 # "native" or "stock"
    tokens_agree: int         # steps whose argmax equals torch's greedy token
    tokens: int
    near_ties: int            # steps whose argmax differs within the tie margin
    first_disagreement: int | None
    max_abs_diff: float

    def as_dict(self) -> dict:
        return asdict(self)


def validate(model_path, model, spec, prompt: np.ndarray, n: int, *, sparse: bool, quantised: bool,
             threads: int = 1, level4_path=None, progress=None) -> Validation:
    """Greedy ``n`` tokens: torch ``model`` (already sparsified/quantised as the bundle) vs ORT.

    The tolerance is :func:`dipdeploy.agreement.tolerance_for` of the graph (``sparse``: any plan but
    dense; ``quantised``). A sparse graph is held against the twin (module docstring). A real
    disagreement fails, a near-tie is counted. ``level4_path``: a level-4 graph measured against the
    free-running reference (native library when built, else stock ORT), reported in ``level4``.
    ``progress`` (a ``dipdeploy.progress.Stage``, or None) counts the tokens each implementation runs.
    """
    import onnxruntime as ort

    from dipdeploy.ops.native import library_path, session_options

    model_path = Path(model_path)
    lib = library_path()
    tick = progress.advance if progress is not None else None
    if progress is not None:  # the reference, each ORT path and the level-4 graph; a sparse path's twin adds its own
        progress.expect(n * (2 + (lib is not None) + (level4_path is not None)))
    ref_tokens, ref_logits = torch_greedy(model, prompt, n, tick)
    peak = float(max(np.abs(x).max() for x in ref_logits))
    tol = tolerance_for(sparse=sparse, quantised=quantised)
    checked, outputs = model_path, None
    if sparse:  # a copy beside it (its external data paths are relative), the selections exposed
        proto, outputs = with_selection_outputs(onnx.load(str(model_path), load_external_data=False))
        checked = model_path.with_name(model_path.stem + ".selections.onnx")
        onnx.save(proto, str(checked))

    def session(path, native: bool):
        return ort.InferenceSession(str(path), session_options(threads=threads, native=native),
                                    providers=["CPUExecutionProvider"])

    twins: list[tuple[list[dict], TwinRun]] = []  # a path that selected what another did shares its twin

    def measure(native: bool) -> PathCheck:
        picks, logits, sel = ort_teacher_forced_selections(session(checked, native), spec, prompt, ref_tokens,
                                                           outputs, on_token=tick)
        free = float(max(np.abs(next_token_logits(a) - next_token_logits(b)).max()
                         for a, b in zip(ref_logits, logits)))
        if not sparse:
            return PathCheck.of(compare_logits(ref_logits, logits, tol), picks, free, None)
        twin = next((t for s, t in twins if _same_selections(s, sel)), None)
        if twin is None:
            if progress is not None:
                progress.expect(n)
            twin = follow(model, prompt.tolist(), ref_tokens, sel)
            twins.append((sel, twin))
            if progress is not None:
                progress.advance(n)
        return PathCheck.of(compare_logits(twin.logits, logits, tol), picks, free, twin)

    try:
        stock = measure(False)
        native = measure(True) if lib is not None else None
    finally:
        if checked != model_path:
            checked.unlink(missing_ok=True)
    level4 = None
    if level4_path is not None:
        _, logits = ort_teacher_forced(session(level4_path, lib is not None), spec, prompt, ref_tokens, tick)
        a = compare_logits(ref_logits, logits, tol)
        differ = sorted(a.near_ties + a.mismatches)
        level4 = Level4("native" if lib is not None else "stock", a.tokens_agree, a.steps, len(a.near_ties),
                        differ[0] if differ else None, a.max_abs_diff).as_dict()
    return Validation(tokens=n, reference_tokens=ref_tokens, tolerance=tol.logits, tie_margin=tol.tie,
                      max_abs_logit=peak, native_library=str(lib) if lib else None, stock=stock, native=native,
                      level4=level4)
