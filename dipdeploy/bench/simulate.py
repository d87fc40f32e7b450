"""The simulate suite: a DIP trace projected by the HW simulator (``dipdeploy.sim``) onto device profiles and
model shapes, tokens/s over a DRAM sweep against dense-static at each budget.

A trace is a file (``--trace``, from ``dipdeploy trace`` or the runtime's ``--trace``), a synthetic
Zipf-like one (``synthetic``), or DIP's selections of a registry model recorded here at each ``--density``
(calibrated on WikiText-2 validation, traced on the test split, as ``dipdeploy trace`` does) and kept in
the trace cache for later runs. Each trace is replayed on every target shape (its own model's: the first
``tokens``; a larger model's: the first ``proj_tokens``, an extrapolation, ``dipdeploy.sim.pattern``), on
every device and precision, for each variant (dense-static; the trace's own selections, ``traced``;
DIP-CA re-masked from its magnitudes, per cache policy and γ), at ``steps`` DRAM budgets from the smallest
that fits to the whole model (``sim.sweep.auto_budgets``). A row is one point of one curve; its ``gain``
and ``DRAM cut`` are against dense-static at the same budget (``sim.sweep.compare``): tokens/s at equal
DRAM, and the DRAM the variant needs for dense's tokens/s. Everything is simulated, nothing measured on
a device; the host's machine is recorded all the same.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, ClassVar

from dipdeploy.bench.rows import SuiteResult

Notice = Callable[[str], None]
#: the suite's methods: dense-static, the trace's own selections, DIP-CA re-masked from its magnitudes
METHODS = ("dense", "dip", "dip-ca")
#: ``--source``'s default: the model whose traces are recorded when no ``--trace`` is given
SOURCE = "smollm2-135m"
#: tokens a recorded trace holds (``dipdeploy trace``'s default): ``tokens`` takes its first ones
TRACE_TOKENS = 512
DEFAULT_TOKENS, DEFAULT_PROJ_TOKENS, DEFAULT_STEPS, DEFAULT_WARMUP = 256, 64, 9, 16
QUICK_TOKENS, QUICK_PROJ_TOKENS, QUICK_STEPS, QUICK_WARMUP = 64, 32, 5, 8
#: DRAM budgets of one sweep, and simulations of one run: a typo's grid must not run for days
MAX_STEPS = 101
MAX_SIMULATIONS = 20000
SYNTHETIC = "synthetic"


@dataclass
class SimulateGrid:
    """What ``dipdeploy bench simulate`` runs, every list checked: traces (files, ``synthetic``, or none:
    ``source`` recorded at each of ``densities``), target models (empty: each trace's own), devices,
    methods, cache policies, DIP-CA's γ values, precisions, budgets per sweep and tokens."""

    traces: list[str] = field(default_factory=list)
    source: str = SOURCE
    densities: list[float] = field(default_factory=lambda: [0.5])
    models: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=lambda: ["a18"])
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    policies: list[str] = field(default_factory=lambda: ["lfu"])
    gammas: list[float] = field(default_factory=list)  # empty: SimConfig's
    precisions: list[str] = field(default_factory=lambda: ["bq4"])
    steps: int = DEFAULT_STEPS
    tokens: int = DEFAULT_TOKENS
    proj_tokens: int = DEFAULT_PROJ_TOKENS
    warmup: int = DEFAULT_WARMUP
    trace_cache: Path | None = None  # None: the dipdeploy cache's traces folder
    data_dir: Path | None = None

    def __post_init__(self) -> None:
        from dipdeploy.limits import check_count
        from dipdeploy.registry import is_registered
        from dipdeploy.sim import SimConfig, get_device

        check_count(self.steps, "--steps", 2, MAX_STEPS, "budgets")
        if "dense" not in self.methods:
            raise ValueError("--method needs dense: every row is compared with dense-static at its budget; "
                             "add dense to --method")
        for name in self.devices:
            get_device(name)  # an unknown profile: refused with the list of those there are
        for name in self.models + ([self.source] if not self.traces else []):
            if not is_registered(name):
                raise ValueError(f"-m/--source {name}: not a registry model (`dipdeploy models`), so its shape is "
                                 "unknown to the simulator; give a registered name")
        for precision in self.precisions:
            SimConfig(precision=precision, warmup=self.warmup)  # the simulator's own checks, one definition
        for gamma in self.gammas:
            SimConfig(gamma=gamma)
        for policy in self.policies:
            SimConfig(policy=policy)
        n = self.simulations()
        if n > MAX_SIMULATIONS:
            raise ValueError(f"the grid runs {n} simulations, over the cap of {MAX_SIMULATIONS}; give fewer values "
                             "or --steps")

    def variants(self, base) -> list:
        """The ``SimConfig`` variants of one sweep (``sim.sweep.expand_variants``): dense-static, the trace's
        selections per policy, DIP-CA per policy and γ (not with a policy that reads the future)."""
        from dipdeploy.sim.sweep import expand_variants

        out = expand_variants(base, ["dense"], self.policies, [base.gamma])
        if "dip" in self.methods:
            out += expand_variants(base, ["traced"], self.policies, [base.gamma])
        if "dip-ca" in self.methods:
            try:
                out += expand_variants(base, ["dip-ca"], self.policies, self.gammas or [base.gamma])
            except ValueError:
                pass  # every policy reads the future: no DIP-CA variant (said in the notes)
        return out

    def simulations(self) -> int:
        from dipdeploy.sim import SimConfig

        traces = len(self.traces) or len(self.densities)
        per = len(self.variants(SimConfig()))
        return traces * max(len(self.models), 1) * len(self.devices) * len(self.precisions) * per * self.steps


@dataclass(frozen=True)
class SimRow:
    model: str
    device: str
    method: str  # dense-static, the trace's method and policy, dip-ca with its policy and γ
    density: float  # the trace's measured MLP density
    precision: str
    dram_gb: float  # the budget
    tok_s: float
    tok_s_overlap: float
    flash_mb_per_token: float
    hit_rate: float
    gain: float | None = None  # tok/s over dense-static's at this budget, − 1; null on dense rows
    dram_cut: float | None = None  # 1 − DRAM needed for dense's tok/s at this budget ÷ this budget
    cut_bound: bool = False  # the variant beats dense already at the smallest budget: the cut is a lower bound
    extrapolated: bool = False  # a larger shape than the trace's: its pattern projected
    trace: str = ""
    tokens: int = 0

    MD_COLUMNS: ClassVar[tuple[str, ...]] = ("model", "device", "method", "ρ", "precision", "DRAM GB", "tok/s",
                                             "tok/s ovl", "Flash MB/tok", "hit rate", "gain", "DRAM cut")
    MD_OPTIONAL: ClassVar[dict[str, str]] = {"precision": "bq4"}
    MD_NUMERIC: ClassVar[tuple[str, ...]] = ("DRAM GB", "tok/s", "tok/s ovl", "gain", "DRAM cut")
    SCHEMA: ClassVar[str] = "bench.simulate"

    def as_dict(self) -> dict:
        return asdict(self)

    def cells(self) -> tuple[str, ...]:
        cut = "" if self.method == "dense-static" else "—" if self.dram_cut is None else (
            f"{'≥' if self.cut_bound else ''}{100 * self.dram_cut:.0f} %")
        return (self.model + (" (extrap.)" if self.extrapolated else ""), self.device, self.method,
                f"{self.density:.3f}", self.precision, f"{self.dram_gb:.4g}", f"{self.tok_s:.4g}",
                f"{self.tok_s_overlap:.4g}", f"{self.flash_mb_per_token:.4g}", f"{self.hit_rate:.3f}",
                "" if self.gain is None else f"{100 * self.gain:+.0f} %", cut)


def record_trace_of(model: str, density: float, folder: Path, data_dir: Path | None, notice: Notice) -> Path:
    """DIP's selections of ``model`` at ``density`` over ``TRACE_TOKENS`` tokens of the WikiText-2 test split
    (the plan calibrated on validation, as ``dipdeploy trace`` does), kept in ``folder`` and reused."""
    path = folder / f"{model}-dip-{density:g}.npz"
    if path.is_file():
        return path
    from dipdeploy import defaults
    from dipdeploy.data import calibration_windows, load_text, windows
    from dipdeploy.loading import load_model
    from dipdeploy.sparsity.calibrate import calibrate
    from dipdeploy.sparsity.plan import SparsityConfig
    from dipdeploy.sparsity.trace import record_trace

    dd = None if data_dir is None else str(data_dir)
    text = load_text("wikitext2", "test", None, dd)  # a missing WikiText-2: one line before the model loads
    notice(f"recording a DIP trace of {model} at ρ {density:g} into {path}")
    lm = load_model(model)
    plan = calibrate(lm, SparsityConfig(method="dip", density=density),
                     calibration_windows(lm.tokenizer, defaults.CALIB_WINDOWS, defaults.CALIB_SEQLEN, dd))
    trace = record_trace(lm, plan, windows(lm.tokenizer, text, TRACE_TOKENS, 1), meta={"text": "wikitext2/test"})
    folder.mkdir(parents=True, exist_ok=True)
    trace.save(path, force=False)
    return path


def _traces(grid: SimulateGrid, notice: Notice) -> list[tuple[str, object]]:
    """(name, Trace) of each trace of the grid."""
    from dipdeploy.paths import cache_dir
    from dipdeploy.trace import Trace

    if grid.traces:
        out = []
        for t in grid.traces:
            if t == SYNTHETIC:
                from dipdeploy.registry import get_model
                from dipdeploy.sim.synthetic import synthetic_trace

                s = get_model(grid.source).shape
                out.append((f"synthetic ({grid.source})", synthetic_trace(
                    s.hidden_size, s.intermediate_size, s.num_hidden_layers, tokens=grid.tokens, rho_in=0.55,
                    rho_glu=0.40, seed=0, model=grid.source)))
            else:
                out.append((Path(t).name, Trace.load(Path(t))))
        return out
    folder = grid.trace_cache or cache_dir("traces")
    return [(f"{grid.source}-dip-{d:g}", Trace.load(record_trace_of(grid.source, d, Path(folder), grid.data_dir,
                                                                     notice))) for d in grid.densities]


def label(r, trace_method: str) -> str:
    if r.method == "dense":
        return f"dense-{r.policy}"
    # the trace's own selections: DIP's (the traces this suite records) or those of the method it recorded
    name = r.method if not r.method.startswith("traced") else trace_method if trace_method == "dip" else (
        f"traced {trace_method}")
    return f"{name} {r.policy}" + (f" γ{r.gamma:g}" if r.method == "dip-ca" else "")


def rows_of(results: list, trace_name: str, trace_method: str) -> list[SimRow]:
    """The suite's rows of one sweep's ``SimResult``s, each variant's gain and DRAM cut against dense-static
    (the dense rows of ``static`` policy) of the same model, device and precision."""
    from dipdeploy.cache.policies import policy_of
    from dipdeploy.sim.sweep import compare

    out = []
    groups: dict[tuple, list] = {}
    for r in results:
        groups.setdefault((r.model, r.device, r.precision), []).append(r)
    for rs in groups.values():
        base = [r for r in rs if r.method == "dense" and policy_of(r.policy).pinned]
        curves: dict[str, list] = {}
        for r in rs:
            curves.setdefault(label(r, trace_method), []).append(r)
        for name, curve in curves.items():
            vs = {c.dram_bytes: c for c in compare(base, curve)} if base and not name.startswith("dense") else {}
            for r in sorted(curve, key=lambda r: r.dram_bytes):
                c = vs.get(r.dram_bytes)
                out.append(SimRow(r.model, r.device, name, r.density, r.precision, r.dram_bytes / 1e9, r.tok_s,
                                  r.tok_s_overlap, r.flash_bytes_per_token / 1e6, r.hit_rate,
                                  None if c is None else c.gain, None if c is None else c.dram_reduction,
                                  bool(c and c.bound), r.extrapolated, trace_name, r.tokens))
    return out


def run_simulate(grid: SimulateGrid, notice: Notice = lambda line: None) -> SuiteResult:
    """Every trace × target shape: one sweep of every device, precision and variant over its budgets."""
    from dipdeploy.sim import SimConfig
    from dipdeploy.sim.sweep import auto_budgets, sweep

    t0 = time.perf_counter()
    rows: list[SimRow] = []
    notes: list[str] = []
    interrupted = False
    try:
        traces = _traces(grid, notice)
        for k, (name, trace) in enumerate(traces, 1):
            if "dip-ca" in grid.methods and not trace.has_magnitudes:
                notes.append(f"{name}: no magnitudes recorded, so no DIP-CA rows (it re-masks from them)")
            for model in grid.models or [trace.model]:
                own = model == trace.model
                tr = trace.head(min(grid.tokens if own else grid.proj_tokens, trace.num_tokens))
                t = time.perf_counter()
                part = []
                for precision in grid.precisions:  # each precision's own budgets: its bytes set the sweep
                    base = SimConfig(model=model, precision=precision, warmup=min(grid.warmup, tr.num_tokens - 1),
                                     **({"gamma": grid.gammas[0]} if grid.gammas else {}))
                    variants = [c for c in grid.variants(base) if c.method != "dip-ca" or tr.has_magnitudes]
                    part += sweep(tr, [replace(c, device=d) for d in grid.devices for c in variants],
                                  auto_budgets(tr, base, grid.steps))
                rows += rows_of(part, name, trace.method)
                notice(f"[{k}/{len(traces)}] {name} on {model}: {len(part)} simulations in "
                       f"{time.perf_counter() - t:.1f} s")
    except KeyboardInterrupt:
        interrupted = True
        notice("interrupted: the rows hold the sweeps finished before it")
    from dipdeploy.cache import policy_of

    if "dip-ca" in grid.methods and all(policy_of(p).needs_future for p in grid.policies):
        notes.append(f"DIP-CA takes no policy that reads the future ({', '.join(grid.policies)}): no DIP-CA rows")
    return SuiteResult(rows, time.perf_counter() - t0, notes, interrupted)
