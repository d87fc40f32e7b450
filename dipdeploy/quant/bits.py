"""Exact bit packing of small unsigned integers along a row: the one bit order all formats share.

Every packed row is a little-endian *bit stream*: value k of a row occupies bits
[k·n, (k+1)·n) of the stream, least significant bit first, and stream bit b lives in byte b // 8 at
bit position b % 8 (LSB = position 0). Each row starts on a byte boundary; the tail of the last byte
is zero. Consequences that the native kernels rely on:

- n = 4: byte k holds value 2k in its low nibble and value 2k+1 in its high nibble.
- n = 8: byte k is value k.
- n = 3: 8 values → 3 bytes; n = 6: 4 values → 3 bytes (b0 = v0 | v1<<6, b1 = v1>>2 | v2<<4,
  b2 = v2>>4 | v3<<2, all & 0xFF).

Packed bytes per row: ``ceil(n_values · n / 8)`` (see :func:`packed_row_bytes`).
Floor 2: numpy only.
"""

from __future__ import annotations

import numpy as np

SUPPORTED_BITS = (3, 4, 6, 8)
_CHUNK_VALUES = 1 << 22  # rows are packed in chunks of about this many values (bounded memory)


def packed_row_bytes(n_values: int, bits: int) -> int:
    """Bytes one packed row of ``n_values`` values of ``bits`` bits takes (whole bytes per row)."""
    return -(-n_values * bits // 8)


def _check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits={bits!r} unsupported for packing; allowed: {SUPPORTED_BITS}")


def _row_chunks(rows: int, per_row: int):
    step = max(1, _CHUNK_VALUES // max(1, per_row))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack uint values in [0, 2^bits) of shape [R, n] into uint8 [R, packed_row_bytes(n, bits)]."""
    _check_bits(bits)
    values = np.asarray(values)
    if values.ndim != 2:
        raise ValueError(f"pack_bits expects a 2-D [rows, values] array, got shape {values.shape}")
    if values.size and (values.min() < 0 or values.max() >= (1 << bits)):
        raise ValueError(f"values out of range for {bits}-bit packing: [{values.min()}, {values.max()}]")
    rows, n = values.shape
    if bits == 8:
        return values.astype(np.uint8)
    nbytes = packed_row_bytes(n, bits)
    out = np.empty((rows, nbytes), dtype=np.uint8)
    if bits == 4:
        v = values.astype(np.uint8)
        if n % 2:
            v = np.concatenate([v, np.zeros((rows, 1), np.uint8)], axis=1)
        out[:] = v[:, 0::2] | (v[:, 1::2] << 4)
        return out
    shifts = np.arange(bits, dtype=np.uint8)
    for sl in _row_chunks(rows, n * bits):
        v = values[sl].astype(np.uint8)
        stream = ((v[:, :, None] >> shifts) & 1).reshape(v.shape[0], n * bits)
        out[sl] = np.packbits(stream, axis=1, bitorder="little")[:, :nbytes]
    return out


def unpack_bits(packed: np.ndarray, bits: int, n_values: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: uint8 [R, nbytes] → uint8 [R, n_values]."""
    _check_bits(bits)
    packed = np.asarray(packed, dtype=np.uint8)
    if packed.ndim != 2:
        raise ValueError(f"unpack_bits expects a 2-D [rows, bytes] array, got shape {packed.shape}")
    rows, nbytes = packed.shape
    if nbytes != packed_row_bytes(n_values, bits):
        raise ValueError(
            f"packed rows have {nbytes} bytes but {n_values} values of {bits} bits need "
            f"{packed_row_bytes(n_values, bits)}"
        )
    if bits == 8:
        return packed.copy()
    if bits == 4:
        out = np.empty((rows, 2 * nbytes), dtype=np.uint8)
        out[:, 0::2] = packed & 0x0F
        out[:, 1::2] = packed >> 4
        return out[:, :n_values]
    weights = (1 << np.arange(bits, dtype=np.uint8)).astype(np.uint8)
    out = np.empty((rows, n_values), dtype=np.uint8)
    for sl in _row_chunks(rows, n_values * bits):
        stream = np.unpackbits(packed[sl], axis=1, bitorder="little")[:, : n_values * bits]
        out[sl] = (stream.reshape(-1, n_values, bits) * weights).sum(axis=2, dtype=np.uint8)
    return out
