"""The NLL of text windows under whatever plan the model carries: the one computation behind the
evaluation's perplexity (``dipdeploy.eval.perplexity``) and the split search's scores
(``calibrate.search_split``, ``streamed.search_split_streamed``), so the two cannot drift apart.
Each batch starts cold (``reset_caches``: DIP-CA's cache state cleared). Imports torch.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from dipdeploy.arch import arch_of_model
from dipdeploy.sparsity.methods import reset_caches


#: fp32 logits per lm_head chunk (cross-entropy's log-softmax holds as many again): B×T×vocab would not fit
#: for long windows, and a fixed count of positions would not either for a batch of windows of a large
#: vocabulary (16 × 512 positions × Gemma 3's 262,144 tokens × 4 bytes, twice that with the softmax)
_LOGIT_ELEMENTS = 1 << 27
_LOGIT_CHUNK = 512  # positions per chunk at most, whatever the budget allows


def logit_chunk(batch: int, vocab: int) -> int:
    """Positions per lm_head chunk for ``batch`` windows: at most ``_LOGIT_CHUNK``, and few enough that the
    chunk's logits stay within ``_LOGIT_ELEMENTS``."""
    return max(1, min(_LOGIT_CHUNK, _LOGIT_ELEMENTS // max(1, batch * vocab)))


@torch.no_grad()
def window_nlls(model, batch: torch.Tensor) -> torch.Tensor:
    """Summed NLL of each window of a batch [B, T] (float64 [B]; T − 1 predicted tokens each).

    The head is applied here in chunks (not by the HF forward), so the family record's logit transform
    is applied here too: Granite's 1 / logits_scaling, a final soft-cap where a config sets one."""
    arch = arch_of_model(model)
    scale, (_, cap) = arch.logits_multiplier(model.config), arch.softcaps(model.config)
    reset_caches(model)
    hidden = model.model(batch, use_cache=False).last_hidden_state[:, :-1]  # [B, T-1, d]
    target = batch[:, 1:]
    nll = torch.zeros(batch.shape[0], dtype=torch.float64)
    chunk = logit_chunk(batch.shape[0], model.config.vocab_size)
    for start in range(0, hidden.shape[1], chunk):
        logits = model.lm_head(hidden[:, start : start + chunk]).float() * scale
        if cap:
            logits = torch.tanh(logits / cap) * cap
        tgt = target[:, start : start + chunk]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none")
        nll += ce.view(tgt.shape).double().sum(1).cpu()
    return nll


def window_nll(model, batch: torch.Tensor) -> tuple[float, int]:
    """Summed NLL and number of predicted tokens for a batch of windows [B, T]."""
    return float(window_nlls(model, batch).sum()), batch[:, 1:].numel()


def summed_nll(model, windows: torch.Tensor, batch_size: int = 1,
               on_batch: Callable[[int], None] | None = None,
               per_window: list[float] | None = None) -> tuple[float, int]:
    """(summed NLL, predicted tokens) of ``model`` on ``windows`` [N, T], ``batch_size`` windows at a time;
    ``on_batch(windows done)`` after each batch; ``per_window`` receives each window's summed NLL in order."""
    total, count = 0.0, 0
    for batch in windows.split(batch_size):
        nlls = window_nlls(model, batch)
        total, count = total + float(nlls.sum()), count + batch[:, 1:].numel()
        if per_window is not None:
            per_window.extend(nlls.tolist())
        if on_batch is not None:
            on_batch(batch.shape[0])
    return total, count
