"""The quantisation stage's configs: one frozen dataclass per format, validated in ``__post_init__``.

Each config round-trips through JSON with its type name and a version (docs/design.md §5), so a packed file
or an ONNX bundle can say exactly which format produced it. Defaults live here and only here; the CLI
names (``bq4``, ``vq3``, ``rtn3``…) map onto these configs through :func:`quant_config_from_name`.

Bits per weight (exact formulas; the packed tensors report the same numbers from their array sizes):

| config | storage per row of C weights (C a multiple of B / of the group width) | bits/weight |
|---|---|---|
| ``Block4QuantConfig(B, symmetric=True)``  | C/2 bytes int4 + C/B fp16 scales | 4 + 16/B (4.5 / 4.25 / 4.125) |
| ``Block4QuantConfig(B, symmetric=False)`` | + C/B uint4 zero points | 4 + 20/B (4.625 / 4.3125 / 4.15625) |
| ``Block8QuantConfig(B=32)``               | C bytes int8 + C/B fp16 scales | 8 + 16/32 = 8.5 |
| ``RTN3QuantConfig(B=128)``                | 3C/8 bytes int3 + C/B fp16 scales | 3 + 16/128 = 3.125 |
| ``VQ3QuantConfig()``                      | 3C/8 bytes of 6-bit codes + per group 64×2 int8 + fp16 scale | 3 + 1040/8192 ≈ 3.127 |

Partial blocks and groups (C not a multiple of B, R not a multiple of the group height) cost a little
more; the exact figure is always the packed tensor's ``bits_per_weight``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

CONFIG_VERSION = 1
_CONFIG_TYPES: dict[str, type] = {}


def _register_config(cls: type) -> type:
    _CONFIG_TYPES[cls.__name__] = cls
    return cls


def _check_choice(owner: str, name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{owner}.{name}={value!r} is not allowed; choose one of {allowed}")


def _check_damp(owner: str, damp: float) -> None:
    if not isinstance(damp, (int, float)) or not 0 < damp <= 1:
        raise ValueError(f"{owner}.damp={damp!r} must be a number in (0, 1]")


@dataclass(frozen=True)
class _BlockIntConfig:
    """Scalar integer weights in blocks of ``block_size`` consecutive weights of one row.

    ``symmetric``: w = (q − 2^(bits−1))·s, q ∈ [0, 2^bits), one fp16 scale s per block, chosen so the
    block's largest-magnitude weight maps to −2^(bits−1) exactly (llama.cpp Q4_0 trick: one more level
    than absmax/7). Otherwise asymmetric: w = (q − z)·s with an unsigned ``bits``-bit zero point z per
    block (zero is exactly representable), s = (max − min)/(2^bits − 1).
    ``scale_search``: the error-minimising variant, a grid over clipping ratios of the block range
    keeping the scale with the least squared error per block. (A Hessian-diagonal weight would not change
    this choice: in the sparse row layout every weight of a row multiplies the same activation, so the
    weight is constant within a block.)
    ``error_feedback``: GPTQ-style: rows are quantised one after another and each row's error is spread
    over the rows not yet quantised through the inverse Hessian of the calibration activations
    (``gptq.py``; ``damp`` × mean diagonal is added to H). The packed layout is unchanged.
    """

    block_size: int = 64
    symmetric: bool = True
    scale_search: bool = False
    search_grid: int = 20
    error_feedback: bool = False
    damp: float = 0.01
    bits: ClassVar[int] = 4
    allowed_block_sizes: ClassVar[tuple[int, ...]] = (32, 64, 128)

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _check_choice(owner, "block_size", self.block_size, self.allowed_block_sizes)
        _check_choice(owner, "symmetric", self.symmetric, (True, False))
        _check_choice(owner, "scale_search", self.scale_search, (True, False))
        if not isinstance(self.search_grid, int) or not 2 <= self.search_grid <= 200:
            raise ValueError(f"{owner}.search_grid={self.search_grid!r} must be an int in [2, 200]")
        _check_damp(owner, self.damp)
        _check_choice(owner, "error_feedback", self.error_feedback, (True, False))

    def statistics(self) -> str | None:
        """The calibration statistics the quantiser uses (``calib.STATISTICS``), None for none: the dense
        Hessian for error feedback; row weights cannot matter here (see above)."""
        return "dense" if self.error_feedback else None

    def bits_per_weight(self) -> float:
        """Exact bits per weight for rows whose length is a multiple of ``block_size``."""
        zero_bits = 0 if self.symmetric else self.bits
        return self.bits + (16 + zero_bits) / self.block_size


@_register_config
@dataclass(frozen=True)
class Block4QuantConfig(_BlockIntConfig):
    """BQ4: 4-bit block-wise integer weights along the sparse row (docs/method.md, Quantisation)."""

    bits: ClassVar[int] = 4
    allowed_block_sizes: ClassVar[tuple[int, ...]] = (32, 64, 128)


@_register_config
@dataclass(frozen=True)
class Block8QuantConfig(_BlockIntConfig):
    """8-bit symmetric blocks: the dense weights (attention, lm_head) that a source stored with more bits
    than BQ4 keeps (``dense.DenseBits``), or every one with ``--dense-bits 8``, read by
    ``com.microsoft::MatMulNBits`` with ``bits=8``. Not an MLP format: no SparseGatherMatMul reads it.
    Blocks of 32 by default, as GGUF's Q8_0."""

    block_size: int = 32
    bits: ClassVar[int] = 8
    allowed_block_sizes: ClassVar[tuple[int, ...]] = (32, 64, 128)


@_register_config
@dataclass(frozen=True)
class RTN3QuantConfig(_BlockIntConfig):
    """RTN3: the scalar 3-bit baseline at VQ3's bit budget (block 128 symmetric = 3.125 bits/weight).

    Blocks of 96 or 192 (3.167 / 3.083 bits/weight) suit rows of 576 (SmolLM2's d), which a block of 128
    would pad (see ``block.py``). Every block size is a multiple of 8, so a block's codes fill whole bytes.
    """

    block_size: int = 128
    bits: ClassVar[int] = 3
    allowed_block_sizes: ClassVar[tuple[int, ...]] = (32, 64, 96, 128, 192, 256)


@_register_config
@dataclass(frozen=True)
class VQ3QuantConfig:
    """VQ3: GPTVQ-style 2-D vector quantisation, a 64-entry codebook per group (docs/method.md, Quantisation).

    A *group* is a rectangle of ``group_rows`` consecutive rows × ``group_cols`` consecutive columns of
    the row matrix; it is derived from the matrix (see ``vq.group_shape``): the row is cut into
    ``ceil(C / max_group_cols)`` equal even-width strips and ``group_rows = round(group_size /
    group_cols)``, so one group holds ≈ ``group_size`` weights and the codebook (64 × 2 int8 + one fp16
    scale = 1040 bits, or 64 × 2 fp16 = 2048 bits) costs ≈ 1040/8192 ≈ 0.127 bits per weight.

    Fitting: weighted k-means (``init``: ``"kmeans++"`` or ``"grid"``, an 8 × 8 product of per-dimension
    quantiles), ``n_iter`` Lloyd iterations (the default, k-means++ init, as the SQNR of SmolLM2's MLP
    chose: benchmarks/results/quant-smollm2.md, "VQ3 fitting"), vectorised over ``batch_groups`` groups
    at a time.

    Calibration (``calib.py``; used when calibration tokens are given, as by ``dipdeploy quantize``):
    ``hessian`` names the statistics that weight each row's error in the centroid updates: ``"dense"``
    E[x_r²] of the unpruned model, ``"dip"`` E[x_r² · 1(r selected)] under a uniform DIP plan of density
    ``hessian_density`` (the rows DIP keeps), ``"none"`` unweighted. ``error_feedback``: GPTVQ-style: the
    codebooks of a band of ``group_rows`` rows are fitted on the current (already corrected) rows, weighted
    by 1/[H⁻¹]ᵢᵢ², then the rows are assigned one by one and each row's error is spread over the rows not
    yet quantised (``gptq.py``), through the full H of the same statistics. Under DIP on SmolLM2, feedback
    with ``"dense"`` measured best, so the commands, which always have calibration text (``quantize``,
    ``eval --quant``, ``export --quant``), turn it on (:data:`CALIBRATED_FEEDBACK`,
    :func:`calibrated_config`); the dataclass keeps it off because the numpy quantiser cannot run it
    without a Hessian (preset ``vq3-gptq`` turns it on there). Without feedback
    ``"dense"`` measured best, ``"dip"`` a close second and plain k-means far behind
    (benchmarks/results/quant-smollm2.md, "Calibrated VQ3"); with ``"dip"``, set ``hessian_density`` to
    the density the model is deployed at (the measurement did).
    """

    group_size: int = 8192
    max_group_cols: int = 256
    n_iter: int = 8
    init: str = "kmeans++"
    codebook_dtype: str = "int8"
    batch_groups: int = 64
    seed: int = 0
    error_feedback: bool = False
    damp: float = 0.01
    hessian: str = "dense"
    hessian_density: float = 0.5
    dim: ClassVar[int] = 2
    n_centroids: ClassVar[int] = 64
    index_bits: ClassVar[int] = 6  # per 2-D vector: 3 bits per weight

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _check_choice(owner, "init", self.init, ("kmeans++", "grid"))
        _check_choice(owner, "codebook_dtype", self.codebook_dtype, ("int8", "float16"))
        for name, lo, hi in (("group_size", 256, 1 << 20), ("max_group_cols", 2, 1 << 16),
                             ("n_iter", 0, 1000), ("batch_groups", 1, 1 << 16)):
            value = getattr(self, name)
            if not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"{owner}.{name}={value!r} must be an int in [{lo}, {hi}]")
        _check_damp(owner, self.damp)
        _check_choice(owner, "error_feedback", self.error_feedback, (True, False))
        _check_choice(owner, "hessian", self.hessian, ("none", "dense", "dip"))
        if not isinstance(self.hessian_density, (int, float)) or not 0 < self.hessian_density <= 1:
            raise ValueError(f"{owner}.hessian_density={self.hessian_density!r} must be a number in (0, 1]")
        if self.error_feedback and self.hessian == "none":
            raise ValueError(f"{owner}: error_feedback=True spreads errors through a Hessian; "
                             "set hessian='dense' or 'dip' (or error_feedback=False)")
        if self.max_group_cols % 2:
            raise ValueError(f"{owner}.max_group_cols={self.max_group_cols} must be even (2-D vectors)")

    def statistics(self) -> str | None:
        """The calibration statistics the quantiser uses (``calib.STATISTICS``), None for none."""
        return None if self.hessian == "none" else self.hessian

    def codebook_bits(self) -> int:
        """Bits of one group's codebook: 64 × 2 int8 + an fp16 scale, or 64 × 2 fp16."""
        per_entry = 8 if self.codebook_dtype == "int8" else 16
        scale = 16 if self.codebook_dtype == "int8" else 0
        return self.n_centroids * self.dim * per_entry + scale

    def bits_per_weight(self) -> float:
        """Nominal bits per weight for groups of exactly ``group_size`` weights."""
        return self.index_bits / self.dim + self.codebook_bits() / self.group_size


QuantConfig = Block4QuantConfig | RTN3QuantConfig | VQ3QuantConfig
#: The formats of the dense weights (attention, lm_head): :func:`dense_config`.
DenseConfig = Block4QuantConfig | Block8QuantConfig


def config_to_dict(cfg: QuantConfig) -> dict:
    """JSON-ready dict: ``{"type": <class name>, "version": 1, <fields>}``."""
    return {"type": type(cfg).__name__, "version": CONFIG_VERSION, **dataclasses.asdict(cfg)}


def config_from_dict(data: dict) -> QuantConfig:
    """Inverse of :func:`config_to_dict`; rejects unknown types, versions and fields."""
    data = dict(data)
    type_name, version = data.pop("type", None), data.pop("version", None)
    if type_name not in _CONFIG_TYPES:
        raise ValueError(f"unknown quant config type {type_name!r}; known: {sorted(_CONFIG_TYPES)}")
    if version != CONFIG_VERSION:
        raise ValueError(
            f"quant config version {version!r} not supported (this dipdeploy reads {CONFIG_VERSION}); "
            "re-run `dipdeploy quantize` to regenerate the file"
        )
    cls = _CONFIG_TYPES[type_name]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{type_name}: unknown fields {sorted(unknown)}; fields are {sorted(names)}")
    return cls(**data)


#: CLI names of the formats; each maps to a config (defaults come from the dataclasses above).
QUANT_PRESETS: dict[str, tuple[type, dict]] = {
    "bq4": (Block4QuantConfig, {}),
    "bq4-b32": (Block4QuantConfig, {"block_size": 32}),
    "bq4-b64": (Block4QuantConfig, {"block_size": 64}),
    "bq4-b128": (Block4QuantConfig, {"block_size": 128}),
    # asymmetric blocks of 32: a re-quantised 4-bit GGUF loses least in the row layout
    # (benchmarks/results/accuracy-qwen2.5-coder-1.5b.md, "The bundle's weight format")
    "bq4-a32": (Block4QuantConfig, {"block_size": 32, "symmetric": False}),
    "vq3": (VQ3QuantConfig, {}),
    "rtn3": (RTN3QuantConfig, {}),
    "rtn3-b96": (RTN3QuantConfig, {"block_size": 96}),
    "rtn3-b192": (RTN3QuantConfig, {"block_size": 192}),
    "bq4-b64-gptq": (Block4QuantConfig, {"block_size": 64, "error_feedback": True}),
    "vq3-gptq": (VQ3QuantConfig, {"error_feedback": True}),
    "rtn3-b96-gptq": (RTN3QuantConfig, {"block_size": 96, "error_feedback": True}),
}


def quant_config_from_name(name: str, **overrides: Any) -> QuantConfig:
    """Map a CLI name (a key of ``QUANT_PRESETS``: ``bq4``, ``bq4-b32``, ``vq3``, ``rtn3``…) to its config."""
    if name not in QUANT_PRESETS:
        raise ValueError(f"--quant {name!r} unknown; choose one of {', '.join(QUANT_PRESETS)}")
    cls, preset = QUANT_PRESETS[name]
    return cls(**{**preset, **overrides})


def dense_config(mlp: QuantConfig, bits: int = 4) -> DenseConfig:
    """The format of an attention or lm_head weight beside the MLP format ``mlp``, at ``bits`` (4 or 8,
    chosen per weight by ``dense.DenseBits``): blocks along each weight's input dimension, which is what
    ``com.microsoft::MatMulNBits`` reads. At 4 bits, the MLP's own config when it is BQ4 (round-to-nearest:
    no calibration for these), else the default BQ4; at 8 bits, :class:`Block8QuantConfig`. Export and
    ``eval --quant-scope all`` both quantise through it (``api.quantize_dense``), so eval measures the
    weights a bundle ships (docs/bundle.md)."""
    if bits == 8:
        return Block8QuantConfig()
    if bits != 4:
        raise ValueError(f"dense weights have 4 or 8 bits, not {bits!r}")
    if isinstance(mlp, Block4QuantConfig):
        return dataclasses.replace(mlp, error_feedback=False)
    return Block4QuantConfig()


def embedding_config(mlp: QuantConfig) -> Block4QuantConfig:
    """The int4 token embedding's format beside the MLP format ``mlp``: :func:`dense_config`'s 4-bit blocks,
    always symmetric, since ``com.microsoft::GatherBlockQuantized`` rows and the host's embedding reader
    (``runtime/embedding.py``) take no zero points; a tied lm_head reads the same blocks."""
    return dataclasses.replace(dense_config(mlp, 4), symmetric=True)


#: Error feedback in the VQ3 of the commands that calibrate (``quantize``, ``eval --quant``, ``export
#: --quant``; ``--vq-feedback/--no-vq-feedback``) over the dataclass's ``hessian``: the measured best under
#: DIP at equal MLP bytes per token (benchmarks/results/quant-smollm2.md, "Calibrated VQ3").
CALIBRATED_FEEDBACK = True


def calibrated_config(name: str, *, hessian: str | None = None, feedback: bool | None = None,
                      density: float | None = None) -> QuantConfig:
    """The config of ``--quant NAME`` in a command that has calibration text, with ``--vq-hessian``,
    ``--vq-feedback`` and ``--vq-density`` (None: not given). The one mapping ``quantize``, ``eval`` and
    ``export`` share, so the same flags fit the same VQ3 everywhere: unless told, feedback follows
    :data:`CALIBRATED_FEEDBACK` where there are statistics to spread errors through (``--vq-hessian none``
    alone is plain k-means). Options that do not apply are refused, naming the fix."""
    if name not in QUANT_PRESETS:
        raise ValueError(f"--quant {name!r} unknown; choose one of {', '.join(QUANT_PRESETS)}")
    cls, preset = QUANT_PRESETS[name]
    given = {k: v for k, v in (("hessian", hessian), ("error_feedback", feedback), ("hessian_density", density))
             if v is not None}
    if cls is not VQ3QuantConfig:
        if given:
            raise ValueError(f"--vq-hessian / --vq-feedback / --vq-density apply to vq3 formats, not {name!r}; "
                             "drop them or use --quant vq3")
        return quant_config_from_name(name)
    kind = given.get("hessian", preset.get("hessian", VQ3QuantConfig.hessian))
    if kind == "none" and given.get("error_feedback"):
        raise ValueError("--vq-feedback spreads each row's error through the calibration Hessian, which "
                         "--vq-hessian none does not compute; drop --vq-feedback or pass --vq-hessian dense")
    if density is not None and kind != "dip":
        raise ValueError(f"--vq-density is the DIP density whose selections weight the rows; it applies to "
                         f"--vq-hessian dip, not {kind!r}; drop it or pass --vq-hessian dip")
    if "error_feedback" not in given and "error_feedback" not in preset:
        given["error_feedback"] = CALIBRATED_FEEDBACK and kind != "none"
    return quant_config_from_name(name, **given)
