"""Evaluation (floor 4): WikiText-2 perplexity of any method × density × quantisation, one table.

``evaluate(EvalConfig(...))`` loads the model and the text once, calibrates a plan per (method, density)
on the *validation* split (or uses a given plan), and returns one row per result.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

from dipdeploy import defaults
from dipdeploy.limits import MAX_BATCH, MAX_TOKENS, MAX_WINDOWS, check_caps
from dipdeploy.progress import Progress
from dipdeploy.sparsity.plan import METHODS, SparsityConfig, SparsityPlan
from dipdeploy.torchdevice import DEFAULT_DEVICE, DEVICES, device_of


#: why the predictor baseline runs on unquantised weights only: its bytes are counted in the MLP's own dtype
PREDICTOR_FP32 = ("method predictor counts its own bytes in the MLP weights' dtype, so it is measured without "
                  "--quant or --weights; drop them for its rows")


def _as_tuple(v, cast):
    if isinstance(v, str):
        return tuple(cast(x.strip()) for x in v.split(",") if x.strip())
    if isinstance(v, (list, tuple)):
        return tuple(cast(x) for x in v)
    return (cast(v),)


def _plan_rows(path: str, method, density) -> tuple[tuple[str], tuple[float]]:
    """The one (method, density) row a plan file evaluates: the plan's own, so the row is labelled and
    metered (TEAL and CATS measure their realised density) as what runs. A method or density given beside
    it must be the plan's (density within 0.01: a top-K plan's realised ρ is a whole number of rows off)."""
    plan = SparsityPlan.load(path)
    given_m = _as_tuple(method, str) if method is not None else (plan.method,)
    given_d = _as_tuple(density, float) if density is not None else (plan.density,)
    if len(given_m) > 1 or len(given_d) > 1:
        raise ValueError("--plan fixes method and density; pass a single method/density or drop --plan")
    if given_m[0] != plan.method or abs(given_d[0] - plan.density) >= 0.01:
        raise ValueError(f"--plan {path} is a {plan.method} plan at ρ {plan.density:.4g}, not {given_m[0]} at "
                         f"ρ {given_d[0]:g}; drop --method and --density (the plan sets them) or give the plan's")
    return (plan.method,), (round(plan.density, 4),)


@dataclass
class EvalConfig:
    model: str = defaults.MODEL
    # None: the plan's own with ``plan``, else SparsityConfig's
    method: str | tuple[str, ...] | None = None
    density: float | tuple[float, ...] | None = None
    plan: str | None = None
    seqlen: int = 2048
    max_windows: int | None = 16
    dataset: str = "wikitext2"
    text_file: str | None = None
    data_dir: str | None = None
    batch_size: int | None = None  # windows side by side; None: 16 for dip-ca (its loop is per step), else 1
    calib_windows: int = defaults.CALIB_WINDOWS
    calib_seqlen: int = defaults.CALIB_SEQLEN
    stats_windows: int = defaults.STATS_WINDOWS  # a calibrated quantiser's statistics: windows of that text
    sparsity: SparsityConfig = field(default_factory=SparsityConfig)
    quant: str | None = None
    quant_scope: str = "all"
    embedding: str = defaults.EMBEDDING  # with quant_scope all: the token embedding as export stores it
    dense_bits: str = defaults.DENSE_BITS  # with quant_scope all: attention and lm_head bits (quant.dense), as export
    weights: str | None = None  # a `dipdeploy quantize` file: its MLP weights instead of quantising here
    # vq3's fit (quant.config.calibrated_config; None: its default), on stats_windows windows of calib_seqlen
    vq_hessian: str | None = None
    vq_feedback: bool | None = None
    vq_density: float | None = None
    lora: str | None = None  # a peft adapter from `dipdeploy finetune`, applied before quantisation
    lora_merge: bool = True  # merge_and_unload (what export does) or keep live adapter layers
    progress: bool = True  # report stages (dipdeploy.progress) when the Evaluator is given no Progress
    device: str = DEFAULT_DEVICE  # where torch computes (dipdeploy.torchdevice); the rows are Python numbers
    # each top-K row's recall of the dense GLU's top-K units (eval.meter.RecallMeter); the predictor's rows
    # always measure it (its dense GLU is computed anyway), the others only when asked (one more up/gate pass)
    recall: bool = False

    def __post_init__(self) -> None:
        own = _plan_rows(self.plan, self.method, self.density) if self.plan is not None else None
        self.method = own[0] if own else _as_tuple(SparsityConfig.method if self.method is None else self.method, str)
        self.density = own[1] if own else _as_tuple(SparsityConfig.density if self.density is None else self.density,
                                                    float)
        for m in self.method:
            if m not in METHODS:
                raise ValueError(f"method {m!r} unknown; choose from {', '.join(METHODS)}")
        for d in self.density:
            if not 0.0 < d <= 1.0:
                raise ValueError(f"density must lie in (0, 1], got {d}")
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} unknown; choose one of {', '.join(DEVICES)}")
        if self.seqlen < 2:
            raise ValueError(f"seqlen must be >= 2, got {self.seqlen}")
        for name in ("max_windows", "batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        check_caps(("--seqlen", self.seqlen, MAX_TOKENS, "tokens"), ("--calib-seqlen", self.calib_seqlen, MAX_TOKENS,
                                                                     "tokens"),
                   ("--max-windows", self.max_windows, MAX_WINDOWS, "windows"),
                   ("--calib-windows", self.calib_windows, MAX_WINDOWS, "windows"),
                   ("--stats-windows", self.stats_windows, MAX_WINDOWS, "windows"),
                   ("--batch-size", self.batch_size, MAX_BATCH, "windows"))
        if self.calib_windows < 1 or self.stats_windows < 1 or self.calib_seqlen < 16:
            raise ValueError(f"--calib-windows {self.calib_windows} --stats-windows {self.stats_windows} "
                             f"--calib-seqlen {self.calib_seqlen}: give at least 1 window of 16 tokens")
        from dipdeploy.quant.fake import SCOPES

        if self.quant_scope not in SCOPES:
            raise ValueError(f"quant_scope {self.quant_scope!r} unknown; choose one of {', '.join(SCOPES)}")
        if self.embedding not in defaults.EMBEDDINGS:
            raise ValueError(f"embedding {self.embedding!r} unknown; choose one of {', '.join(defaults.EMBEDDINGS)}")
        self.dense_bits = str(self.dense_bits)
        if self.dense_bits not in defaults.DENSE_BITS_CHOICES:
            raise ValueError(f"--dense-bits {self.dense_bits!r} unknown; choose one of "
                             f"{', '.join(defaults.DENSE_BITS_CHOICES)}")
        if self.dense_bits != defaults.DENSE_BITS and (self.quant_scope != "all"
                                                       or (self.quant is None and self.weights is None)):
            raise ValueError(f"--dense-bits {self.dense_bits} sets the bits of quantised attention and lm_head "
                             "weights; add --quant (with --quant-scope all) or drop --dense-bits")
        if "predictor" in self.method and (self.quant is not None or self.weights is not None):
            raise ValueError(PREDICTOR_FP32)
        if self.quant is not None and self.weights is not None:
            raise ValueError("--weights brings its own quantised MLP; drop --quant (or drop --weights)")
        vq = (self.vq_hessian, self.vq_feedback, self.vq_density)
        if self.quant is None and any(v is not None for v in vq):
            raise ValueError("--vq-hessian / --vq-feedback / --vq-density fit the VQ3 of --quant vq3"
                             + ("; a --weights file was fitted by `dipdeploy quantize`: pass them there"
                                if self.weights is not None else "; add --quant vq3 or drop them"))
        if self.quant is not None:
            self.quant_config()  # a bad format or option fails here, before the model is loaded

    def quant_config(self):
        """The MLP format of ``quant`` with the vq options (``quant.config.calibrated_config``)."""
        from dipdeploy.quant.config import calibrated_config

        return calibrated_config(self.quant, hessian=self.vq_hessian, feedback=self.vq_feedback,
                                 density=self.vq_density)


def _quantize(lm, cfg: EvalConfig, calib: Callable[[], object] | None = None) -> dict:
    """Fake-quantise ``lm`` in place. The default scope ``all`` is what ``export --quant`` ships (MLP in the
    format, attention and lm_head in the MatMulNBits blocks of ``quant.config.dense_config`` at the bits
    ``dense_bits`` rules for each (``quant.dense``: ``auto`` reads the source GGUF's tensor types), the
    embedding in int4 blocks unless ``embedding`` is fp32). A calibrated format (vq3) takes its
    statistics from ``calib()`` (``stats_windows`` windows of the calibration text), as ``dipdeploy
    quantize`` does, so ``eval --quant`` equals ``quantize`` then ``eval --weights`` with the same options."""
    if cfg.quant is None and cfg.weights is None:
        return {"quant": "none", "bits_per_weight": 32.0}
    from dipdeploy.loading import source_types
    from dipdeploy.quant.dense import DenseBits
    from dipdeploy.quant.fake import fit_record, load_mlp_weights_, quantize_model_  # imports torch lazily
    from dipdeploy.sparsity.methods import uniform_dip

    fit = {}
    dense = cfg.quant_scope == "all"
    rule = DenseBits(cfg.dense_bits, source_types(lm) if dense and cfg.dense_bits == "auto" else {})
    if cfg.weights is not None:
        report = load_mlp_weights_(lm.model, cfg.weights, scope=cfg.quant_scope, model_name=lm.name,
                                   embedding=cfg.embedding, dense_bits=rule)
        name = f"{report.format} ({cfg.weights})"
    else:
        qcfg = cfg.quant_config()
        ids = None
        if qcfg.statistics() is not None:
            if calib is None:
                raise ValueError(f"--quant {cfg.quant} fits on calibration statistics and no calibration windows "
                                 "were given; pass --vq-hessian none for plain k-means")
            ids = calib()
        report = quantize_model_(lm.model, qcfg, scope=cfg.quant_scope, calib_ids=ids, progress=False,
                                 embedding=cfg.embedding, under_dip=uniform_dip, dense_bits=rule)
        name, fit = cfg.quant, {"quant_fit": fit_record(qcfg, ids)}
    return {"quant": name, "quant_scope": cfg.quant_scope,
            "embedding": cfg.embedding if dense else "fp32",
            **({"dense_bits": rule.record()["asked"]} if dense else {}),
            "bits_per_weight": float(report.bits_per_weight), "quant_seconds": float(report.seconds), **fit}


def reachable(method: str, density: float) -> bool:
    from dipdeploy.sparsity.plan import min_density

    return density >= min_density(method) - 1e-9 and (method != "dense" or density == 1.0)


class Evaluator:
    """Holds what every row of one evaluation shares: the (quantised) model, the test windows, the
    calibration windows and the memoised split searches. ``row(method, density)`` evaluates one.

    The adapter and the quantiser work on the CPU (as export's do); the model then moves to ``cfg.device``,
    and the test and calibration windows go to wherever ``lm.model`` is when they are used."""

    def __init__(self, cfg: EvalConfig, progress: Progress | None = None):
        from dipdeploy.loading import load_model
        from dipdeploy.torchdevice import resolve_device

        self.cfg = cfg
        self.device = resolve_device(cfg.device)  # a device torch does not see: refused before the load
        self.progress = progress or Progress(quiet=not cfg.progress)
        with self.progress.stage(f"load {cfg.model}"):
            self.lm = load_model(cfg.model)
        self.lora = "none"
        if cfg.lora is not None:
            from dipdeploy.finetune.adapter import apply_lora

            self.lm = apply_lora(self.lm, cfg.lora, merge=cfg.lora_merge)
            self.lora = "merged" if cfg.lora_merge else "adapter"
        self._calib = None
        with self.progress.stage(f"quantise ({cfg.quant or cfg.weights})") if cfg.quant or cfg.weights else nullcontext():
            self.qinfo = _quantize(self.lm, cfg, lambda: self._windows(cfg.stats_windows))
        self.lm.model.to(self.device)
        self._test = None
        self.splits: dict = {}
        self.curves: dict = {}  # the joint allocation's error curves per score (sparsity.allocate)
        self.predictors: dict = {}  # the predictor method's trained predictors per plan (sparsity.predictor)

    @property
    def test(self):
        """The test windows, tokenised on first use (a task evaluation never needs them)."""
        if self._test is None:
            from dipdeploy.data import load_text, windows

            with self.progress.stage("tokenise the test text"):
                text = load_text(self.cfg.dataset, "test", self.cfg.text_file, self.cfg.data_dir)
                self._test = windows(self.lm.tokenizer, text, self.cfg.seqlen, self.cfg.max_windows)
        return self._test

    def _windows(self, count: int):
        """``count`` windows of ``calib_seqlen`` tokens of the calibration text (WikiText-2 validation)."""
        from dipdeploy.data import calibration_windows

        return calibration_windows(self.lm.tokenizer, count, self.cfg.calib_seqlen, self.cfg.data_dir)

    @property
    def calib(self):
        """The plan's calibration windows (``calib_windows`` of them)."""
        if self._calib is None:
            self._calib = self._windows(self.cfg.calib_windows)
        return self._calib.to(device_of(self.lm.model))

    def row_bytes(self) -> list[int]:
        """What one up|gate and one down row take in the bundle ``export --quant`` would write with this
        evaluation's format (fp32 rows without --quant): the ``reads`` cache split prices misses by them."""
        from dipdeploy.export.mlp import stored_row_bytes

        if self.cfg.weights is not None and self.cfg.quant is None:
            raise ValueError("--cache-split reads prices rows in the bundle's format; with --weights give it as --quant")
        c = self.lm.model.config
        return stored_row_bytes(self.cfg.quant_config() if self.cfg.quant else None, c.hidden_size,
                                c.intermediate_size)

    def plan_for(self, sparsity: SparsityConfig):
        from dipdeploy.sparsity.calibrate import calibrate

        if self.cfg.plan is not None:
            return SparsityPlan.load(self.cfg.plan)
        if sparsity.method == "dense":
            return None
        if self.cfg.lora is not None:  # an adapter runs under the plan it was trained for, when asked for
            from dipdeploy.finetune import adapter_plan

            trained = adapter_plan(self.cfg.lora)
            if trained.method == sparsity.method and abs(trained.density - sparsity.density) < 0.01:
                return trained
        with self.progress.stage(f"calibrate {sparsity.method} ρ={sparsity.density:g}, window passes") as stage:
            return calibrate(self.lm, sparsity, self.calib, self.splits, self.curves, progress=stage)

    def train_predictors(self, plan: SparsityPlan, steps: int):
        """The trained predictors of a ``predictor`` plan (``dipdeploy.sparsity.predictor``), trained once
        per (density, rank, steps) on the calibration windows."""
        from dipdeploy.sparsity.predictor import fit_predictors

        key = (round(plan.density, 6), plan.predictor_rank, steps)
        if key not in self.predictors:
            with self.progress.stage(f"train predictor r={plan.predictor_rank} ρ={plan.density:.4g}, "
                                     f"{steps} steps per layer, layers") as stage:
                self.predictors[key] = fit_predictors(self.lm, plan, self.calib, steps, progress=stage)
        return self.predictors[key]

    def plan(self, method: str, density: float, **overrides):
        """The plan of one row (None for dense): calibrated or given, DIP-CA's ``reads`` split priced in
        this evaluation's row bytes."""
        from dataclasses import replace

        plan = self.plan_for(replace(self.cfg.sparsity, method=method, density=density, **overrides))
        if plan is not None and method == "dip-ca" and plan.cache_split == "reads" and plan.row_bytes is None:
            plan = replace(plan, row_bytes=self.row_bytes())
        return plan

    def sparsify(self, plan: SparsityPlan | None, overrides: dict):
        """Run the model under ``plan`` (dense for None); a predictor plan's predictors trained (once) and
        attached, and returned (None for the other methods). Undo with ``methods.unsparsify_``."""
        from dipdeploy.sparsity.methods import sparsify_

        if plan is None:
            return None
        fit = None
        if plan.method == "predictor":
            fit = self.train_predictors(plan, overrides.get("predictor_steps", self.cfg.sparsity.predictor_steps))
        sparsify_(self.lm.model, plan)
        if fit is not None:
            from dipdeploy.sparsity.predictor import attach

            attach(self.lm.model, fit)
        return fit

    def row(self, method: str, density: float, **overrides) -> dict:

        from dipdeploy.eval.meter import RECALL_METHODS, DensityMeter, RecallMeter
        from dipdeploy.eval.perplexity import perplexity
        from dipdeploy.sparsity.methods import unsparsify_

        cfg = self.cfg
        t0 = time.time()
        plan = self.plan(method, density, **overrides)
        fit = self.sparsify(plan, overrides)
        t1 = time.time()
        batch = cfg.batch_size or (16 if method == "dip-ca" else 1)
        meter = DensityMeter(self.lm.model, plan) if method in ("teal", "cats") else nullcontext()
        recall = RecallMeter(self.lm.model) if method in RECALL_METHODS and (cfg.recall or fit is not None) \
            else None
        try:
            n = int(self.test.shape[0])
            nlls: list[float] = []
            with meter, recall or nullcontext(), \
                    self.progress.stage(f"eval {method} ρ={density:g}, windows", total=n) as stage:
                ppl, tokens = perplexity(self.lm.model, self.test.to(device_of(self.lm.model)), batch,
                                         on_batch=stage.advance, per_window=nlls)
        finally:
            unsparsify_(self.lm.model)
        realised = meter.density() if isinstance(meter, DensityMeter) else (plan.density if plan else 1.0)
        ca = plan is not None and method == "dip-ca"
        return {
            "model": self.lm.name, "method": method,
            "density": round(plan.density if plan else 1.0, 4), "target_density": density,
            "density_test": round(realised, 4),
            "ppl": ppl, "tokens": tokens, "seqlen": cfg.seqlen, "windows": int(self.test.shape[0]),
            "window_nll": [round(v, 4) for v in nlls],  # each test window's summed NLL (dipdeploy.eval.paired)
            "rho_in": round(plan.rho_in, 4) if plan and plan.rho_in else 1.0,
            "allocation": plan.allocation if plan else "-",
            "greedy_strength": plan.calibration.get("greedy_strength") if plan else None,
            "score": plan.score if plan else "-",
            "gamma": plan.gamma if plan else 1.0, "policy": plan.policy if ca else "-",
            "cache_frac": plan.cache_frac if ca else None, "cache_split": plan.cache_split if ca else None,
            "recall": None if recall is None or recall.recall() is None else round(recall.recall(), 4),
            **({"predictor": fit.info()} if fit is not None else {}),
            "lora": self.lora, **self.qinfo, "calib_s": round(t1 - t0, 1), "eval_s": round(time.time() - t1, 1),
        }


def combinations(cfg: EvalConfig) -> list[tuple[str, float]]:
    """The (method, density) rows of ``cfg``: each method at each density it can reach; ``dense`` once, at
    ρ = 1 (so ``--method dense,dip --density 0.4,0.5`` is the dense baseline beside two DIP rows)."""
    combos = []
    for m in cfg.method:
        if m == "dense":
            combos.append(("dense", 1.0))
        else:
            combos += [(m, d) for d in cfg.density if reachable(m, d)]
    return combos


def evaluate(cfg: EvalConfig, progress: Progress | None = None) -> list[dict]:
    """One row per (method, density) of :func:`combinations`: the realised density, PPL and how it was
    obtained."""
    combos = combinations(cfg)
    if not combos:
        raise ValueError(f"no reachable (method, density) among {cfg.method} × {cfg.density}; "
                         f"see docs/method.md's table of lowest densities")
    ev = Evaluator(cfg, progress)
    return [ev.row(m, d) for m, d in combos]
