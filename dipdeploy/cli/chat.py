"""``dipdeploy chat``: the interactive loop (``dipdeploy.runtime.chat.repl``) in a terminal, with line editing
and a history when stdin is one; the options are ``run``'s (``dipdeploy.cli.run``)."""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional

import typer

from dipdeploy import defaults
from dipdeploy.cli._app import app
from dipdeploy.cli.core import console, fail, utf8
from dipdeploy.cli.helpview import BASIC, PanelCommand
from dipdeploy.cli.run import (_ERRORS, BUDGET, BUNDLE_OPTION, CACHE_SPLIT, CONTEXT, DRAFT, FLASH, FLASH_DEVICE,
                               FUSED, GAMMA, IO, IO_ENGINE, IO_GAP, IO_THREADS, LEVEL, NATIVE, POLICY, PREFETCH,
                               PREFILL, PREFILL_CHUNK, REP, SEED, SINGLE, SPECULATE, STOP, SYSTEM, TEMPERATURE,
                               THREAD_POOL, THREADS, TOP_K, TOP_P, _close, _engine, _Prefill, _sampler, check_bundle,
                               named_bundle, read_prompt, sampling_note)
from dipdeploy.limits import MAX_TOKENS, check_count
from dipdeploy.terminal import shown

#: lines kept in the history file (readline's, as a shell keeps its own)
HISTORY_LINES = 1000


def history_file() -> Path:
    from dipdeploy.paths import cache_dir

    return cache_dir("chat_history")


@contextmanager
def line_editing(enabled: bool):
    """On a terminal: readline's editing (arrow keys, Ctrl-R) for ``input``, and the earlier sessions'
    lines as history, kept in the user's cache folder and capped. A history that cannot be read or written
    (a read-only home, no readline on this Python) costs the history, never the chat."""
    readline = None
    if enabled:
        try:
            import readline
        except ImportError:
            readline = None
    path = None
    if readline is not None:
        try:
            path = history_file()
            readline.set_history_length(HISTORY_LINES)
            if path.is_file():
                readline.read_history_file(path)
        except OSError:
            path = None
    try:
        yield
    finally:
        if readline is not None and path is not None:
            try:
                readline.write_history_file(path)
            except OSError:
                pass


@app.command("chat", cls=PanelCommand)
def chat_cmd(
    bundle: Optional[Path] = typer.Argument(None, help="a bundle directory from `dipdeploy export` (with a chat "
                                            "template; or -m)", show_default=False),
    model: Optional[Path] = BUNDLE_OPTION,
    max_new_tokens: int = typer.Option(defaults.CHAT_MAX_NEW_TOKENS, "--max-new-tokens", "-n",
                                       help="tokens per answer at most", rich_help_panel=BASIC),
    dram_budget: str = BUDGET, policy: str = POLICY, gamma: Optional[float] = GAMMA,
    accuracy_level: Optional[int] = LEVEL, native: Optional[bool] = NATIVE, flash_bandwidth: Optional[str] = FLASH,
    flash_device: Optional[str] = FLASH_DEVICE, io: str = IO, io_threads: Optional[int] = IO_THREADS,
    io_engine: str = IO_ENGINE, io_gap: int = IO_GAP, cache_split: str = CACHE_SPLIT, prefill: str = PREFILL,
    prefill_chunk: int = PREFILL_CHUNK, context: Optional[int] = CONTEXT, threads: Optional[int] = THREADS,
    thread_pool: str = THREAD_POOL, single_session: Optional[bool] = SINGLE, fused: Optional[bool] = FUSED,
    prefetch: Optional[bool] = PREFETCH, speculate: int = SPECULATE, draft: Optional[str] = DRAFT,
    temperature: float = TEMPERATURE, top_k: int = TOP_K, top_p: float = TOP_P,
    repetition_penalty: float = REP, stop: Optional[List[str]] = STOP, seed: Optional[int] = SEED,
    system: Optional[str] = SYSTEM,
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="read the system prompt from this UTF-8 text "
                                        "file (llama.cpp's conversation mode), instead of --system",
                                        rich_help_panel=BASIC),
) -> None:
    """Interactive chat through the bundle's chat template: streams each answer, then one line of stats.
    Ctrl-C stops an answer (kept in the conversation); Ctrl-C, Ctrl-D or /exit at the prompt quits; /help
    lists the commands (/clear, /set temp 0.7 …)."""
    options = dict(locals())
    from dipdeploy.runtime.chat import Chat, Interrupt, check_policy, repl

    try:
        bundle = options["bundle"] = named_bundle(bundle, model, "chat")
        check_bundle(bundle, "chat")
        if max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
        check_count(max_new_tokens, "--max-new-tokens", 1, MAX_TOKENS, "tokens")
        check_policy(policy)
        system = read_prompt(system, file, flag="--system", what="the system prompt", required=False, stdin=False)
        for flag, value in (("--system", system), *(("--stop", s) for s in stop or ())):
            utf8(value, flag)
        sampler = _sampler(options)
        engine, drafter = _engine(bundle, options)
        try:
            chat = Chat(engine, sampler, system, draft=drafter)
        except BaseException:
            _close(engine, drafter)
            raise
    except _ERRORS as err:
        fail(err)
    density = (engine.manifest.plan or {}).get("density", 1.0)
    seeded = f", {sampling_note(sampler)}" if sampling_note(sampler) else ""
    console.print(f"[dim]{shown(bundle.name)}: {shown(engine.manifest.method)} at MLP density ρ {density:.2f} "
                  f"(`dipdeploy demo` shows what ρ costs), budget {shown(dram_budget)}, policy "
                  f"{shown(engine.cfg.policy)}, γ {engine.gamma:g}{seeded}; Ctrl-C stops an answer, Ctrl-D or "
                  f"/exit quits, /help lists the commands[/]")
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
        with line_editing(sys.stdin.isatty()):
            repl(chat, input, write, lambda line: console.print(f"[dim]{shown(line)}[/]", highlight=False),
                 max_new_tokens, interrupt, answering, on_prefill=lambda: _Prefill().on_prefill)
    except _ERRORS as err:
        fail(err)
    finally:
        _close(engine, drafter)
