"""CLI of the export stage: ``dipdeploy export`` and ``dipdeploy inspect`` (parse, call, present)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer
from dipdeploy import defaults
from dipdeploy.cli._app import app
from dipdeploy.cli.core import (CALIB_SEQLEN, CALIB_WINDOWS, STATS_WINDOWS, VQ_DENSITY, VQ_FEEDBACK, VQ_HESSIAN, console, fail,
                                kept, utf8, write_json)
from dipdeploy.cli.tables import table as make_table
from dipdeploy.export.config import ExportConfig
from dipdeploy.limits import MAX_TOKENS, check_count
from dipdeploy.terminal import shown

_X = ExportConfig  # every default of export is ExportConfig's (docs/design.md §1)

# OSError covers FileNotFoundError, FileExistsError, PermissionError and a full disk.
_ERRORS = (ValueError, KeyError, RuntimeError, OSError)


def _config(**given):
    """ExportConfig from the flags that were given; the rest keep the dataclass defaults."""
    fields = {f.name for f in dataclasses.fields(ExportConfig)}
    return ExportConfig(**{k: v for k, v in given.items() if v is not None and k in fields})


def _check_per_layer(asked: Optional[bool], cfg) -> None:
    """The per-layer graphs run DIP's sparse MLPs for the host runtime; a dense export has none, and an
    explicit ``--per-layer`` must not be dropped silently."""
    from dipdeploy.sparsity.plan import SparsityPlan

    method = SparsityPlan.load(cfg.plan).method if cfg.plan else cfg.method
    if asked and method == "dense":
        raise ValueError("--per-layer with a dense export: the per-layer graphs run DIP's sparse MLPs and a dense "
                         "model has none; drop --per-layer, or export --method dip --rho-in 1 --density 1 for a "
                         "dense baseline that `dipdeploy run` can stream")


@app.command("export")
def export_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="bundle directory to create"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="registry name, HF dir, .gguf or hub id "
                                        f"(default: {_X.model})"),
    method: Optional[str] = typer.Option(None, help=f"dense | dip | dip-ca (default: {_X.method})"),
    density: Optional[float] = typer.Option(None, help=f"MLP density ρ when no --plan (default {_X.density:g})"),
    rho_in: Optional[float] = typer.Option(None, "--rho-in", help="input share; given = no calibration"),
    gamma: Optional[float] = typer.Option(None, help=f"DIP-CA γ for the host runtime (default {_X.gamma:g})"),
    plan: Optional[Path] = typer.Option(None, help="a plan from `dipdeploy calibrate`"),
    quant: Optional[str] = typer.Option(None, help="none | bq4 | bq4-b32 | bq4-b64 | bq4-b128 | bq4-a32 | vq3 "
                                        "(calibrated on the plan's calibration text unless --vq-hessian none)"),
    vq_hessian: Optional[str] = VQ_HESSIAN,
    vq_feedback: Optional[bool] = VQ_FEEDBACK,
    vq_density: Optional[float] = VQ_DENSITY,
    calib_windows: int = CALIB_WINDOWS,
    calib_seqlen: int = CALIB_SEQLEN,
    stats_windows: int = STATS_WINDOWS,
    lora: Optional[Path] = typer.Option(None, help="a peft LoRA adapter directory, merged before quantising"),
    accuracy_level: Optional[int] = typer.Option(None, help="0 = fp32; 4 = int8 activations (MatMulNBits) and "
                                                 "int8 coefficients (BQ4 SparseGatherMatMul)"),
    attention: Optional[str] = typer.Option(None, help="standard (opset 21) | gqa (com.microsoft GroupQueryAttention)"),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="positions the graphs cover (RoPE tables, "
                                             f"genai_config's context_length; default {_X.max_length}, at most "
                                             "the model's max_position_embeddings)"),
    per_layer: Optional[bool] = typer.Option(None, "--per-layer/--no-per-layer",
                                             help="also write the per-layer graphs for the host runtime"),
    fuse_norms: Optional[bool] = typer.Option(None, "--fuse-norms/--no-fuse-norms",
                                              help="residual add + RMSNorm as one com.microsoft::"
                                                   "SkipSimplifiedLayerNormalization (default) or as standard ops"),
    embedding: Optional[str] = typer.Option(None, help="int4 | fp32: the token embedding of a quantised bundle "
                                            "(int4: GatherBlockQuantized rows, shared with a tied lm_head; "
                                            f"default {_X.embedding})"),
    dense_bits: Optional[str] = typer.Option(None, "--dense-bits", help="auto | 4 | 8: bits of the attention and "
                                             "lm_head weights of a quantised bundle (auto: 8 where the source GGUF "
                                             "stores a tensor with more than 4.5 bits/weight, never fewer than the file you "
                                             "brought; 4 for a source that is not a quantised GGUF; default "
                                             f"{_X.dense_bits})"),
    stream: Optional[bool] = typer.Option(None, "--stream/--no-stream",
                                          help="read the weights one layer at a time (models larger than "
                                               "memory; calibration and --lora too, the same bundle; no torch "
                                               "validation); default: when the fp32 model exceeds half of the "
                                               "free memory"),
    device: Optional[str] = typer.Option(None, help="where calibration runs: auto (cuda when torch sees one) | "
                                         f"cpu | cuda (default: {_X.device})"),
    validate_tokens: Optional[int] = typer.Option(None, help=f"greedy tokens to validate (0 = skip; default {_X.validate_tokens})"),
    prompt: Optional[str] = typer.Option(None, help=f"validation prompt (default {_X.prompt!r})"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="folder with wikitext-2-raw/"),
    row_order: Optional[str] = typer.Option(None, "--row-order", help="auto | calibrated | natural: rows that miss "
                                            f"together placed in the same Flash blocks (default {_X.row_order})"),
    force: bool = typer.Option(False, "--force", help="replace an existing bundle at --out"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the summary and validation as JSON"),
) -> None:
    """Export a model with DIP sparse MLPs as a validated ONNX bundle (see docs/bundle.md)."""
    import signal

    from dipdeploy.cli.core import check_inputs
    from dipdeploy.progress import Progress

    # `kill` (SIGTERM) cleans up like Ctrl-C: the temporary bundle directory is removed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        check_inputs(data_dir=data_dir, files={"--plan": plan}, outputs={"--json": json_out}, force=force)
        utf8(prompt, "--prompt")
        if lora is not None and not lora.is_dir():
            raise FileNotFoundError(f"--lora {lora} is not an adapter directory; give one from `dipdeploy finetune`")
        cfg = _config(model=model, method=method, density=density, rho_in=rho_in, gamma=gamma,
                      plan=str(plan) if plan else None, quant=quant, lora=str(lora) if lora else None,
                      accuracy_level=accuracy_level, attention=attention, max_length=max_length, per_layer=per_layer,
                      fuse_norms=fuse_norms, embedding=embedding, dense_bits=dense_bits, stream=stream, device=device,
                      validate_tokens=validate_tokens, prompt=prompt, data_dir=str(data_dir) if data_dir else None,
                      row_order=row_order, vq_hessian=vq_hessian, vq_feedback=vq_feedback, vq_density=vq_density,
                      calib_windows=calib_windows, calib_seqlen=calib_seqlen, stats_windows=stats_windows)
        _check_per_layer(per_layer, cfg)
        check_inputs(model=cfg.model)
        from dipdeploy.export.bundle import export_model

        steps = Progress().steps()
        try:
            result = export_model(cfg, out, force=force, progress=steps,
                                  notice=lambda line: console.print(f"[yellow]note:[/] {shown(line)}"))
        finally:
            steps()
    except _ERRORS as err:
        fail(err)
    summary = result.summary()
    table = make_table("item", "value", title=f"bundle {shown(out)}", wrap=("value",))
    for k, v in summary.items():
        if k != "steps_s" and k not in VALIDATION_KEYS and v is not None:
            table.add_row(shown(k), f"{v:.4g}" if isinstance(v, float) else shown(v))
    v = result.manifest.validation
    table.add_row("validation", shown(_verdict(v)))
    if _drift(v):
        table.add_row("free-running", shown(_drift(v)))
    table.add_row("quality", shown(_quality(summary["method"], summary["density"], summary["quant"], cfg.model,
                                               cfg.rho_in)))
    console.print(table)
    console.print(f"{summary['seconds']} s in all; steps (s): {shown(summary['steps_s'])}")
    from dipdeploy.ops.native import library_path

    lib = library_path()
    console.print(f"run it: dipdeploy run {shown(out)} -p TEXT  (in your own ORT code, register "
                  + (f"{shown(lib)}, the op library dipdeploy runs on," if lib else "the op library")
                  + " with SessionOptions.register_custom_ops_library for the native kernels; a bundle's own copy "
                  "is code: `dipdeploy inspect BUNDLE --verify` checks it is this one)")
    kept(write_json({**summary, "validation": result.manifest.validation}, json_out, force,
                    schema="export"))


def _file_kind(name: str) -> str:
    if name in ("mlp.bin", "dense.bin"):
        return name
    if name.endswith(".onnx"):
        return "graphs (.onnx)"
    if name.endswith((".so", ".dll", ".dylib")):
        return "native library"
    return "tokenizer+configs"


def _sizes(files: dict) -> dict[str, int]:
    """Bytes per kind of file: what a user asks first (how big, where the bytes are)."""
    out: dict[str, int] = {}
    for name, rec in files.items():
        out[_file_kind(name)] = out.get(_file_kind(name), 0) + int(rec["size"])
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


#: The validation record's keys: export's summary shows them as its validation, free-running and quality
#: lines (:func:`_verdict`, :func:`_drift`, :func:`_quality`), not one by one; ``--json`` keeps each.
VALIDATION_KEYS = ("agrees_stock", "agrees_native", "near_ties_stock", "near_ties_native", "max_abs_diff",
                   "max_abs_diff_native", "max_abs_diff_free_stock", "tolerance", "level4", "validation_skipped")


def _verdict(v: dict) -> str:
    """One line from the validation record (docs/bundle.md, "Validation"): whether the graphs compute what
    their torch reference computes. It says nothing of the model's quality (:func:`_quality`)."""
    if not v:
        return "not run (exported with --validate-tokens 0)"
    if v.get("skipped"):
        return f"skipped: {v['skipped']}"
    native = {True: "native agrees", False: "native DIFFERS", None: "native not run"}[v.get("agrees_native")]
    stock = "stock ORT agrees" if v.get("agrees_stock") else "stock ORT DIFFERS"
    ties = sum(len(v.get(k) or ()) if isinstance(v.get(k), list) else (v.get(k) or 0)
               for k in ("near_ties_stock", "near_ties_native"))
    diff, tol = v.get("max_abs_diff"), v.get("tolerance")
    bound = (f"; max |Δlogit| {diff:.2g} {'≤' if diff <= tol else '>'} tolerance {tol:g}"
             if diff is not None and tol is not None else "")
    head = "matches its torch reference" if v.get("ok") else "DIFFERS from its torch reference"
    return (f"{head} ({stock}, {native}, {ties} near-ties{bound})"
            + ("; level 4 measured (--json)" if v.get("level4") else ""))


def _drift(v: dict) -> str | None:
    """``max_abs_diff_free_stock``: stock ORT against torch's free-running greedy reference, whose top-K
    picks are its own, not ORT's: where two scores tie within rounding the two keep different rows and the
    logits part. It shows how far a near-tie moves a sparse model; no tolerance applies, so no verdict."""
    free = (v or {}).get("max_abs_diff_free_stock")
    if free is None:
        return None
    return (f"{free:.2g} max |Δlogit| against torch's own greedy run (its top-K picks, not ORT's: a near-tie "
            "moves it; informative, no tolerance)")


def _quality(method: str, density: float | None, quant: str | None, model: str | None,
             rho_in: float | None = None) -> str:
    """Validation checks the export, not the model: a sparse model at a low density can pass it and still
    answer badly. The measurement of quality is ``dipdeploy eval`` (perplexity against dense), named with
    the export's own knobs so it measures the same plan."""
    args = ([f"--model {model}"] if model and model != defaults.MODEL else []) + [f"--method {method}"]
    if method != "dense" and density is not None:
        args.append(f"--density {density:.3g}")
        args += [f"--rho-in {rho_in:g}"] if rho_in is not None else []
    if quant and quant != "none":
        args.append(f"--quant {quant}")
    return f"not judged by validation: `dipdeploy eval {' '.join(args)}` measures perplexity beside dense"


def _fit_line(fit: dict | None) -> str:
    """How the MLP was fitted (manifest ``quant.fit``; empty for formats with no statistics)."""
    if not fit or fit.get("statistics") == "none":
        return "; fitted without calibration" if fit and fit.get("calibration_tokens") == 0 else ""
    return (f"; fitted on {fit['statistics']} statistics of {fit['calibration_tokens']} calibration tokens"
            + (" with error feedback" if fit.get("error_feedback") else ""))


def _plan_line(plan: dict) -> str:
    layers = plan.get("layers") or []
    if not layers:
        return f"density {plan.get('density', 1.0):.4g}"
    k_in, k_glu = [lp["k_in"] for lp in layers], [lp["k_glu"] for lp in layers]
    span = lambda ks: f"{min(ks)}" if min(ks) == max(ks) else f"{min(ks)}–{max(ks)}"  # noqa: E731
    return (f"density {plan.get('density', 1.0):.4g}, {plan.get('allocation', 'uniform')}, {len(layers)} layers: "
            f"K_in {span(k_in)}/{plan.get('hidden_size', '?')}, K_glu {span(k_glu)}/{plan.get('intermediate_size', '?')}"
            f", γ {plan.get('gamma', 1.0):g}")


@app.command("inspect")
def inspect_cmd(
    bundle: Path = typer.Argument(..., help="a bundle directory from `dipdeploy export`"),
    verify: bool = typer.Option(False, "--verify", help="also check the sha256 of the tensor data files and "
                                "that the op library is one this dipdeploy built (the structure, sizes and the "
                                "other files' sha256 are always checked)"),
    files: bool = typer.Option(False, "--files", help="also list every file (bytes, sha256) and each layer's K"),
    prompt: Optional[str] = typer.Option(None, help="also generate greedily from this prompt (plain ORT)"),
    max_new_tokens: int = typer.Option(defaults.MAX_NEW_TOKENS, help="tokens to generate with --prompt"),
    native: bool = typer.Option(False, "--native", help="with --prompt: register the native op library"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the manifest summary as JSON"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing --json file"),
) -> None:
    """A bundle's summary on one screen (after the structure checks); --files lists every file,
    --verify checks every checksum."""
    from dipdeploy.bundle.manifest import read_manifest, verify as verify_bundle
    from dipdeploy.cli.core import check_inputs

    try:
        check_inputs(outputs={"--json": json_out}, force=force)
        utf8(prompt, "--prompt")
        if max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens {max_new_tokens}: give at least 1")
        check_count(max_new_tokens, "--max-new-tokens", 1, MAX_TOKENS, "tokens")
        m = read_manifest(bundle)
    except _ERRORS as err:
        fail(err)
    plan = m.plan or {}
    q = m.quant or {}
    rows = {"format": f"{m.format} v{m.version}", "model": m.source.get("model"),
            "architecture": m.source.get("architecture"), "method": m.method,
            "density": plan.get("density", 1.0), "score": plan.get("score", "-"),
            "quant": q.get("name", "none"),
            "bits/weight (MLP)": q.get("bits_per_weight_mlp", 32.0),
            "ops": f"{m.ops['domain']} v{m.ops['version']}", "onnxruntime": f">= {m.onnxruntime['min']}",
            "graphs": ", ".join([m.graphs["model"]] + ([f"{len(m.graphs['layers'])} per-layer"]
                                                       if m.graphs.get("layers") else [])),
            "tensors": len(m.tensors), "validation": json.dumps({k: m.validation.get(k) for k in (
                "agrees_stock", "agrees_native", "near_ties_stock", "near_ties_native", "max_abs_diff", "tolerance",
                "level4")})}
    sizes = _sizes(m.files)
    quant = "none (fp32)" if not q else (
        f"{q.get('name')}: MLP {q.get('bits_per_weight_mlp', 32.0):.4g} bits/weight; attention and lm_head "
        f"{q.get('attention_and_lm_head', '-')} ({q.get('bits_per_weight_dense', 32.0):.4g}); "
        f"embedding {q.get('embedding', 'fp32')}" + _fit_line(q.get("fit")))
    exported = m.onnxruntime.get("exported_with")
    summary = {
        "model": f"{rows['model']} ({rows['architecture']})",
        "method": f"{m.method}, score {rows['score']}",
        "plan": _plan_line(plan),
        "quant": quant,
        "size": f"{_mb(sum(sizes.values()))}: " + ", ".join(f"{k} {_mb(v)}" for k, v in sizes.items()),
        "graphs": f"{rows['graphs']}; {rows['tensors']} tensors",
        "validation": _verdict(m.validation),
        "quality": _quality(m.method, plan.get("density"), q.get("name"), m.source.get("model"),
                            m.export_config.get("rho_in")),
        "runtime": f"onnxruntime {rows['onnxruntime']}" + (f" (exported with {exported})" if exported else "")
                   + f"; ops {rows['ops']}" + (f", native {m.ops['native_library']}"
                                               if m.ops.get("native_library") else ", no native library"),
    }
    # every value below may come from the manifest: printed through shown (dipdeploy.terminal)
    table = make_table("item", "value", title=f"bundle {shown(bundle)} ({shown(rows['format'])})", wrap=("value",))
    for k, v in summary.items():
        table.add_row(shown(k), shown(v))
    console.print(table)
    if files:
        listing = make_table("file", "bytes", "sha256", wrap=("file",))
        for name, rec in m.files.items():
            listing.add_row(shown(name), shown(rec["size"]), shown(str(rec["sha256"])[:16]))
        console.print(listing)
        if plan.get("layers"):
            console.print("K_in/K_glu per layer: " + shown(" ".join(f"{lp['k_in']}/{lp['k_glu']}"
                                                                     for lp in plan["layers"])))
    problems = []
    if verify:
        from dipdeploy.ops.native import known_library_hashes

        problems = verify_bundle(bundle, m, checksums="all", libraries=known_library_hashes())
        console.print("verify: [green]ok[/]" if not problems else "verify: [red]" + shown("; ".join(problems)) + "[/]")
    gen = None
    if prompt is not None:
        from dipdeploy.export.generate import generate

        try:
            g = generate(bundle, prompt, max_new_tokens, native=native)
        except _ERRORS as err:
            fail(err)
        console.print(f"[bold]{shown(g.prompt, lines=True)}[/]{shown(g.text, lines=True)}")
        console.print(f"{len(g.tokens)} tokens, {g.tokens_per_s:.1f} tok/s, "
                      f"{'native library' if g.native else 'stock ORT'}, 1 thread, {shown(m.method)} "
                      f"{shown(rows['quant'])}")
        gen = {"text": g.text, "tokens": g.tokens, "tokens_per_s": g.tokens_per_s, "native": g.native}
    kept(write_json({**rows, "summary": summary, "sizes": sizes, "problems": problems, "generation": gen}, json_out,
                    force, schema="inspect"))
    if problems:
        raise typer.Exit(1)
