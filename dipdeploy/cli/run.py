"""CLI of the host runtime: ``dipdeploy run`` and ``dipdeploy chat`` (parse, call ``Engine``, present)."""

from __future__ import annotations

import dataclasses
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional

import typer

from dipdeploy import defaults
from dipdeploy.cli._app import app
from dipdeploy.cli.core import console, fail, kept, trace_room, utf8, write_json, write_output
from dipdeploy.cli.tables import table as make_table
from dipdeploy.limits import MAX_TOKENS, check_count
from dipdeploy.runtime.blockio import IO_RING_DEPTH as _IO_RING_DEPTH
from dipdeploy.runtime.blockio import IO_THREADS as _IO_THREADS
from dipdeploy.runtime.budget import DEFAULT_CONTEXT
from dipdeploy.runtime.config import EngineConfig
from dipdeploy.runtime.readahead import PROBE_TOKENS as _PROBE_TOKENS
from dipdeploy.runtime.sampler import Sampler
from dipdeploy.terminal import shown

# Defaults are EngineConfig's and Sampler's (docs/design.md §1); run and chat share every option below.
_E = EngineConfig

_ERRORS = (ValueError, FileNotFoundError, FileExistsError, KeyError, PermissionError, RuntimeError, OSError)

BUDGET = typer.Option(_E.dram_budget, "--dram-budget", help="DRAM for the MLP caches: a share of the MLP bytes "
                      "(50%) or a total for everything resident (120MB, 1.5GiB); dense weights and the KV cache come first")
POLICY = typer.Option(_E.policy, "--policy", help="cache policy: lfu | lru | belady (offline bound, γ = 1) | "
                      "static (pinned rows: the dense baseline) | none")
GAMMA = typer.Option(None, "--gamma", help="DIP-CA γ in [0, 1] (1 = plain DIP); default: the bundle's")
LEVEL = typer.Option(None, "--accuracy-level", help="0 = fp32; 4 = int8 activations/coefficients in MatMulNBits and "
                     "BQ4 SparseGatherMatMul (faster on x86); default: the bundle's")
NATIVE = typer.Option(None, "--native/--no-native", help="native kernels (default: when built) or the ONNX "
                      "fallback functions")
FLASH = typer.Option(None, "--flash-bandwidth", help="emulate a phone's Flash at this rate, e.g. 1GB/s: the whole "
                     "4 KiB blocks holding the missed rows are paced, as a device returns them")
FLASH_DEVICE = typer.Option(None, "--flash-device", help="emulate a device profile's Flash (a `dipdeploy simulate "
                            "--device` name, e.g. sd8gen3, or a .toml profile): its bandwidth and its cost per "
                            "request, a run of touching 4 KiB blocks a request; instead of --flash-bandwidth")
COLD = typer.Option(_E.cold, "--cold", help="drop the MLP file from the OS page cache before the run (real disk "
                    "reads)")
IO = typer.Option(_E.io, "--io", help="Flash reads: auto (direct where rows stay on Flash and the filesystem "
                  "takes O_DIRECT, else mmap) | mmap (MADV_RANDOM gathers through the page cache: faster where "
                  "the whole MLP file fits in free memory, thrashes under a memory limit that does not hold it) | "
                  "pread (positioned reads, one per run of adjacent rows; slower in Python) | direct (O_DIRECT, "
                  "block-aligned, many in flight: every miss from the device, the budget kept)")
IO_THREADS = typer.Option(_E.io_threads, "--io-threads", help="--io direct: reads in flight (the io_uring queue "
                          f"depth, default {_IO_RING_DEPTH}, or the op library's pread threads, default {_IO_THREADS}; "
                          "a Python thread pool without the library)")
IO_ENGINE = typer.Option(_E.io_engine, "--io-engine", help="--io direct: auto (io_uring where the kernel grants a "
                         "ring, else threads) | io_uring (a ring that keeps many more reads in flight without a "
                         "thread each, as fio's --ioengine=io_uring) | threads (a pool of pread threads, as fio's "
                         "--ioengine=psync with numjobs)")
IO_GAP = typer.Option(_E.io_gap, "--io-gap", help="--io direct: read through gaps of at most this many 4 KiB blocks "
                      "between wanted rows, so they cost one request, not two (0: only touching blocks coalesce)")
CACHE_SPLIT = typer.Option(_E.cache_split, "--cache-split", help="how the budget's cache bytes are shared among the "
                           "groups: reads (the groups whose misses cost most reading per byte first: small rows "
                           "such as down's) | even (the same share of every group's rows, the paper's)")
CONTEXT = typer.Option(_E.context, "--context", help=f"KV-cache length reserved in the budget (tokens): "
                       f"prompt plus answer (run), the whole conversation (chat); default {DEFAULT_CONTEXT}, or "
                       f"the bundle's positions if fewer; more than those is refused")
PREFILL = typer.Option(_E.prefill, "--prefill", help="prompt: batch (one batch per layer, plain DIP, caches warmed "
                       "from its selections) | token (one at a time as decode: the exact DIP-CA reference)")
PREFILL_CHUNK = typer.Option(_E.prefill_chunk, "--prefill-chunk", help="--prefill batch: at most this many tokens "
                             "per graph run (llama.cpp's --ubatch-size); a longer prompt runs in chunks, so its "
                             "activations stay within the plan")
PREFILL_PROGRESS = 64  # prompts from this many tokens on show the prefill's progress (long with --prefill token)
THREADS = typer.Option(_E.threads, "--threads", help="ORT intra-op threads (prefill and decode; the sessions run "
                       "one at a time)")
THREAD_POOL = typer.Option(_E.thread_pool, "--thread-pool", help="above 1 thread: per-session (each session's own "
                           "pool, workers sleep when idle) | shared (onnxruntime's one pool for the process; its "
                           "workers spin)")
SINGLE = typer.Option(_E.single_session, "--single-session/--per-layer", help="all in DRAM: model.onnx in one "
                      "session per token, every row resident from the start, so DIP-CA is plain DIP (default: when "
                      "the budget holds every MLP row and no --trace is asked for), or the per-layer graphs (caches "
                      "start empty; joined or not: --fused/--no-fused)")
FUSED = typer.Option(_E.fused, "--fused/--no-fused", help="below 100 %: the per-layer graphs joined into one "
                     "session per token, the cache step inside the graph (the same decisions, faster), or "
                     "--no-fused: one session per graph, the cache step on the host. Default: joined wherever it "
                     "can run (--io mmap or direct, the op library, no belady, no --trace)")
PREFETCH = typer.Option(_E.prefetch, "--prefetch/--no-prefetch", show_default=False,
                        help="--io direct, joined: predict each layer's up|gate rows from its input and read the "
                        "missing ones while its attention runs (the same decisions and logits; a wrong guess costs "
                        "reads), or read them only once selected (faster where the token waits on the device: a "
                        "fast CPU, --accuracy-level 4). Default: whichever decodes faster, timed on the first "
                        f"{_PROBE_TOKENS} tokens each way")
PIN = typer.Option(None, "--pin-from", help="static: pin the most used rows of this trace (`dipdeploy trace`)")
VERIFY = typer.Option(_E.verify, "--verify", help="also check the sha256 of the tensor data files first (the "
                      "structure, sizes and the other files' sha256 are always checked)")


# Generation options: the names of HF generate / llama.cpp; defaults are Sampler's (one definition).
_GEN = Sampler()
TEMPERATURE = typer.Option(_GEN.temperature, "--temperature", help="0 = greedy")
TOP_K = typer.Option(_GEN.top_k, "--top-k", help="sample from the k most likely tokens (0 = off)")
TOP_P = typer.Option(_GEN.top_p, "--top-p", help="sample from the smallest set of tokens reaching this probability")
REP = typer.Option(_GEN.repetition_penalty, "--repetition-penalty", help="divide positive / multiply negative logits "
                   "of tokens already in the context (HF semantics; 1 = off, 1.1-1.3 typical)")
STOP = typer.Option(None, "--stop", help="end the answer at this string (not printed; repeatable); the model's EOS "
                    "ends it too")
SEED = typer.Option(_GEN.seed, "--seed", help="sampling seed")
SYSTEM = typer.Option(None, "--system", help="system prompt (through the bundle's chat template)")


def _by_field(cls, options: dict) -> dict:
    """The parsed ``options`` (a command's parameters by name) that are fields of the dataclass ``cls``."""
    return {f.name: options[f.name] for f in dataclasses.fields(cls) if f.init and f.name in options}


def _sampler(options: dict) -> Sampler:
    """The ``Sampler`` of a command's parsed options, by field name (its checks name the options)."""
    return Sampler(**{**_by_field(Sampler, options), "stop": tuple(options.get("stop") or ())})


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
    from dipdeploy.runtime import Engine

    engine = Engine(bundle, engine_config(options))
    if engine.flash.note:
        typer.echo(f"note: {shown(engine.flash.note, markup=False)}", err=True)
    return engine


class _Prefill:
    """A long prompt's prefill as a progress stage (``dipdeploy.progress``), and the prompt printed once,
    when its prefill is done, so the stage's line or bar never lands inside the streamed text."""

    def __init__(self):
        from dipdeploy.progress import Progress

        self.progress, self.stage, self.printed = Progress(), None, False

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
            console.print(f"[bold]{shown(text, lines=True)}[/]", end="", highlight=False)
        self.printed = True


@app.command("run")
def run_cmd(
    bundle: Path = typer.Argument(..., help="a bundle directory from `dipdeploy export`"),
    prompt: str = typer.Option(..., "--prompt", "-p", help="text to continue (with --chat: the user's message)"),
    max_new_tokens: int = typer.Option(defaults.MAX_NEW_TOKENS, "--max-new-tokens", "-n",
                                       help="tokens to generate"),
    dram_budget: str = BUDGET, policy: str = POLICY, gamma: Optional[float] = GAMMA,
    accuracy_level: Optional[int] = LEVEL, native: Optional[bool] = NATIVE, flash_bandwidth: Optional[str] = FLASH,
    flash_device: Optional[str] = FLASH_DEVICE,
    cold: bool = COLD, io: str = IO, io_threads: Optional[int] = IO_THREADS, io_engine: str = IO_ENGINE, io_gap: int = IO_GAP, cache_split: str = CACHE_SPLIT,
    prefill: str = PREFILL, prefill_chunk: int = PREFILL_CHUNK,
    context: Optional[int] = CONTEXT, threads: int = THREADS, thread_pool: str = THREAD_POOL,
    pin_from: Optional[Path] = PIN, verify: bool = VERIFY, single_session: Optional[bool] = SINGLE,
    fused: Optional[bool] = FUSED, prefetch: Optional[bool] = PREFETCH, temperature: float = TEMPERATURE, top_k: int = TOP_K,
    top_p: float = TOP_P, repetition_penalty: float = REP, stop: Optional[List[str]] = STOP, seed: int = SEED,
    chat: bool = typer.Option(False, "--chat", help="format the prompt as one user turn with the bundle's chat "
                              "template (default: raw completion)"),
    system: Optional[str] = SYSTEM,
    trace: Optional[Path] = typer.Option(None, "--trace", help="record every token's selected rows and hits "
                                         "(a dipdeploy trace, for `dipdeploy simulate`)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the text and the stats as JSON"),
    force: bool = typer.Option(False, "--force", help="overwrite existing --trace/--json files"),
) -> None:
    """Generate from a bundle under a DRAM budget, MLP rows streamed from its weight file; print the stats."""
    options = dict(locals())
    from dipdeploy.cli.core import check_inputs
    from dipdeploy.runtime.chat import length_mark
    from dipdeploy.runtime.template import ChatTemplate, messages

    try:
        if system is not None and not chat:
            raise ValueError("--system needs --chat (the system prompt goes through the chat template)")
        if max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
        check_count(max_new_tokens, "--max-new-tokens", 1, MAX_TOKENS, "tokens")
        for flag, value in (("--prompt", prompt), ("--system", system), *(("--stop", s) for s in stop or ())):
            utf8(value, flag)
        sampler = _sampler(options)
        check_inputs(files={"--pin-from": pin_from}, outputs={"--trace": trace, "--json": json_out}, force=force)
        if trace is not None:  # a trace is the per-layer path's selections (dipdeploy.runtime.backends.whole)
            if single_session:
                raise ValueError("--trace records the per-layer graphs' selections: drop --single-session")
            if fused:
                raise ValueError("--trace records the per-layer graphs' selections: drop --fused")
            options.update(single_session=False, fused=False)
        engine = _engine(bundle, options)
        text = prompt
        if chat:
            rendered = ChatTemplate.from_bundle(engine.path, engine.manifest.files).render(messages(prompt, system))
            text = engine.encode(rendered, special_tokens=False)  # the template writes its special tokens
        recorder = engine.trace_recorder() if trace is not None else None
        screen = _Prefill()
        shown_prompt = prompt + ("\n" if chat else "")
        g = engine.generate(text, max_new_tokens, sampler=sampler, trace=recorder, on_prefill=screen.on_prefill,
                            on_text=lambda piece: (screen.prompt(shown_prompt),
                                                   console.print(shown(piece, lines=True, markup=False), end="",
                                                                 markup=False, highlight=False)))
        screen.prompt(shown_prompt)
        console.print()
    except _ERRORS as err:
        fail(err)
    if g.finish == "length":
        console.print(f"[dim]{shown(length_mark(max_new_tokens))}[/]")
    table = make_table("stat", "value", title=f"dipdeploy run {shown(bundle.name)}", wrap=("stat", "value"))
    for k, v in g.stats.table():
        table.add_row(shown(k), shown(v))
    console.print(table)
    traced = True
    if recorder is not None:
        recorder.meta.update({"prompt": prompt, "bundle": str(bundle)})
        recorded = recorder.finish()
        traced = write_output(lambda p, f: recorded.save(p, force=f), trace, force, "--trace")
    kept(traced, write_json({"prompt": prompt, "text": g.text, "tokens": g.tokens, "finish": g.finish,
                             **g.stats.as_dict()}, json_out, force=force))


@app.command("chat")
def chat_cmd(
    bundle: Path = typer.Argument(..., help="a bundle directory from `dipdeploy export` (with a chat template)"),
    max_new_tokens: int = typer.Option(defaults.CHAT_MAX_NEW_TOKENS, "--max-new-tokens", "-n",
                                       help="tokens per answer at most"),
    dram_budget: str = BUDGET, policy: str = POLICY, gamma: Optional[float] = GAMMA,
    accuracy_level: Optional[int] = LEVEL, native: Optional[bool] = NATIVE, flash_bandwidth: Optional[str] = FLASH,
    flash_device: Optional[str] = FLASH_DEVICE,
    io: str = IO, io_threads: Optional[int] = IO_THREADS, io_engine: str = IO_ENGINE, io_gap: int = IO_GAP, cache_split: str = CACHE_SPLIT,
    prefill: str = PREFILL, prefill_chunk: int = PREFILL_CHUNK, context: Optional[int] = CONTEXT, threads: int = THREADS,
    thread_pool: str = THREAD_POOL, single_session: Optional[bool] = SINGLE, fused: Optional[bool] = FUSED,
    prefetch: Optional[bool] = PREFETCH, temperature: float = TEMPERATURE, top_k: int = TOP_K, top_p: float = TOP_P, repetition_penalty: float = REP,
    stop: Optional[List[str]] = STOP, seed: int = SEED, system: Optional[str] = SYSTEM,
) -> None:
    """Interactive chat through the bundle's chat template: streams each answer, then one line of stats.
    Ctrl-C stops an answer (kept in the conversation); Ctrl-C or Ctrl-D at the prompt quits."""
    options = dict(locals())
    from dipdeploy.runtime.chat import Chat, Interrupt, check_policy, repl

    try:
        if max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
        check_count(max_new_tokens, "--max-new-tokens", 1, MAX_TOKENS, "tokens")
        check_policy(policy)
        for flag, value in (("--system", system), *(("--stop", s) for s in stop or ())):
            utf8(value, flag)
        sampler = _sampler(options)
        engine = _engine(bundle, options)
        chat = Chat(engine, sampler, system)
    except _ERRORS as err:
        fail(err)
    density = (engine.manifest.plan or {}).get("density", 1.0)
    console.print(f"[dim]{shown(bundle.name)}: {shown(engine.manifest.method)} at MLP density ρ {density:.2f} "
                  f"(`dipdeploy demo` shows what ρ costs), budget {shown(dram_budget)}, policy "
                  f"{shown(engine.cfg.policy)}, "
                  f"γ {engine.gamma:g}; Ctrl-C stops an answer, Ctrl-D or Ctrl-C at the prompt quits[/]")
    interrupt = Interrupt()

    @contextmanager
    def answering():
        previous = signal.signal(signal.SIGINT, lambda *_: setattr(interrupt, "requested", True))
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def write(piece: str) -> None:
        sys.stdout.write(shown(piece, lines=True, markup=False))  # a model's text may hold ESC
        sys.stdout.flush()

    try:
        repl(chat, input, write, lambda line: console.print(f"[dim]{shown(line)}[/]", highlight=False),
             max_new_tokens, interrupt, answering, on_prefill=lambda: _Prefill().on_prefill)
    except _ERRORS as err:
        fail(err)
