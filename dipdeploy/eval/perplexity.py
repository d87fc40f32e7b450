"""Perplexity under a sparsity plan (docs/method.md, evaluation protocol).

Mean NLL over every predicted token of every window, PPL = exp(mean). Prefill and decode are both
sparsified: every position's MLP runs with its own mask (unlike TEAL's protocol, which sparsifies only
half the tokens). Windows run side by side as a batch; for DIP-CA each window has its own cache state
and starts cold. The NLL is :mod:`dipdeploy.sparsity.nll`'s, the one the split search scores by.

:func:`bundle_perplexity` is the same protocol on an exported bundle as the host runtime runs it (``eval
--bundle``): the same windows, each a new sequence with its caches cold, fed one token at a time as the
runtime decodes (teacher-forced: the text's next token, never the model's), every position scored. The
runtime sits above this floor, so its engine and the engine's timer come in from the CLI.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from dipdeploy.sparsity.nll import logit_chunk, summed_nll, window_nll, window_nlls

__all__ = ["bundle_perplexity", "logit_chunk", "perplexity", "window_nll", "window_nlls"]


def perplexity(model, windows: torch.Tensor, batch_size: int = 1,
               on_batch: Callable[[int], None] | None = None,
               per_window: list[float] | None = None) -> tuple[float, int]:
    """(PPL, predicted tokens) of ``model`` on ``windows`` [N, T]; ``on_batch(windows done)`` after each
    batch (the CLI's progress, ``dipdeploy.progress``); ``per_window`` receives each window's summed NLL in
    order, for a paired comparison of two plans on the same windows (``dipdeploy.eval.paired``)."""
    total, count = summed_nll(model, windows, batch_size, on_batch, per_window)
    return math.exp(total / count), count


def bundle_perplexity(engine, timer, windows: torch.Tensor, on_token: Callable[[int], None] | None = None,
                      per_window: list[float] | None = None) -> tuple[float, int]:
    """(PPL, predicted tokens) of a ``dipdeploy.runtime.Engine`` (its context at least the windows' length)
    on ``windows`` [N, T], as :func:`perplexity` scores a model; ``timer``: the engine's
    (``dipdeploy.runtime.stats.Timer``); ``on_token(1)`` after each position; ``per_window`` as there."""
    total, count = 0.0, 0
    for window in windows.tolist():
        engine.reset()
        nll = 0.0
        for token, target in zip(window[:-1], window[1:]):
            logits = np.asarray(engine.step(token, timer), dtype=np.float64).reshape(-1)
            peak = logits.max()
            nll += float(peak + np.log(np.exp(logits - peak).sum()) - logits[target])
            if on_token is not None:
                on_token(1)
        total, count = total + nll, count + len(window) - 1
        if per_window is not None:
            per_window.append(nll)
    return math.exp(total / count), count
