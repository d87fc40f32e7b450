"""The model registry: one declarative TOML file per model in ``dipdeploy/models/`` (shipped in the wheel).

The registry is data (docs/design.md §6): a file names the HF id, the architecture (its family record in
:mod:`dipdeploy.arch` gives the MLP layout, the head_dim rule and everything else about the family), the
shapes, extra HF config entries of a tiny model (``[config]``), plus the per-model defaults of the sparsity
stage. ``$DIPDEPLOY_MODELS`` names further folders (``os.pathsep``-separated), searched before the shipped
one. Lookup is by exact name; an unknown name raises an error that lists what is known. Floor 1: no torch.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from dipdeploy.arch import Arch, ArchitectureError, get_arch
from dipdeploy.limits import MAX_LAYERS, MAX_WIDTH

#: The folder of the shipped registry, inside the package (``package-data`` in pyproject.toml covers it).
PACKAGED_MODELS = Path(__file__).resolve().parent / "models"


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
    head_dim: int = 0  # from the family's rule (``Arch.head_dim``), never assumed to be d / heads

    def __post_init__(self) -> None:
        for name, cap in (("hidden_size", MAX_WIDTH), ("intermediate_size", MAX_WIDTH),
                          ("num_hidden_layers", MAX_LAYERS), ("num_attention_heads", MAX_WIDTH),
                          ("num_key_value_heads", MAX_WIDTH), ("vocab_size", MAX_WIDTH),
                          ("max_position_embeddings", MAX_WIDTH)):
            value = getattr(self, name)  # every count sizes a table, a loop or a simulated layer
            if type(value) is not int or not 1 <= value <= cap:
                raise ValueError(f"model shape {name} {value!r} is not a whole number in [1, {cap}] (the cap); "
                                 "fix the registry file")
        if self.head_dim <= 0:
            raise ValueError("ModelShape needs head_dim: take it from the family record, "
                             "dipdeploy.arch.get_arch(architecture).head_dim(shape)")

    def mlp_params_per_layer(self) -> int:
        """Weights of one gated MLP: W_u, W_g ∈ R^{F×d} and W_d ∈ R^{d×F}."""
        return 3 * self.hidden_size * self.intermediate_size

    def non_mlp_params(self) -> int:
        """Attention, norms, embeddings and lm_head: what the simulator places in DRAM first."""
        d, L = self.hidden_size, self.num_hidden_layers
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attn = d * q * 2 + d * kv * 2  # q, o and k, v
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return L * (attn + 2 * d) + emb + d


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str
    shape: ModelShape
    hf_id: str | None = None
    source: dict | None = None  # {pypi, module, gguf[, chunks]} for a model shipped inside a wheel (or chunk wheels)
    tiny: dict | None = None  # {seed}: built locally, randomly initialised
    config: dict = field(default_factory=dict)  # extra HF config entries of a tiny model (rope_parameters, …)
    note: str = ""

    @property
    def arch(self) -> Arch:
        return get_arch(self.architecture)

    @property
    def mlp_layout(self) -> str:
        return self.arch.mlp_layout

    @property
    def is_tiny(self) -> bool:
        return self.tiny is not None


def models_dirs() -> list[Path]:
    """Where registry files are looked up, in order: ``$DIPDEPLOY_MODELS`` folders, then the shipped one."""
    extra = [Path(p) for p in os.environ.get("DIPDEPLOY_MODELS", "").split(os.pathsep) if p]
    return [*extra, PACKAGED_MODELS]


def _parse(path: Path) -> ModelSpec:
    raw = tomllib.loads(path.read_text())
    try:
        arch = get_arch(raw["architecture"])
        if "mlp_layout" in raw:
            raise ArchitectureError(f"mlp_layout is the family record's ({arch.name}: {arch.mlp_layout}); "
                                    f"remove it from the file")
        shape = {"tie_word_embeddings": arch.tied_head_default, **raw["shape"]}
        shape["head_dim"] = arch.head_dim(shape)
    except ArchitectureError as err:
        raise ValueError(f"{path}: {err}") from err
    return ModelSpec(
        name=raw["name"],
        architecture=raw["architecture"],
        shape=ModelShape(**shape),
        hf_id=raw.get("hf_id"),
        source=raw.get("source"),
        tiny=raw.get("tiny"),
        config=raw.get("config", {}),
        note=raw.get("note", ""),
    )


def _path(name: str) -> Path | None:
    return next((d / f"{name}.toml" for d in models_dirs() if (d / f"{name}.toml").is_file()), None)


def list_models() -> list[ModelSpec]:
    names = sorted({p.stem for d in models_dirs() if d.is_dir() for p in d.glob("*.toml")})
    return [_parse(_path(n)) for n in names]


def get_model(name: str) -> ModelSpec:
    path = _path(name)
    if path is None:
        known = ", ".join(m.name for m in list_models())
        raise KeyError(f"unknown model {name!r}; registry names: {known} (or pass a local HF dir / .gguf)")
    return _parse(path)


def is_registered(name: str) -> bool:
    return _path(name) is not None
