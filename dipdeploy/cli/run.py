"""CLI of the host runtime: ``dipdeploy run`` and ``dipdeploy chat`` (parse, call ``Engine``, present)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import List, Optional

import typer

from dipdeploy import defaults
from dipdeploy.cli._app import app
from dipdeploy.cli.core import console, err_console, fail, kept, trace_room, utf8, write_json, write_output
from dipdeploy.cli.helpview import ADVANCED, BASIC, IO_PANEL, MEMORY, SAMPLING, PanelCommand
from dipdeploy.cli.tables import table as make_table
from dipdeploy.limits import MAX_TOKENS, check_count
from dipdeploy.runtime.blockio import IO_RING_DEPTH as _IO_RING_DEPTH
from dipdeploy.runtime.blockio import IO_THREADS as _IO_THREADS
from dipdeploy.runtime.budget import DEFAULT_CONTEXT
from dipdeploy.runtime.config import MAX_SPECULATE, EngineConfig
from dipdeploy.runtime.readahead import PROBE_TOKENS as _PROBE_TOKENS
from dipdeploy.runtime.sampler import Sampler
from dipdeploy.terminal import shown

# Defaults are EngineConfig's and Sampler's (docs/design.md §1); run and chat share every option below.
_E = EngineConfig

_ERRORS = (ValueError, FileNotFoundError, FileExistsError, KeyError, PermissionError, RuntimeError, OSError)

BUDGET = typer.Option(_E.dram_budget, "--dram-budget", help="DRAM for the MLP caches: a share of the MLP bytes "
                      "(50%) or a total for everything resident (120MB, 1.5GiB); dense weights and the KV cache come first", rich_help_panel=MEMORY)
POLICY = typer.Option(_E.policy, "--policy", help="cache policy: lfu | lru | belady (offline bound, γ = 1) | "
                      "static (pinned rows: the dense baseline) | none", rich_help_panel=MEMORY)
GAMMA = typer.Option(None, "--gamma", help="DIP-CA γ in [0, 1] (1 = plain DIP); default: the bundle's", rich_help_panel=MEMORY)
LEVEL = typer.Option(None, "--accuracy-level", help="0 = fp32; 4 = int8 activations/coefficients in MatMulNBits and "
                     "BQ4 SparseGatherMatMul (faster on x86); default: the bundle's", rich_help_panel=ADVANCED)
NATIVE = typer.Option(None, "--native/--no-native", help="native kernels (default: when built) or the ONNX "
                      "fallback functions", rich_help_panel=ADVANCED)
FLASH = typer.Option(None, "--flash-bandwidth", help="emulate a phone's Flash at this rate, e.g. 1GB/s: the whole "
                     "4 KiB blocks holding the missed rows are paced, as a device returns them", rich_help_panel=IO_PANEL)
FLASH_DEVICE = typer.Option(None, "--flash-device", help="emulate a device profile's Flash (a `dipdeploy simulate "
                            "--device` name, e.g. sd8gen3, or a .toml profile): its bandwidth and its cost per "
                            "request, a run of touching 4 KiB blocks a request; instead of --flash-bandwidth", rich_help_panel=IO_PANEL)
COLD = typer.Option(_E.cold, "--cold", help="drop the MLP file from the OS page cache before the run (real disk "
                    "reads)", rich_help_panel=IO_PANEL)
IO = typer.Option(_E.io, "--io", help="Flash reads: auto (direct where rows stay on Flash and the filesystem "
                  "takes O_DIRECT, else mmap) | mmap (MADV_RANDOM gathers through the page cache: faster where "
                  "the whole MLP file fits in free memory, thrashes under a memory limit that does not hold it) | "
                  "pread (positioned reads, one per run of adjacent rows; slower in Python) | direct (O_DIRECT, "
                  "block-aligned, many in flight: every miss from the device, the budget kept)", rich_help_panel=IO_PANEL)
IO_THREADS = typer.Option(_E.io_threads, "--io-threads", help="--io direct: reads in flight (the io_uring queue "
                          f"depth, default {_IO_RING_DEPTH}, or the op library's pread threads, default {_IO_THREADS}; "
                          "a Python thread pool without the library)", rich_help_panel=IO_PANEL)
IO_ENGINE = typer.Option(_E.io_engine, "--io-engine", help="--io direct: auto (io_uring where the kernel grants a "
                         "ring, else threads) | io_uring (a ring that keeps many more reads in flight without a "
                         "thread each, as fio's --ioengine=io_uring) | threads (a pool of pread threads, as fio's "
                         "--ioengine=psync with numjobs)", rich_help_panel=IO_PANEL)
IO_GAP = typer.Option(_E.io_gap, "--io-gap", help="--io direct: read through gaps of at most this many 4 KiB blocks "
                      "between wanted rows, so they cost one request, not two (0: only touching blocks coalesce)", rich_help_panel=IO_PANEL)
CACHE_SPLIT = typer.Option(_E.cache_split, "--cache-split", help="how the budget's cache bytes are shared among the "
                           "groups: reads (the groups whose misses cost most reading per byte first: small rows "
                           "such as down's) | even (the same share of every group's rows, the paper's)", rich_help_panel=MEMORY)
CONTEXT = typer.Option(_E.context, "--context", "-c", help=f"KV-cache length reserved in the budget (tokens): "
                       f"prompt plus answer (run), the whole conversation (chat); default {DEFAULT_CONTEXT}, or "
                       f"the bundle's positions if fewer; more than those is refused", rich_help_panel=MEMORY)
PREFILL = typer.Option(_E.prefill, "--prefill", help="prompt: batch (one batch per layer, plain DIP, caches warmed "
                       "from its selections) | token (one at a time as decode: the exact DIP-CA reference)", rich_help_panel=ADVANCED)
PREFILL_CHUNK = typer.Option(_E.prefill_chunk, "--prefill-chunk", help="--prefill batch: at most this many tokens "
                             "per graph run (llama.cpp's --ubatch-size); a longer prompt runs in chunks, so its "
                             "activations stay within the plan", rich_help_panel=ADVANCED)
PREFILL_PROGRESS = 64  # prompts from this many tokens on show the prefill's progress (long with --prefill token)
THREADS = typer.Option(_E.threads, "--threads", "-t", help="ORT intra-op threads (prefill and decode; the sessions run "
                       "one at a time) [default: the physical cores, as llama.cpp's -t]", show_default=False,
                       rich_help_panel=BASIC)
THREAD_POOL = typer.Option(_E.thread_pool, "--thread-pool", help="above 1 thread: per-session (each session's own "
                           "pool, workers sleep when idle) | shared (onnxruntime's one pool for the process; its "
                           "workers spin)", rich_help_panel=ADVANCED)
SINGLE = typer.Option(_E.single_session, "--single-session/--per-layer", help="all in DRAM: model.onnx in one "
                      "session per token, every row resident from the start, so DIP-CA is plain DIP (default: when "
                      "the budget holds every MLP row and no --trace is asked for), or the per-layer graphs (caches "
                      "start empty; joined or not: --fused/--no-fused)", rich_help_panel=MEMORY)
FUSED = typer.Option(_E.fused, "--fused/--no-fused", help="below 100 %: the per-layer graphs joined into one "
                     "session per token, the cache step inside the graph (the same decisions, faster), or "
                     "--no-fused: one session per graph, the cache step on the host. Default: joined wherever it "
                     "can run (--io mmap or direct, the op library, no belady, no --trace)", rich_help_panel=ADVANCED)
PREFETCH = typer.Option(_E.prefetch, "--prefetch/--no-prefetch", show_default=False,
                        help="--io direct, joined: predict each layer's up|gate rows from its input and read the "
                        "missing ones while its attention runs (the same decisions and logits; a wrong guess costs "
                        "reads), or read them only once selected (faster where the token waits on the device: a "
                        "fast CPU, --accuracy-level 4). Default: whichever decodes faster, timed on the first "
                        f"{_PROBE_TOKENS} tokens each way", rich_help_panel=IO_PANEL)
PIN = typer.Option(None, "--pin-from", help="static: pin the most used rows of this trace (`dipdeploy trace`)", rich_help_panel=MEMORY)
VERIFY = typer.Option(_E.verify, "--verify", help="also check the sha256 of the tensor data files first (the "
                      "structure, sizes and the other files' sha256 are always checked)", rich_help_panel=IO_PANEL)


# Generation options: the names of HF generate / llama.cpp; defaults are Sampler's (one definition).
_GEN = Sampler()
TEMPERATURE = typer.Option(_GEN.temperature, "--temperature", "--temp", help="0 = greedy", rich_help_panel=SAMPLING)
TOP_K = typer.Option(_GEN.top_k, "--top-k", help="sample from the k most likely tokens (0 = off)", rich_help_panel=SAMPLING)
TOP_P = typer.Option(_GEN.top_p, "--top-p", help="sample from the smallest set of tokens reaching this probability", rich_help_panel=SAMPLING)
REP = typer.Option(_GEN.repetition_penalty, "--repetition-penalty", "--repeat-penalty", help="divide positive / multiply negative logits "
                   "of tokens already in the context (HF semantics; 1 = off, 1.1-1.3 typical)", rich_help_panel=SAMPLING)
STOP = typer.Option(None, "--stop", help="end the answer at this string (not printed; repeatable); the model's EOS "
                    "ends it too", rich_help_panel=SAMPLING)
SEED = typer.Option(None, "--seed", "-s", help="sampling seed (default: a random one, printed with the stats "
                    "and kept in --json, so a run can be repeated; greedy needs none)", rich_help_panel=SAMPLING)
SPECULATE = typer.Option(_E.speculate, "--speculate", help="draft up to K tokens and verify them in one batched "
                         f"pass that reads each missing row once (0 = off, at most {MAX_SPECULATE}); docs/runtime.md",
                         rich_help_panel=ADVANCED)
DRAFT = typer.Option(None, "--draft", help="--speculate's draft: ngram (tokens copied from an earlier occurrence of "
                     "the last few: no model; the default), cache (the model on the rows its caches hold: no read) "
                     "or a bundle of the same tokenizer, kept resident inside --dram-budget (give it as a size)",
                     rich_help_panel=ADVANCED)
SYSTEM = typer.Option(None, "--system", help="system prompt (through the bundle's chat template)", rich_help_panel=BASIC)


def _by_field(cls, options: dict) -> dict:
    """The parsed ``options`` (a command's parameters by name) that are fields of the dataclass ``cls``."""
    return {f.name: options[f.name] for f in dataclasses.fields(cls) if f.init and f.name in options}


def _sampler(options: dict) -> Sampler:
    """The ``Sampler`` of a command's parsed options, by field name (its checks name the options). Without
    ``--seed`` a sampled run draws its seed, so two runs do not give the same answer as a fixed default
    would; the seed drawn is the sampler's ``seed``, which the command shows so the run can be repeated."""
    fields = {**_by_field(Sampler, options), "stop": tuple(options.get("stop") or ())}
    if fields.get("seed") is not None and fields["seed"] < 0:
        raise ValueError(f"--seed must be >= 0, got {fields['seed']}; or leave it out for a random one")
    if fields.get("seed") is None:  # drawn for greedy too: chat's /set temp may turn sampling on
        fields["seed"] = random_seed()
    return Sampler(**fields)


def random_seed() -> int:
    import secrets

    return secrets.randbelow(SEED_RANGE)


SEED_RANGE = 2**31  # seeds a user can retype (a positive 32-bit integer), as llama.cpp prints them


def sampling_note(sampler: Sampler) -> str | None:
    """The line that makes a sampled answer repeatable (None for greedy, which is repeatable as it is)."""
    return f"seed {sampler.seed} (-s {sampler.seed} repeats this answer)" if sampler.temperature > 0 else None


def engine_config(options: dict) -> EngineConfig:
    """The ``EngineConfig`` of a command's parsed options, built once by field name: ``--flash-bandwidth``
    parsed to bytes per second, ``--pin-from``'s trace read into ``pinned_counts``. Its ``__post_init__``
    is the one check; a refused field is reported under its option's name (``--`` + the field's)."""
    from dipdeploy.runtime import parse_bandwidth
    from dipdeploy.runtime.config import FieldError

    kw = _by_field(EngineConfig, options)
    if kw.get("flash_bandwidth"):
        kw["flash_bandwidth"] = parse_bandwidth(kw["flash_bandwidth"])
    try:
        cfg = EngineConfig(**kw)
    except FieldError as err:
        raise ValueError(err.named("--" + err.field.replace("_", "-"))) from None
    if options.get("pin_from") is not None:
        from dipdeploy.trace import Trace

        cfg.pinned_counts = Trace.load(options["pin_from"], max_bytes=trace_room()).row_counts()
    return cfg


def _engine(bundle: Path, options: dict):
    """The engine of a command's options and, with ``--speculate``, its draft (``--draft``: the target's
    own caches, or a bundle whose plan comes out of the same budget: ``speculate.open_model_draft``)."""
    from dipdeploy.runtime import Engine
    from dipdeploy.runtime.speculate import (CACHE_DRAFT, DEFAULT_DRAFT, NGRAM_DRAFT, CacheDraft, NgramDraft,
                                             open_model_draft)

    cfg, draft = engine_config(options), None
    name = options.get("draft") or DEFAULT_DRAFT
    if options.get("draft") is not None and not cfg.speculate:
        raise ValueError(f"--draft {name} drafts for --speculate K: give --speculate 4, say, or drop --draft")
    if cfg.speculate and name in (CACHE_DRAFT, NGRAM_DRAFT):
        draft = CacheDraft() if name == CACHE_DRAFT else NgramDraft()
    elif cfg.speculate:
        check_bundle(Path(name), "run --draft")
        draft, cfg = open_model_draft(cfg, name)
    engine = Engine(bundle, cfg)
    if engine.flash.note:
        typer.echo(f"note: {shown(engine.flash.note, markup=False)}", err=True)
    return engine, draft


def _close(engine, drafter) -> None:
    """What :func:`_engine` opened, closed: the bundle's descriptors go with it, for a caller that lives on
    (a library user, CliRunner)."""
    engine.close()
    if drafter is not None:
        drafter.close()


class _Prefill:
    """A long prompt's prefill as a progress stage (``dipdeploy.progress``), and the prompt printed once,
    when its prefill is done, so the stage's line or bar never lands inside the streamed text. Both go to
    stderr (stdout holds the generated text alone); ``quiet`` shows neither."""

    def __init__(self, quiet: bool = False):
        from dipdeploy.progress import Progress

        self.progress, self.stage, self.printed = Progress(quiet=quiet), None, quiet

    def on_prefill(self, done: int, total: int) -> None:
        if self.stage is None and total >= PREFILL_PROGRESS:
            self.stage = self.progress.start("prefill the prompt, tokens", total=total)
        if self.stage is not None:
            self.stage.advance(done - self.stage.done)
            if done == total:
                self.stage.finish()
                self.stage = None

    def prompt(self, text: str | None) -> None:
        if not self.printed and text is not None:
            # on a terminal the answer continues the prompt's line; else the prompt's stream ends its line
            inline = sys.stdout.isatty() and sys.stderr.isatty()
            err_console.print(f"[bold]{shown(text, lines=True)}[/]", end="" if inline or text.endswith("\n") else "\n",
                              highlight=False)
        self.printed = True


#: a prompt file larger than this is a wrong file rather than a prompt: refused before reading it all
PROMPT_FILE_LIMIT = 1 << 20
#: suffixes of model files that users hand to ``run`` as llama.cpp's ``-m`` takes them
_MODEL_FILES = (".gguf", ".safetensors", ".bin", ".pt", ".pth")


BUNDLE_OPTION = typer.Option(None, "--model", "-m", help="the bundle directory, as llama.cpp's -m names the model "
                             "(the same as giving it first)", show_default=False, rich_help_panel=BASIC)


def named_bundle(positional: Optional[Path], option: Optional[Path], command: str) -> Path:
    """The bundle of ``run``/``chat``, given first (``run BUNDLE``) or as ``-m BUNDLE`` (llama.cpp's and
    onnxruntime-genai's habit); both are accepted when they name the same folder."""
    if positional is None and option is None:
        raise ValueError(f"no bundle given: `dipdeploy {command} BUNDLE` or `dipdeploy {command} -m BUNDLE`")
    if positional is not None and option is not None and positional.resolve() != option.resolve():
        raise ValueError(f"two bundles given, {positional} and -m {option}; give one")
    return positional if positional is not None else option


def check_bundle(bundle: Path, command: str) -> None:
    """A model where a bundle is expected (``run model.gguf``, ``run smollm2-135m``, ``run ~/models/HF``)
    is a common first try: say it is a model, and give the export that makes a bundle of it."""
    import shlex

    from dipdeploy.bundle.names import MANIFEST
    from dipdeploy.registry import is_registered

    if bundle.is_dir() and (bundle / MANIFEST).is_file():
        return
    if bundle.is_file() and bundle.suffix.lower() in _MODEL_FILES:
        what = "a model file"
    elif bundle.is_dir() and (bundle / "config.json").is_file():
        what = "a Hugging Face model folder"
    elif not bundle.exists() and is_registered(str(bundle)):
        what = "a model of the registry (`dipdeploy models`)"
    else:
        return  # the engine says what is wrong with it
    raise ValueError(f"{bundle} is {what}, not a bundle; make a bundle of it first: `dipdeploy export --model "
                     f"{shlex.quote(str(bundle))} --out BUNDLE`, then `dipdeploy {command} BUNDLE`")


def read_prompt(prompt: Optional[str], file: Optional[Path], *, flag: str = "-p", what: str = "the prompt",
                required: bool = True, stdin: bool = True) -> Optional[str]:
    """The text of ``-p TEXT`` (``flag``) or ``-f FILE`` (``-f -``: standard input, where ``stdin``), never
    both, one of them when ``required``; a file must be UTF-8 text of a prompt's size (a wrong file is refused,
    not tokenised)."""
    if (prompt is not None and file is not None) or (required and prompt is None and file is None):
        raise ValueError(f"give {what} once: {flag} TEXT or -f FILE (a UTF-8 text file"
                         f"{'; - reads stdin' if stdin else ''})")
    if file is None:
        return utf8(prompt, "--prompt" if flag == "-p" else flag)
    if str(file) == "-":
        if not stdin:
            raise ValueError("-f - : this command reads stdin itself; give a file")
        data = sys.stdin.buffer.read(PROMPT_FILE_LIMIT + 1) if hasattr(sys.stdin, "buffer") else \
            sys.stdin.read().encode("utf-8", "surrogateescape")
    else:
        if not file.is_file():
            raise FileNotFoundError(f"--file {file} {'is a folder' if file.is_dir() else 'does not exist'}; give "
                                    f"a text file holding {what}")
        with open(file, "rb") as f:
            data = f.read(PROMPT_FILE_LIMIT + 1)
    if len(data) > PROMPT_FILE_LIMIT:
        raise ValueError(f"--file {file} is larger than {PROMPT_FILE_LIMIT >> 20} MiB, too long for a prompt; give "
                         f"a file holding {what} alone")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"--file {file} is not UTF-8 text (byte {data[err.start:err.start + 1]!r} at offset "
                         f"{err.start}); convert it (iconv -t UTF-8)") from None


@app.command("run", cls=PanelCommand)
def run_cmd(
    bundle: Optional[Path] = typer.Argument(None, help="a bundle directory from `dipdeploy export` (or -m)",
                                            show_default=False),
    model: Optional[Path] = BUNDLE_OPTION,
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="text to continue (with --chat: the "
                                         "user's message)", rich_help_panel=BASIC),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="read the prompt from this UTF-8 text file "
                                        "(- : standard input), instead of -p", rich_help_panel=BASIC),
    max_new_tokens: int = typer.Option(defaults.MAX_NEW_TOKENS, "--max-new-tokens", "-n",
                                       help="tokens to generate", rich_help_panel=BASIC),
    dram_budget: str = BUDGET, policy: str = POLICY, gamma: Optional[float] = GAMMA,
    accuracy_level: Optional[int] = LEVEL, native: Optional[bool] = NATIVE, flash_bandwidth: Optional[str] = FLASH,
    flash_device: Optional[str] = FLASH_DEVICE,
    cold: bool = COLD, io: str = IO, io_threads: Optional[int] = IO_THREADS, io_engine: str = IO_ENGINE,
    io_gap: int = IO_GAP, cache_split: str = CACHE_SPLIT, prefill: str = PREFILL, prefill_chunk: int = PREFILL_CHUNK,
    context: Optional[int] = CONTEXT, threads: Optional[int] = THREADS, thread_pool: str = THREAD_POOL,
    pin_from: Optional[Path] = PIN, verify: bool = VERIFY, single_session: Optional[bool] = SINGLE,
    fused: Optional[bool] = FUSED, prefetch: Optional[bool] = PREFETCH, speculate: int = SPECULATE,
    draft: Optional[str] = DRAFT, temperature: float = TEMPERATURE,
    top_k: int = TOP_K, top_p: float = TOP_P, repetition_penalty: float = REP, stop: Optional[List[str]] = STOP,
    seed: Optional[int] = SEED,
    chat: bool = typer.Option(False, "--chat", help="format the prompt as one user turn with the bundle's chat "
                              "template (default: raw completion)", rich_help_panel=BASIC),
    system: Optional[str] = SYSTEM,
    trace: Optional[Path] = typer.Option(None, "--trace", help="record every token's selected rows and hits "
                                         "(a dipdeploy trace, for `dipdeploy simulate`)", rich_help_panel=ADVANCED),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the text, the seed and the stats as JSON",
                                            rich_help_panel=BASIC),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print the generated text alone: no prompt, stats, "
                               "progress or notes of files written (errors still show)", rich_help_panel=BASIC),
    force: bool = typer.Option(False, "--force", help="overwrite existing --trace/--json files",
                               rich_help_panel=BASIC),
) -> None:
    """Generate from a bundle under a DRAM budget, MLP rows streamed from its weight file. The text goes to
    stdout, the stats to stderr (`run … > answer.txt` keeps the answer alone)."""
    options = dict(locals())
    from dipdeploy.cli.core import check_inputs
    from dipdeploy.runtime.chat import length_mark
    from dipdeploy.runtime.template import ChatTemplate, messages

    opened = contextlib.ExitStack()  # the engine and its draft, closed however the run ends
    with opened:
        try:
            bundle = options["bundle"] = named_bundle(bundle, model, "run")
            check_bundle(bundle, "run")
            if system is not None and not chat:
                raise ValueError("--system needs --chat (the system prompt goes through the chat template)")
            if max_new_tokens < 1:
                raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
            check_count(max_new_tokens, "--max-new-tokens", 1, MAX_TOKENS, "tokens")
            check_inputs(files={"--pin-from": pin_from}, outputs={"--trace": trace, "--json": json_out}, force=force)
            prompt = options["prompt"] = read_prompt(prompt, file)
            for flag, value in (("--system", system), *(("--stop", s) for s in stop or ())):
                utf8(value, flag)
            sampler = _sampler(options)
            if trace is not None:  # a trace is the per-layer path's selections (dipdeploy.runtime.backends.whole)
                if single_session:
                    raise ValueError("--trace records the per-layer graphs' selections: drop --single-session")
                if fused:
                    raise ValueError("--trace records the per-layer graphs' selections: drop --fused")
                if speculate:
                    raise ValueError("--trace records the per-layer graphs' selections, which --speculate does not run: "
                                     "drop --speculate")
                options.update(single_session=False, fused=False)
            engine, drafter = _engine(bundle, options)
            opened.callback(_close, engine, drafter)
            text = prompt
            if chat:
                rendered = ChatTemplate.from_bundle(engine.files, engine.manifest.files).render(messages(prompt, system))
                text = engine.encode(rendered, special_tokens=False)  # the template writes its special tokens
            recorder = engine.trace_recorder() if trace is not None else None
            screen = _Prefill(quiet)
            shown_prompt = prompt + ("\n" if chat else "")
            g = engine.generate(text, max_new_tokens, sampler=sampler, trace=recorder, on_prefill=screen.on_prefill,
                                draft=drafter,
                                on_text=lambda piece: (screen.prompt(shown_prompt),
                                                       console.print(shown(piece, lines=True, markup=False), end="",
                                                                     markup=False, highlight=False)))
            screen.prompt(shown_prompt)
            console.print()
        except _ERRORS as err:
            fail(err)
        if not quiet:
            if g.finish == "length":
                err_console.print(f"[dim]{shown(length_mark(max_new_tokens))}[/]")
            table = make_table("stat", "value", title=f"dipdeploy run {shown(bundle.name)}", wrap=("stat", "value"))
            for k, v in g.stats.table():
                table.add_row(shown(k), shown(v))
            if sampling_note(sampler):
                table.add_row("seed", str(sampler.seed))
            err_console.print(table)
        traced = True
        if recorder is not None:
            recorder.meta.update({"prompt": prompt, "bundle": str(bundle)})
            recorded = recorder.finish()
            traced = write_output(lambda p, f: recorded.save(p, force=f), trace, force, "--trace", said=False)
        kept(traced, write_json({"prompt": prompt, "text": g.text, "tokens": g.tokens, "finish": g.finish,
                                 "seed": sampler.seed, **g.stats.as_dict()}, json_out, force=force, said=False,
                                schema="run"))
        if not quiet:
            for path in (trace, json_out):
                if path is not None:
                    err_console.print(f"wrote {shown(path)}")
