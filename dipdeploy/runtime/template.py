"""The bundle's chat template, rendered the way transformers' ``apply_chat_template`` renders it.

An instruct model answers well only in the turn format it was tuned on, and that format is the Jinja
template its tokenizer ships (``chat_template.jinja``, or ``chat_template`` in ``tokenizer_config.json``;
an export copies both with the tokenizer). Rendering follows transformers: a sandboxed Jinja environment
with ``trim_blocks``/``lstrip_blocks``, the loop-control extension, ``raise_exception``, ``strftime_now``,
a ``tojson`` that does not escape HTML, and the tokenizer's special tokens (``bos_token`` …) as
variables. Torch-free (jinja2 only). A bundle without a template is refused by name: a base model has no
turn format to follow, ``dipdeploy run`` without ``--chat`` continues raw text.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from dipdeploy.bundle.bundledir import BundleDir
from dipdeploy.bundle.manifest import held

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")
# Caps on one render (``_Budget``): real templates loop over the messages, write the conversation once and
# finish in milliseconds, so only a hostile or broken template meets them.
MAX_LOOP_STEPS = 1 << 20  # steps through ``range`` in one render
MAX_RENDER_CHARS = 1 << 24  # characters written (a conversation of the longest context is far fewer)
MAX_RENDER_S = 10.0  # seconds: the backstop for loops the step count does not see
MAX_SOURCE_BYTES = 16 << 20  # tokenizer_config.json or chat_template.jinja: a model's are kilobytes
MAX_POWER = 1 << 10  # the largest exponent of ``**`` (a huge integer power takes unbounded time)


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    special_tokens: dict

    @classmethod
    def from_bundle(cls, bundle: str | Path | BundleDir, files: dict) -> "ChatTemplate":
        """The template of the bundle at ``bundle`` (an engine's ``files``: read through the folder it
        holds); ``files``: the manifest's file records (only listed files are opened, each checked on the
        descriptor read and against its sha256, the bundle sandbox of README.md)."""
        with held(bundle, files) as folder:
            return cls._read_from(folder, files)

    @classmethod
    def _read_from(cls, bundle: BundleDir, files: dict) -> "ChatTemplate":
        config = {}
        if TOKENIZER_CONFIG in files:
            config = json.loads(_read(bundle, TOKENIZER_CONFIG))
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates, as transformers allows: take "default"
            source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
        if TEMPLATE_FILE in files:
            source = _read(bundle, TEMPLATE_FILE)
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"bundle {bundle} has no chat template ({TEMPLATE_FILE} or chat_template in "
                             f"{TOKENIZER_CONFIG}): chat needs an instruct model's bundle; continue raw text "
                             "with `dipdeploy run` (without --chat)")
        special = {}
        for name in SPECIAL_TOKENS:
            value = config.get(name)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                special[name] = value
        return cls(source, special)

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The conversation as the model reads it; ``add_generation_prompt`` opens the assistant's turn.
        A template is code from the bundle: its loops, output and time are capped (:class:`_Budget`)."""
        import jinja2

        budget = _Budget()
        try:
            pieces = _compile(self.source).generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                    **self.special_tokens, range=budget.range)
            out = []
            for piece in pieces:
                out.append(piece)
                budget.wrote(len(piece))
            return "".join(out)
        except TemplateLimit as err:
            raise ValueError(f"the bundle's chat template {err}; re-export the bundle with the model's own chat "
                             "template") from None
        except jinja2.exceptions.TemplateError as err:
            raise ValueError(f"the bundle's chat template refused the conversation: {err}") from None
        except (RecursionError, MemoryError, OverflowError) as err:
            raise ValueError(f"the bundle's chat template cannot be rendered ({type(err).__name__}); re-export the "
                             "bundle with the model's own chat template") from None


def _read(bundle: BundleDir, name: str) -> str:
    """A template file's text, refused above ``MAX_SOURCE_BYTES`` before it is read whole."""
    path = bundle.path / name
    size = (bundle.files.get(name) or {}).get("size")
    data = None
    if not (type(size) is int and size > MAX_SOURCE_BYTES):
        with bundle.refusing():
            data = bundle.read_bytes(name, cap=MAX_SOURCE_BYTES)
    if data is None:
        raise ValueError(f"{path} is over the cap of {MAX_SOURCE_BYTES} bytes for a tokenizer config or chat "
                         "template; re-export the bundle with the model's own tokenizer files")
    return data.decode("utf-8")


class TemplateLimit(Exception):
    """A chat template over one of the render caps (not a jinja2 error, so nothing inside the template
    can catch it)."""


class _Budget:
    """One render's allowance: loop steps through ``range`` (the one way a template loops beyond the
    size of the conversation it is given), characters written and seconds spent. A template runs as
    code from the bundle, and nested ``range`` loops or a repeated string would otherwise hold the
    process until memory or patience ran out."""

    def __init__(self):
        self.steps, self.chars, self.deadline = 0, 0, time.monotonic() + MAX_RENDER_S

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_LOOP_STEPS:
            raise TemplateLimit(f"runs over the cap of {MAX_LOOP_STEPS} loop steps")
        self.clock()

    def clock(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimit(f"runs over the cap of {MAX_RENDER_S:g} s of rendering")

    def wrote(self, n: int) -> None:
        self.chars += n
        if self.chars > MAX_RENDER_CHARS:
            raise TemplateLimit(f"writes over the cap of {MAX_RENDER_CHARS} characters")
        self.clock()

    def range(self, *args) -> "_Counted":
        r = range(*args)
        if len(r) > MAX_LOOP_STEPS:
            raise TemplateLimit(f"asks for a range of {len(r)}, over the cap of {MAX_LOOP_STEPS} loop steps")
        return _Counted(r, self)


class _Counted:
    """A ``range`` whose every step is counted against the render's budget (``length`` and indexing as
    a range's)."""

    def __init__(self, r: range, budget: _Budget):
        self.r, self.budget = r, budget

    def __len__(self) -> int:
        return len(self.r)

    def __getitem__(self, k):
        return self.r[k]

    def __iter__(self):
        for i in self.r:
            self.budget.step()
            yield i


def _check_arguments(name: str, args, kwargs) -> None:
    for value in (*args, *kwargs.values()):
        if type(value) is int and abs(value) > MAX_RENDER_CHARS:
            raise TemplateLimit(f"passes {value} to {name}, over the cap of {MAX_RENDER_CHARS}")


def _check_widths(fmt: str, braces: bool) -> None:
    """The widths and precisions of a format string (``{:>N}`` with ``braces``, else ``%N.Ms``) under
    the output cap: a formatted field is built whole before the output cap could see it."""
    import re
    import string

    try:
        specs = [spec for _, _, spec, _ in string.Formatter().parse(fmt) if spec] if braces else \
            [m.group(0) for m in re.finditer(r"%[-#0 +]*\d*(?:\.\d*)?", fmt)]
    except ValueError:
        return  # a malformed format: the formatting itself refuses it
    for spec in specs:
        for digits in re.findall(r"\d+", spec):
            if len(digits) > 12 or int(digits) > MAX_RENDER_CHARS:
                raise TemplateLimit(f"formats a field {digits[:20]} wide, over the cap of {MAX_RENDER_CHARS}")


def _capped(name: str, f):
    """Filter ``f`` with its arguments after the value checked (:func:`_check_arguments`); jinja2's
    markers of what a filter is passed first (the environment, the context) are kept by ``wraps``."""
    skip = 2 if getattr(f, "jinja_pass_arg", None) is not None else 1

    @functools.wraps(f)
    def capped(*args, **kwargs):
        _check_arguments(f"the {name} filter", args[skip:], kwargs)
        if name == "format" and len(args) >= skip and isinstance(args[skip - 1], str):  # a %-format
            _check_widths(args[skip - 1], braces=False)
        return f(*args, **kwargs)

    return capped


@lru_cache(maxsize=8)
def _compile(source: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Sandbox(ImmutableSandboxedEnvironment):
        """The sandbox with ``*``, ``**`` and the integers given to calls and filters capped: a repeated
        string or list, a huge power, or a width (``'x'.ljust(n)``, ``|center(n)``, ``|batch(n)``) is built
        whole before the output cap could see it."""

        intercepted_binops = frozenset({"*", "**", "%"})

        def wrap_str_format(self, value):
            if isinstance(getattr(value, "__self__", None), str):  # 'text {:>9}'.format(...): its widths
                _check_widths(value.__self__, braces=True)
            return super().wrap_str_format(value)

        def call(self, context, obj, /, *args, **kwargs):
            _check_arguments(getattr(obj, "__name__", "a call"), args, kwargs)
            return super().call(context, obj, *args, **kwargs)

        def call_binop(self, context, operator, left, right):
            if operator == "%" and isinstance(left, str):
                _check_widths(left, braces=False)
            if operator == "**" and isinstance(right, int) and abs(right) > MAX_POWER:
                raise TemplateLimit(f"raises to the power {right}, over the cap of {MAX_POWER}")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_RENDER_CHARS:
                        raise TemplateLimit(f"repeats a sequence to {len(seq) * n} items, over the cap of "
                                            f"{MAX_RENDER_CHARS}")
            return super().call_binop(context, operator, left, right)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.filters.update({name: _capped(name, f) for name, f in env.filters.items()})
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateError as err:
        raise ValueError(f"the bundle's chat template does not parse ({err}); re-export it with a valid "
                         "chat_template") from None


def messages(user: str, system: str | None = None) -> list[dict]:
    """One user turn, after the system prompt when one is given."""
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
