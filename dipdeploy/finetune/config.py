"""``LoraConfig``: what `dipdeploy finetune` trains (defaults are defined here only, docs/design.md §1)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

TARGETS = ("up", "gate", "down", "attn", "norms")
#: The roles LoRA adapts (the rest of TARGETS is trained whole: ``norms``).
PROJECTIONS = ("up", "gate", "down", "attn")
#: What the adapter is trained to do: ``lm``, next-token cross-entropy on the text; ``distill``, match the
#: dense base model's next-token distribution (KL(dense ‖ student), temperature 1) with the masks active.
OBJECTIVES = ("lm", "distill")
#: Training text other than a user file (dipdeploy/finetune/data.py); never the evaluation (test) split.
DATA = ("wikitext2-valid", "pydoc-topics", "dense-samples")
#: The text each objective trains on when none is named. Distillation must not see WikiText at all: its
#: gain would then mix recovery from pruning with domain adaptation to the evaluation text
#: (benchmarks/results/lora-smollm2.md, the control rows).
DEFAULT_DATA = {"lm": "wikitext2-valid", "distill": "pydoc-topics"}
SCHEDULERS = ("cosine", "linear", "constant")


@dataclass
class LoraConfig:
    """LoRA recovery of a DIP/DIP-CA-sparsified model (docs/method.md, LoRA section).

    ``targets`` names projections by role (``up``, ``gate``, ``down``; ``attn`` adds every attention
    projection); :func:`dipdeploy.finetune.adapter.target_modules` maps roles to module names of the family record.
    ``norms`` adds the RMSNorm weights, trained whole beside the LoRA (a few thousand numbers a layer;
    :func:`dipdeploy.finetune.adapter.norm_modules`): the norm before the MLP scales both DIP's input scores
    |RMSNorm(h) ⊙ w| and the values the kept columns multiply, which no LoRA on the projections reaches
    directly. They train at ``norm_lr_scale`` × ``lr``: at the LoRA's own rate they cost SmolLM2
    perplexity, each step reshuffling the top-K in a way the gradient does not see; at a tenth of it they
    gained (benchmarks/results/distill-recipes-smollm2.md).
    ``tokens``, when set, overrides ``steps``: steps = ⌈tokens / (batch_size · grad_accum · seqlen · processes)⌉,
    since each data-parallel process trains ``batch_size`` windows per step (:meth:`total_steps`).
    ``alpha=None`` means 2·rank, the usual LoRA scaling of 2.
    ``bf16`` runs the forward under bf16 autocast (GPU, or a CPU with AVX512-BF16, where it is faster:
    benchmarks/results/lora-smollm2.md, "bf16"); the LoRA weights and the optimizer stay fp32, and evaluation stays fp32.
    ``sample_windows`` (``dense-samples`` only) draws that many windows and trains on them in turn, so
    fewer samples serve more steps (sampling one window costs a forward per token; None: one fresh window
    per window trained).
    ``objective`` is one of :data:`OBJECTIVES`; ``hidden_weight`` (distill only) adds the dense model's hidden
    state after every decoder layer as a second target (:func:`dipdeploy.finetune.distill.hidden_match`), at
    that weight against the KL; 0 is logits only. ``mlp_weight`` (distill only) adds each layer's dense MLP
    output on the student's own MLP input (:func:`dipdeploy.finetune.distill.mlp_match`), at that weight.
    ``data=None`` means the objective's own text (:data:`DEFAULT_DATA`), resolved here so the saved config
    names the text actually used.
    """

    rank: int = 16
    alpha: float | None = None
    dropout: float = 0.0
    targets: tuple[str, ...] = ("up", "gate", "down")
    steps: int = 200
    tokens: int | None = None
    lr: float = 1e-3
    norm_lr_scale: float = 0.1  # the norms' learning rate, × lr (with ``norms`` in targets)
    scheduler: str = "cosine"
    warmup_steps: int = 10
    weight_decay: float = 0.0
    batch_size: int = 4
    grad_accum: int = 1
    seqlen: int = 512
    objective: str = "lm"
    hidden_weight: float = 0.0
    mlp_weight: float = 0.0
    data: str | None = None
    text_file: str | None = None
    sample_windows: int | None = None
    save_steps: int = 50
    logging_steps: int = 10
    seed: int = 0
    bf16: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.targets, str):
            self.targets = tuple(t.strip() for t in self.targets.split(",") if t.strip())
        self.targets = tuple(self.targets)
        bad = [t for t in self.targets if t not in TARGETS]
        if bad or not any(t in PROJECTIONS for t in self.targets):
            raise ValueError(f"targets {self.targets!r} invalid; choose a subset of {', '.join(TARGETS)} with at "
                             f"least one of {', '.join(PROJECTIONS)} (norms train beside a LoRA)")
        for name in ("rank", "steps", "batch_size", "grad_accum", "save_steps", "logging_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seqlen < 2:
            raise ValueError(f"seqlen must be >= 2, got {self.seqlen}")
        if self.tokens is not None and self.tokens < 1:
            raise ValueError(f"tokens must be >= 1 (or None to use steps), got {self.tokens}")
        if self.sample_windows is not None and self.sample_windows < 1:
            raise ValueError(f"sample_windows must be >= 1 (or None for one per window trained), "
                             f"got {self.sample_windows}")
        if self.alpha is not None and self.alpha <= 0:
            raise ValueError(f"alpha must be > 0 (or None for 2·rank), got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")
        if self.lr <= 0 or self.norm_lr_scale <= 0:
            raise ValueError(f"lr and norm_lr_scale must be > 0, got {self.lr}, {self.norm_lr_scale}")
        if self.warmup_steps < 0 or self.weight_decay < 0:
            raise ValueError(f"warmup_steps and weight_decay must be >= 0, got {self.warmup_steps}, {self.weight_decay}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler {self.scheduler!r} unknown; choose one of {', '.join(SCHEDULERS)}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective {self.objective!r} unknown; choose one of {', '.join(OBJECTIVES)}")
        for name in ("hidden_weight", "mlp_weight"):
            w = getattr(self, name)
            if w < 0 or (w and self.objective != "distill"):
                raise ValueError(f"{name} {w}: give a weight >= 0, and only with objective distill (the target is "
                                 f"the dense teacher's)")
        if self.data is None:
            self.data = DEFAULT_DATA[self.objective]
        if self.data not in DATA:
            raise ValueError(
                f"data {self.data!r} unknown; choose one of {', '.join(DATA)} or pass text_file "
                f"(the WikiText-2 test split is for evaluation only)"
            )
        if self.objective == "distill" and self.data.startswith("wikitext2") and self.text_file is None:
            raise ValueError(
                f"data {self.data!r} with objective distill: distillation trains on text that is not WikiText "
                f"(the evaluation corpus); use data {DEFAULT_DATA['distill']!r} or a text file"
            )

    @property
    def lora_alpha(self) -> float:
        return float(self.alpha) if self.alpha is not None else 2.0 * self.rank

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.seqlen

    def total_steps(self, processes: int = 1) -> int:
        """Optimizer steps of each of ``processes`` data-parallel processes (they step together)."""
        if self.tokens is None:
            return self.steps
        return -(-self.tokens // (self.tokens_per_step * processes))

    def to_dict(self) -> dict:
        return {"type": "LoraConfig", **asdict(self), "targets": list(self.targets)}

    @classmethod
    def from_dict(cls, raw: dict) -> "LoraConfig":
        raw = dict(raw)
        if raw.pop("type", None) != "LoraConfig":
            raise ValueError("not a LoraConfig (no type 'LoraConfig')")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)
