"""Embedding rows read from ``dense.bin`` per token, so the table never becomes resident.

A token needs one row of the [vocab, d] table; ``embed.onnx`` (a Gather, or a GatherBlockQuantized on an
int4 table, over the whole table) is what other hosts run. The host runtime does what it computes with
one positioned read per row: d float32 values, or an int4 row (d/2 bytes of codes and its block scales,
decoded (q − 8)·s in float32 as GatherBlockQuantized and ``quant.block`` decode it, bit-equal) into its
``hidden`` buffer, then the family's embedding multiplier (Gemma's √d, Granite's; ``dipdeploy.arch``),
in float32 as the graph's Mul does. The residency plan then counts one row, not the table
(docs/runtime.md, "Budget"). Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dipdeploy.bundle.bundledir import BundleDir
from dipdeploy.bundle.manifest import REGENERATE, BundleError, Manifest, held
from dipdeploy.bundle.names import EMBEDDING

_ZERO_POINT = 8  # int4 codes are stored offset by 8 (MatMulNBits' and GatherBlockQuantized's default)


def embedding_tensors(manifest: Manifest) -> list[str]:
    """The tensors of the embedding table in the bundle: ``.weight`` (fp32) or ``.qweight`` + ``.scales``."""
    if f"{EMBEDDING}.qweight" in manifest.tensors:
        return [f"{EMBEDDING}.qweight", f"{EMBEDDING}.scales"]
    return [f"{EMBEDDING}.weight"]


def embedding_table_bytes(manifest: Manifest) -> int:
    """Bytes of the table that only the embedding reads (which the runtime reads row by row instead of
    holding): 0 when a tied lm_head views them, since the head keeps them resident anyway."""
    names = embedding_tensors(manifest)
    viewed = {t.get("view_of") for t in manifest.tensors.values() if isinstance(t, dict)}
    if viewed & set(names):
        return 0
    return sum(manifest.tensors[n]["length"] for n in names if n in manifest.tensors)


def embedding_rows(manifest: Manifest) -> int | None:
    """Rows of the embedding table (the token ids the bundle can embed), or None when the manifest names
    no 2-d table (``EmbeddingRows`` refuses that where it reads rows)."""
    t = manifest.tensors.get(embedding_tensors(manifest)[0])
    shape = t.get("shape") if isinstance(t, dict) else None
    return int(shape[0]) if isinstance(shape, list) and len(shape) == 2 and type(shape[0]) is int else None


def check_token_ids(ids, rows: int | None) -> None:
    """Refuse a token id the embedding table has no row for, in one line: ``model.onnx``'s Gather gives
    such an id a zero row (a silent wrong result), so every path checks ids where they enter the engine."""
    if rows is None:
        return
    bad = next((t for t in ids if not 0 <= int(t) < rows), None)
    if bad is not None:
        raise ValueError(f"token id {int(bad)} is outside the embedding table's {rows} rows: give ids in "
                         f"0..{rows - 1} (the bundle's tokenizer encodes text to such ids)")


class EmbeddingRows:
    """Positioned reads of single embedding rows (see the module docstring)."""

    def __init__(self, bundle: Path | BundleDir, manifest: Manifest, multiplier: float):
        names = embedding_tensors(manifest)
        ts = [manifest.tensors.get(n) for n in names]
        if any(t is None or len(t["shape"]) != 2 for t in ts) or len({t["file"] for t in ts}) != 1:
            raise BundleError(f"{bundle}: the manifest has no [vocab, ·] embedding tensors {', '.join(names)} in one "
                              f"file; {REGENERATE}")
        self.vocab = int(ts[0]["shape"][0])
        self.int4 = len(ts) == 2  # codes + scales (else one fp32 table)
        config = manifest.source.get("config") or {}
        self.d = int(config.get("hidden_size") or 0) if self.int4 else int(ts[0]["shape"][1])
        self._parts = []  # (offset, row bytes, row buffer) per tensor
        for t in ts:
            row = np.empty(int(t["shape"][1]), np.dtype(t["dtype"]))
            if int(t["shape"][0]) != self.vocab:
                raise BundleError(f"{bundle}: the embedding tensors disagree on the vocabulary size; {REGENERATE}")
            self._parts.append((int(t["offset"]), row.nbytes, row))
        self._values = None  # the int4 row decoded, float32 [blocks, block]
        if self.int4:
            codes, scales = self._parts[0][2], self._parts[1][2]
            if codes.dtype != np.uint8 or scales.dtype != np.float32 or (2 * codes.size) % scales.size \
                    or not 0 < self.d <= 2 * codes.size:
                raise BundleError(f"{bundle}: the int4 embedding's codes {codes.dtype}[{codes.size}], scales "
                                  f"{scales.dtype}[{scales.size}] and hidden size {self.d} do not fit; {REGENERATE}")
            self._values = np.empty((scales.size, 2 * codes.size // scales.size), np.float32)
        self.multiplier = np.float32(multiplier)
        with held(bundle, manifest.files) as folder:  # the rows are read through a checked descriptor
            self.path = folder.path / ts[0]["file"]
            with folder.refusing():
                self.fd = folder.open(ts[0]["file"])

    @property
    def nbytes(self) -> int:
        """Resident bytes: the row buffers."""
        return sum(p[1] for p in self._parts) + (self._values.nbytes if self.int4 else 0)

    def read(self, token: int, out: np.ndarray) -> None:
        """Write row ``token`` (× the multiplier) into ``out`` [..., d] float32."""
        if not 0 <= token < self.vocab:
            raise ValueError(f"token id {token} outside the vocabulary of {self.vocab}")
        for offset, nbytes, buf in self._parts:
            got = os.preadv(self.fd, [memoryview(buf).cast("B")], offset + token * nbytes)
            if got != nbytes:
                raise OSError(f"{self.path}: short read of the embedding row {token}; re-export the bundle or run "
                              "`dipdeploy inspect --verify`")
        row = out.reshape(-1)
        if not self.int4:
            row[:] = self._parts[0][2]
        else:
            codes, scales, v = self._parts[0][2], self._parts[1][2], self._values
            flat = v.reshape(-1)
            flat[0::2] = codes & 0x0F
            flat[1::2] = codes >> 4
            flat -= _ZERO_POINT
            v *= scales[:, None]
            row[:] = flat[: self.d]
        if self.multiplier != 1.0:
            row *= self.multiplier

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
