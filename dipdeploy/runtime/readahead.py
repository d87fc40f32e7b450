"""``--prefetch auto``: whether the read-ahead during the attention pays on this machine, measured on the
first decode tokens.

The read-ahead (``CachePrefetch``, docs/decisions/0003-joined-graph-written-by-export.md) reads a layer's predicted
up|gate misses while its attention runs. Where compute is slow against the device, that hides reads;
where the device is the bottleneck, its wrong guesses' bytes and the second set of requests cost more than
it hides (docs/decisions/0005-prefetch-auto.md cites both kinds of
machine). Which holds depends on the CPU, the disk and the bundle, so
the engine times tokens both ways: it switches the read-ahead on and off on alternate tokens until it has
:data:`PROBE_TOKENS` of each, then keeps the setting whose median token was shorter (on when equal). The
read-ahead changes no logit (CacheEnd hands the product the same rows in the same order), so the probe
changes only the timings. Torch-free (floor 5).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

PROBE_TOKENS = 4  # tokens timed with the read-ahead on, and as many off, alternating, before the choice


@dataclass
class ReadAheadProbe:
    """The tokens timed with the read-ahead on and off, and the choice once both have ``tokens``."""

    tokens: int = PROBE_TOKENS
    seconds: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})
    chosen: bool | None = None

    def next(self) -> bool:
        """The setting for the next token: the choice once made, else on and off in turn."""
        if self.chosen is not None:
            return self.chosen
        return len(self.seconds[True]) <= len(self.seconds[False])

    def record(self, on: bool, seconds: float) -> None:
        """One token's time with the read-ahead ``on``; the choice is made when both settings have enough."""
        if self.chosen is not None:
            return
        self.seconds[on].append(seconds)
        if min(len(v) for v in self.seconds.values()) >= self.tokens:
            self.chosen = self.median(True) <= self.median(False)

    def median(self, on: bool) -> float:
        return statistics.median(self.seconds[on]) if self.seconds[on] else float("nan")

    def describe(self) -> str:
        """One line for the stats: the choice and the medians it was made from, or the probe under way."""
        if self.chosen is None:
            done = min(len(v) for v in self.seconds.values())
            return f"auto: probing ({done} of {self.tokens} tokens each)"
        return (f"auto: {'on' if self.chosen else 'off'} ({self.median(True) * 1e3:.3g} ms a token on, "
                f"{self.median(False) * 1e3:.3g} off, median of {self.tokens})")
