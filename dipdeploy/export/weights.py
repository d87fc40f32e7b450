"""Weight files of a bundle: each tensor written once, aligned, and referenced as ONNX external data.

Every graph of a bundle (the whole decoder and the per-layer graphs) refers to the same bytes by
(file, offset, length), so nothing is duplicated on disk and ORT memory-maps the files. Tensors are
streamed to disk as they are added, so a large model exports with one layer in memory at a time.
``onnx.save_model(save_as_external_data=True)`` does not align (docs/onnxruntime.md); we write the files
ourselves with every tensor starting at a multiple of ``alignment`` (4 KiB by default).

Floor 4 but torch-free: numpy and onnx only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from dipdeploy.flash import BLOCK


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the table in ``manifest.json``."""

    name: str
    file: str
    offset: int
    length: int
    dtype: str
    shape: tuple[int, ...]
    layout: str
    view_of: str = ""  # the tensor whose bytes these are, read with another shape (``WeightStore.view``)

    def as_dict(self) -> dict:
        out = {"file": self.file, "offset": self.offset, "length": self.length, "dtype": self.dtype,
               "shape": list(self.shape), "layout": self.layout}
        if self.view_of:
            out["view_of"] = self.view_of
        return out


class WeightStore:
    """Appends tensors to named files in ``root`` and hands out external-data TensorProtos."""

    def __init__(self, root: Path, alignment: int = BLOCK):
        self.root = Path(root)
        self.alignment = alignment
        self.entries: dict[str, TensorEntry] = {}
        self._files: dict[str, object] = {}
        self._protos: dict[str, TensorProto] = {}

    def _handle(self, file: str):
        if file not in self._files:
            self._files[file] = open(self.root / file, "wb")
        return self._files[file]

    def add(self, name: str, array: np.ndarray, file: str, layout: str) -> TensorProto:
        """Write ``array`` (C order) at the next aligned offset of ``file``; return its reference.

        A name already written is not written again (every graph shares the first copy); its dtype
        and shape must agree.
        """
        array = np.ascontiguousarray(array)
        if name in self.entries:
            old = self.entries[name]
            if (old.dtype, old.shape) != (array.dtype.name, tuple(array.shape)):
                raise ValueError(f"tensor {name!r} written twice with different dtype/shape: "
                                 f"{old.dtype}{list(old.shape)} vs {array.dtype.name}{list(array.shape)}")
            return self.proto(name)
        f = self._handle(file)
        pos = f.tell()
        pad = -pos % self.alignment
        if pad:
            f.write(b"\0" * pad)
        offset = pos + pad
        f.write(memoryview(array.reshape(-1)).cast("B"))  # the array's own bytes: no copy of a large one
        self.entries[name] = TensorEntry(name, file, offset, array.nbytes, array.dtype.name, tuple(array.shape), layout)
        self._protos[name] = external_tensor(name, array.dtype, array.shape, file, offset, array.nbytes)
        return self.proto(name)

    def view(self, name: str, of: str, shape: tuple[int, ...], layout: str) -> TensorProto:
        """``of``'s bytes under another name and shape (same dtype and length), written nowhere: a tied
        lm_head's MatMulNBits reads the int4 embedding table that GatherBlockQuantized gathers rows
        from, and the two ops want different shapes of the same blocks (docs/onnxruntime.md)."""
        src = self.entries[of]
        shape = tuple(int(s) for s in shape)
        if int(np.prod(shape)) * np.dtype(src.dtype).itemsize != src.length:
            raise ValueError(f"view {name!r} of {of!r}: shape {list(shape)} does not hold its {src.length} bytes")
        if name in self.entries:
            if self.entries[name].view_of != of or self.entries[name].shape != shape:
                raise ValueError(f"tensor {name!r} written twice as different tensors")
            return self.proto(name)
        self.entries[name] = TensorEntry(name, src.file, src.offset, src.length, src.dtype, shape, layout, of)
        self._protos[name] = external_tensor(name, src.dtype, shape, src.file, src.offset, src.length)
        return self.proto(name)

    def proto(self, name: str) -> TensorProto:
        """A fresh copy of the reference to an already written tensor (for another graph)."""
        copy = TensorProto()
        copy.CopyFrom(self._protos[name])
        return copy

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def external_tensor(name: str, dtype, shape, file: str, offset: int, length: int) -> TensorProto:
    t = TensorProto()
    t.name = name
    t.data_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    t.dims.extend(int(s) for s in shape)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", file), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t

