"""What the graph builder needs to know about a decoder: its family record plus the numbers of its
``config.json`` (torch-free).

Every family-level fact comes from the record (``dipdeploy.arch``); this module only resolves them for
one checkpoint and refuses, with the reason, what the graphs do not build (dipdeploy/export/DESIGN.md,
"How to add a model family"). The block is: [norm] → GQA attention with RoPE (optional per-head q/k
norms) → [norm] → ×residual multiplier → residual → [norm] → gated MLP → [norm] → ×multiplier → residual.
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

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def window(self, layer_type: str) -> int | None:
        return self.sliding_window if layer_type == "sliding_attention" else None

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
        )


def _refusal(arch: Arch, config: dict) -> str:
    """Why the graphs cannot express this checkpoint, or "" (they can)."""
    if arch.export_refusal:
        return arch.export_refusal
    if any(cap is not None for cap in arch.softcaps(config)):
        return ("soft-capping (attn_logit_softcapping / final_logit_softcapping) is not built by the graphs; "
                "set them to null in config.json only if the checkpoint was trained without them")
    return ""
