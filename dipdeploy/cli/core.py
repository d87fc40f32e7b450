"""CLI commands of the foundation: models, calibrate, eval, demo."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console

from dipdeploy import defaults
from dipdeploy.cli._app import app
from dipdeploy.cli.tables import table as make_table
from dipdeploy.demo import DemoConfig, chat_hint
from dipdeploy.eval import EvalConfig
from dipdeploy.eval.humaneval import TaskConfig
from dipdeploy.limits import MAX_TOKENS, MAX_WINDOWS, check_caps
from dipdeploy.quant.config import CALIBRATED_FEEDBACK, VQ3QuantConfig
from dipdeploy.registry import list_models
from dipdeploy.sparsity.plan import PREDICTOR_EVAL_ONLY, SparsityConfig, allocation_label
from dipdeploy.terminal import shown
from dipdeploy.torchdevice import DEFAULT_DEVICE

console = Console(width=None if sys.stdout.isatty() else 160)  # logs and pipes get whole tables
#: what accompanies a command's result (run's stats, notes), so stdout holds the result alone
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def fail(err: Exception) -> None:
    """Print a clear one-line error (no traceback, never wrapped, the message's brackets kept, a file's
    control characters made visible) on stderr, where a redirected stdout does not hide it, and exit 2."""
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)  # KeyError quotes its str
    err_console.print(f"[bold red]error:[/] {' '.join(shown(text).split())}", soft_wrap=True)
    raise typer.Exit(2)


def utf8(text: Optional[str], flag: str) -> Optional[str]:
    """A text option must be UTF-8: bytes that are not reach Python as lone surrogates, which every
    tokenizer refuses with a message that names neither the option nor the fix."""
    if text is not None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"{flag} holds bytes that are not valid UTF-8 (at character {err.start}); give UTF-8 "
                             f"text (a UTF-8 locale: LANG=C.UTF-8)") from None
    return text


@app.command("models")
def models_cmd() -> None:
    """List the model registry (dipdeploy/models/*.toml)."""
    table = make_table("name", "architecture", "layout", "layers", "d", "F", "source", wrap=("source",))
    for m in list_models():
        s = m.shape
        src = "tiny, seed %d" % m.tiny["seed"] if m.tiny else (
            _source_label(m.source) if m.source else (m.hf_id or ""))
        table.add_row(*map(shown, (m.name, m.architecture, m.mlp_layout, s.num_hidden_layers, s.hidden_size,
                                   s.intermediate_size, src)))
    console.print(table)


def _source_label(src: dict) -> str:
    """Where a real model's file comes from: one package, or N part packages (``name-part1…N``)."""
    return f"pypi:{src['parts'].format('1…' + str(src['count']))}" if "parts" in src else f"pypi:{src['pypi']}"


def _sparsity_options(method, density, rho_in, allocation, score, gamma, policy, cache_frac, fixed_top_n,
                      gamma_warmup, cache_split=SparsityConfig.cache_split,
                      predictor_rank=SparsityConfig.predictor_rank, predictor_steps=SparsityConfig.predictor_steps):
    return SparsityConfig(method=method, density=density, rho_in=rho_in, allocation=allocation, score=score,
                          gamma=gamma, policy=policy, cache_frac=cache_frac, fixed_top_n=fixed_top_n,
                          gamma_warmup=gamma_warmup, cache_split=cache_split, predictor_rank=predictor_rank,
                          predictor_steps=predictor_steps)


#: eval's table: row key → column header (short, so ten columns fit 80)
_ROW_COLUMNS = {"method": "method", "density": "ρ", "rho_in": "ρ_in", "allocation": "alloc", "ppl": "PPL",
                "quant": "quant", "bits_per_weight": "bits/\nweight", "tokens": "tokens", "calib_s": "calib\ns",
                "eval_s": "eval\ns"}


def print_rows(rows: list[dict], title: str, seconds: Optional[float] = None) -> None:
    """eval's rows as a table, and under it the time the command took (``seconds``, when given) in all and
    per part: each row's calibration (``calib s``: its plan calibrated, or read) and evaluation (``eval s``)."""
    cols = list(_ROW_COLUMNS)
    table = make_table(*_ROW_COLUMNS.values(), title=title, wrap=("quant",))
    for r in rows:
        r = {**r, "allocation": allocation_label(r.get("allocation", "-"), r.get("greedy_strength"))}
        table.add_row(*[f"{r[c]:.4g}" if isinstance(r.get(c), float) else shown(r.get(c, "")) for c in cols])
    console.print(table)
    if seconds is not None:
        console.print(time_line(rows, seconds), highlight=False)


def time_line(rows: list[dict], seconds: float) -> str:
    """``time: T in all (calibrate C, evaluate E, load and the rest R)``: the rows' ``calib_s`` and
    ``eval_s`` summed; calibration named only where some row spent time on it."""
    from dipdeploy.progress import duration

    calib, evaluate = (sum(float(r.get(k) or 0.0) for r in rows) for k in ("calib_s", "eval_s"))
    parts = ([f"calibrate {duration(calib)}"] if calib >= 0.1 else []) + [f"evaluate {duration(evaluate)}"]
    rest = max(seconds - calib - evaluate, 0.0)
    return f"time: {duration(seconds)} in all ({', '.join(parts)}, load and the rest {duration(rest)})"


def write_output(write: Callable[[Path, bool], object], path: Optional[Path], force: bool, flag: str, *,
                 text: Optional[str] = None, said: bool = True) -> bool:
    """Write one output once the work is done (``write(path, force)``), and never lose the results to a
    failed write: a full disk, a folder made unwritable, a file put in the way since the check before the
    work. Then ``write`` is tried on a fresh file in the temporary folder, then in the current one, and
    ``text`` (the output as text) goes to stdout as the last resort; one line on stderr says what failed
    and where the results are. False when they are not at ``path`` (the command then exits 1: ``kept``).
    ``said``: print ``wrote PATH`` (False where the command's own line names the output)."""
    if path is None:
        return True
    try:
        write(path, force)
    except OSError as err:
        where = _elsewhere(write, path)
        if where is None and text is not None:
            typer.echo(text)
            where = "are on stdout"
        else:
            where = f"are in {where} instead" if where is not None else "could not be kept elsewhere either"
        why = err.strerror or " ".join(str(err).split())
        typer.echo(shown(f"error: could not write {flag} {path} ({why}); the results {where}", markup=False),
                   err=True)
        return False
    if said:
        console.print(f"wrote {shown(path)}")
    return True


def _elsewhere(write: Callable[[Path, bool], object], path: Path) -> Optional[Path]:
    """A fresh file named after ``path`` in the temporary folder or the current one that ``write`` filled."""
    import os
    import tempfile

    for folder in (tempfile.gettempdir(), os.getcwd()):
        try:
            fd, spare = tempfile.mkstemp(prefix=f"dipdeploy-{path.stem}-", suffix=path.suffix, dir=folder)
            os.close(fd)
        except OSError:
            continue
        try:
            write(Path(spare), True)
            return Path(spare)
        except OSError:
            Path(spare).unlink(missing_ok=True)
    return None


def kept(*written: bool) -> None:
    """Exit 1 when an output is not where it was asked for (``write_output`` said where it is)."""
    if not all(written):
        raise typer.Exit(1)


def write_json(body, path: Optional[Path], force: bool, flag: str = "--json", said: bool = True, *,
               schema: str) -> bool:
    """``body`` as the JSON document of ``schema`` (a command of ``dipdeploy.jsonout.VERSIONS``, which adds
    the schema keys) at ``path`` through :func:`write_output` (kept elsewhere if the write fails)."""
    from dipdeploy.jsonout import dumps
    from dipdeploy.paths import write_atomic

    text = dumps(schema, body)
    return write_output(lambda p, f: write_atomic(p, text, force=f), path, force, flag, text=text, said=said)


# Options shared by eval and calibrate (typer wants them spelled out per command); every default is read
# from the dataclass that owns it (docs/design.md §1): SparsityConfig, EvalConfig, dipdeploy.defaults.
_S, _EV, _TASK = SparsityConfig, EvalConfig, TaskConfig
TASKS = ("wikitext2", "humaneval")
#: eval's options that build the model and its plans (``model_eval_config``), for both tasks
_MODEL_ARGS = ("model", "method", "density", "plan", "data_dir", "rho_in", "allocation", "score", "gamma", "policy",
               "cache_frac", "fixed_top_n", "gamma_warmup", "cache_split", "quant", "quant_scope", "embedding",
               "dense_bits", "weights", "vq_hessian", "vq_feedback", "vq_density", "calib_windows", "calib_seqlen",
               "stats_windows", "lora", "lora_merge", "device", "predictor_rank", "predictor_steps")
#: eval's options of `--bundle` perplexity beyond those (``task.bundle_perplexity_cmd``)
_BUNDLE_PPL_ARGS = ("bundle", "dram_budget", "speculate", "draft", "seqlen", "max_windows", "dataset", "text_file",
                    "batch_size", "json_out", "plot", "force")
#: eval's options of `--task humaneval` beyond those (the rest are perplexity's)
_HUMANEVAL_ARGS = ("batch_size", "json_out", "plot", "force", "limit", "max_new_tokens", "bundle", "dram_budget",
                   "timeout", "resume", "speculate", "draft")
MODEL = typer.Option(defaults.MODEL, "--model", "-m", help="registry name, HF directory, .gguf file or hub id")
RHO_IN = typer.Option(None, "--rho-in", help="input share ρ_in for teal/dip/dip-ca; default: calibrated")
ALLOC = typer.Option(_S.allocation, "--allocation", help="per-layer allocation: uniform | greedy | joint (per-layer density and split) | greedy-split (greedy densities, per-layer split; docs/method.md)")
SCORE = typer.Option(_S.score, "--score", help="DIP score: abs (|x|) | wina (|x_i|·‖W_:,i‖₂, and |GLU~|·‖W_d[:,j]‖₂) | wina-in (the input group only, folded into the weights on export)")
GAMMA = typer.Option(_S.gamma, "--gamma", help="DIP-CA re-weighting of non-resident rows (1 = plain DIP)")
POLICY = typer.Option(_S.policy, "--policy", help="DIP-CA cache policy in the torch reference: lru | lfu")
CACHE = typer.Option(_S.cache_frac, "--cache-frac", help="DIP-CA cache capacity, fraction of the MLP rows' bytes")
TOPN = typer.Option(_S.fixed_top_n, "--fixed-top-n", help="DIP-CA: exempt the n largest |x| from re-weighting")
WARM = typer.Option(_S.gamma_warmup, "--gamma-warmup", help="DIP-CA: tokens over which γ goes from 1 to --gamma")
SPLIT = typer.Option(_S.cache_split, "--cache-split", help="DIP-CA: how the cache's bytes are shared between the "
                     "groups, as `run --cache-split`: reads (where a cached byte saves the most reading; rows priced "
                     "in fp32, or in eval's --quant format) | even (the same fraction of each group's rows)")
DATA = typer.Option(None, "--data-dir", help="folder with wikitext-2-raw/ (default: $DIPDEPLOY_DATA)")
FORCE = typer.Option(False, "--force", help="overwrite existing output files")
# The calibrated VQ3 (quantize, eval --quant vq3, export --quant vq3): None = quant.config.calibrated_config's default
VQ_HESSIAN = typer.Option(None, "--vq-hessian", help="vq3: calibration statistics weighting the rows: none (plain "
                          f"k-means) | dense | dip (default {VQ3QuantConfig.hessian})")
VQ_FEEDBACK = typer.Option(None, "--vq-feedback/--no-vq-feedback", help="vq3: GPTVQ-style error feedback through "
                           f"the statistics (default {'on' if CALIBRATED_FEEDBACK else 'off'}; off with --vq-hessian none)")
VQ_DENSITY = typer.Option(None, "--vq-density", help="vq3 --vq-hessian dip: the DIP density whose selections weight "
                          f"the rows (default {VQ3QuantConfig.hessian_density})")
CALIB_WINDOWS = typer.Option(defaults.CALIB_WINDOWS, "--calib-windows", help="calibration windows (WikiText-2 "
                             "validation split) of the plan")
STATS_WINDOWS = typer.Option(defaults.STATS_WINDOWS, "--stats-windows", help="windows of --calib-seqlen tokens of "
                             "the same text that a calibrated quantisation (vq3, -gptq) estimates its statistics on")
CALIB_SEQLEN = typer.Option(defaults.CALIB_SEQLEN, "--calib-seqlen", help="tokens per calibration window")
# None stands for the default, so that finetune can tell an explicit --device under a launcher
DEVICE = typer.Option(None, "--device", help="where torch computes: auto (cuda when torch sees a GPU) | cpu | "
                      f"cuda (default: {DEFAULT_DEVICE})")


def check_inputs(*, data_dir: Optional[Path] = None, files: dict[str, Optional[Path]] | None = None,
                 outputs: dict[str, Optional[Path]] | None = None, force: bool = False,
                 model: Optional[str] = None) -> None:
    """The checks every command runs before any work: named input folders and files exist, every output
    can be written (``dipdeploy.paths.check_output``: one overwrite rule, ``--force``), and ``model``
    names something loadable (a hub id only from the local cache) of a family DIP can prune, so a typo or an
    unsupported architecture fails before any stage."""
    from dipdeploy.paths import check_input_dir, check_input_file, check_outputs

    check_input_dir(data_dir, "--data-dir")
    for flag, path in (files or {}).items():
        check_input_file(path, flag)
    check_outputs(force, outputs or {})
    if (outputs or {}).get("--plot") is not None:
        from dipdeploy.extras import require

        require("plot")  # a PNG asked for, checked before the work it would plot
    if model is not None:
        from dipdeploy.loading import check_model

        check_model(model)


def model_eval_config(opts: dict, **task_fields) -> EvalConfig:
    """The ``EvalConfig`` of eval's model and plan options (``_MODEL_ARGS``, as the CLI parsed them) and a
    task's own fields: one construction for perplexity and HumanEval, every option checked before the
    model loads (the adapter folder, the density list, the sparsity knobs, the model itself)."""
    o = opts
    if o["lora"] is not None and not o["lora"].is_dir():
        raise FileNotFoundError(f"--lora {o['lora']} is not an adapter directory; give one from `dipdeploy finetune`")
    if o["density"] is not None:
        floats(o["density"], "--density")
    # the knobs every row shares; each row sets its own method and density (evaluate)
    sp = _sparsity_options(_S.method, _S.density, o["rho_in"], o["allocation"], o["score"], o["gamma"], o["policy"],
                           o["cache_frac"], o["fixed_top_n"], o["gamma_warmup"], o["cache_split"],
                           o["predictor_rank"], o["predictor_steps"])
    cfg = EvalConfig(model=o["model"], method=o["method"], density=o["density"],
                     plan=str(o["plan"]) if o["plan"] else None, data_dir=str(o["data_dir"]) if o["data_dir"] else None,
                     sparsity=sp, quant=o["quant"], quant_scope=o["quant_scope"], embedding=o["embedding"],
                     dense_bits=o["dense_bits"] or _EV.dense_bits,
                     weights=str(o["weights"]) if o["weights"] else None, vq_hessian=o["vq_hessian"],
                     vq_feedback=o["vq_feedback"], vq_density=o["vq_density"], calib_windows=o["calib_windows"],
                     calib_seqlen=o["calib_seqlen"], stats_windows=o["stats_windows"],
                     lora=str(o["lora"]) if o["lora"] else None, lora_merge=o["lora_merge"],
                     device=o["device"] or _EV.device, **task_fields)
    check_inputs(model=o["model"])
    return cfg


def trace_room() -> int | None:
    """The most bytes a trace read here may inflate to: the memory available now, or the cgroup's limit
    where it is tighter (``Trace.load``'s ``max_bytes``); None where neither is known."""
    from dipdeploy.runtime.cgroup import memory_limit
    from dipdeploy.trace import available_memory

    known = [m for m in (available_memory(), memory_limit()) if m]
    return min(known) if known else None


def floats(text: str, flag: str) -> list[float]:
    """A comma list of numbers (``--density 0.4,0.5``); a typo is named with the option."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r} is not a comma list of numbers (e.g. 0.4,0.5)") from None


@app.command("eval")
def eval_cmd(
    model: str = MODEL,
    method: Optional[str] = typer.Option(None, help="comma list of: dense, glu, gate, up, cats, teal, dip, dip-ca, "
                                         "predictor (dense is evaluated once, at ρ = 1; cats: threshold on "
                                         "|act(W_g x)|, act = SiLU, or GELU for GeGLU; predictor: the Deja Vu / LLM "
                                         "in a flash baseline, a learned low-rank predictor of the GLU's top-K) "
                                         f"[default: {_S.method}, or the --plan's]"),
    density: Optional[str] = typer.Option(None, help="comma list of MLP densities ρ in (0, 1] [default: "
                                          f"{_S.density:g}, or the --plan's]"),
    plan: Optional[Path] = typer.Option(None, help="a plan from `dipdeploy calibrate` (skips calibration; the "
                                        "row is its method at its density)"),
    seqlen: int = typer.Option(_EV.seqlen, help="window length in tokens"),
    max_windows: Optional[int] = typer.Option(_EV.max_windows, help="evaluate at most this many windows (all: 0)"),
    dataset: str = typer.Option(_EV.dataset, help="wikitext2 (test split) or use --text-file"),
    text_file: Optional[Path] = typer.Option(None, help="evaluate on this UTF-8 text instead"),
    data_dir: Optional[Path] = DATA,
    batch_size: Optional[int] = typer.Option(None, help="windows run side by side (default: 16 for dip-ca, else 1)"),
    rho_in: Optional[float] = RHO_IN, allocation: str = ALLOC, score: str = SCORE, gamma: float = GAMMA,
    policy: str = POLICY, cache_frac: float = CACHE, fixed_top_n: int = TOPN, gamma_warmup: int = WARM,
    cache_split: str = SPLIT,
    predictor_rank: int = typer.Option(_S.predictor_rank, "--predictor-rank", help="predictor: rank r of each "
                                       "layer's P(x) = (x A) B + b (its bytes count in ρ; docs/method.md)"),
    predictor_steps: int = typer.Option(_S.predictor_steps, "--predictor-steps", help="predictor: Adam steps "
                                        "per layer on the calibration windows"),
    recall: bool = typer.Option(False, "--recall", help="also measure the recall of the dense GLU's top-K units "
                                "by glu, dip and dip-ca rows (one more up/gate pass; predictor rows always do)"),
    quant: Optional[str] = typer.Option(None, help="bq4 | bq4-b32 | bq4-b64 | bq4-b128 | bq4-a32 | vq3 | rtn3 (and their "
                                        "-gptq variants)"),
    quant_scope: str = typer.Option(_EV.quant_scope, help="all: attention and lm_head in MatMulNBits blocks "
                                    "too, as `export --quant` ships them | mlp: the MLP only"),
    embedding: str = typer.Option(_EV.embedding, help="int4 | fp32: the token embedding with --quant-scope all, "
                                  "as `export --embedding` stores it"),
    dense_bits: Optional[str] = typer.Option(None, "--dense-bits", help="auto | 4 | 8: bits of attention and "
                                             "lm_head with --quant-scope all, as `export --dense-bits` stores them "
                                             f"(default {_EV.dense_bits})"),
    weights: Optional[Path] = typer.Option(None, help="MLP weights from `dipdeploy quantize` (.npz) instead of "
                                           "quantising here; --quant-scope all adds attention and lm_head"),
    vq_hessian: Optional[str] = VQ_HESSIAN, vq_feedback: Optional[bool] = VQ_FEEDBACK,
    vq_density: Optional[float] = VQ_DENSITY, calib_windows: int = CALIB_WINDOWS, calib_seqlen: int = CALIB_SEQLEN,
    stats_windows: int = STATS_WINDOWS,
    lora: Optional[Path] = typer.Option(None, help="a peft adapter from `dipdeploy finetune` (applied first)"),
    lora_merge: bool = typer.Option(True, "--lora-merge/--lora-live", help="merge the adapter or keep it live"),
    device: Optional[str] = DEVICE,
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the rows as JSON (docs/json.md)"),
    plot: Optional[Path] = typer.Option(None, help="save a PPL-vs-density Pareto plot (PNG; pass@1 with --task humaneval)"),
    force: bool = FORCE,
    task: str = typer.Option("wikitext2", "--task", help="wikitext2 (perplexity) | humaneval (greedy pass@1 "
                             "through the chat template, code run in a sandbox; docs/method.md)"),
    limit: Optional[int] = typer.Option(None, "--limit", help="humaneval: the first N problems (1..164; "
                                        "default all)"),
    max_new_tokens: int = typer.Option(_TASK.max_new_tokens, "--max-new-tokens", help="humaneval: tokens per "
                                       "answer at most"),
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="an exported bundle run by `dipdeploy run`'s "
                                          "engine, with its own method, density and quantisation: its perplexity "
                                          "(the text fed one token at a time) or, with --task humaneval, its "
                                          "pass@1 (default: the torch reference of --model)"),
    dram_budget: Optional[str] = typer.Option(None, "--dram-budget", help="--bundle: the engine's DRAM "
                                              "budget (as `run --dram-budget`)"),
    speculate: int = typer.Option(0, "--speculate", help="humaneval --bundle: speculative decoding, up to K draft "
                                  "tokens per verification pass (as `run --speculate`)"),
    draft: Optional[str] = typer.Option(None, "--draft", help="humaneval --bundle --speculate: the draft (cache | "
                                        "ngram | a bundle; as `run --draft`)"),
    timeout: float = typer.Option(_TASK.timeout_s, "--timeout", help="humaneval: seconds each check program may "
                                  "run in the sandbox"),
    resume: bool = typer.Option(False, "--resume", help="humaneval: continue the unfinished run of the same "
                                "--json (its problems kept in JSON.partial.jsonl)"),
) -> None:
    """WikiText-2 perplexity (GPTQ-style protocol of docs/method.md) or HumanEval pass@1 of sparse methods."""
    given = dict(locals())
    from dipdeploy.eval import evaluate
    from dipdeploy.progress import Progress

    opts = {k: given[k] for k in _MODEL_ARGS}
    if task not in TASKS:
        fail(ValueError(f"--task {task!r} unknown; choose one of {', '.join(TASKS)}"))
    if task == "humaneval":
        from dipdeploy.cli.task import humaneval_cmd

        return humaneval_cmd(opts, **{k: given[k] for k in _HUMANEVAL_ARGS})
    if bundle is not None:
        from dipdeploy.cli.task import bundle_perplexity_cmd

        return bundle_perplexity_cmd(opts, **{k: given[k] for k in _BUNDLE_PPL_ARGS})
    try:
        if dram_budget is not None or speculate or draft is not None:
            raise ValueError("--dram-budget, --speculate and --draft are the bundle engine's; add --bundle or drop "
                             "them")
        check_inputs(data_dir=data_dir, files={"--plan": plan, "--text-file": text_file},
                     outputs={"--json": json_out, "--plot": plot}, force=force)
        cfg = model_eval_config(opts, seqlen=seqlen, max_windows=max_windows or None, dataset=dataset,
                                text_file=str(text_file) if text_file else None, batch_size=batch_size,
                                recall=recall)
        start = time.perf_counter()
        rows = evaluate(cfg, Progress())
    except (ValueError, OSError, KeyError) as err:
        fail(err)
    from dipdeploy.eval.paired import paired_lines

    print_rows(rows, f"{shown(rows[0]['model'])} · WikiText-2 · seqlen {seqlen} · {rows[0]['windows']} windows",
               time.perf_counter() - start)
    for line in paired_lines(rows):
        console.print(shown(line))
    from dipdeploy.eval.plot import plot_pareto

    kept(write_json(rows, json_out, force, schema="eval"),
         write_output(lambda p, f: plot_pareto(rows, p, rows[0]["model"], force=f), plot, force, "--plot"))


@app.command("calibrate")
def calibrate_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="where to write the plan (JSON)"),
    model: str = MODEL,
    method: str = typer.Option(_S.method, help="dense, glu, gate, up, cats, teal, dip, dip-ca"),
    density: float = typer.Option(_S.density, help="target MLP density ρ"),
    rho_in: Optional[float] = RHO_IN, allocation: str = ALLOC, score: str = SCORE, gamma: float = GAMMA,
    policy: str = POLICY, cache_frac: float = CACHE, fixed_top_n: int = TOPN, gamma_warmup: int = WARM,
    cache_split: str = SPLIT,
    text_file: Optional[Path] = typer.Option(None, help="calibration text (default: WikiText-2 validation)"),
    data_dir: Optional[Path] = DATA,
    windows: int = typer.Option(defaults.CALIB_WINDOWS, help="calibration windows"),
    seqlen: int = typer.Option(defaults.CALIB_SEQLEN, help="calibration window length"),
    device: Optional[str] = DEVICE,
    stream: Optional[bool] = typer.Option(None, "--stream/--no-stream",
                                          help="read the weights one layer at a time (models larger than "
                                               "memory; dip and dip-ca, --allocation uniform; the same plan); "
                                               "default: when the fp32 model exceeds half of the free memory"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing plan"),
) -> None:
    """Calibrate a sparsity plan (split, thresholds, per-layer allocation) on calibration text."""
    from dipdeploy.progress import Progress
    from dipdeploy.torchdevice import resolve_device

    try:
        check_inputs(data_dir=data_dir, files={"--text-file": text_file}, outputs={"--out": out}, force=force)
        if windows < 1 or seqlen < 16:
            raise ValueError(f"--windows {windows} --seqlen {seqlen}: give at least 1 window of 16 tokens")
        check_caps(("--windows", windows, MAX_WINDOWS, "windows"), ("--seqlen", seqlen, MAX_TOKENS, "tokens"))
        cfg = _sparsity_options(method, density, rho_in, allocation, score, gamma, policy, cache_frac,
                                fixed_top_n, gamma_warmup, cache_split)
        if cfg.method == "predictor":
            raise ValueError(PREDICTOR_EVAL_ONLY)
        check_inputs(model=model)
        where = resolve_device(device or DEFAULT_DEVICE)
        from dipdeploy.data import calibration_windows
        from dipdeploy.loading import load_model, streams_by_default
        from dipdeploy.sparsity.calibrate import calibrate_on
        from dipdeploy.sparsity.streamed import check_streamable

        streamed = streams_by_default(model) if stream is None else stream
        if streamed:
            check_streamable(cfg)
        progress = Progress()
        with progress.stage(f"load {model}" + (" (streamed: one layer at a time)" if streamed else "")):
            lm = load_model(model, stream=streamed)
        with progress.stage("tokenise the calibration text"):
            calib = calibration_windows(lm.tokenizer, windows, seqlen, data_dir, text_file)
        with progress.stage(f"calibrate {method} ρ={density:g} on {calib.shape[0]}×{seqlen} tokens ({where}), "
                            "window passes") as stage:
            plan = calibrate_on(lm, cfg, calib, where, progress=stage)
    except (ValueError, OSError, KeyError) as err:
        fail(err)
    written = write_output(lambda p, f: plan.save(p, force=f), out, force, "--out", text=plan.to_json(), said=False)
    allocation = allocation_label(plan.allocation, plan.calibration.get("greedy_strength"))
    if written:
        console.print(f"plan for {shown(plan.model)}: {shown(plan.method)}, density {plan.density:.4f} "
                      f"(ρ_in {plan.rho_in}, {shown(allocation)}) → {shown(out)}")
    kept(written)


_DEMO = DemoConfig  # the demo's defaults (dipdeploy/demo.py)


@app.command("demo")
def demo_cmd(
    model: str = MODEL,
    density: str = typer.Option(",".join(f"{d:g}" for d in _DEMO.densities),
                                help="comma list of DIP-CA MLP densities ρ to set against dense"),
    windows: int = typer.Option(_DEMO.windows, help="WikiText-2 test windows for the perplexity"),
    seqlen: int = typer.Option(_DEMO.seqlen, help="window length"),
    question: str = typer.Option(_DEMO.question, help="asked through the chat template"),
    max_new_tokens: int = typer.Option(_DEMO.max_new_tokens, "--max-new-tokens", "-n", help="tokens per answer at most"),
    out: Path = typer.Option(_DEMO.out, "--out", help="folder for the bundles (one per row)"),
    data_dir: Optional[Path] = DATA,
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the rows as JSON"),
    force: bool = typer.Option(False, "--force", help="replace the bundles of an earlier demo"),
) -> None:
    """Dense against DIP-CA, each a bundle run by the host runtime under the same DRAM budget: perplexity,
    decode speed, Flash and DRAM per token, and each one's answer (dipdeploy/demo.py)."""
    from dipdeploy.demo import run_demo

    try:
        try:
            densities = tuple(float(d) for d in density.split(","))
        except ValueError:
            raise ValueError(f"--density takes a comma list of numbers such as 0.7,0.5, got {density!r}") from None
        utf8(question, "--question")
        cfg = DemoConfig(model=model, densities=densities, windows=windows,
                         seqlen=seqlen, question=question, max_new_tokens=max_new_tokens, out=str(out),
                         data_dir=str(data_dir) if data_dir else None)
        check_inputs(data_dir=data_dir, outputs={"--json": json_out}, force=force, model=model)
        rows, native = run_demo(cfg, force, lambda line: console.print(f"[dim]{shown(line)}[/]", highlight=False))
    except (ValueError, OSError, KeyError) as err:
        fail(err)
    _demo_screen(cfg, rows, native)
    kept(write_json([r.as_dict() for r in rows], json_out, force=force, schema="demo"))


def _demo_screen(cfg, rows, native: bool) -> None:
    """One screen for someone who has never heard of DIP: what ρ is, the figures, the answers."""
    from rich.table import Table

    from dipdeploy.registry import get_model, is_registered

    dense = rows[0]
    name = (get_model(cfg.model).hf_id or cfg.model) if is_registered(cfg.model) else cfg.model
    console.print()
    console.print(f"[bold]Dynamic Input Pruning on {shown(name)}[/] ({cfg.quant.upper()} weights, "
                  f"run by the dipdeploy host runtime, {'native kernels' if native else 'ONNX fallback kernels'})")
    console.print("ρ (MLP density) = the share of MLP weights a token reads. DIP picks them per token from the "
                  "largest inputs; DIP-CA (cache-aware) prefers the weight rows already in DRAM.")
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("", "ρ", "perplexity", "decode tok/s", "Flash MB/token", "DRAM MB"):
        table.add_column(col, justify="left" if not col else "right")
    for r in rows:
        change = "" if r is dense else f" ({100 * (r.ppl / dense.ppl - 1):+.0f}%)"
        table.add_row(shown(r.label), f"{r.density:.2f}", f"{r.ppl:.1f}{change}", f"{r.decode_tok_s:.1f}",
                      f"{r.flash_block_mb_per_token:.1f}", f"{r.dram_mb:.0f}")
    console.print(table)
    console.print(f"\n[bold]{shown(cfg.question)}[/]")
    answers = Table(box=None, show_header=False, pad_edge=False)
    answers.add_column(no_wrap=True)
    answers.add_column()
    for r in rows:
        cut = f" [dim][… {r.new_tokens} tokens][/]" if r.finish == "length" else ""
        answers.add_row(f"{shown(r.label)} {r.density:.2f}", shown(" ⏎ ".join(r.text.strip().splitlines())) + cut)
    console.print(answers)
    console.print(f"\n[dim]Every row has the same DRAM budget (the bytes of {shown(cfg.dram_budget)} of the MLP rows "
                  f"cached, small rows first; dense pins its most used rows, DIP-CA caches with LFU) and reads the "
                  f"rest from Flash emulated at {shown(cfg.flash_bandwidth)}: Flash MB/token counts the whole 4 KiB "
                  f"blocks holding the missed rows, as a device returns them (the rows themselves: "
                  f"{' / '.join(f'{r.flash_mb_per_token:.1f}' for r in rows)} MB; a row smaller than a block "
                  f"costs the block). Perplexity: WikiText-2 test, "
                  f"{cfg.windows}×{cfg.seqlen} tokens, lower is better. Greedy answers.\nTry it under the same "
                  f"conditions: dipdeploy {shown(' '.join(chat_hint(cfg, rows[1].bundle)))} (without --io and "
                  f"--flash-bandwidth it reads the rows from this disk with O_DIRECT)[/]")


@app.command("trace")
def trace_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="trace file to write (.npz)"),
    model: str = MODEL,
    method: str = typer.Option(_S.method, help="dense | dip | dip-ca"),
    density: float = typer.Option(_S.density, help="target MLP density ρ (ignored for dense)"),
    plan: Optional[Path] = typer.Option(None, help="a plan from `dipdeploy calibrate` (skips calibration)"),
    tokens: int = typer.Option(512, help="tokens to trace"),
    split: str = typer.Option("test", help="WikiText-2 split to trace (test | validation)"),
    text_file: Optional[Path] = typer.Option(None, help="trace this UTF-8 text instead"),
    data_dir: Optional[Path] = DATA,
    rho_in: Optional[float] = RHO_IN, gamma: float = GAMMA, policy: str = POLICY, cache_frac: float = CACHE,
    force: bool = typer.Option(False, "--force", help="overwrite an existing trace"),
) -> None:
    """Record per-token, per-layer selected rows (and magnitudes) from the torch reference, for `simulate`."""
    from dipdeploy.progress import Progress
    from dipdeploy.sparsity.plan import SparsityConfig, SparsityPlan

    try:
        check_inputs(data_dir=data_dir, files={"--plan": plan, "--text-file": text_file}, outputs={"--out": out},
                     force=force)
        if tokens < 1:
            raise ValueError(f"--tokens {tokens}: give at least 1 token to trace")
        check_caps(("--tokens", tokens, MAX_TOKENS, "tokens"))
        if method not in ("dense", "dip", "dip-ca"):
            raise ValueError(f"--method {method!r}: tracing records dense, dip or dip-ca")
        if split not in ("test", "validation"):
            raise ValueError(f"--split {split!r} unknown; choose test or validation")
        p = SparsityPlan.load(plan) if plan is not None else None
        cfg = None if p is not None or method == "dense" else SparsityConfig(
            method=method, density=density, rho_in=rho_in, gamma=gamma, policy=policy, cache_frac=cache_frac)
        check_inputs(model=model)
        from dipdeploy.data import calibration_windows, load_text, wikitext_text, windows as make_windows
        from dipdeploy.loading import load_model

        # the texts before the model: a missing WikiText-2 is one line now, not after minutes of loading
        text = load_text("wikitext2", split, text_file, data_dir)
        if p is None and cfg is not None:
            wikitext_text("validation", data_dir)  # calibration's text (calibration_windows reads it again)
        from dipdeploy.sparsity.calibrate import calibrate
        from dipdeploy.sparsity.plan import uniform_plan
        from dipdeploy.sparsity.trace import record_trace

        progress = Progress()
        with progress.stage(f"load {model}"):
            lm = load_model(model)
        c = lm.model.config
        if p is None and cfg is None:
            p = uniform_plan(SparsityConfig(method="dip", density=1.0), lm.name, c.num_hidden_layers,
                             c.hidden_size, c.intermediate_size)
        elif p is None:
            with progress.stage(f"calibrate {method} ρ={density:g}, window passes") as stage:
                calib = calibration_windows(lm.tokenizer, defaults.CALIB_WINDOWS, defaults.CALIB_SEQLEN, data_dir)
                p = calibrate(lm, cfg, calib, progress=stage)
        with progress.stage(f"trace {tokens} tokens"):
            ids = make_windows(lm.tokenizer, text, tokens, 1)
            trace = record_trace(lm, p, ids, meta={"text": str(text_file) if text_file else f"wikitext2/{split}"})
    except (ValueError, OSError, KeyError) as err:
        fail(err)
    kept(write_output(lambda p, f: trace.save(p, force=f), out, force, "--out", said=False))
    console.print(f"trace of {trace.num_tokens} tokens × {trace.num_layers} layers ({shown(trace.method)}, "
                  f"ρ={trace.density:.3f}) → {shown(out)}")
