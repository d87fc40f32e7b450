"""The record of one architecture family: every fact about it that any stage needs, in one place.

A family is registered by its Hugging Face class name (``config.architectures[0]``). Loading, the
sparse methods, fake quantisation, LoRA, the registry, the simulator and the ONNX export all read the
record; none keeps its own table (docs/contributing/family.md). Values
that differ between checkpoints of one family (head_dim, multipliers, RoPE scaling, the sliding
window) are read from the checkpoint's ``config.json`` by the record's methods, so the rule lives here
and the number lives in the config. Floor 1: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

#: The gated MLP's activation, by our name → the ``hidden_act`` spellings of HF configs meaning it.
ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "silu": ("silu", "swish"),
    "gelu_tanh": ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new"),
}
HEAD_DIM_RULES = ("config", "ratio")
EMBEDDING_SCALES = ("none", "sqrt_hidden", "config")
ROPE_KINDS = ("config", "per_layer_type")
QK_NORM_SPANS = ("head", "projection")
SLIDING_WINDOWS = ("none", "all", "layer_types", "config")


class ArchitectureError(ValueError):
    """A model whose architecture DIP or this build cannot handle; the message says why and what to do."""


def config_dict(config: Any) -> dict:
    """A config as a plain dict, whether an HF ``PretrainedConfig`` or already a mapping."""
    return dict(config) if isinstance(config, Mapping) else config.to_dict()


@dataclass(frozen=True)
class MlpModules:
    """Module names of the gated MLP inside ``layers[i].mlp``. ``gate_up`` set: one fused matrix
    [2F, d] whose first F output rows are the gate and last F the up projection (Phi-3)."""

    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    gate_up: str | None = None


@dataclass(frozen=True)
class AttnModules:
    """Module names inside ``layers[i].self_attn``. ``qkv`` set: one fused [q; k; v] matrix (Phi-3).
    ``q_norm``/``k_norm`` set: an RMSNorm of q and k before RoPE (over each head or the whole
    projection: ``Arch.qk_norm_span``)."""

    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    o: str = "o_proj"
    qkv: str | None = None
    q_norm: str | None = None
    k_norm: str | None = None

    @property
    def projections(self) -> tuple[str, ...]:
        return (self.qkv, self.o) if self.qkv else (self.q, self.k, self.v, self.o)


@dataclass(frozen=True)
class NormModules:
    """Norm names inside ``layers[i]`` (and the final one in ``model.model``). ``attn_out``/``mlp_out``
    set: a norm on the sub-layer's output before its residual add (Gemma's sandwich norms); ``attn_in``/
    ``mlp_in`` None: no norm before the sub-layer (OLMo2 normalises outputs only)."""

    attn_in: str | None = "input_layernorm"
    mlp_in: str | None = "post_attention_layernorm"
    attn_out: str | None = None
    mlp_out: str | None = None
    final: str = "norm"


@dataclass(frozen=True)
class Arch:
    """One decoder family with a gated MLP (GLU), as DIP prunes it (docs/method.md).

    ``name``: the HF class name it is registered by; ``model_type``: the HF config's ``model_type``
    (what ``AutoConfig.for_model`` builds tiny models from); ``genai_type``: onnxruntime-genai's
    ``model.type`` in ``genai_config.json`` (empty when there is none). ``export_refusal``: empty when the ONNX export builds this
    family's block, else the one-line reason it does not (evaluation still runs in torch).
    """

    name: str
    model_type: str
    genai_type: str = ""
    activation: str = "silu"
    head_dim_rule: str = "ratio"  # "config": an explicit head_dim (Qwen3, Gemma); "ratio": d / heads
    qkv_bias: bool = False  # q/k/v always carry a bias (Qwen2); else config.attention_bias says
    norm_offset: float = 0.0  # RMSNorm scales by (offset + w): 1.0 for Gemma
    embedding_scale: str = "none"  # "sqrt_hidden": × √d (Gemma); "config": × embedding_multiplier (Granite)
    multipliers: bool = False  # Granite: residual_multiplier, attention_multiplier, logits_scaling
    softcapping: bool = False  # configs may set attn_logit_softcapping / final_logit_softcapping
    rope: str = "config"  # "config": one table from rope_parameters (default, llama3, …); "per_layer_type"
    sliding_window: str = "none"  # "all": every layer when config.sliding_window is set; "layer_types";
    # "config": config.layer_types when config.use_sliding_window is on (Qwen2/3, SmolLM3 switches)
    qk_norm_span: str = "head"  # q/k norms (attn.q_norm set) over each head's Dh, or the whole projection (OLMo2)
    nope_layers: bool = False  # some layers use no RoPE: config.no_rope_layers[i] == 0 (SmolLM3)
    tied_head_default: bool = False
    mlp: MlpModules = field(default_factory=MlpModules)
    attn: AttnModules = field(default_factory=AttnModules)
    norms: NormModules = field(default_factory=NormModules)
    tokenizer_note: str = ""
    export_refusal: str = ""

    def __post_init__(self) -> None:
        for value, allowed, what in ((self.activation, tuple(ACTIVATIONS), "activation"),
                                     (self.head_dim_rule, HEAD_DIM_RULES, "head_dim_rule"),
                                     (self.embedding_scale, EMBEDDING_SCALES, "embedding_scale"),
                                     (self.rope, ROPE_KINDS, "rope"),
                                     (self.qk_norm_span, QK_NORM_SPANS, "qk_norm_span"),
                                     (self.sliding_window, SLIDING_WINDOWS, "sliding_window")):
            if value not in allowed:
                raise ValueError(f"architecture record {self.name}: {what}={value!r} not in {allowed}")

    # -- what the record says about the family ------------------------------------------------------
    @property
    def mlp_layout(self) -> str:
        """``fused_gate_up`` (one [2F, d] matrix) or ``split`` (gate, up, down)."""
        return "fused_gate_up" if self.mlp.gate_up else "split"

    def lora_modules(self, role: str) -> tuple[str, ...]:
        """peft target module names of a role (up, gate, down, attn). With a fused gate_up, up and
        gate share one matrix, so either role adapts both."""
        m = self.mlp
        roles = {"up": (m.gate_up or m.up,), "gate": (m.gate_up or m.gate,), "down": (m.down,),
                 "attn": self.attn.projections}
        return roles[role]

    # -- what a checkpoint's config adds ------------------------------------------------------------
    def check(self, config: Any) -> None:
        """Raise :class:`ArchitectureError` when this checkpoint's config leaves the family's rules."""
        c = config_dict(config)
        act = c.get("hidden_act") or c.get("hidden_activation") or ACTIVATIONS[self.activation][0]
        if act not in ACTIVATIONS[self.activation]:
            raise ArchitectureError(
                f"{self.name}: hidden_act={act!r}, but this family's gated MLP uses {self.activation} "
                f"({', '.join(ACTIVATIONS[self.activation])}); fix config.json or register a family record")

    def head_dim(self, config: Any) -> int:
        """Per-head width: the config's ``head_dim`` (Qwen3 and Gemma set one ≠ d / heads), else d / heads
        (what every HF attention module does: ``getattr(config, "head_dim", d // heads)``)."""
        c = config_dict(config)
        explicit = c.get("head_dim")
        if self.head_dim_rule == "config" and not explicit:
            raise ArchitectureError(f"{self.name}: config has no head_dim; this family states it explicitly "
                                    f"(add head_dim to the config / the registry shape)")
        return int(explicit or c["hidden_size"] // c["num_attention_heads"])

    def attention_bias(self, config: Any) -> bool:
        """Whether q/k/v carry a bias: always for Qwen2, else as ``config.attention_bias`` says (Llama,
        Qwen3 and Granite configs have that switch, off by default)."""
        return self.qkv_bias or bool(config_dict(config).get("attention_bias", False))

    def embedding_multiplier(self, config: Any) -> float:
        c = config_dict(config)
        if self.embedding_scale == "sqrt_hidden":
            return float(c["hidden_size"]) ** 0.5
        if self.embedding_scale == "config":
            return float(c.get("embedding_multiplier", 1.0))
        return 1.0

    def residual_multiplier(self, config: Any) -> float:
        return float(config_dict(config).get("residual_multiplier", 1.0)) if self.multipliers else 1.0

    def attention_scale(self, config: Any) -> float:
        """The factor on q·kᵀ: Granite's attention_multiplier, Gemma's query_pre_attn_scalar^-½, else Dh^-½."""
        c = config_dict(config)
        if self.multipliers:
            return float(c.get("attention_multiplier", 1.0))
        if c.get("query_pre_attn_scalar"):
            return float(c["query_pre_attn_scalar"]) ** -0.5
        return float(self.head_dim(c)) ** -0.5

    def logits_multiplier(self, config: Any) -> float:
        """Granite divides the logits by logits_scaling."""
        return 1.0 / float(config_dict(config).get("logits_scaling", 1.0)) if self.multipliers else 1.0

    def softcaps(self, config: Any) -> tuple[float | None, float | None]:
        """(attention, final logit) soft-capping values, None when off."""
        if not self.softcapping:
            return None, None
        c = config_dict(config)
        return c.get("attn_logit_softcapping"), c.get("final_logit_softcapping")

    def layer_types(self, config: Any) -> list[str]:
        """Per layer ``full_attention`` or ``sliding_attention`` (what HF's ``config.layer_types`` says)."""
        c = config_dict(config)
        n = c["num_hidden_layers"]
        if self.sliding_window == "layer_types":
            return list(c.get("layer_types") or ["full_attention"] * n)
        if self.sliding_window == "config" and c.get("use_sliding_window") and c.get("layer_types"):
            return list(c["layer_types"])
        if self.sliding_window == "all" and c.get("sliding_window"):
            return ["sliding_attention"] * n
        return ["full_attention"] * n

    def rope_layers(self, config: Any) -> list[bool]:
        """Per layer, whether attention applies RoPE (SmolLM3 leaves it out where no_rope_layers[i] == 0)."""
        c = config_dict(config)
        flags = c.get("no_rope_layers") if self.nope_layers else None
        return [bool(f) for f in flags] if flags else [True] * c["num_hidden_layers"]

    def window(self, config: Any) -> int | None:
        """The sliding window in tokens, when any layer uses one."""
        c = config_dict(config)
        return c.get("sliding_window") if "sliding_attention" in self.layer_types(c) else None
