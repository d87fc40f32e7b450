"""Next-token choice: greedy (the default, deterministic) or temperature / top-p with a seeded RNG."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sampler:
    """``temperature`` 0 = greedy (ties → lower token id, as argmax). ``top_p`` keeps the smallest set of
    tokens whose probability reaches p. ``seed`` makes sampling repeatable (``reset`` restarts it)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        self.reset()

    def reset(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def __call__(self, logits: np.ndarray) -> int:
        if self.temperature == 0.0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / self.temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        keep = order[: int(np.searchsorted(np.cumsum(p[order]), self.top_p) + 1)]
        q = p[keep] / p[keep].sum()
        return int(keep[self._rng.choice(len(keep), p=q)])
