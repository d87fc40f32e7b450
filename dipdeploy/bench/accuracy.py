"""The accuracy suite: WikiText-2 perplexity (and, asked for, HumanEval pass@1) of the sparse methods over a
grid of models, methods, densities, allocations and weight formats, with the iso-accuracy view of its rows.

Every figure comes from ``dipdeploy.eval`` (the ``Evaluator`` of ``dipdeploy eval``: calibration on the
WikiText-2 validation split, never test; the test windows at ``seqlen`` × ``windows``), so a row here is
the row ``dipdeploy eval`` gives for the same flags. One ``Evaluator`` serves each (model, weight format):
the model is loaded and quantised once, the test text tokenised once, the split searches shared.

Dense is measured once per (model, weight format) in every run, first: a row's ``× dense`` is its
perplexity over that dense row's, on the same windows of the same run, never a figure from elsewhere.
The iso-accuracy view is read off the rows (``dipdeploy.eval.iso.lowest_density`` over the densities the
run measured, no bisection): per method the lowest realised density from which every denser measured row
stays within each tolerance of dense. A density a method cannot reach (CATS below 1/3) is left out and
said in the notes. An interrupt (Ctrl-C) keeps the rows measured before it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

from dipdeploy.bench.rows import SuiteResult

Notice = Callable[[str], None]
#: the methods of the suite (``dipdeploy eval`` takes more: the single-group baselines stay there)
METHODS = ("dense", "dip", "dip-ca", "teal", "cats", "predictor")
TASKS = ("wikitext2", "humaneval")
#: ``--quant``'s value for fp32 weights (``eval`` without ``--quant``)
NO_QUANT = "none"
#: the iso-accuracy view's tolerances over dense perplexity
TOLERANCES = (0.01, 0.03)
#: ``--quick``'s test windows: a smoke run, not a result (the protocol is ``EvalConfig``'s)
QUICK_SEQLEN, QUICK_WINDOWS = 512, 2
#: evaluations of one run (each a calibration and a pass over the test windows): a typo's grid must not
#: run for days
MAX_EVALUATIONS = 400


@dataclass
class AccuracyGrid:
    """What ``dipdeploy bench accuracy`` runs, every list checked: models, methods, target densities,
    allocations (``SparsityConfig.allocation``), weight formats (``none``: fp32), tasks, the test windows,
    HumanEval's first ``limit`` problems, the WikiText-2 folder, torch's device and threads."""

    models: list[str]
    methods: list[str] = field(default_factory=lambda: ["dense", "dip"])
    densities: list[float] = field(default_factory=lambda: [0.5])
    allocations: list[str] = field(default_factory=lambda: ["uniform"])
    quants: list[str] = field(default_factory=lambda: [NO_QUANT])
    tasks: list[str] = field(default_factory=lambda: ["wikitext2"])
    seqlen: int | None = None  # None: EvalConfig's protocol
    windows: int | None = None
    limit: int | None = None
    data_dir: Path | None = None
    device: str | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("give a model: -m NAME (a registry model, `dipdeploy models`, or a Hugging Face folder)")
        if "predictor" in self.methods and any(q != NO_QUANT for q in self.quants):
            from dipdeploy.eval import PREDICTOR_FP32

            raise ValueError(PREDICTOR_FP32)
        if self.limit is not None and "humaneval" not in self.tasks:
            raise ValueError("--limit counts HumanEval problems; add --task humaneval or leave --limit out")
        for model in self.models:
            for quant in self.quants:
                self.eval_config(model, quant)  # a bad format, window count or device: refused before any load
        if self.limit is not None:
            from dipdeploy.eval.humaneval import TaskConfig

            TaskConfig(limit=self.limit)
        n = len(self.configs()) * len(self.tasks)
        if n > MAX_EVALUATIONS:
            raise ValueError(f"the grid runs {n} evaluations, over the cap of {MAX_EVALUATIONS}; give fewer values")
        from dipdeploy.data import find_wikitext

        # the texts before any model: a missing WikiText-2 is one line now, not after minutes of loading
        for split in (["test"] if "wikitext2" in self.tasks else []) + (["validation"] if len(self.methods_of()) > 1
                                                                        else []):
            find_wikitext(split, self.data_dir)

    def eval_config(self, model: str, quant: str):
        from dipdeploy.eval import EvalConfig

        kw = {"seqlen": self.seqlen, "max_windows": self.windows, "device": self.device,
              "data_dir": None if self.data_dir is None else str(self.data_dir)}
        try:
            return EvalConfig(model=model, method="dense", quant=None if quant == NO_QUANT else quant, progress=True,
                              **{k: v for k, v in kw.items() if v is not None})
        except ValueError as err:
            raise ValueError(f"--quant {quant}: {err}" if quant != NO_QUANT and "quant" in str(err) else str(err)) \
                from None

    def methods_of(self) -> list[tuple[str, float, str]]:
        """(method, target density, allocation) of each row of one (model, format): dense first, once, at
        ρ = 1; then each method at each density it can reach, per allocation."""
        from dipdeploy.eval import reachable

        out = [("dense", 1.0, "uniform")]
        out += [(m, d, a) for m in self.methods if m != "dense" for a in self.allocations for d in self.densities
                if reachable(m, d)]
        return out

    def unreachable(self) -> list[str]:
        from dipdeploy.eval import reachable
        from dipdeploy.sparsity.plan import min_density

        return [f"{m} at ρ {d:g}: left out, below its lowest density {min_density(m):.3g}"
                for m in self.methods if m != "dense" for d in self.densities if not reachable(m, d)]

    def configs(self) -> list[tuple[str, str, str, float, str]]:
        """(model, format, method, density, allocation) in run order: per model and format, dense first."""
        return [(model, q, m, d, a) for model in self.models for q in self.quants for m, d, a in self.methods_of()]


@dataclass(frozen=True)
class AccuracyRow:
    model: str
    method: str
    allocation: str
    quant: str
    target_density: float
    density: float  # realised on the test tokens (TEAL, CATS: measured; top-K methods: the plan's)
    ppl: float | None = None
    x_dense: float | None = None  # over the dense row of the same model, format and windows, this run
    pass_at_1: float | None = None  # percent; null without --task humaneval
    problems: int | None = None
    seqlen: int | None = None
    windows: int | None = None
    tokens: int | None = None  # predicted tokens of the perplexity
    recall: float | None = None  # predictor rows: its recall of the dense GLU's top-K units (eval.meter)
    calib_s: float | None = None
    eval_s: float | None = None

    MD_COLUMNS: ClassVar[tuple[str, ...]] = ("model", "method", "allocation", "quant", "target ρ", "ρ", "PPL",
                                             "× dense", "pass@1 %", "problems")
    MD_OPTIONAL: ClassVar[dict[str, str]] = {"allocation": "uniform", "quant": NO_QUANT, "PPL": "", "× dense": "",
                                             "pass@1 %": "", "problems": ""}
    MD_NUMERIC: ClassVar[tuple[str, ...]] = ("target ρ", "PPL", "× dense", "pass@1 %", "problems")
    SCHEMA: ClassVar[str] = "bench.accuracy"

    def as_dict(self) -> dict:
        return asdict(self)

    def cells(self) -> tuple[str, ...]:
        def f(v, spec):
            return "" if v is None else format(v, spec)

        return (self.model, self.method, self.allocation, self.quant, f"{self.target_density:g}", f"{self.density:.4g}",
                f(self.ppl, ".4g"), f(self.x_dense, ".4f"), f(self.pass_at_1, ".1f"), f(self.problems, "d"))


@dataclass(frozen=True)
class IsoRow:
    """The iso-accuracy view of one (model, format, method, allocation) at one tolerance."""

    model: str
    quant: str
    method: str
    allocation: str
    tolerance: str  # as eval.iso labels it
    ppl_limit: float
    lowest_density: float | None  # None: even the densest row measured fails
    ppl: float | None
    at_grid_floor: bool  # the lowest density measured passes: the true crossing may lie lower


@dataclass
class AccuracyResult(SuiteResult):
    iso: list[IsoRow] = field(default_factory=list)  # the iso-accuracy view, written under the table


def with_dense(rows: list[AccuracyRow]) -> list[AccuracyRow]:
    """Each row's ``× dense``: its perplexity over the dense row of its model, format and windows."""
    from dataclasses import replace

    dense = {(r.model, r.quant, r.seqlen, r.windows): r.ppl for r in rows if r.method == "dense" and r.ppl}
    return [replace(r, x_dense=r.ppl / dense[k]) if r.ppl is not None and (k := (r.model, r.quant, r.seqlen,
                                                                                  r.windows)) in dense else r
            for r in rows]


def iso_view(rows: list[AccuracyRow], tolerances: tuple[float, ...] = TOLERANCES) -> list[IsoRow]:
    """Per (model, format, method, allocation) and tolerance, the lowest realised density from which every
    denser row of the run is within the tolerance of dense (``eval.iso.lowest_density`` on the measured
    densities, no evaluation of its own)."""
    from dipdeploy.eval.iso import lowest_density

    def unmeasured(rho: float) -> float:  # refine 0 over measured points: never called
        raise AssertionError(f"the iso view evaluates nothing (ρ {rho})")

    out = []
    dense = {(r.model, r.quant): r.ppl for r in rows if r.method == "dense" and r.ppl is not None}
    groups: dict[tuple, dict[float, float]] = {}
    for r in rows:
        if r.method != "dense" and r.ppl is not None and (r.model, r.quant) in dense:
            groups.setdefault((r.model, r.quant, r.method, r.allocation), {})[round(r.density, 6)] = r.ppl
    for (model, quant, method, allocation), measured in groups.items():
        for tol in tolerances:
            iso = lowest_density(unmeasured, dense[(model, quant)], tol, sorted(measured), 0, dict(measured))
            out.append(IsoRow(model, quant, method, allocation, f"+{tol:.0%}", iso.limit, iso.density, iso.ppl,
                              iso.at_grid_floor))
    return out


def iso_markdown(iso: list[IsoRow]) -> str:
    """The iso view as a markdown table to follow the rows' (empty without rows to read it from)."""
    if not iso:
        return ""
    lines = ["", "Iso-accuracy: per method, the lowest density ρ measured from which every denser row stays within "
             "the tolerance of dense (≤: the lowest measured passes, the crossing may lie lower; none: even the "
             "densest fails).", "", "| model | quant | method | allocation | tolerance | PPL limit | lowest ρ | PPL |",
             "|---|---|---|---|---|---:|---:|---:|"]
    for r in iso:
        rho = "none" if r.lowest_density is None else f"{'≤' if r.at_grid_floor else ''}{r.lowest_density:.4g}"
        lines.append(f"| {r.model} | {r.quant} | {r.method} | {r.allocation} | {r.tolerance} | {r.ppl_limit:.4g} | "
                     f"{rho} | {'' if r.ppl is None else format(r.ppl, '.4g')} |")
    return "\n".join(lines) + "\n"


def _describe(model: str, quant: str, method: str, rho: float, allocation: str) -> str:
    return (f"{model}{'' if quant == NO_QUANT else ' ' + quant} {method} ρ {rho:g}"
            + ("" if allocation == "uniform" or method == "dense" else f" ({allocation})"))


def run_accuracy(grid: AccuracyGrid, notice: Notice = lambda line: None) -> AccuracyResult:
    """Every (model, format): one ``Evaluator``, then dense and each method × allocation × density in turn,
    each perplexity row (and pass@1, with humaneval) as ``dipdeploy eval`` gives it."""
    from dipdeploy.eval import Evaluator
    from dipdeploy.progress import Progress

    t0 = time.perf_counter()
    if grid.threads is not None:
        import torch

        torch.set_num_threads(grid.threads)
    items, log, task = None, None, None
    if "humaneval" in grid.tasks:
        from dipdeploy.eval import humaneval as he

        task, log = he.TaskConfig(limit=grid.limit), he.ResumeLog(None, resume=False)
        items = he.problems(task.limit)
    plan = grid.configs()
    rows: list[AccuracyRow] = []
    interrupted, ev, held = False, None, None
    try:
        for step, (model, quant, method, rho, allocation) in enumerate(plan, 1):
            if held != (model, quant):
                ev, held = None, None
                ev, held = Evaluator(grid.eval_config(model, quant), Progress()), (model, quant)
            over = {} if method == "dense" else {"allocation": allocation}
            got: dict = {}
            if "wikitext2" in grid.tasks:
                got = ev.row(method, rho, **over)
            passed = None
            if items is not None:
                from dipdeploy.eval.humaneval import evaluate_method

                passed = evaluate_method(ev, method, rho, items, task, log, **over)
            row = AccuracyRow(model=model, method=method, allocation="uniform" if method == "dense" else allocation,
                              quant=quant, target_density=rho,
                              density=got.get("density_test", passed["density"] if passed else rho),
                              ppl=got.get("ppl"), pass_at_1=passed["pass_at_1"] if passed else None,
                              problems=passed["problems"] if passed else None, seqlen=got.get("seqlen"),
                              windows=got.get("windows"), tokens=got.get("tokens"), recall=got.get("recall"),
                              calib_s=got.get("calib_s"),
                              eval_s=got.get("eval_s"))
            rows.append(row)
            said = ", ".join(x for x in ("" if row.ppl is None else f"PPL {row.ppl:.4g}",
                                         "" if row.pass_at_1 is None else f"pass@1 {row.pass_at_1:.1f} %") if x)
            notice(f"[{step}/{len(plan)}] {_describe(model, quant, method, rho, allocation)}: {said}")
    except KeyboardInterrupt:
        interrupted = True
        notice("interrupted: the rows hold the evaluations finished before it")
    rows = with_dense(rows)
    return AccuracyResult(rows, time.perf_counter() - t0, grid.unreachable(), interrupted, iso_view(rows))

