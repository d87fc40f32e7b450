"""Format dispatch: ``quantize`` by config type, ``dequantize_rows`` by packed-tensor type.

Formats register themselves with the decorators below (docs/design.md §3): adding a format edits no ``if``.
Floor 2: numpy only.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from dipdeploy.quant.config import dense_config, embedding_config


class PackedTensor(Protocol):
    """What every packed row matrix offers (see ``block.BlockQuantTensor`` and ``vq.VQTensor``)."""

    rows: int
    cols: int

    def arrays(self) -> dict[str, np.ndarray]: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def bits_per_weight(self) -> float: ...


_QUANTIZERS: dict[type, Callable] = {}
_FEEDBACK_QUANTIZERS: dict[type, Callable] = {}
_DEQUANTIZERS: dict[type, Callable] = {}
_TENSOR_TYPES: dict[str, type] = {}


def register_quantizer(config_type: type) -> Callable:
    def deco(fn: Callable) -> Callable:
        _QUANTIZERS[config_type] = fn
        return fn

    return deco


def register_feedback_quantizer(config_type: type) -> Callable:
    """Register the GPTQ-style (error feedback) quantiser of a format: ``fn(rows, cfg, hessian)``."""
    def deco(fn: Callable) -> Callable:
        _FEEDBACK_QUANTIZERS[config_type] = fn
        return fn

    return deco


def register_tensor(tensor_type: type) -> type:
    """Register a packed-tensor class: its ``dequantize_rows`` method and its name (for file I/O)."""
    _DEQUANTIZERS[tensor_type] = tensor_type.dequantize_rows
    _TENSOR_TYPES[tensor_type.__name__] = tensor_type
    return tensor_type


def tensor_type_by_name(name: str) -> type:
    if name not in _TENSOR_TYPES:
        raise ValueError(f"unknown packed tensor type {name!r}; known: {sorted(_TENSOR_TYPES)}")
    return _TENSOR_TYPES[name]


def check_rows(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[1] == 0:
        raise ValueError(f"expected a non-empty 2-D row matrix [R, C], got shape {rows.shape}")
    if not np.issubdtype(rows.dtype, np.floating):
        raise ValueError(f"expected floating-point weights, got dtype {rows.dtype}")
    if not all(np.isfinite(block).all() for block in _row_blocks(rows)):
        raise ValueError("weights contain NaN or Inf; fix the checkpoint before quantising")
    return np.ascontiguousarray(rows, dtype=np.float32)


#: Bytes of a matrix checked at a time by :func:`check_rows`: its mask of finite values is one byte per
#: weight, a large temporary for a large vocabulary's embedding or lm_head when made whole.
CHECK_BYTES = 8 << 20


def _row_blocks(rows: np.ndarray):
    step = max(1, CHECK_BYTES // max(1, rows[0].nbytes))
    return (rows[i:i + step] for i in range(0, rows.shape[0], step))


def quantize(rows: np.ndarray, cfg, *, row_weight: np.ndarray | None = None,
             hessian: np.ndarray | None = None) -> PackedTensor:
    """Quantise a row matrix [R, C] (row = the unit DIP selects) with the format named by ``cfg``.

    ``row_weight`` ([R], optional): importance of each row, e.g. the Hessian diagonal E[x_r²] of the
    activation that multiplies row r. Formats for which it cannot matter ignore it.
    ``hessian`` ([R, R], required when ``cfg.error_feedback``): H = Σ x xᵀ of the activations that
    multiply the rows (calibration data), for GPTQ-style error feedback (``gptq.py``).
    """
    if type(cfg) not in _QUANTIZERS:
        raise TypeError(f"no quantizer for {type(cfg).__name__}; known: {[t.__name__ for t in _QUANTIZERS]}")
    rows = check_rows(rows)
    if row_weight is not None:
        row_weight = np.asarray(row_weight, dtype=np.float64)
        if row_weight.shape != (rows.shape[0],) or (row_weight < 0).any():
            raise ValueError(f"row_weight must be non-negative with shape ({rows.shape[0]},), got {row_weight.shape}")
    if getattr(cfg, "error_feedback", False):
        if hessian is None:
            raise ValueError(
                f"{type(cfg).__name__}.error_feedback=True needs a Hessian of the calibration activations; "
                "pass hessian= (numpy) or calib_ids= to quantize_model_, or use error_feedback=False"
            )
        hessian = np.asarray(hessian, dtype=np.float64)
        if hessian.shape != (rows.shape[0],) * 2:
            raise ValueError(f"hessian must have shape ({rows.shape[0]}, {rows.shape[0]}), got {hessian.shape}")
        return _FEEDBACK_QUANTIZERS[type(cfg)](rows, cfg, hessian)
    return _QUANTIZERS[type(cfg)](rows, cfg, row_weight)


def dequantize_rows(packed: PackedTensor, row_idx: np.ndarray | None = None) -> np.ndarray:
    """float32 [len(row_idx), C] of the selected rows (all rows if ``row_idx`` is None).

    This is the numpy reference the ONNX custom ops and native kernels implement.
    """
    if type(packed) not in _DEQUANTIZERS:
        raise TypeError(f"no dequantizer for {type(packed).__name__}")
    if row_idx is None:
        row_idx = np.arange(packed.rows)
    row_idx = np.asarray(row_idx)
    if row_idx.ndim != 1 or not np.issubdtype(row_idx.dtype, np.integer):
        raise ValueError(f"row_idx must be a 1-D integer array, got {row_idx.dtype} shape {row_idx.shape}")
    if row_idx.size and (row_idx.min() < 0 or row_idx.max() >= packed.rows):
        raise ValueError(f"row_idx out of range [0, {packed.rows}): min {row_idx.min()}, max {row_idx.max()}")
    return _DEQUANTIZERS[type(packed)](packed, row_idx)


def fake_quantize(rows: np.ndarray, cfg, *, row_weight: np.ndarray | None = None,
                  hessian: np.ndarray | None = None) -> tuple[np.ndarray, PackedTensor]:
    """Quantise then dequantise (numpy): the values a deployed model computes with, and the packing."""
    packed = quantize(rows, cfg, row_weight=row_weight, hessian=hessian)
    return dequantize_rows(packed), packed


def quantize_dense(weight: np.ndarray, mlp_cfg, bits: int = 4) -> PackedTensor:
    """An attention or lm_head weight [out, in] in the ``bits``-bit blocks of :func:`dense_config` (rows =
    output features, blocks along the input): the one quantiser of these weights, for export's MatMulNBits
    and for the torch fake-quant alike, so both hold the same numbers."""
    return quantize(weight, dense_config(mlp_cfg, bits))


def quantize_embedding(table: np.ndarray, mlp_cfg) -> PackedTensor:
    """The token embedding table [vocab, dim] in the int4 blocks of :func:`config.embedding_config`, for
    export's GatherBlockQuantized table and the torch fake-quant alike."""
    return quantize(table, embedding_config(mlp_cfg))
