"""A multi-turn conversation over one engine, and the interactive loop of ``dipdeploy chat``.

Every turn renders the whole conversation with the bundle's chat template (``template.py``) and feeds
only the tokens after the longest prefix the KV cache already holds: the template, not the tokens
sampled, decides what a past turn looks like, so the model always reads the format it was tuned on.
When the history changes (an interrupted answer, the oldest turns dropped for a full context) the
engine truncates its KV cache to the common prefix and re-reads the rest. The DRAM row caches simply
continue. Torch-free.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

from dipdeploy import defaults
from dipdeploy.cache import policy_of
from dipdeploy.runtime.engine import Engine, Generation
from dipdeploy.runtime.sampler import Sampler
from dipdeploy.runtime.template import ChatTemplate


@dataclass
class Reply:
    """One answer: the generation, and how many of the oldest turns were dropped to fit the context."""

    generation: Generation
    dropped_turns: int
    prompt_tokens: int


@dataclass
class Interrupt:
    """Ctrl-C while an answer streams: a signal handler sets ``requested``, the engine asks before every
    token (an interrupt must not cut one token's cache update in half)."""

    requested: bool = False

    def __call__(self) -> bool:
        return self.requested


def check_policy(policy: str) -> None:
    """Belady replays a recorded future (``Engine.generate`` records it in a first pass over a fixed
    prompt); a conversation's next turns are unknown, so it is refused rather than replaced."""
    if policy_of(policy).needs_future:
        raise ValueError(f"policy {policy!r} needs every future token's selections in advance (a recorded "
                         "sequence), which a conversation cannot know; use --policy lfu or lru here, or "
                         f"`dipdeploy run --policy {policy}` on a DIP bundle (γ = 1)")


class Chat:
    def __init__(self, engine: Engine, sampler: Sampler | None = None, system: str | None = None,
                 template: ChatTemplate | None = None, draft=None):
        check_policy(engine.cfg.policy)
        self.engine, self.sampler, self.draft = engine, sampler or Sampler(), draft  # draft: --speculate's
        self.template = template or ChatTemplate.from_bundle(engine.files, engine.manifest.files)
        self.system = [{"role": "system", "content": system}] if system else []
        self.turns: list[dict] = []  # user and assistant messages, oldest first
        engine.reset()

    def clear(self) -> None:
        """Start a new conversation (the system prompt stays); the next turn re-reads from the first token
        that differs, and the DRAM row caches stay warm."""
        self.turns = []

    @property
    def history(self) -> list[dict]:
        return self.system + self.turns

    def say(self, text: str, max_new_tokens: int = defaults.CHAT_MAX_NEW_TOKENS, on_text: Callable[[str], None] | None = None,
            should_stop: Callable[[], bool] | None = None,
            on_prefill: Callable[[int, int], None] | None = None) -> Reply:
        """One turn: the answer streams to ``on_text``; it is kept in the history even when interrupted."""
        user = {"role": "user", "content": text}
        context, dropped = self.engine.cfg.context, 0
        while True:
            ids = self.engine.encode(self.template.render(self.history + [user], add_generation_prompt=True),
                                     special_tokens=False)
            if len(ids) + max_new_tokens <= context:
                break
            if not self.turns:
                raise ValueError(f"this message ({len(ids)} tokens with the template) + {max_new_tokens} new "
                                 f"tokens exceed the context of {context}; raise --context or lower -n")
            self.turns = self.turns[2:]  # the oldest user turn and its answer
            dropped += 1
        held = self.engine.sequence
        keep = 0
        while keep < min(len(held), len(ids) - 1) and held[keep] == ids[keep]:
            keep += 1
        self.engine.truncate(keep)
        g = self.engine.extend(ids[keep:], max_new_tokens, self.sampler, on_text=on_text, should_stop=should_stop,
                               on_prefill=on_prefill, draft=self.draft)
        self.turns += [user, {"role": "assistant", "content": g.text}]
        return Reply(g, dropped, len(ids))


def length_mark(max_new_tokens: int) -> str:
    return f"[… stopped at {max_new_tokens} tokens; -n to raise]"


#: ``/set NAME VALUE``: the sampling options a conversation can change, by the names users type
SETTABLE = {"temp": "temperature", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
            "seed": "seed", "repeat_penalty": "repetition_penalty", "repetition_penalty": "repetition_penalty"}
HELP = ("commands: /exit (or Ctrl-D) quits · /clear starts a new conversation · /set NAME VALUE changes "
        "sampling (NAME: temp, top_k, top_p, repeat_penalty, seed) · /set shows it · /help this list; "
        "a message that begins with / is sent as //message")
QUIT = "quit"


def sampling(sampler: Sampler) -> str:
    return (f"temp {sampler.temperature:g}, top_k {sampler.top_k}, top_p {sampler.top_p:g}, repeat_penalty "
            f"{sampler.repetition_penalty:g}, seed {sampler.seed}")


def command(chat: Chat, line: str) -> str:
    """A ``/command`` line: what to show, or :data:`QUIT`. A refusal is one line naming the fix; the
    conversation goes on either way."""
    words = line.split()
    name, args = words[0].lower(), words[1:]
    if name in ("/exit", "/quit", "/bye") and not args:
        return QUIT
    if name == "/clear" and not args:
        chat.clear()
        return "[a new conversation: the earlier turns are forgotten]"
    if name in ("/help", "/?") and not args:
        return HELP
    if name == "/set" and not args:
        return sampling(chat.sampler)
    if name == "/set":
        key = args[0].lower().replace("-", "_")
        if key not in SETTABLE or len(args) != 2:
            return f"/set {' '.join(args)}: give /set NAME VALUE, NAME one of temp, top_k, top_p, repeat_penalty, seed"
        field = SETTABLE[key]
        kind = int if field in ("top_k", "seed") else float
        try:
            value = kind(args[1])
            if field == "seed" and value < 0:
                raise ValueError(f"seed must be >= 0, got {value}")
            chat.sampler = dataclasses.replace(chat.sampler, **{field: value})  # checked, and reseeded
        except ValueError as err:
            what = f"not {'an integer' if kind is int else 'a number'}" if "invalid literal" in str(err) \
                or "could not convert" in str(err) else str(err)
            return f"/set {key} {args[1]}: {what}; the sampling stays {sampling(chat.sampler)}"
        return sampling(chat.sampler)
    return f"unknown command {words[0]} (or wrong arguments); /help lists the commands"


def repl(chat: Chat, read: Callable[[str], str], write: Callable[[str], None], note: Callable[[str], None],
         max_new_tokens: int, interrupt: Interrupt, answering=nullcontext,
         on_prefill: Callable[[], Callable[[int, int], None]] | None = None) -> None:
    """The loop of ``dipdeploy chat``, terminal-free for tests: ``read`` is ``input``, ``write`` streams
    the answer, ``note`` prints status lines, ``answering()`` is a context manager the CLI uses to route
    Ctrl-C to ``interrupt`` while an answer streams, ``on_prefill()`` gives each turn its prefill
    callback (progress for a long message). Ctrl-C or Ctrl-D at the prompt quits; a blank line is ignored;
    a line that begins with / is a :func:`command` (``//`` sends a message that begins with /)."""
    while True:
        try:
            line = read("> ")
        except (EOFError, KeyboardInterrupt):
            write("\n")
            return
        if not line.strip():
            continue
        if line.lstrip().startswith("//"):
            line = line.lstrip()[1:]
        elif line.lstrip().startswith("/"):
            said = command(chat, line)
            if said == QUIT:
                return
            note(said)
            continue
        interrupt.requested = False
        try:
            with answering():
                reply = chat.say(line, max_new_tokens, on_text=write, should_stop=interrupt,
                                 on_prefill=on_prefill() if on_prefill is not None else None)
        except ValueError as err:  # this message cannot fit: say so, keep the conversation
            note(str(err))
            continue
        g, s = reply.generation, reply.generation.stats
        write("\n")
        if reply.dropped_turns:
            note(f"[context of {chat.engine.cfg.context} tokens full: dropped the {reply.dropped_turns} oldest "
                 f"turn(s), re-read {s.prompt_tokens} tokens]")
        if g.finish == "interrupted":
            note("[interrupted: the partial answer stays in the conversation]")
        elif g.finish == "length":
            note(length_mark(max_new_tokens))
        note(f"{s.decode_tok_s:.1f} tok/s, hit rate {s.hit_rate:.2f}, Flash {s.flash_mb_per_token:.2f} MB/token")
