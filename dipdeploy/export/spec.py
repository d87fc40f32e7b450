"""What the graph builder needs to know about a decoder: its family record plus the numbers of its
``config.json`` (torch-free).

Every family-level fact comes from the record (``dipdeploy.arch``); this module only resolves them for
one checkpoint and refuses, with the reason, what the graphs do not build (docs/contributing/
family.md). The block is: [norm] → GQA attention with RoPE (optional per-head q/k
norms, optional soft-capped scores) → [norm] → ×residual multiplier → residual → [norm] → gated MLP →
[norm] → ×multiplier → residual; the head may soft-cap its logits.
"""

from __future__ import annotations

from dataclasses import dataclass

from dipdeploy.arch import Arch, ArchitectureError, arch_of


@dataclass(frozen=True)
class ArchSpec:
    """Shapes and switches of one decoder, from its ``config.json`` and its family record."""

    architecture: str
    arch: Arch
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    layer_types: tuple[str, ...]  # per layer "full_attention" or "sliding_attention"
    rope_layers: tuple[bool, ...]  # per layer, whether attention applies RoPE (False: SmolLM3's NoPE layers)
    sliding_window: int | None = None
    attention_scale: float = 1.0
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_multiplier: float = 1.0
    attn_softcap: float | None = None  # scores = cap·tanh(scores / cap) before the mask (Gemma 2)
    final_softcap: float | None = None  # logits = cap·tanh(logits / cap)
    rotary_dim: int = 0  # dims of each head RoPE rotates: head_dim × partial_rotary_factor (Phi-4-mini: 3/4)
    longrope_limit: int | None = None  # longrope: positions its short factors cover (original_max_position_embeddings)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def window(self, layer_type: str) -> int | None:
        return self.sliding_window if layer_type == "sliding_attention" else None

    def check_export(self, max_length: int, attention: str) -> None:
        """Raise :class:`ArchitectureError` when an export's options ask what the graphs cannot build."""
        self.context_length(max_length)
        if attention == "gqa" and self.gqa_refusal():
            raise ArchitectureError(f"cannot export {self.architecture}: {self.gqa_refusal()}")

    def gqa_refusal(self) -> str:
        """Why com.microsoft::GroupQueryAttention cannot build this model's attention, or "": its rotary
        cos/sin cache must be a multiple of 8 dims wide (half the rotated dims; docs/onnxruntime.md)."""
        if any(self.rope_layers) and (self.rotary_dim // 2) % 8:
            return (f"attention='gqa' cannot rotate {self.rotary_dim} of {self.head_dim} dims per head "
                    f"(GroupQueryAttention needs half the rotated dims to be a multiple of 8); "
                    f"use --attention standard")
        return ""

    def context_length(self, max_length: int) -> int:
        """The positions the graphs' RoPE tables cover for an export asked for ``max_length``: at most
        max_position_embeddings. A longrope model (Phi-3.5/Phi-4-mini) uses its short factors up to
        original_max_position_embeddings and its long factors for the whole sequence beyond: one table
        cannot be both, so the graphs carry the short one and a longer context is refused."""
        length = min(max_length, self.max_position_embeddings)
        if self.longrope_limit is not None and length > self.longrope_limit:
            raise ArchitectureError(
                f"cannot export {self.architecture} with max_length {length}: its longrope RoPE switches to the "
                f"long factors beyond original_max_position_embeddings={self.longrope_limit}, which the graphs do "
                f"not build; pass --max-length {self.longrope_limit} or less")
        return length

    @classmethod
    def from_config(cls, config: dict) -> "ArchSpec":
        try:
            arch = arch_of(config)
        except ArchitectureError as err:
            raise ArchitectureError(f"cannot export: {err}") from err
        why = _refusal(arch, config)
        if why:
            raise ArchitectureError(f"cannot export {arch.name}: {why}")
        heads = config["num_attention_heads"]
        attn_cap, final_cap = arch.softcaps(config)
        return cls(
            architecture=arch.name, arch=arch, hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"], num_layers=config["num_hidden_layers"],
            num_heads=heads, num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=arch.head_dim(config), vocab_size=config["vocab_size"],
            rms_norm_eps=float(config["rms_norm_eps"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
            layer_types=tuple(arch.layer_types(config)), rope_layers=tuple(arch.rope_layers(config)),
            sliding_window=arch.window(config),
            attention_scale=arch.attention_scale(config), embedding_multiplier=arch.embedding_multiplier(config),
            residual_multiplier=arch.residual_multiplier(config), logits_multiplier=arch.logits_multiplier(config),
            attn_softcap=float(attn_cap) if attn_cap else None, final_softcap=float(final_cap) if final_cap else None,
            rotary_dim=int(arch.head_dim(config) * _partial_rotary_factor(config)),
            longrope_limit=_longrope_limit(config),
        )


def _refusal(arch: Arch, config: dict) -> str:
    """Why the graphs cannot express this checkpoint, or "" (they can)."""
    return arch.export_refusal


def _partial_rotary_factor(config: dict) -> float:
    """The fraction of each head RoPE rotates (Phi-4-mini 0.75; the rest passes through), from
    rope_parameters, where transformers puts it, else the config's top level."""
    rope = config.get("rope_parameters") or {}
    return float(rope.get("partial_rotary_factor") or config.get("partial_rotary_factor") or 1.0)


def _longrope_limit(config: dict) -> int | None:
    """original_max_position_embeddings of a longrope checkpoint (from rope_parameters, where
    transformers puts it, else the config's top level), None for any other RoPE."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type")) != "longrope":
        return None
    return int(rope.get("original_max_position_embeddings") or config["original_max_position_embeddings"])
