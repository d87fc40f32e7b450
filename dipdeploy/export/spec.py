"""What the graph builder needs to know about a decoder, read from the HF config (torch-free).

One small table per architecture says what differs (docs/design.md §6): whether q/k/v carry a bias (Qwen2),
whether q/k/v and gate/up come fused in the checkpoint (Phi-3). Everything else is the same Llama-style
block: RMSNorm → GQA attention with RoPE → residual → RMSNorm → SwiGLU MLP → residual.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """What one HF architecture does differently from Llama."""

    qkv_bias: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    sliding_window: bool = False


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family(),
    "MistralForCausalLM": Family(sliding_window=True),
    "Qwen2ForCausalLM": Family(qkv_bias=True),
    "Phi3ForCausalLM": Family(fused_qkv=True, fused_gate_up=True),
}


@dataclass(frozen=True)
class ArchSpec:
    """Shapes and switches of one decoder, from its ``config.json``."""

    architecture: str
    family: Family
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
    sliding_window: int | None = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_config(cls, config: dict) -> "ArchSpec":
        archs = config.get("architectures") or []
        arch = archs[0] if archs else ""
        if arch not in FAMILIES:
            raise ValueError(
                f"architecture {arch!r} cannot be exported; supported: {', '.join(FAMILIES)}"
            )
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={config.get('hidden_act')!r}: only SwiGLU (silu) MLPs are exported")
        family = FAMILIES[arch]
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        window = config.get("sliding_window") if family.sliding_window else None
        return cls(
            architecture=arch, family=family, hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"], num_layers=config["num_hidden_layers"],
            num_heads=heads, num_kv_heads=config.get("num_key_value_heads") or heads, head_dim=head_dim,
            vocab_size=config["vocab_size"], rms_norm_eps=float(config["rms_norm_eps"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=int(config.get("max_position_embeddings", 4096)), sliding_window=window,
        )
