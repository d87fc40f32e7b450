"""The packed-weights file written by ``dipdeploy quantize`` and read by ``dipdeploy eval --weights``.

A ``.npz`` (zip of ``.npy`` arrays, readable by ``numpy.load``) written entry by entry, so a 7B model
streams through with one layer in memory. Entries:

- ``__header__``: uint8 bytes of a UTF-8 JSON object ``{"magic": "DIPDEPLOY-QUANT", "version": 1,
  "config": <config_to_dict>, "model": ..., "tensors": {<name>: {"type", "rows", "cols", "nbytes", "meta"}}}``;
- ``<name>.<array>`` for every array of every packed tensor, ``<name>`` = ``layers.{i}.up_gate`` (rows
  [d, 2F], the bundled [W_uᵀ | W_gᵀ]) or ``layers.{i}.down`` (rows [F, d] of W_dᵀ). Array names and
  layouts are those of ``block.BlockQuantTensor`` / ``vq.VQTensor``.

Written to a temporary file in the same folder and renamed into place; an existing file is kept unless
``force``. Floor 2: numpy only.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Iterable

import numpy as np

from dipdeploy.paths import check_output
from dipdeploy.quant.api import PackedTensor, tensor_type_by_name
from dipdeploy.quant.config import QuantConfig, config_from_dict, config_to_dict

MAGIC = "DIPDEPLOY-QUANT"
FILE_VERSION = 1
_REGENERATE = "regenerate it with `dipdeploy quantize --model M --quant Q --out FILE --force`"


def _write_array(zf: zipfile.ZipFile, name: str, arr: np.ndarray) -> None:
    with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)


def save_packed(path: str | Path, cfg: QuantConfig, tensors: Iterable[tuple[str, PackedTensor]], *,
                model: str = "", force: bool = False) -> Path:
    """Stream (name, packed) pairs into ``path`` atomically; returns the path."""
    path = check_output(Path(path), force)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"magic": MAGIC, "version": FILE_VERSION, "config": config_to_dict(cfg), "model": model, "tensors": {}}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
            for name, packed in tensors:
                if name in header["tensors"]:
                    raise ValueError(f"tensor name {name!r} written twice")
                header["tensors"][name] = {"type": type(packed).__name__, "rows": packed.rows,
                                           "cols": packed.cols, "nbytes": packed.nbytes,
                                           "meta": packed.meta()}
                for key, arr in packed.arrays().items():
                    _write_array(zf, f"{name}.{key}", arr)
            _write_array(zf, "__header__", np.frombuffer(json.dumps(header).encode(), dtype=np.uint8))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_header(path: str | Path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        if "__header__" not in z.files:
            raise ValueError(f"{path} is not a dipdeploy packed-weights file (no __header__); {_REGENERATE}")
        header = json.loads(z["__header__"].tobytes().decode())
    if header.get("magic") != MAGIC:
        raise ValueError(f"{path}: magic {header.get('magic')!r} != {MAGIC!r}; {_REGENERATE}")
    if header.get("version") != FILE_VERSION:
        raise ValueError(f"{path}: file version {header.get('version')!r} unsupported "
                         f"(this dipdeploy reads {FILE_VERSION}); {_REGENERATE}")
    return header


def load_packed(path: str | Path) -> tuple[QuantConfig, dict[str, PackedTensor], dict]:
    """(config, {name: packed tensor}, header) of a file written by :func:`save_packed`."""
    header = read_header(path)
    cfg = config_from_dict(header["config"])
    out: dict[str, PackedTensor] = {}
    with np.load(path, allow_pickle=False) as z:
        for name, info in header["tensors"].items():
            cls = tensor_type_by_name(info["type"])
            prefix = f"{name}."
            arrays = {k[len(prefix):]: z[k] for k in z.files if k.startswith(prefix)}
            out[name] = cls.from_arrays(cfg, info["rows"], info["cols"], arrays, **info["meta"])
    return cfg, out, header


def bits_per_weight(header: dict) -> float:
    """Exact bits per weight over all tensors of a file (from its header)."""
    info = header["tensors"].values()
    return 8 * sum(t["nbytes"] for t in info) / sum(t["rows"] * t["cols"] for t in info)
