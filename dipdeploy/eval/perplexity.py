"""Perplexity under a sparsity plan (docs/method.md, evaluation protocol).

Mean NLL over every predicted token of every window, PPL = exp(mean). Prefill and decode are both
sparsified: every position's MLP runs with its own mask (unlike TEAL's protocol, which sparsifies only
half the tokens). Windows run side by side as a batch; for DIP-CA each window has its own cache state
and starts cold. The NLL is :mod:`dipdeploy.sparsity.nll`'s, the one the split search scores by.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from dipdeploy.sparsity.nll import logit_chunk, summed_nll, window_nll, window_nlls

__all__ = ["logit_chunk", "perplexity", "window_nll", "window_nlls"]


def perplexity(model, windows: torch.Tensor, batch_size: int = 1,
               on_batch: Callable[[int], None] | None = None,
               per_window: list[float] | None = None) -> tuple[float, int]:
    """(PPL, predicted tokens) of ``model`` on ``windows`` [N, T]; ``on_batch(windows done)`` after each
    batch (the CLI's progress, ``dipdeploy.progress``); ``per_window`` receives each window's summed NLL in
    order, for a paired comparison of two plans on the same windows (``dipdeploy.eval.paired``)."""
    total, count = summed_nll(model, windows, batch_size, on_batch, per_window)
    return math.exp(total / count), count
