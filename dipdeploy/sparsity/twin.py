"""The torch reference made to follow another implementation's top-K choices where they are near-ties.

A top-K is discontinuous: where two scores are within rounding, ORT (or the runtime, or another CPU's
kernels) may keep the other column, and that one column moves the logits by a few percent at that step
and, through the KV cache and DIP-CA's cache, at later ones. A logit tolerance wide enough to absorb
that would also absorb a broken row or a wrong K. So the comparison is made in two parts instead:

1. every selection of the other implementation is checked against the reference's *own* scores at the
   same point (``dipdeploy.agreement.compare_topk``: K distinct rows, swaps only between scores within
   the tie margin of the K-th);
2. the reference then uses that selection, so both sides compute the same sparse function from there on,
   and their logits are held to the rounding tolerance (``dipdeploy.agreement.tolerance_for``).

The twin is fed token by token with a KV cache (one position per call), so "the same point" is one
position of one layer's group ("in": the up|gate input columns, "glu": the down columns).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from dipdeploy.agreement import TOPK_TIE, Tolerance, TokenAgreement, compare_logits, compare_topk
from dipdeploy.cache import topk_rows
from dipdeploy.sparsity.methods import SparseMLP

#: per fed position, {(layer, group): the other implementation's indices [K] at that point}
Selections = Sequence[dict]


@dataclass
class TwinRun:
    """The twin's next-token logits per step (as ``compare_logits`` takes them) and the top-K check."""

    logits: list[np.ndarray]
    topk_checked: int = 0                  # selections checked
    topk_swaps: int = 0                    # rows exchanged against the reference's own top-K (near-ties)
    topk_mismatches: list[tuple[int, int, str]] = field(default_factory=list)  # (position, layer, group)

    @property
    def ok(self) -> bool:
        return not self.topk_mismatches

    def as_dict(self) -> dict:
        return {"topk_checked": self.topk_checked, "topk_swaps": self.topk_swaps,
                "topk_mismatches": [list(m) for m in self.topk_mismatches[:20]],
                "topk_mismatch_count": len(self.topk_mismatches)}


def _sparse_mlps(model) -> list[SparseMLP]:
    return [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, SparseMLP)]


@torch.no_grad()
def follow(model, prompt: Sequence[int], tokens: Sequence[int], selections: Selections,
           tie: float = TOPK_TIE) -> TwinRun:
    """Feed ``prompt`` then ``tokens[:-1]`` one by one to the sparsified torch ``model``, each MLP taking
    ``selections`` once they pass the top-K check against its own scores (a mismatch is recorded and
    the selection used anyway, so one fault does not hide the ones after it).

    Step 0 of the result is the prompt's logits [S, V], then one [V] per fed token.
    """
    from transformers import DynamicCache

    mlps = _sparse_mlps(model)
    for m in mlps:
        m.reset()  # DIP-CA starts from a cold cache, as a new sequence does
    run = TwinRun(logits=[])
    position = 0

    def select(layer: int, group: str, scores: np.ndarray, k: int) -> np.ndarray:
        given = np.asarray(selections[position][(layer, group)], dtype=np.int64).reshape(1, -1)
        res = compare_topk(scores, given, k, tie)
        run.topk_checked += 1
        run.topk_swaps += res.swaps
        if not res.ok:
            run.topk_mismatches.append((position, layer, group))
        return given if given.shape[-1] == k else topk_rows(scores, k)  # a wrong K: go on with our own

    for m in mlps:
        m.selector = select
    try:
        cache = DynamicCache(config=model.config)
        fed = [int(t) for t in prompt] + [int(t) for t in tokens[:-1]]
        prompt_logits = []
        for position, tok in enumerate(fed):
            out = model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
            step = out.logits[0, -1].float().numpy()
            if position < len(prompt):
                prompt_logits.append(step)
                if position == len(prompt) - 1:
                    run.logits.append(np.stack(prompt_logits))
            else:
                run.logits.append(step)
    finally:
        for m in mlps:
            m.selector = None
            m.reset()
    return run


def compare_with_twin(model, prompt: Sequence[int], tokens: Sequence[int], logits: Sequence[np.ndarray],
                      selections: Selections, tol: Tolerance) -> tuple[TokenAgreement, TwinRun]:
    """Another implementation's teacher-forced ``logits`` and ``selections`` (fed ``prompt``, then
    ``tokens[:-1]``) against the twin that follows them: agreed when both results are ``ok``."""
    twin = follow(model, prompt, tokens, selections)
    return compare_logits(twin.logits, logits, tol), twin
