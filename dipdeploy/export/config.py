"""The export stage's one config: :class:`ExportConfig` (defaults defined here and only here).

The CLI builds it from flags it was given (absent flags fall back to these defaults), so no default is
written twice (docs/design.md §1). Validation names the field, the bad value and the allowed values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dipdeploy import defaults
from dipdeploy.bundle.names import ATTENTION_LAYOUTS
from dipdeploy.flash import BLOCK
from dipdeploy.limits import MAX_THREADS, MAX_TOKENS, MAX_WINDOWS, check_caps
from dipdeploy.ops.formats import format_of_config
from dipdeploy.ops.schemas import BUNDLE_ACCURACY_LEVELS
from dipdeploy.quant.config import QUANT_PRESETS
from dipdeploy.sparsity.plan import PREDICTOR_EVAL_ONLY, SparsityConfig
from dipdeploy.torchdevice import DEFAULT_DEVICE, DEVICES

#: Methods the exported graph can run. Other plan methods (glu, gate, up, cats, teal) have no
#: TopKColumnMask form in this bundle format and are refused by name.
EXPORT_METHODS = ("dense", "dip", "dip-ca")
#: MLP weight formats of the bundle (``none`` = fp32 rows): the quant presets that pack an op format
#: (``ops.formats.FORMATS``), without the ``-gptq`` ones (export fits VQ3 by ``vq_feedback``).
EXPORT_QUANTS = ("none", *(name for name, (cls, preset) in QUANT_PRESETS.items()
                           if format_of_config(cls) is not None and not preset.get("error_feedback")))
#: Accuracy levels of a bundle (0 = fp32 compute, 4 = int8 activations; docs/onnxruntime.md).
ACCURACY_LEVELS = BUNDLE_ACCURACY_LEVELS
#: Where every tensor of a bundle's weight files starts: a multiple of the Flash block, or of 16 blocks.
ALIGNMENTS = (BLOCK, 16 * BLOCK)
#: ``standard``: attention in opset-21 ops (runs on any ORT); ``gqa``: com.microsoft::GroupQueryAttention.
ATTENTION_OPS = ATTENTION_LAYOUTS
#: Where each MLP row lies in ``mlp.bin`` (docs/method.md, "Flash layout"): ``calibrated`` orders each
#: group's rows from a miss trace of the calibration text so rows read together share blocks; ``natural``
#: keeps the logical order; ``auto`` is calibrated where the export can trace (a sparse plan, per-layer
#: graphs, the whole model and the calibration text at hand), natural elsewhere, the manifest says which.
#: The default is natural: on held-out text the calibrated order saves a few percent of the device bytes
#: for a much longer export (docs/bundle.md, "Row order"; benchmarks/results/row_order.md), and the
#: Android engine reads natural bundles only.
ROW_ORDERS = ("auto", "calibrated", "natural")


@dataclass
class ExportConfig:
    """What ``dipdeploy export`` builds.

    ``density``/``rho_in``/``gamma`` only matter when no ``plan`` is given (they make one).
    ``accuracy_level`` applies when quantising, to the MatMulNBits of attention and lm_head and to the
    BQ4 SparseGatherMatMul of the MLP: 0 keeps fp32 arithmetic, so the bundle matches the fake-quant
    torch reference to float rounding; 4 computes with int8 activations/coefficients (for x86 with
    AVX2 or VNNI: benchmarks/results/level4.md), validated through its level-0 twin and measured against the reference.
    ``fuse_norms``: each residual add and the RMSNorm after it as one
    com.microsoft::SkipSimplifiedLayerNormalization in ``model.onnx`` (as onnxruntime-genai emits;
    360 fewer nodes on SmolLM2); False writes them as standard ops in torch's order.
    ``max_length``: the positions the graphs cover (RoPE tables, genai_config's context_length), capped at
    the model's max_position_embeddings; a longrope model (Phi-3.5, Phi-4-mini) is refused beyond its
    original_max_position_embeddings (``spec.ArchSpec.context_length``).
    ``dense_bits``: the bits of the attention and lm_head weights when quantising (``quant.dense``):
    ``auto`` keeps a GGUF source's precision (8 bits where the file stores a tensor with more than 4.5
    bits per weight, 4 elsewhere and for a source that is not a quantised GGUF), ``4`` or ``8`` for every one.
    An 8-bit lm_head is stored apart from an int4 embedding it was tied to.
    ``embedding``: ``int4`` stores the token embedding in the BQ4 blocks of the dense weights (read
    through com.microsoft::GatherBlockQuantized; a tied lm_head shares the same blocks) whenever
    ``quant`` quantises; ``fp32`` keeps the table as the checkpoint has it. Without ``quant`` it is fp32.
    ``stream``: read the weights one decoder layer at a time from the safetensors checkpoint (peak
    memory ≈ one fp32 layer plus the embedding and, while calibrating, the calibration activations);
    None = when the fp32 model would take more than half of the available memory. A streamed export
    calibrates layer by layer (``dipdeploy.sparsity.streamed``) and merges ``lora`` as each layer is read
    (``prepare.stream_lora``), giving the eager export's bundle; it skips the validation against torch
    (which needs the whole model). ``device``: where calibration runs (``auto``: cuda when torch sees
    one); the bundle's weights are read and quantised on the CPU either way. ``row_order``: see ``ROW_ORDERS``.
    ``calib_windows``/``calib_seqlen``: the WikiText-2 validation text used when the split is
    calibrated, the same as ``eval``'s and ``calibrate``'s (``dipdeploy.defaults``), so an export
    without ``--plan`` runs the plan ``eval`` measured (``--calib-windows``/``--calib-seqlen`` for a longer
    calibration). ``stats_windows``: the windows of that text a calibrated VQ3's statistics are
    estimated on (``dipdeploy.defaults.STATS_WINDOWS``, as ``quantize`` and ``eval``). ``method``, ``density`` and ``gamma`` default to
    ``SparsityConfig``'s. ``vq_hessian``/``vq_feedback``/``vq_density``: how ``quant="vq3"`` is fitted
    (``quant.config.calibrated_config``, the mapping ``quantize`` and ``eval`` use; None: its default,
    Hessian-weighted k-means with error feedback from statistics of the same calibration text);
    ``vq_hessian="none"`` is plain k-means and needs no text.
    """

    model: str = defaults.MODEL
    method: str = SparsityConfig.method
    density: float = SparsityConfig.density
    rho_in: float | None = None
    gamma: float = SparsityConfig.gamma
    plan: str | None = None
    quant: str = "none"
    lora: str | None = None
    accuracy_level: int = 0
    attention: str = "standard"
    alignment: int = BLOCK
    max_length: int = 2048
    validate_tokens: int = 32
    prompt: str = "The capital of France is"
    calib_windows: int = defaults.CALIB_WINDOWS
    calib_seqlen: int = defaults.CALIB_SEQLEN
    stats_windows: int = defaults.STATS_WINDOWS
    per_layer: bool = True
    fuse_norms: bool = True
    embedding: str = defaults.EMBEDDING
    dense_bits: str = defaults.DENSE_BITS
    stream: bool | None = None
    device: str = DEFAULT_DEVICE
    threads: int = 1
    data_dir: str | None = None
    row_order: str = "natural"
    vq_hessian: str | None = None
    vq_feedback: bool | None = None
    vq_density: float | None = None

    def __post_init__(self) -> None:
        self.dense_bits = str(self.dense_bits)  # 4 and "4" alike
        if self.method == "predictor":
            raise ValueError(PREDICTOR_EVAL_ONLY)
        choices = {"method": EXPORT_METHODS, "quant": EXPORT_QUANTS, "accuracy_level": ACCURACY_LEVELS,
                   "alignment": ALIGNMENTS, "attention": ATTENTION_OPS, "embedding": defaults.EMBEDDINGS,
                   "dense_bits": defaults.DENSE_BITS_CHOICES,
                   "row_order": ROW_ORDERS, "device": DEVICES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"ExportConfig.{name}={getattr(self, name)!r} is not allowed; choose one of {allowed}")
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"ExportConfig.density={self.density!r} must lie in (0, 1]")
        if self.rho_in is not None and not 0.0 < self.rho_in <= 1.0:
            raise ValueError(f"ExportConfig.rho_in={self.rho_in!r} must lie in (0, 1] or be None (calibrate)")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"ExportConfig.gamma={self.gamma!r} must lie in [0, 1]")
        if self.row_order == "calibrated" and (self.method == "dense" or not self.per_layer):
            raise ValueError("ExportConfig.row_order='calibrated' needs a sparse method with per-layer graphs (the "
                             "only bundles the host runtime streams); pass --row-order natural")
        vq = (self.vq_hessian, self.vq_feedback, self.vq_density)
        if self.quant == "none" and any(v is not None for v in vq):
            raise ValueError("--vq-hessian / --vq-feedback / --vq-density fit the VQ3 of --quant vq3; add "
                             "--quant vq3 or drop them")
        if self.quant == "none" and self.dense_bits != defaults.DENSE_BITS:
            raise ValueError(f"--dense-bits {self.dense_bits} sets the bits of quantised attention and lm_head "
                             "weights; add --quant (e.g. --quant bq4) or drop --dense-bits")
        self.mlp_config()  # a bad vq option fails here, before any work
        for name, lo in (("max_length", 16), ("validate_tokens", 0), ("calib_windows", 1), ("calib_seqlen", 16),
                         ("stats_windows", 1),
                         ("threads", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < lo:
                raise ValueError(f"ExportConfig.{name}={value!r} must be an int >= {lo}")
        check_caps(*((f"--{name.replace('_', '-')}" if name != "threads" else "ExportConfig.threads", getattr(self, name),
                      cap, unit) for name, cap, unit in (
            ("max_length", MAX_TOKENS, "tokens"), ("validate_tokens", MAX_TOKENS, "tokens"),
            ("calib_windows", MAX_WINDOWS, "windows"), ("calib_seqlen", MAX_TOKENS, "tokens"),
            ("stats_windows", MAX_WINDOWS, "windows"), ("threads", MAX_THREADS, "threads"))))

    @property
    def quantised(self) -> bool:
        return self.quant != "none"

    def mlp_config(self):
        """The MLP's quant config (None unquantised), with the vq options applied."""
        from dipdeploy.quant.config import calibrated_config

        if self.quant == "none":
            return None
        return calibrated_config(self.quant, hessian=self.vq_hessian, feedback=self.vq_feedback,
                                 density=self.vq_density)

    def as_dict(self) -> dict:
        return asdict(self)
