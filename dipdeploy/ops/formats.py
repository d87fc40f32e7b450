"""The weight formats SparseGatherMatMul accepts, and ``OpWeights``: one weight matrix in one of them.

A weight matrix is a *row matrix* W [R, O]: row r is what selecting input column r of X multiplies
(the sparse layout of docs/method.md: bundled up|gate rows, or rows of W_dᵀ). Per format, the op's
variadic ``weights`` inputs are, in this order:

| format | inputs | dtypes | shapes |
|---|---|---|---|
| fp32 | W | float32 | [R, O] |
| fp16 | W | float16 | [R, O] |
| bq4  | qweight, scales[, zeros] | uint8, float16[, uint8] | [R, Cp/2], [R, nb][, [R, ceil(nb/2)]] |
| vq3  | codes, codebooks, codebook_scales | uint8, int8, float16 | [R, ceil(3·O/8)], [ngr, ngc, 64, 2], [ngr, ngc] |

BQ4 is ``dipdeploy.quant.block.BlockQuantTensor`` with bits = 4 (block size B = Cp / nb, derived from the
shapes; ``zeros`` present = asymmetric). VQ3 is ``dipdeploy.quant.vq.VQTensor`` with int8 codebooks (the
default ``codebook_dtype``; fp16 codebooks are not an op format); its group shape travels in the node
attributes ``group_rows``/``group_cols``. Quantised formats carry the output width O in the attribute
``cols`` because padding makes it underivable from the shapes.

R may be larger than the X width D (never smaller without slots): in *slab* mode W holds only the
rows the host runtime keeps in DRAM and the op's ``slots`` input says which slab row serves each
selected column; the same op and kernels serve both modes. A slab holds only the per-row arrays
(``shared`` arrays stay whole, :meth:`OpWeights.slab`): VQ3's codebooks and scales cover the
original D rows and a selected row decodes with the group of its *original* row ``indices[n, j]``
(``gi = indices[n, j] // group_rows``), never of its slot, so ngr = ceil(D / group_rows) in slab mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from dipdeploy.quant.config import Block4QuantConfig, VQ3QuantConfig


@dataclass(frozen=True)
class WeightFormat:
    """One format's record: everything the package, the bundle and the native library know of it.

    Adding a format is adding one record to :data:`FORMATS` (and its kernel in ``custom_ops``, which
    ``tests/test_records.py`` holds to the record); every other module looks the traits up here.

    ``dtypes``/``arrays``: the dtype and the label of each weight input (required first, then optional
    ones); the labels are the packed tensor's ``arrays()`` keys and the bundle's tensor name suffixes.
    ``code_bits``: bits of one weight's own code, without scales or codebooks (the native library's
    bytes per weight × 8; the bits per weight of an unquantised format). ``native``: the format's
    ``dd_format`` enumerator in ``custom_ops/src/kernels/``. ``config``: the ``dipdeploy.quant``
    config class that packs it (None: unquantised), ``requires`` the config fields the op format fixes.
    ``dequantize``: the numpy decode of selected rows; ``rows_onnx``: the fallback function's decode
    (``ops.fallback``). ``shared``: weight inputs indexed by original row group, not per W row (their
    group shape travels in ``group_rows``/``group_cols``). ``int8``: accuracy level 4 computes with int8
    coefficients. ``matmul``: a standard MatMul reads its rows as they are (the dense MLP).
    """

    name: str
    dtypes: tuple[str, ...]
    arrays: tuple[str, ...]
    n_optional: int
    code_bits: int
    native: str
    dequantize: Callable[["OpWeights", np.ndarray, np.ndarray], np.ndarray]
    rows_onnx: Callable
    config: type | None = None
    requires: tuple[tuple[str, object], ...] = ()
    shared: tuple[int, ...] = ()  # weight inputs indexed by original row group, not per W row
    int8: bool = False
    matmul: bool = False

    @property
    def n_required(self) -> int:
        return len(self.dtypes) - self.n_optional

    @property
    def quantised(self) -> bool:
        return self.config is not None

    @property
    def grouped(self) -> bool:
        """Whether its nodes carry a group shape (``group_rows``/``group_cols``): it has shared tables."""
        return bool(self.shared)


def _dequant_plain(w: "OpWeights", row_ids: np.ndarray, original: np.ndarray) -> np.ndarray:
    return w.arrays[0][row_ids].astype(np.float32)


def _dequant_packed(w: "OpWeights", row_ids: np.ndarray, original: np.ndarray) -> np.ndarray:
    from dipdeploy.quant.api import dequantize_rows

    return dequantize_rows(w.packed, row_ids)


def _dequant_vq3(w: "OpWeights", row_ids: np.ndarray, original: np.ndarray) -> np.ndarray:
    """Codes of W rows ``row_ids`` with the codebooks of original rows ``original`` (they differ in slab mode).

    ``VQTensor.dequantize_rows`` takes the group from the row it decodes, so it is called on a view with
    one group row per selected row: that row's codes and its original group's codebooks and scales.
    """
    from dataclasses import replace

    from dipdeploy.quant.api import dequantize_rows

    vq = w.packed
    gi = original // vq.group_rows
    if gi.size and gi.max() >= vq.codebooks.shape[0]:
        raise ValueError(f"original row {original.max()} has no VQ3 codebooks: they cover "
                         f"{vq.codebooks.shape[0]} groups of {vq.group_rows} rows")
    view = replace(vq, rows=len(row_ids), group_rows=1, codes=vq.codes[row_ids], codebooks=vq.codebooks[gi],
                   codebook_scales=vq.codebook_scales[gi])
    return dequantize_rows(view)


def _onnx_plain(b, rows: str, w: list[str], original: str) -> str:
    from dipdeploy.ops.fallback import _rows_fp  # ops.fallback imports this module: looked up on call

    return _rows_fp(b, rows, w)


def _onnx_bq4(b, rows: str, w: list[str], original: str) -> str:
    from dipdeploy.ops.fallback import _rows_bq4

    return _rows_bq4(b, rows, w)


def _onnx_vq3(b, rows: str, w: list[str], original: str) -> str:
    from dipdeploy.ops.fallback import _rows_vq3

    return _rows_vq3(b, rows, w, original=original)


FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat("fp32", ("float32",), ("rows",), 0, 32, "DD_FORMAT_FP32", _dequant_plain, _onnx_plain,
                     matmul=True),
        WeightFormat("fp16", ("float16",), ("rows",), 0, 16, "DD_FORMAT_FP16", _dequant_plain, _onnx_plain),
        WeightFormat("bq4", ("uint8", "float16", "uint8"), ("qweight", "scales", "zeros"), 1, 4, "DD_FORMAT_BQ4",
                     _dequant_packed, _onnx_bq4, config=Block4QuantConfig, int8=True),
        WeightFormat("vq3", ("uint8", "int8", "float16"), ("codes", "codebooks", "codebook_scales"), 0, 3,
                     "DD_FORMAT_VQ3", _dequant_vq3, _onnx_vq3, config=VQ3QuantConfig,
                     requires=(("codebook_dtype", "int8"),), shared=(1, 2)),
    )
}


def weight_format(name: str) -> WeightFormat:
    """The record of format ``name``."""
    if name not in FORMATS:
        raise ValueError(f"format={name!r} is not a SparseGatherMatMul weight format; allowed: {tuple(FORMATS)}")
    return FORMATS[name]


@dataclass(frozen=True)
class OpWeights:
    """A row matrix [rows, cols] as the op's weight inputs (``arrays``, in input order).

    ``packed`` keeps the ``dipdeploy.quant`` tensor of a quantised format, for the numpy reference.
    Build with :meth:`from_matrix` (fp32/fp16) or :meth:`from_packed` (BQ4/VQ3).
    """

    format: str
    arrays: tuple[np.ndarray, ...]
    rows: int
    cols: int
    packed: object | None = None
    attrs: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        fmt = weight_format(self.format)
        if not fmt.n_required <= len(self.arrays) <= len(fmt.dtypes):
            raise ValueError(
                f"format {self.format!r} takes {fmt.n_required}..{len(fmt.dtypes)} weight arrays, got {len(self.arrays)}"
            )
        for i, (a, dt) in enumerate(zip(self.arrays, fmt.dtypes)):
            if a.dtype != np.dtype(dt) or a.ndim < 2:
                raise ValueError(f"weights[{i}] of format {self.format!r} must be a {dt} matrix, got {a.dtype} {a.shape}")
        if self.arrays[0].shape[0] != self.rows:
            raise ValueError(f"weights[0] must have {self.rows} rows, got shape {self.arrays[0].shape}")
        if fmt.quantised and self.packed is None:
            raise ValueError(f"format {self.format!r} needs the packed tensor (use OpWeights.from_packed)")

    @classmethod
    def from_matrix(cls, w: np.ndarray) -> "OpWeights":
        """fp32 or fp16 row matrix [R, O], by its dtype."""
        w = np.ascontiguousarray(w)
        names = {np.dtype(f.dtypes[0]): f.name for f in FORMATS.values() if not f.quantised}
        if w.ndim != 2 or w.dtype not in names:
            raise ValueError(f"expected a {' or '.join(map(str, names))} matrix [R, O], got {w.dtype} {w.shape}")
        return cls(names[w.dtype], (w,), w.shape[0], w.shape[1])

    @classmethod
    def from_packed(cls, packed) -> "OpWeights":
        """A ``dipdeploy.quant`` packed tensor: BQ4 (``BlockQuantTensor`` with 4 bits) or VQ3."""
        name = _packed_format_name(packed)
        arrays = tuple(np.ascontiguousarray(a) for a in packed.arrays().values())
        meta = packed.meta() if hasattr(packed, "meta") else {}
        return cls(name, arrays, packed.rows, packed.cols, packed, tuple(sorted(meta.items())))

    @property
    def overload(self) -> str:
        """The fallback function variant these arrays need (e.g. ``bq4`` vs ``bq4_zp``)."""
        fmt = weight_format(self.format)
        return self.format + ("_zp" if len(self.arrays) > fmt.n_required else "")

    def rows_float32(self, row_ids: np.ndarray, original: np.ndarray | None = None) -> np.ndarray:
        """float32 [len(row_ids), cols]: the reference decode of the selected rows.

        ``original``: the original row each one holds (the op's ``indices``; default ``row_ids``, full
        mode). Only formats with ``shared`` per-group tables (VQ3) read it.
        """
        row_ids = np.asarray(row_ids, dtype=np.int64)
        original = row_ids if original is None else np.asarray(original, dtype=np.int64)
        if original.shape != row_ids.shape:
            raise ValueError(f"original {original.shape} must have the shape of row_ids {row_ids.shape}")
        return weight_format(self.format).dequantize(self, row_ids, original)

    def slab(self, held: np.ndarray) -> "OpWeights":
        """The weights of a slab whose row s holds original row ``held[s]`` (what a host runtime binds).

        Per-row arrays are gathered; ``shared`` ones (VQ3 codebooks, scales) stay whole, because they
        are indexed by the original row's group. Feed the op ``slots`` (slab rows) with ``indices``.
        """
        held = np.asarray(held, dtype=np.int64)
        if held.ndim != 1 or (held.size and (held.min() < 0 or held.max() >= self.rows)):
            raise ValueError(f"held must be a 1-D array of rows in [0, {self.rows}), got shape {held.shape}")
        shared = weight_format(self.format).shared
        arrays = tuple(a if i in shared else np.ascontiguousarray(a[held]) for i, a in enumerate(self.arrays))
        packed = None
        if self.packed is not None:
            names = list(self.packed.arrays())
            packed = type(self.packed).from_arrays(self.packed.config, len(held), self.cols,
                                                   dict(zip(names, arrays)), **self.packed.meta())
        return OpWeights(self.format, arrays, len(held), self.cols, packed, self.attrs)

    def row_nbytes(self) -> float:
        """Bytes a kernel reads per selected row: the row's own data plus its share of per-group tables."""
        tables = weight_format(self.format).shared
        own = sum(a[0].nbytes for i, a in enumerate(self.arrays) if i not in tables)
        shared = sum(a.nbytes for i, a in enumerate(self.arrays) if i in tables)
        return own + shared / self.rows


def format_of_config(config) -> WeightFormat | None:
    """The op format packed with ``config`` (a quant config or its class); None for a config of no op format (RTN3)."""
    cls = config if isinstance(config, type) else type(config)
    return next((f for f in FORMATS.values() if f.config is not None and f.config is cls), None)


def _packed_format_name(packed) -> str:
    kind = type(packed).__name__
    config = getattr(packed, "config", None)
    fmt = None if config is None else format_of_config(config)
    if fmt is None:
        bits = getattr(config, "bits", None)
        supported = ", ".join(f.name.upper() for f in FORMATS.values() if f.quantised)
        raise ValueError(f"no SparseGatherMatMul format for packed tensor {kind} (bits={bits}); supported: {supported}")
    for field, want in fmt.requires:
        if getattr(config, field) != want:
            raise ValueError(f"{fmt.name.upper()} with {field}={getattr(config, field)!r} is not an op format; "
                             f"quantise with {field}={want!r}")
    return fmt.name
