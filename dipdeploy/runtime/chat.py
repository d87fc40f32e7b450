"""A multi-turn conversation over one engine: the KV cache and the DRAM caches continue across turns.

Turns are framed with ChatML (``<|im_start|>role\\n…<|im_end|>``) when the bundle's tokenizer has those
special tokens (SmolLM2-Instruct, Qwen2), otherwise as plain "User:/Assistant:" text. Torch-free.
"""

from __future__ import annotations

from dipdeploy.runtime.engine import Engine
from dipdeploy.runtime.sampler import Sampler
from dipdeploy.runtime.stats import RunStats


class Chat:
    def __init__(self, engine: Engine, sampler: Sampler | None = None):
        self.engine, self.sampler = engine, sampler or Sampler()
        self.chatml = engine.tokenizer.token_to_id("<|im_start|>") is not None
        self.pending: list[int] = []
        engine.reset()

    def frame(self, text: str) -> str:
        if self.chatml:
            return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
        return f"User: {text}\nAssistant:"

    def say(self, text: str, max_new_tokens: int = 128, on_token=None, on_prefill=None) -> RunStats:
        """One turn: feed the user's words, stream the answer; returns the turn's stats."""
        ids = self.pending + self.engine.encode(self.frame(text))
        g = self.engine.extend(ids, max_new_tokens, self.sampler, on_token=on_token, on_prefill=on_prefill)
        self.pending = g.tokens[-1:]
        return g.stats
