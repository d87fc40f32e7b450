"""Validation built into export: ORT on ``model.onnx`` against the torch reference, greedy decoding.

The torch reference is ``dipdeploy.sparsity.methods`` on the same (fake-quantised) weights with the
same plan; for DIP-CA it is plain DIP with the plan's K, because ``model.onnx`` runs plain DIP and
cache-aware masking is the host runtime's job (DESIGN.md). Torch picks each next token greedily; ORT
is fed the same tokens (teacher forcing) so logits compare step by step, and its own argmax at each
step must equal torch's: that is "the same greedy tokens". Run once on stock ORT (fallback functions
inlined) and once with the native library when it is built.

A graph at accuracy level 4 (int8 activations in MatMulNBits, int8 coefficients in
SparseGatherMatMul) has no torch twin: export validates its level-0 twin (the same graph and weights,
``dipdeploy.ops.nodes.with_accuracy_level``) strictly, then measures the level-4 graph against the
same reference and reports how far it moved (``Level4``), without holding it to the tolerance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from dipdeploy.export.generate import KVDecoder


@dataclass
class Validation:
    tokens: int
    reference_tokens: list[int]
    tokens_match_stock: bool
    tokens_match_native: bool | None
    max_abs_diff: float
    max_abs_diff_native: float | None
    tolerance: float
    max_abs_logit: float
    native_library: str | None
    steps_above_1e2_stock: int = 0
    steps_above_1e2_native: int | None = None
    level4: dict | None = None  # Level4.as_dict() when a level-4 graph was measured

    @property
    def ok(self) -> bool:
        native_ok = self.tokens_match_native in (None, True) and (
            self.max_abs_diff_native is None or self.max_abs_diff_native <= self.tolerance)
        return self.tokens_match_stock and self.max_abs_diff <= self.tolerance and native_ok

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


@torch.no_grad()
def torch_greedy(model, prompt: np.ndarray, n: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens and the logits they came from: [prefill logits [S, V], step logits [1, V]…]."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.from_numpy(prompt)[None]
    out = model(input_ids=ids, cache=cache, use_cache=True)
    logits = [out.logits[0].float().numpy()]
    tokens = []
    for step in range(n):
        tok = int(logits[-1][-1].argmax())
        tokens.append(tok)
        if step == n - 1:
            break
        out = model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
        logits.append(out.logits[0].float().numpy())
    return tokens, logits


def ort_teacher_forced(session, spec, prompt: np.ndarray, tokens: list[int]) -> tuple[list[int], list[np.ndarray]]:
    """ORT fed the prompt, then ``tokens`` one by one; its argmax per step and its logits."""
    kv = KVDecoder(session, spec.num_kv_heads, spec.head_dim)
    feed, logits, picks = prompt, [], []
    for step in range(len(tokens)):
        logits.append(kv.feed(feed))
        picks.append(int(logits[-1][-1].argmax()))
        feed = [tokens[step]]
    return picks, logits


@dataclass
class Level4:
    """The level-4 graph against the torch reference (reported, not held to the tolerance)."""

    path: str                 # "native" or "stock"
    tokens_agree: int         # steps whose argmax equals torch's greedy token
    tokens: int
    first_disagreement: int | None
    max_abs_diff: float

    def as_dict(self) -> dict:
        return asdict(self)


def _diffs(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    return np.array([float(np.abs(x - y).max()) for x, y in zip(a, b)])


def validate(model_path, model, spec, prompt: np.ndarray, n: int, tolerance: float, threads: int = 1,
             rel_tolerance: float = 0.0, level4_path=None) -> Validation:
    """Greedy ``n`` tokens: torch ``model`` (already sparsified/quantised as the bundle) vs ORT.

    The tolerance is ``max(tolerance, rel_tolerance · max|logit|)``. A top-K is discontinuous: when
    two columns' scores are within float rounding, a kernel that sums in another order may keep the
    other one, which moves the logits by a few percent at that step, and through the KV cache at
    later steps too (not rounding). Sparse graphs get a relative tolerance for that; the count of
    steps above 1e-2 is reported so such flips stay visible, and the greedy tokens must match
    exactly either way. ``level4_path``: a level-4 graph measured against the same reference (native
    library when built, else stock ORT) and reported in ``Validation.level4``.
    """
    import onnxruntime as ort

    from dipdeploy.ops.native import library_path, session_options

    ref_tokens, ref_logits = torch_greedy(model, prompt, n)
    results = {}
    lib = library_path()
    for native in ((False, True) if lib is not None else (False,)):
        so = session_options(threads=threads, native=native)
        sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        picks, logits = ort_teacher_forced(sess, spec, prompt, ref_tokens)
        diffs = _diffs(logits, ref_logits)
        results[native] = (picks == ref_tokens, float(diffs.max()), int((diffs > 1e-2).sum()))
        del sess
    native = results.get(True)
    peak = float(max(np.abs(x).max() for x in ref_logits))
    level4 = None
    if level4_path is not None:
        sess = ort.InferenceSession(str(level4_path), session_options(threads=threads, native=lib is not None),
                                    providers=["CPUExecutionProvider"])
        picks, logits = ort_teacher_forced(sess, spec, prompt, ref_tokens)
        agree = [a == b for a, b in zip(picks, ref_tokens)]
        level4 = Level4("native" if lib is not None else "stock", sum(agree), len(agree),
                        agree.index(False) if not all(agree) else None,
                        float(_diffs(logits, ref_logits).max())).as_dict()
        del sess
    return Validation(
        tokens=n, reference_tokens=ref_tokens, tokens_match_stock=results[False][0],
        tokens_match_native=None if native is None else native[0], max_abs_diff=results[False][1],
        max_abs_diff_native=None if native is None else native[1],
        tolerance=max(tolerance, rel_tolerance * peak), max_abs_logit=peak,
        native_library=str(lib) if lib else None, steps_above_1e2_stock=results[False][2],
        steps_above_1e2_native=None if native is None else native[2], level4=level4,
    )
