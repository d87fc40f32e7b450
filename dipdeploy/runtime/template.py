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

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    special_tokens: dict

    @classmethod
    def from_bundle(cls, bundle: str | Path, files: dict) -> "ChatTemplate":
        """The template of the bundle at ``bundle``; ``files``: the manifest's file records (only listed,
        already checked files are opened, the bundle sandbox of README.md)."""
        bundle = Path(bundle)
        config = {}
        if TOKENIZER_CONFIG in files:
            config = json.loads((bundle / TOKENIZER_CONFIG).read_text(encoding="utf-8"))
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates, as transformers allows: take "default"
            source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
        if TEMPLATE_FILE in files:
            source = (bundle / TEMPLATE_FILE).read_text(encoding="utf-8")
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
        """The conversation as the model reads it; ``add_generation_prompt`` opens the assistant's turn."""
        import jinja2

        try:
            return _compile(self.source).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                **self.special_tokens)
        except jinja2.exceptions.TemplateError as err:
            raise ValueError(f"the bundle's chat template refused the conversation: {err}") from None


@lru_cache(maxsize=8)
def _compile(source: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
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
