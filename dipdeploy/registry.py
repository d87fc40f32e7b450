"""The model registry: one declarative TOML file per model in the top-level ``models/`` folder.

The registry is data (docs/design.md §6): a file names the HF id, the architecture, the MLP layout and the
shapes, plus the per-model defaults of the sparsity stage. Lookup is by exact name; an unknown name
raises an error that lists what is known. Floor 1: no torch.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

#: Architectures with a SwiGLU MLP that the sparse methods understand, by HF class name.
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Phi3ForCausalLM",
    "Qwen2ForCausalLM",
)
MLP_LAYOUTS = ("split", "fused_gate_up")


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def mlp_params_per_layer(self) -> int:
        """Weights of one SwiGLU MLP: W_u, W_g ∈ R^{F×d} and W_d ∈ R^{d×F}."""
        return 3 * self.hidden_size * self.intermediate_size

    def non_mlp_params(self) -> int:
        """Attention, norms, embeddings and lm_head: what the simulator places in DRAM first."""
        d, L = self.hidden_size, self.num_hidden_layers
        kv = self.num_key_value_heads * self.head_dim
        attn = d * d * 2 + d * kv * 2  # q, o and k, v
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return L * (attn + 2 * d) + emb + d


@dataclass(frozen=True)
class ModelDefaults:
    density: float = 0.5
    rho_in: float = 0.55


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str
    mlp_layout: str
    shape: ModelShape
    defaults: ModelDefaults = field(default_factory=ModelDefaults)
    hf_id: str | None = None
    source: dict | None = None  # e.g. {pypi, module, gguf} for a model shipped inside a wheel
    tiny: dict | None = None  # {seed}: built locally, randomly initialised
    note: str = ""

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"model {self.name!r}: architecture {self.architecture!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.mlp_layout not in MLP_LAYOUTS:
            raise ValueError(f"model {self.name!r}: mlp_layout {self.mlp_layout!r} not in {MLP_LAYOUTS}")

    @property
    def is_tiny(self) -> bool:
        return self.tiny is not None


def models_dir() -> Path:
    """The registry folder: ``$DIPDEPLOY_MODELS`` if set, else ``models/`` beside the package."""
    env = os.environ.get("DIPDEPLOY_MODELS")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "models"


def _parse(path: Path) -> ModelSpec:
    raw = tomllib.loads(path.read_text())
    return ModelSpec(
        name=raw["name"],
        architecture=raw["architecture"],
        mlp_layout=raw.get("mlp_layout", "split"),
        shape=ModelShape(**raw["shape"]),
        defaults=ModelDefaults(**raw.get("defaults", {})),
        hf_id=raw.get("hf_id"),
        source=raw.get("source"),
        tiny=raw.get("tiny"),
        note=raw.get("note", ""),
    )


def list_models() -> list[ModelSpec]:
    folder = models_dir()
    if not folder.is_dir():
        raise FileNotFoundError(f"model registry folder {folder} not found; set DIPDEPLOY_MODELS to it")
    return [_parse(p) for p in sorted(folder.glob("*.toml"))]


def get_model(name: str) -> ModelSpec:
    path = models_dir() / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(m.name for m in list_models())
        raise KeyError(f"unknown model {name!r}; registry names: {known} (or pass a local HF dir / .gguf)")
    return _parse(path)


def is_registered(name: str) -> bool:
    return (models_dir() / f"{name}.toml").is_file()
