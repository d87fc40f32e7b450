"""The sparsity plan: per-layer K_in, K_glu (and thresholds, γ, score) — the file every later stage reads.

MLP density (docs/method.md): the fraction of MLP weight bytes read per token,

    ρ = (2·K_in/d + K_glu/F) / 3,       ρ_in = K_in/d,  ρ_glu = K_glu/F.            (eq. ρ)

A method's reachable densities follow from which weights it skips:

| method | reads                         | ρ in terms of its knob        | lowest ρ |
|--------|-------------------------------|-------------------------------|----------|
| dense  | everything                    | 1                             | 1        |
| glu    | W_u, W_g, K_glu cols of W_d   | (2 + ρ_glu)/3                 | 2/3      |
| gate, up, cats | one of W_u/W_g, K_glu rows of the other and of W_d | (1 + 2ρ_glu)/3 | 1/3 |
| teal, dip, dip-ca | K_in cols of W_u, W_g; K_glu cols of W_d | (2ρ_in + ρ_glu)/3 | 0 |
| predictor | A, B, b; K_glu rows of W_u, W_g, cols of W_d | ρ_glu + (r(d+F) + F)/(3dF) | its own bytes |

Floor 3 (no torch here, but lives beside the torch methods). Plans round-trip through JSON with a
version; a reader rejects a version it does not know.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dipdeploy import defaults
from dipdeploy.cache import POLICY_RECORDS
from dipdeploy.cache.split import CACHE_SPLIT, CACHE_SPLITS, spend
from dipdeploy.limits import MAX_PREDICTOR_RANK, MAX_PREDICTOR_STEPS, check_count
from dipdeploy.paths import write_atomic

PLAN_VERSION = 1
METHODS = ("dense", "glu", "gate", "up", "cats", "teal", "dip", "dip-ca", "predictor")
#: the predictor baseline lives in the torch reference only: its trained weights are in no plan and no bundle
PREDICTOR_EVAL_ONLY = ("method predictor is trained and measured by `dipdeploy eval --method predictor` only (its "
                       "weights are kept in no plan and no bundle); calibrate or export dip or dip-ca")
SCORES = ("abs", "wina", "wina-in")  # dipdeploy.sparsity.scores
ALLOCATIONS = ("uniform", "greedy", "joint", "greedy-split")
#: policies usable inside the torch reference: those that update from the past alone (Belady needs the future)
CA_POLICIES = tuple(p.name for p in POLICY_RECORDS.values() if p.updates and not p.needs_future)


@dataclass
class SparsityConfig:
    """What the user asks for; calibration turns it into a :class:`SparsityPlan`.

    ``rho_in=None`` means: calibrate the split between ρ_in and ρ_glu on calibration text.
    ``cache_frac`` is the DIP-CA cache capacity as a fraction of the MLP rows' bytes, shared by ``cache_split``
    as the runtime shares a budget (``dipdeploy.cache.split``): ``reads`` (default) where a cached byte saves
    the most reading, ``even`` the same fraction of each group's rows (the paper's §5).
    """

    method: str = "dip"
    density: float = defaults.DENSITY
    rho_in: float | None = None
    allocation: str = "uniform"
    score: str = "abs"
    gamma: float = 0.5  # the paper's 0.2 costs SmolLM2 far more perplexity at cache_frac 0.5 (docs/method.md)
    policy: str = "lfu"
    cache_frac: float = 0.5
    cache_split: str = CACHE_SPLIT
    fixed_top_n: int = 0
    gamma_warmup: int = 0
    # the predictor baseline (``dipdeploy.sparsity.predictor``): rank r of P(x) = (x A) B + b, Adam steps per layer
    predictor_rank: int = 64
    predictor_steps: int = 300

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} unknown; choose one of {', '.join(METHODS)}")
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"density must lie in (0, 1], got {self.density}")
        lo = min_density(self.method)
        if self.density < lo - 1e-9:
            raise ValueError(
                f"density {self.density} is unreachable for method {self.method!r}: it reads at least "
                f"{lo:.3f} of the MLP (see docs/method.md); choose density >= {lo:.3f} or another method"
            )
        if self.rho_in is not None and not 0.0 < self.rho_in <= 1.0:
            raise ValueError(f"rho_in must lie in (0, 1], got {self.rho_in}")
        if self.allocation not in ALLOCATIONS:
            raise ValueError(f"allocation {self.allocation!r} unknown; choose one of {', '.join(ALLOCATIONS)}")
        if self.score not in SCORES:
            raise ValueError(f"score {self.score!r} unknown; choose one of {', '.join(SCORES)}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1], got {self.gamma}")
        if self.policy not in CA_POLICIES:
            raise ValueError(
                f"policy {self.policy!r} cannot drive the torch reference; choose one of "
                f"{', '.join(CA_POLICIES)} (Belady and static need a trace: see `dipdeploy simulate`)"
            )
        if not 0.0 <= self.cache_frac <= 1.0:
            raise ValueError(f"cache_frac must lie in [0, 1], got {self.cache_frac}")
        if self.cache_split not in CACHE_SPLITS:
            raise ValueError(f"cache split {self.cache_split!r} unknown; choose one of {', '.join(CACHE_SPLITS)}")
        check_count(self.predictor_rank, "--predictor-rank", 1, MAX_PREDICTOR_RANK)
        check_count(self.predictor_steps, "--predictor-steps", 1, MAX_PREDICTOR_STEPS, "steps")


def min_density(method: str) -> float:
    return {"dense": 1.0, "glu": 2 / 3, "gate": 1 / 3, "up": 1 / 3, "cats": 1 / 3}.get(method, 0.0)


def predictor_share(rank: int, d: int, f: int) -> float:
    """The predictor's own bytes per token over the dense MLP's: A [d, r], B [r, F] and b [F], stored in the
    MLP weights' dtype and read for every token, against the 3·d·F weights of W_u, W_g and W_d."""
    return (rank * (d + f) + f) / (3 * d * f)


def density(k_in: int, k_glu: int, d: int, f: int) -> float:
    """Eq. ρ for input-and-GLU pruning (teal, dip, dip-ca)."""
    return (2 * k_in / d + k_glu / f) / 3


FP32_BYTES = 4  # what ``cache_capacity`` prices a value at when the plan has no row_bytes


@dataclass(frozen=True)
class _Group:  # dipdeploy.cache.split.Group
    rows: int
    row_bytes: int
    k: int


@dataclass
class LayerPlan:
    k_in: int
    k_glu: int
    thr_in: float | None = None  # teal: threshold on |x|
    thr_glu: float | None = None  # teal: on |GLU~|; cats: on |act(W_g x)|


@dataclass
class SparsityPlan:
    model: str
    method: str
    density: float  # the realised mean density of the plan's K (or the calibrated target for thresholds)
    hidden_size: int
    intermediate_size: int
    layers: list[LayerPlan]
    score: str = SparsityConfig.score
    gamma: float = 1.0  # a plan written without γ is plain DIP
    policy: str = SparsityConfig.policy
    cache_frac: float = SparsityConfig.cache_frac
    cache_split: str = SparsityConfig.cache_split
    row_bytes: list[int] | None = None  # one up|gate row and one down row as the bundle stores them
    fixed_top_n: int = SparsityConfig.fixed_top_n
    gamma_warmup: int = SparsityConfig.gamma_warmup
    allocation: str = SparsityConfig.allocation
    rho_in: float | None = None
    predictor_rank: int = 0  # the predictor method's rank r (its bytes count in ρ); 0 for the other methods
    calibration: dict = field(default_factory=dict)
    version: int = PLAN_VERSION

    def layer_density(self, i: int) -> float:
        lp = self.layers[i]
        d, f = self.hidden_size, self.intermediate_size
        if self.method == "dense":
            return 1.0
        if self.method == "glu":
            return (2 + lp.k_glu / f) / 3
        if self.method in ("gate", "up", "cats"):
            return (1 + 2 * lp.k_glu / f) / 3
        if self.method == "predictor":
            return lp.k_glu / f + predictor_share(self.predictor_rank, d, f)
        return density(lp.k_in, lp.k_glu, d, f)

    def cache_capacity(self, miss_cost) -> list[list[int]]:
        """Rows of each layer's two DIP-CA caches: round(cache_frac · rows) per group, as the runtime gives a
        fractional budget (``runtime.budget.plan_residency``), re-spent by ``cache_split``; ``reads`` prices a
        miss of a ``row_bytes`` row by ``miss_cost`` (``dipdeploy.flash.miss_cost``), fp32 rows when
        the plan has no ``row_bytes`` (an unquantised model's: BQ4's rows have the same up|gate : down ratio,
        and on SmolLM2 both give the same capacities, benchmarks/results/accuracy-smollm2.md)."""
        d, f, frac = self.hidden_size, self.intermediate_size, self.cache_frac
        even = [[round(frac * d), round(frac * f)] for _ in self.layers]
        rb_in, rb_glu = self.row_bytes or (2 * f * FP32_BYTES, d * FP32_BYTES)
        groups = [[_Group(d, rb_in, lp.k_in), _Group(f, rb_glu, lp.k_glu)] for lp in self.layers]
        return spend(self.cache_split, even, groups, miss_cost)

    def mean_density(self) -> float:
        return sum(self.layer_density(i) for i in range(len(self.layers))) / len(self.layers)

    def to_json(self) -> str:
        return json.dumps({"type": "SparsityPlan", **asdict(self)}, indent=1)

    def save(self, path: Path, force: bool = False) -> Path:
        return write_atomic(Path(path), self.to_json(), force=force)

    @classmethod
    def from_json(cls, text: str) -> "SparsityPlan":
        raw = json.loads(text)
        if raw.pop("type", None) != "SparsityPlan":
            raise ValueError("not a sparsity plan (no type 'SparsityPlan'); write one with `dipdeploy calibrate`")
        if raw.get("version") != PLAN_VERSION:
            raise ValueError(
                f"plan version {raw.get('version')} is not supported (this dipdeploy reads {PLAN_VERSION}); "
                f"regenerate it with `dipdeploy calibrate`"
            )
        raw["layers"] = [LayerPlan(**lp) for lp in raw["layers"]]
        return cls(**raw)

    @classmethod
    def load(cls, path: Path) -> "SparsityPlan":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"plan {path} not found; write one with `dipdeploy calibrate`")
        return cls.from_json(path.read_text())

    def check_model(self, num_layers: int, d: int, f: int) -> None:
        if (len(self.layers), self.hidden_size, self.intermediate_size) != (num_layers, d, f):
            raise ValueError(
                f"plan for {self.model!r} has {len(self.layers)} layers, d={self.hidden_size}, "
                f"F={self.intermediate_size}, but the model has {num_layers} layers, d={d}, F={f}; "
                f"calibrate a plan for this model with `dipdeploy calibrate`"
            )


def allocation_label(allocation: str, greedy_strength: float | None) -> str:
    """The allocation as tables print it: a greedy plan with the strength its held-out KL chose
    (``calibrate.allocate_greedy``), since strength 0 is the uniform plan, which greedy keeps when no skew
    lowers the KL, and a table that says only "greedy" hides that."""
    if greedy_strength is None or allocation not in ("greedy", "greedy-split"):
        return allocation
    uniform = greedy_strength == 0 and allocation == "greedy"  # greedy-split may still split per layer
    return f"{allocation} (strength {greedy_strength:g}{': uniform' if uniform else ''})"


def split_for(method: str, rho: float, rho_in: float | None) -> tuple[float, float]:
    """(ρ_in, ρ_glu) that realise density ρ for a method, given the input share for DIP-like methods."""
    if method == "dense":
        return 1.0, 1.0
    if method == "glu":
        return 1.0, 3 * rho - 2
    if method in ("gate", "up", "cats"):
        return 1.0, (3 * rho - 1) / 2
    if rho_in is None:
        rho_in = default_rho_in(rho)
    rho_in = min(rho_in, 1.0, 1.5 * rho)
    rho_glu = 3 * rho - 2 * rho_in
    if rho_glu > 1.0:
        rho_glu, rho_in = 1.0, (3 * rho - 1) / 2
    return rho_in, rho_glu


def default_rho_in(rho: float) -> float:
    """Input share when nothing is calibrated: ρ_in = 1.1ρ, the best split of SmolLM2's at ρ = 0.5
    (docs/method.md, the split table)."""
    return min(1.0, 1.1 * rho)


def uniform_plan(cfg: SparsityConfig, model: str, num_layers: int, d: int, f: int,
                 rho_in: float | None = None) -> SparsityPlan:
    """Every layer at the same (K_in, K_glu)."""
    if cfg.method == "predictor":
        return _predictor_plan(cfg, model, num_layers, d, f)
    r_in, r_glu = split_for(cfg.method, cfg.density, rho_in if rho_in is not None else cfg.rho_in)
    k_in = max(1, min(d, round(r_in * d)))
    k_glu = max(1, min(f, round(r_glu * f)))
    plan = SparsityPlan(
        model=model, method=cfg.method, density=cfg.density, hidden_size=d, intermediate_size=f,
        layers=[LayerPlan(k_in, k_glu) for _ in range(num_layers)], score=cfg.score,
        gamma=cfg.gamma if cfg.method == "dip-ca" else 1.0, policy=cfg.policy, cache_frac=cfg.cache_frac,
        cache_split=cfg.cache_split, fixed_top_n=cfg.fixed_top_n, gamma_warmup=cfg.gamma_warmup, allocation="uniform",
        rho_in=r_in,
    )
    plan.density = plan.mean_density()
    return plan


def _predictor_plan(cfg: SparsityConfig, model: str, num_layers: int, d: int, f: int) -> SparsityPlan:
    """The predictor's plan: every input feature, and the K = (ρ − its own share)·F units it predicts, so
    its density, predictor bytes included, is the target within half a unit."""
    if cfg.predictor_rank > min(d, f):
        raise ValueError(f"--predictor-rank {cfg.predictor_rank} exceeds the model's width (d={d}, F={f}); give "
                         f"{min(d, f)} or less")
    share = predictor_share(cfg.predictor_rank, d, f)
    k = min(f, round((cfg.density - share) * f))
    if k < 1:
        raise ValueError(f"density {cfg.density:g} is below the rank-{cfg.predictor_rank} predictor's own bytes "
                         f"(ρ {share:.3f} of this MLP); raise --density or lower --predictor-rank")
    plan = SparsityPlan(model=model, method="predictor", density=cfg.density, hidden_size=d, intermediate_size=f,
                        layers=[LayerPlan(d, k) for _ in range(num_layers)], allocation="uniform", rho_in=1.0,
                        predictor_rank=cfg.predictor_rank)
    plan.density = plan.mean_density()
    return plan
