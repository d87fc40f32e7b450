"""Next-token choice with the options of Hugging Face ``generate`` (also llama.cpp's and
onnxruntime-genai's names): repetition penalty, temperature, top-k, top-p, stop strings, a seed.

Order as in transformers' logits processors: the repetition penalty first, then temperature, top-k and
top-p. Temperature 0 is greedy (the default, deterministic; ties → the lower token id, as argmax): the
penalty still applies, the filters do not matter. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dipdeploy.limits import MAX_WIDTH


@dataclass
class Sampler:
    """The generation options (the CLI's ``--temperature --top-k --top-p --repetition-penalty --stop
    --seed`` are these fields; their defaults are defined here only).

    ``repetition_penalty`` p: the logit of every token already in the context (prompt, earlier turns and
    the answer so far) is divided by p when positive and multiplied by p when negative (HF semantics;
    1 = off). ``top_k`` keeps the k most likely tokens (0 = off; ties → the lower id), ``top_p`` the
    smallest set whose probability reaches p. ``stop``: strings that end the answer where they first
    appear (they are not part of the text); the bundle's EOS ids end it too. ``seed`` makes sampling
    repeatable (``reset`` restarts it)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int = 0
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.stop = tuple(self.stop)
        problems = [message for ok, message in (
            (math.isfinite(self.temperature) and self.temperature >= 0,
             f"--temperature must be a number >= 0 (0 = greedy), got {self.temperature}"),
            (type(self.top_k) is int and 0 <= self.top_k <= MAX_WIDTH,  # the cap: no vocabulary is larger
             f"--top-k must be an integer in [0, {MAX_WIDTH}] (0 = off), got {self.top_k}"),
            (type(self.seed) is int and self.seed >= 0, f"--seed must be an integer >= 0, got {self.seed}"),
            (0.0 < self.top_p <= 1.0, f"--top-p must lie in (0, 1] (1 = off), got {self.top_p}"),
            (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0,
             f"--repetition-penalty must be a number > 0 (1 = off; HF uses 1.1-1.3), got {self.repetition_penalty}"),
            (all(isinstance(s, str) and s for s in self.stop), "--stop strings must not be empty"),
        ) if not ok]
        if problems:
            raise ValueError("; ".join(problems))
        self.reset()

    def reset(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def penalise(self, logits: np.ndarray, context) -> np.ndarray:
        """The logits with the repetition penalty applied to the tokens of ``context`` (a copy)."""
        z = logits.astype(np.float64)
        if self.repetition_penalty != 1.0 and len(context):
            seen = np.unique(np.asarray(context, np.int64))
            seen = seen[(seen >= 0) & (seen < z.size)]
            v = z[seen]
            z[seen] = np.where(v > 0, v / self.repetition_penalty, v * self.repetition_penalty)
        return z

    def probabilities(self, logits: np.ndarray, context=()) -> np.ndarray:
        """The distribution sampled from (temperature > 0): penalty, temperature, top-k, top-p; zeros
        outside the kept tokens."""
        z = self.penalise(logits, context) / self.temperature
        order = np.argsort(-z, kind="stable")  # stable: equal logits keep the lower id first
        if self.top_k:
            order = order[: self.top_k]
        p = np.exp(z[order] - z[order[0]])
        p /= p.sum()
        order = order[: int(np.searchsorted(np.cumsum(p), self.top_p) + 1)]
        out = np.zeros_like(z)
        out[order] = p[: len(order)] / p[: len(order)].sum()
        return out

    def __call__(self, logits: np.ndarray, context=()) -> int:
        """The next token after ``context`` (the token ids the sequence holds, for the penalty)."""
        return self.draw(logits, context)[0]

    def draw(self, logits: np.ndarray, context=()) -> tuple[int, np.ndarray | None]:
        """The next token after ``context`` and the distribution it was drawn from (None: greedy), which
        speculative sampling needs (``dipdeploy.runtime.speculate``)."""
        if self.temperature == 0.0:
            return int(np.argmax(self.penalise(logits, context))), None
        p = self.probabilities(logits, context)
        return self.pick(p), p

    def pick(self, p: np.ndarray) -> int:
        """A token drawn from the distribution ``p`` with this sampler's generator."""
        keep = np.flatnonzero(p)
        return int(keep[self._rng.choice(len(keep), p=p[keep])])
