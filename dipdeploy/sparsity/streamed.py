"""Calibration of a streamed model: the weights stay on disk, one decoder layer is in memory at a time.

The split search of :mod:`dipdeploy.sparsity.calibrate` runs each candidate input share as a whole
forward pass; a streamed model (``dipdeploy.checkpoint.StreamedCheckpoint``) cannot hold the model for
that. Here the same forwards run in the sequential order GPTQ uses: one forward pass through the HF
model with every decoder layer replaced by a recorder records what each layer is called with (the
embedding output, the attention mask of its layer type, the RoPE tables, the positions); then layer i
is read from the checkpoint in fp32, run on every candidate's hidden states of every window (each
candidate with its own DIP plan on that layer), its outputs kept as layer i+1's inputs, and released.
The last hidden states then go through the same perplexity code as the eager search
(``calibrate._nll``, with the decoder layers replaced by one module that replays them),
so the candidates' NLLs, hence the plan, are the eager ones: the same fp32 ops on the same inputs in
the same order, window by window (``tests/test_export_streamed.py`` compares the two plans exactly).

Peak memory: one fp32 decoder layer, the resident embedding and (for the NLL) the final norm and the
lm_head, plus the activations: candidates × windows × seqlen × hidden fp32 (small beside a 7B layer).
Each layer is read once, whatever the number of candidates.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from dipdeploy.arch import arch_of_model
from dipdeploy.sparsity.calibrate import SPLIT_RATIOS, _nll, split_probes
from dipdeploy.sparsity.methods import SparseMLP, decoder_layers
from dipdeploy.sparsity.plan import SparsityConfig


class _Recorded(Exception):
    """Raised by the last recorder: the final norm and head are not needed (nor resident) then."""


class _Recorder(nn.Module):
    """Stands in for decoder layer ``index`` during the recording forward: keeps its keyword inputs and
    passes the hidden states through unchanged (the inputs of layer 0 are the embedding output)."""

    def __init__(self, index: int, calls: list[dict], last: bool):
        super().__init__()
        self.index, self.calls, self.last = index, calls, last
        self.mlp = None  # sparse_mlps / unsparsify_ look for one

    def forward(self, hidden_states, **kw):
        self.calls[self.index] = {"hidden": hidden_states, **kw}
        if self.last:
            raise _Recorded
        return hidden_states


class _Replay(nn.Module):
    """The whole decoder stack for one NLL pass: returns the next window's final hidden states."""

    def __init__(self, hidden: list[torch.Tensor]):
        super().__init__()
        self.hidden = list(hidden)
        self.mlp = None

    def forward(self, hidden_states, **kw):
        return self.hidden.pop(0)


@contextmanager
def _layers_replaced(model, modules: list[nn.Module]):
    inner = model.model
    saved = inner.layers
    inner.layers = nn.ModuleList(modules)
    try:
        yield
    finally:
        inner.layers = saved


@torch.no_grad()
def _record(lm, windows: torch.Tensor) -> list[list[dict]]:
    """Per window, per layer: the keyword inputs the HF forward gives that decoder layer (layer 0's
    ``hidden`` is the embedding output; the other layers' hidden states are computed later)."""
    L = len(decoder_layers(lm.model))
    out = []
    for w in windows.split(1):
        calls: list[dict] = [{} for _ in range(L)]
        with _layers_replaced(lm.model, [_Recorder(i, calls, i == L - 1) for i in range(L)]):
            try:
                lm.model.model(w, use_cache=False)
            except _Recorded:
                pass
        out.append(calls)
    return out


@contextmanager
def _resident(lm, module: nn.Module, prefix: str, device: str):
    """``module`` read from the checkpoint (fp32) and on ``device`` for the block, released after."""
    lm.checkpoint.materialise(module, prefix)
    module.to(device)
    try:
        yield module
    finally:
        lm.checkpoint.release(module)


def _head_modules(lm) -> list[tuple[nn.Module, str]]:
    """What ``window_nll`` needs besides the layers: the final norm, and the lm_head unless tied."""
    model = lm.model
    name = arch_of_model(model).norms.final
    out = [(getattr(model.model, name), f"model.{name}.")]
    if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        out.append((model.get_output_embeddings(), "lm_head."))
    return out


def check_streamable(cfg: SparsityConfig) -> None:
    """What a streamed model can calibrate: the split search, which runs layer by layer here. CATS and
    TEAL thresholds and the greedy and joint allocations run the whole model many times over; they are
    refused before any weight is read."""
    whole = (f"--method {cfg.method} (its thresholds)" if cfg.method in ("cats", "teal") else
             f"--allocation {cfg.allocation}" if cfg.allocation != "uniform" else None)
    if whole is not None:
        raise ValueError(f"{whole} runs the whole model, which a streamed calibration (--stream) does not hold; "
                         f"stream dip or dip-ca with --allocation uniform, or calibrate with --no-stream on a "
                         f"machine that holds the model")


@torch.no_grad()
def search_split_streamed(lm, cfg: SparsityConfig, windows: torch.Tensor, device: str = "cpu",
                          ratios: tuple[float, ...] = SPLIT_RATIOS, progress=None) -> tuple[float, dict]:
    """:func:`dipdeploy.sparsity.calibrate.search_split` on a streamed model, each layer read once.

    Same candidates (``split_probes``), same NLL per candidate, same choice; the returned
    ``(rho_in, {"split_nll": …})`` is what ``calibrate`` memoises in its ``splits``. ``progress`` counts
    the layers (``calibrate``'s module docstring)."""
    L = len(decoder_layers(lm.model))
    probes = split_probes(cfg, lm.name, L, lm.model.config.hidden_size, lm.model.config.intermediate_size, ratios)
    arch = arch_of_model(lm.model)
    stationary = [lm.model.get_input_embeddings(), lm.model.model.rotary_emb]
    for m in stationary:
        m.to(device)
    try:
        calls = _record(lm, windows.to(device))  # on ``device``: the embedding and RoPE are there
        hidden = {key: [per_window[0]["hidden"] for per_window in calls] for key in probes}
        if progress is not None:
            progress.expect(L)
        for i, layer in enumerate(decoder_layers(lm.model)):
            with _resident(lm, layer, f"model.layers.{i}.", device):
                base = layer.mlp
                try:
                    for key, plan in probes.items():
                        layer.mlp = SparseMLP(base, arch, plan, i)
                        hidden[key] = [layer(h, **{k: v for k, v in calls[w][i].items() if k != "hidden"})
                                       for w, h in enumerate(hidden[key])]
                finally:
                    layer.mlp = base
            if progress is not None:
                progress.advance()
        del calls
        tried: dict[str, float] = {}
        with ExitStack() as heads:
            for module, prefix in _head_modules(lm):
                heads.enter_context(_resident(lm, module, prefix, device))
            for key in probes:
                with _layers_replaced(lm.model, [_Replay(hidden[key])]):
                    tried[key] = _nll(lm.model, windows.to(device))
    finally:
        for m in stationary:
            m.to("cpu")
    best = min(tried, key=tried.get)
    return float(best), {"split_nll": tried}

