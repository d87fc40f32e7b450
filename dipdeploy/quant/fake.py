"""Fake quantisation of a Hugging Face causal LM (export-time; imports torch lazily).

``quantize_model_(model, cfg, scope)`` replaces weights IN PLACE with their quantise → dequantise values,
computed by the numpy formats in the sparse row layout (``layout.py``), so an evaluation sees exactly
the numbers a deployed model decodes. ``iter_packed_mlp`` streams the packed MLP weights layer by layer
(bounded memory: one layer's rows at a time) for ``dipdeploy quantize``.

The MLP's modules are found by the model's family record (``dipdeploy.arch``, ``Arch.mlp``):
- split: up and gate [F, d] and down [d, F] (Llama, Mistral, Qwen2/3, Gemma 3, Granite, SmolLM2);
- fused: one gate_up [2F, d] whose first F output rows are the gate and last F the up
  (transformers' ``Phi3MLP``: ``gate, up = gate_up_proj(x).chunk(2, dim=-1)``), plus down.

``scope="all"`` also quantises every ``nn.Linear`` of the attention blocks and the lm_head with
``api.quantize_dense`` (4- or 8-bit blocks along the input dimension, ``config.dense_config``, the bits of
each weight by ``dense.DenseBits``, q/k/v of a layer together as export stacks them), the function the
exporter packs into MatMulNBits, so the values equal a bundle's; and the embedding table, as export's
default int4 embedding stores it (a tied 4-bit lm_head shares it, quantised once), unless
``embedding="fp32"`` (then a tied lm_head is untied first so the table stays as it was; an 8-bit lm_head
is untied from an int4 table likewise). ``load_mlp_weights_`` puts the MLP weights of a ``dipdeploy quantize``
file into a model instead of quantising them again (a ``-gptq`` format is calibrated once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from dipdeploy import defaults
from dipdeploy.arch import Arch, arch_of_model
from dipdeploy.quant.api import PackedTensor, dequantize_rows, quantize, quantize_dense, quantize_embedding
from dipdeploy.quant.calib import UnderDip, decoder_layers, row_statistics
from dipdeploy.quant.config import QuantConfig, config_to_dict, dense_config, quant_config_from_name
from dipdeploy.quant.dense import DenseBits
from dipdeploy.quant.io import load_packed, save_packed
from dipdeploy.quant.layout import mlp_to_rows, rows_to_mlp

SCOPES = ("mlp", "all")
__all__ = ["QuantReport", "calibration_statistics", "fit_record", "iter_packed_mlp", "load_mlp_weights_",
           "quant_config_from_name", "quantize_group", "quantize_model_", "write_packed_mlp"]


@dataclass
class QuantReport:
    """What ``quantize_model_`` did: exact bits per weight (MLP and over everything quantised)."""

    format: str
    config: dict
    scope: str
    bits_per_weight_mlp: float
    bits_per_weight: float
    n_params_mlp: int
    n_params: int
    seconds: float
    layers: int
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _np(weight) -> np.ndarray:
    import torch

    return weight.detach().to(device="cpu", dtype=torch.float32, copy=True).numpy()


def _assign(linear, value: np.ndarray) -> None:
    import torch

    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(value).to(linear.weight.dtype))


def _module(mlp, name: str, arch: Arch):
    if not hasattr(mlp, name):
        raise ValueError(f"{type(mlp).__name__} has no {name!r}, which the {arch.name} record names for its MLP")
    return getattr(mlp, name)


def mlp_weights(mlp, arch: Arch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(W_u, W_g [F, d], W_d [d, F]) as float32 numpy, for the split and fused layouts."""
    m = arch.mlp
    down = _np(_module(mlp, m.down, arch).weight)
    if m.gate_up:
        w = _np(_module(mlp, m.gate_up, arch).weight)
        F = w.shape[0] // 2
        return w[F:], w[:F], down
    return _np(_module(mlp, m.up, arch).weight), _np(_module(mlp, m.gate, arch).weight), down


def set_mlp_weights(mlp, arch: Arch, w_up: np.ndarray, w_gate: np.ndarray, w_down: np.ndarray) -> None:
    m = arch.mlp
    if m.gate_up:
        _assign(_module(mlp, m.gate_up, arch), np.concatenate([w_gate, w_up], axis=0))
    else:
        _assign(_module(mlp, m.up, arch), w_up)
        _assign(_module(mlp, m.gate, arch), w_gate)
    _assign(_module(mlp, m.down, arch), w_down)


def calibration_statistics(model, cfg: QuantConfig, calib_ids, *, under_dip: UnderDip | None = None
                           ) -> list[dict[str, np.ndarray | None]] | None:
    """The statistics ``cfg``'s quantiser uses (``config.statistics``, ``calib.row_statistics``) from
    ``calib_ids`` [B, T]: full Hessians for error feedback, else diagonals; None without calibration or
    when the config uses none. ``under_dip`` (``sparsity.methods.uniform_dip``) runs the pass of ``dip``
    statistics."""
    kind = cfg.statistics()
    if calib_ids is None or kind is None:
        return None
    return row_statistics(model, calib_ids, full=bool(cfg.error_feedback), kind=kind,
                          density=getattr(cfg, "hessian_density", 1.0), under_dip=under_dip)


def iter_packed_mlp(model, cfg: QuantConfig, *, calib=None, progress: bool = True
                    ) -> Iterator[tuple[int, dict[str, PackedTensor]]]:
    """Yield (layer index, {"up_gate": packed [d, 2F], "down": packed [F, d]}) one layer at a time.

    ``calib``: the output of :func:`calibration_statistics` (full H for ``error_feedback`` configs, else
    diagonals), or None.
    """
    from tqdm.auto import tqdm

    layers, arch = decoder_layers(model), arch_of_model(model)
    for i, layer in enumerate(tqdm(layers, desc=f"quantise MLP ({type(cfg).__name__})", disable=not progress)):
        up_gate, down = mlp_to_rows(*mlp_weights(layer.mlp, arch))
        yield i, {key: quantize_group(rows, cfg, None if calib is None else calib[i][key])
                  for key, rows in (("up_gate", up_gate), ("down", down))}


def quantize_group(rows: np.ndarray, cfg: QuantConfig, stat: np.ndarray | None) -> PackedTensor:
    """One row group with its statistic from :func:`calibration_statistics` (None, the diagonal [R] as
    row weights, or the full H [R, R] for error feedback, its diagonal as row weights): the one call by
    which ``quantize``, ``eval --quant`` and ``export --quant`` quantise an MLP, so all three give the
    same numbers."""
    if stat is not None and stat.ndim == 2:
        return quantize(rows, cfg, row_weight=np.diag(stat).clip(0), hessian=stat)
    return quantize(rows, cfg, row_weight=stat)


def fit_record(cfg: QuantConfig, calib_ids) -> dict:
    """How the MLP weights were fitted, for a bundle's manifest and an eval row: the statistics that
    weighted the rows (``none``: plain, unweighted), whether errors were fed back, and how many
    calibration tokens (WikiText-2 validation) gave the statistics."""
    kind = cfg.statistics() if calib_ids is not None else None
    if kind is None:
        return {"statistics": "none", "error_feedback": False, "calibration_tokens": 0}
    rec = {"statistics": kind, "error_feedback": bool(cfg.error_feedback),
           "calibration_tokens": int(np.prod(calib_ids.shape)), "calibration_text": "wikitext2 validation"}
    if kind == "dip":
        rec["hessian_density"] = cfg.hessian_density
    return rec


def _dense_groups(model) -> list[list[tuple[str, Any]]]:
    """The attention and lm_head ``nn.Linear``s as export stores them, by HF module name: per layer the
    q, k and v projections in one group (one stacked MatMulNBits, one bits for all three), every other
    projection alone, then the lm_head."""
    import torch

    names = {id(m): n for n, m in model.named_modules()}
    attn_names = arch_of_model(model).attn
    stacked = set() if attn_names.qkv else {attn_names.q, attn_names.k, attn_names.v}
    out = []
    for i, layer in enumerate(decoder_layers(model)):
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            raise ValueError(f"layer {i} has no self_attn; scope='all' cannot find the attention projections")
        linears = [(n, m) for n, m in attn.named_modules() if isinstance(m, torch.nn.Linear)]
        qkv = [(names[id(m)], m) for n, m in linears if n in stacked]
        out += ([qkv] if qkv else []) + [[(names[id(m)], m)] for n, m in linears if n not in stacked]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        out.append([(names[id(head)], head)])
    return out


def quantize_model_(model, cfg: QuantConfig, scope: str = "mlp", *, calib_ids=None,
                    progress: bool = True, embedding: str = defaults.EMBEDDING,
                    under_dip: UnderDip | None = None, dense_bits: DenseBits | None = None) -> QuantReport:
    """Replace weights in place by their fake-quantised values; return what was done.

    ``calib_ids`` ([B, T] token ids): calibration text. Required by configs with ``error_feedback``
    (GPTQ-style, full Hessians); otherwise optional, giving the Hessian-diagonal row weights VQ3's
    ``hessian`` names (without it VQ3 fits unweighted k-means; BQ4/RTN3 use none, see
    ``config._BlockIntConfig``). ``under_dip``: as :func:`calibration_statistics` (a ``dip`` config needs it).
    ``dense_bits``: the bits of attention and lm_head with ``scope="all"`` (default: ``DenseBits()``).
    """
    if scope not in SCOPES:
        raise ValueError(f"scope={scope!r} is not allowed; choose one of {SCOPES}")
    t0 = time.perf_counter()
    notes: list[str] = []
    feedback = bool(getattr(cfg, "error_feedback", False))
    if feedback and calib_ids is None:
        raise ValueError(f"{type(cfg).__name__}.error_feedback=True needs calibration data: pass calib_ids "
                         "([B, T] token ids) or use the format without -gptq")
    calib = calibration_statistics(model, cfg, calib_ids, under_dip=under_dip)
    if calib is not None:
        kind = "full Hessians (GPTQ-style error feedback)" if feedback else "Hessian-diagonal row weights"
        notes.append(f"{kind} ({cfg.statistics()}) from {int(np.prod(calib_ids.shape))} calibration tokens")
    mlp_bits = mlp_params = 0
    layers, arch = decoder_layers(model), arch_of_model(model)
    for i, packed in iter_packed_mlp(model, cfg, calib=calib, progress=progress):
        set_mlp_weights(layers[i].mlp, arch, *rows_to_mlp(dequantize_rows(packed["up_gate"]), dequantize_rows(packed["down"])))
        for p in packed.values():
            mlp_bits += 8 * p.nbytes
            mlp_params += p.rows * p.cols
    return _dense_and_report(model, cfg, scope, mlp_bits, mlp_params, t0, notes, embedding, dense_bits)


def _untie_head(model, notes: list[str], why: str) -> None:
    import torch

    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and emb is not None and head.weight is emb.weight:
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
        if hasattr(model.config, "tie_word_embeddings"):
            model.config.tie_word_embeddings = False
        notes.append(f"lm_head untied from the embedding table ({why})")


def _dense_and_report(model, cfg: QuantConfig, scope: str, mlp_bits: int, mlp_params: int, t0: float,
            notes: list[str], embedding: str = defaults.EMBEDDING,
            dense_bits: DenseBits | None = None) -> QuantReport:
    """Quantise attention and lm_head too when ``scope`` is ``all``; the report over everything."""
    bits, params = mlp_bits, mlp_params
    if scope == "all":
        rule = dense_bits or DenseBits()
        groups = _dense_groups(model)
        widths = [rule.bits(f"{name}.weight" for name, _ in group) for group in groups]
        for width in sorted(set(widths)):
            dense = dense_config(cfg, width)
            if dense != cfg:
                notes.append(f"{widths.count(width)} attention/lm_head matrices use {dense} (blocks along the "
                             "input dimension)")
        emb = model.get_input_embeddings()
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if embedding != "int4":
            _untie_head(model, notes, "the embedding stays unquantised")
        elif head is not None and widths and widths[-1] != 4:
            _untie_head(model, notes, f"a {widths[-1]}-bit lm_head beside the int4 embedding")
        if embedding == "int4":  # as export's int4 table (GatherBlockQuantized)
            packed = quantize_embedding(_np(emb.weight), cfg)
            _assign(emb, dequantize_rows(packed))
            bits += 8 * packed.nbytes
            params += packed.rows * packed.cols
        for group, width in zip(groups, widths):
            for _name, linear in group:
                if linear.weight is emb.weight:  # a tied 4-bit lm_head: the same int4 blocks, quantised once
                    continue
                packed = quantize_dense(_np(linear.weight), cfg, width)
                _assign(linear, dequantize_rows(packed))
                bits += 8 * packed.nbytes
                params += packed.rows * packed.cols
    return QuantReport(
        format=type(cfg).__name__, config=config_to_dict(cfg), scope=scope,
        bits_per_weight_mlp=mlp_bits / mlp_params, bits_per_weight=bits / params,
        n_params_mlp=mlp_params, n_params=params, seconds=time.perf_counter() - t0,
        layers=len(decoder_layers(model)), notes=notes,
    )


def load_mlp_weights_(model, path, scope: str = "mlp", *, model_name: str = "",
                      embedding: str = defaults.EMBEDDING, dense_bits: DenseBits | None = None) -> QuantReport:
    """Replace every MLP's weights in place by those of a ``dipdeploy quantize`` file (dequantised);
    with ``scope="all"`` quantise attention and lm_head as :func:`quantize_model_` does, in the file's
    format. Refuses a file made for another model or shape, naming both."""
    if scope not in SCOPES:
        raise ValueError(f"scope={scope!r} is not allowed; choose one of {SCOPES}")
    t0 = time.perf_counter()
    cfg, tensors, header = load_packed(path)
    made_for = header.get("model") or "?"
    if model_name and made_for not in ("?", model_name):
        raise ValueError(f"{path} holds the MLP weights of {made_for!r}, not {model_name!r}; pass --model "
                         f"{made_for} or re-run `dipdeploy quantize --model {model_name}`")
    arch = arch_of_model(model)
    mlp_bits = mlp_params = 0
    for i, layer in enumerate(decoder_layers(model)):
        up_gate, down = mlp_to_rows(*mlp_weights(layer.mlp, arch))
        packed = {g: tensors.get(f"layers.{i}.{g}") for g in ("up_gate", "down")}
        for group, want in (("up_gate", up_gate.shape), ("down", down.shape)):
            p = packed[group]
            if p is None or (p.rows, p.cols) != want:
                got = "missing" if p is None else f"[{p.rows}, {p.cols}]"
                raise ValueError(f"{path}: layers.{i}.{group} is {got}, the model needs {list(want)}; the file "
                                 f"was made for {made_for!r} (re-run `dipdeploy quantize` for this model)")
        set_mlp_weights(layer.mlp, arch, *rows_to_mlp(dequantize_rows(packed["up_gate"]),
                                                      dequantize_rows(packed["down"])))
        for p in packed.values():
            mlp_bits += 8 * p.nbytes
            mlp_params += p.rows * p.cols
    return _dense_and_report(model, cfg, scope, mlp_bits, mlp_params, t0, [f"MLP weights from {path}"], embedding,
                             dense_bits)


def write_packed_mlp(model, cfg: QuantConfig, out, *, model_name: str = "", force: bool = False,
                     calib_ids=None, progress: bool = True, under_dip: UnderDip | None = None):
    """Quantise every MLP (both groups) and stream the packed tensors into ``out`` (see ``io.py``).

    ``calib_ids`` and ``under_dip`` as in :func:`quantize_model_` (``calib_ids`` required for ``error_feedback``
    configs).
    """
    feedback = bool(getattr(cfg, "error_feedback", False))
    if feedback and calib_ids is None:
        raise ValueError(f"{type(cfg).__name__}.error_feedback=True needs calibration data (calib_ids)")
    calib = calibration_statistics(model, cfg, calib_ids, under_dip=under_dip)

    def tensors():
        for i, packed in iter_packed_mlp(model, cfg, calib=calib, progress=progress):
            for group, p in packed.items():
                yield f"layers.{i}.{group}", p

    return save_packed(out, cfg, tensors(), model=model_name, force=force)
