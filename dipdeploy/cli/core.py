"""CLI commands of the foundation: models, calibrate, eval, demo."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dipdeploy.cli._app import app
from dipdeploy.registry import list_models

console = Console(width=None if sys.stdout.isatty() else 160)  # logs and pipes get whole tables


def fail(err: Exception) -> None:
    """Print a clear one-line error (no traceback, never wrapped, the message's brackets kept) and exit 2."""
    console.print(f"[bold red]error:[/] {escape(' '.join(str(err).split()))}", soft_wrap=True)
    raise typer.Exit(2)


@app.command("models")
def models_cmd() -> None:
    """List the model registry (models/*.toml)."""
    table = Table("name", "architecture", "layout", "layers", "d", "F", "source")
    for m in list_models():
        s = m.shape
        src = "tiny, seed %d" % m.tiny["seed"] if m.tiny else (
            f"pypi:{m.source['pypi']}" if m.source else (m.hf_id or ""))
        table.add_row(m.name, m.architecture, m.mlp_layout, str(s.num_hidden_layers),
                      str(s.hidden_size), str(s.intermediate_size), src)
    console.print(table)


def _sparsity_options(method, density, rho_in, allocation, score, gamma, policy, cache_frac, fixed_top_n,
                      gamma_warmup):
    from dipdeploy.sparsity.plan import SparsityConfig

    return SparsityConfig(method=method, density=density, rho_in=rho_in, allocation=allocation, score=score,
                          gamma=gamma, policy=policy, cache_frac=cache_frac, fixed_top_n=fixed_top_n,
                          gamma_warmup=gamma_warmup)


def print_rows(rows: list[dict], title: str) -> None:
    table = Table(title=title)
    cols = ["method", "density", "rho_in", "allocation", "ppl", "quant", "bits_per_weight", "tokens", "eval_s"]
    for c in cols:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*[f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols])
    console.print(table)


def write_json(rows, path: Optional[Path], force: bool = True) -> None:
    if path is not None:
        from dipdeploy.paths import write_atomic

        write_atomic(path, json.dumps(rows, indent=1), force=force)
        console.print(f"wrote {path}")


# Options shared by eval and calibrate (typer wants them spelled out per command).
MODEL = typer.Option("smollm2-135m", "--model", "-m", help="registry name, HF directory, .gguf file or hub id")
RHO_IN = typer.Option(None, "--rho-in", help="input share ρ_in for teal/dip/dip-ca; default: calibrated")
ALLOC = typer.Option("uniform", "--allocation", help="per-layer allocation: uniform | greedy")
SCORE = typer.Option("abs", "--score", help="DIP score: abs (|x|) | wina (|x_i|·‖W_:,i‖₂)")
GAMMA = typer.Option(0.5, "--gamma", help="DIP-CA re-weighting of non-resident rows (1 = plain DIP)")
POLICY = typer.Option("lfu", "--policy", help="DIP-CA cache policy in the torch reference: lru | lfu")
CACHE = typer.Option(0.5, "--cache-frac", help="DIP-CA cache capacity, fraction of each group's rows")
TOPN = typer.Option(0, "--fixed-top-n", help="DIP-CA: exempt the n largest |x| from re-weighting")
WARM = typer.Option(0, "--gamma-warmup", help="DIP-CA: tokens over which γ goes from 1 to --gamma")
DATA = typer.Option(None, "--data-dir", help="folder with wikitext-2-raw/ (default: $DIPDEPLOY_DATA)")


@app.command("eval")
def eval_cmd(
    model: str = MODEL,
    method: str = typer.Option("dip", help="comma list of: dense, glu, gate, up, cats, teal, dip, dip-ca "
                               "(cats: threshold on |act(W_g x)|, act = SiLU, or GELU for GeGLU)"),
    density: str = typer.Option("0.5", help="comma list of MLP densities ρ in (0, 1]"),
    plan: Optional[Path] = typer.Option(None, help="a plan from `dipdeploy calibrate` (skips calibration)"),
    seqlen: int = typer.Option(2048, help="window length in tokens"),
    max_windows: Optional[int] = typer.Option(16, help="evaluate at most this many windows (all: 0)"),
    dataset: str = typer.Option("wikitext2", help="wikitext2 (test split) or use --text-file"),
    text_file: Optional[Path] = typer.Option(None, help="evaluate on this UTF-8 text instead"),
    data_dir: Optional[Path] = DATA,
    batch_size: Optional[int] = typer.Option(None, help="windows run side by side (default: 16 for dip-ca, else 1)"),
    rho_in: Optional[float] = RHO_IN, allocation: str = ALLOC, score: str = SCORE, gamma: float = GAMMA,
    policy: str = POLICY, cache_frac: float = CACHE, fixed_top_n: int = TOPN, gamma_warmup: int = WARM,
    quant: Optional[str] = typer.Option(None, help="bq4 | bq4-b32 | bq4-b64 | bq4-b128 | vq3 | rtn3"),
    quant_scope: str = typer.Option("mlp", help="mlp | all (attention and lm_head too)"),
    lora: Optional[Path] = typer.Option(None, help="a peft adapter from `dipdeploy finetune` (applied first)"),
    lora_merge: bool = typer.Option(True, "--lora-merge/--lora-live", help="merge the adapter or keep it live"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the rows as a JSON list"),
    plot: Optional[Path] = typer.Option(None, help="save a PPL-vs-density Pareto plot (PNG)"),
) -> None:
    """WikiText-2 perplexity of sparse methods (GPTQ-style protocol of docs/method.md)."""
    from dipdeploy.eval import EvalConfig, evaluate

    try:
        first_density = float(density.split(",")[0])
        sp = _sparsity_options(method.split(",")[0], first_density if first_density <= 1 else 0.5, rho_in,
                               allocation, score, gamma, policy, cache_frac, fixed_top_n, gamma_warmup)
        cfg = EvalConfig(model=model, method=method, density=density, plan=str(plan) if plan else None,
                         seqlen=seqlen, max_windows=max_windows or None, dataset=dataset,
                         text_file=str(text_file) if text_file else None, data_dir=str(data_dir) if data_dir else None,
                         batch_size=batch_size, sparsity=sp, quant=quant, quant_scope=quant_scope,
                         lora=str(lora) if lora else None, lora_merge=lora_merge)
        rows = evaluate(cfg)
    except (ValueError, FileNotFoundError, KeyError, FileExistsError) as err:
        fail(err)
    print_rows(rows, f"{rows[0]['model']} · WikiText-2 · seqlen {seqlen} · {rows[0]['windows']} windows")
    write_json(rows, json_out)
    if plot is not None:
        from dipdeploy.eval.plot import plot_pareto

        console.print(f"wrote {plot_pareto(rows, plot, rows[0]['model'])}")


@app.command("calibrate")
def calibrate_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="where to write the plan (JSON)"),
    model: str = MODEL,
    method: str = typer.Option("dip", help="dense, glu, gate, up, cats, teal, dip, dip-ca"),
    density: float = typer.Option(0.5, help="target MLP density ρ"),
    rho_in: Optional[float] = RHO_IN, allocation: str = ALLOC, score: str = SCORE, gamma: float = GAMMA,
    policy: str = POLICY, cache_frac: float = CACHE, fixed_top_n: int = TOPN, gamma_warmup: int = WARM,
    text_file: Optional[Path] = typer.Option(None, help="calibration text (default: WikiText-2 validation)"),
    data_dir: Optional[Path] = DATA,
    windows: int = typer.Option(8, help="calibration windows"),
    seqlen: int = typer.Option(512, help="calibration window length"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing plan"),
) -> None:
    """Calibrate a sparsity plan (split, thresholds, per-layer allocation) on calibration text."""
    from dipdeploy.eval.data import load_text, windows as make_windows
    from dipdeploy.loading import load_model
    from dipdeploy.paths import check_output
    from dipdeploy.sparsity.calibrate import calibrate

    try:
        check_output(out, force)
        cfg = _sparsity_options(method, density, rho_in, allocation, score, gamma, policy, cache_frac,
                                fixed_top_n, gamma_warmup)
        lm = load_model(model)
        text = load_text("wikitext2", "validation", text_file, data_dir)
        plan = calibrate(lm, cfg, make_windows(lm.tokenizer, text, seqlen, windows))
        plan.save(out, force=force)
    except (ValueError, FileNotFoundError, KeyError, FileExistsError) as err:
        fail(err)
    console.print(f"plan for {plan.model}: {plan.method}, density {plan.density:.4f} "
                  f"(ρ_in {plan.rho_in}, {plan.allocation}) → {out}")


@app.command("demo")
def demo_cmd(
    model: str = MODEL,
    windows: int = typer.Option(4, help="WikiText-2 test windows"),
    seqlen: int = typer.Option(512, help="window length"),
    density: float = typer.Option(0.5, help="MLP density of the sparse methods"),
) -> None:
    """The main job on the embedded default model: dense vs DIP, DIP-CA and two peers, a few windows."""
    from dipdeploy.eval import EvalConfig, Evaluator

    try:
        ev = Evaluator(EvalConfig(model=model, seqlen=seqlen, max_windows=windows))
        rows = [ev.row("dense", 1.0)] + [ev.row(m, density) for m in ("cats", "teal", "dip", "dip-ca")]
    except (ValueError, FileNotFoundError, KeyError) as err:
        fail(err)
    print_rows(rows, f"{rows[0]['model']} · WikiText-2 test · {windows}×{seqlen} tokens · calibrated on validation")


@app.command("trace")
def trace_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="trace file to write (.npz)"),
    model: str = MODEL,
    method: str = typer.Option("dip", help="dense | dip | dip-ca"),
    density: float = typer.Option(0.5, help="target MLP density ρ (ignored for dense)"),
    plan: Optional[Path] = typer.Option(None, help="a plan from `dipdeploy calibrate` (skips calibration)"),
    tokens: int = typer.Option(512, min=1, help="tokens to trace"),
    split: str = typer.Option("test", help="WikiText-2 split to trace (test | validation)"),
    text_file: Optional[Path] = typer.Option(None, help="trace this UTF-8 text instead"),
    data_dir: Optional[Path] = DATA,
    rho_in: Optional[float] = RHO_IN, gamma: float = GAMMA, policy: str = POLICY, cache_frac: float = CACHE,
    force: bool = typer.Option(False, "--force", help="overwrite an existing trace"),
) -> None:
    """Record per-token, per-layer selected rows (and magnitudes) from the torch reference, for `simulate`."""
    from dipdeploy.eval.data import load_text, windows as make_windows
    from dipdeploy.loading import load_model
    from dipdeploy.paths import check_output
    from dipdeploy.sparsity.calibrate import calibrate
    from dipdeploy.sparsity.plan import SparsityConfig, SparsityPlan, uniform_plan
    from dipdeploy.sparsity.trace import record_trace

    try:
        check_output(out, force)
        lm = load_model(model)
        c = lm.model.config
        if plan is not None:
            p = SparsityPlan.load(plan)
        elif method == "dense":
            p = uniform_plan(SparsityConfig(method="dip", density=1.0), lm.name, c.num_hidden_layers,
                             c.hidden_size, c.intermediate_size)
        else:
            cfg = SparsityConfig(method=method, density=density, rho_in=rho_in, gamma=gamma, policy=policy,
                                 cache_frac=cache_frac)
            calib = make_windows(lm.tokenizer, load_text("wikitext2", "validation", None, data_dir), 512, 4)
            p = calibrate(lm, cfg, calib)
        ids = make_windows(lm.tokenizer, load_text("wikitext2", split, text_file, data_dir), tokens, 1)
        trace = record_trace(lm, p, ids, meta={"text": str(text_file) if text_file else f"wikitext2/{split}"})
        trace.save(out, force=force)
    except (ValueError, FileNotFoundError, KeyError, FileExistsError) as err:
        fail(err)
    console.print(f"trace of {trace.num_tokens} tokens × {trace.num_layers} layers ({trace.method}, "
                  f"ρ={trace.density:.3f}) → {out}")
