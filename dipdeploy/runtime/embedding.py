"""Embedding rows read from ``dense.bin`` per token, so the table never becomes resident.

A token needs one row of the [vocab, d] table; ``embed.onnx`` (a Gather over the whole table) is what
other hosts run, the host runtime does what it computes with one positioned read of d values into its
``hidden`` buffer, then the family's embedding multiplier (Gemma's √d, Granite's; ``dipdeploy.arch``),
in float32 as the graph's Mul does. The residency plan then counts one row, not the table
(README, "Budget"). Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dipdeploy.export.manifest import REGENERATE, BundleError, Manifest

EMBEDDING = "model.embed_tokens.weight"


class EmbeddingRows:
    """Positioned reads of single embedding rows (see the module docstring)."""

    def __init__(self, bundle: Path, manifest: Manifest, multiplier: float):
        t = manifest.tensors.get(EMBEDDING)
        if t is None or len(t["shape"]) != 2:
            raise BundleError(f"{bundle}: the manifest has no [vocab, d] tensor {EMBEDDING}; {REGENERATE}")
        self.vocab, self.d = (int(n) for n in t["shape"])
        self.dtype = np.dtype(t["dtype"])
        self.offset, self.row_bytes = int(t["offset"]), self.d * self.dtype.itemsize
        self.multiplier = np.float32(multiplier)
        self._row = np.empty(self.d, self.dtype)
        self.fd = os.open(bundle / t["file"], os.O_RDONLY)
        self.path = bundle / t["file"]

    @property
    def nbytes(self) -> int:
        """Resident bytes: the one row buffer."""
        return self._row.nbytes

    def read(self, token: int, out: np.ndarray) -> None:
        """Write row ``token`` (× the multiplier) into ``out`` [..., d] float32."""
        if not 0 <= token < self.vocab:
            raise ValueError(f"token id {token} outside the vocabulary of {self.vocab}")
        got = os.preadv(self.fd, [memoryview(self._row).cast("B")], self.offset + token * self.row_bytes)
        if got != self.row_bytes:
            raise OSError(f"{self.path}: short read of the embedding row {token}; re-export the bundle or run "
                          "`dipdeploy inspect --verify`")
        row = out.reshape(-1)
        row[:] = self._row
        if self.multiplier != 1.0:
            row *= self.multiplier

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
