"""Byte sizes as people write them: "4GB" (10^9), "3.5GiB" (2^30), "512MB", "2e9", and ranges "2GB..8GB"."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str) -> float:
    """Bytes in ``text``; decimal units (GB = 10^9) unless the binary ones (GiB) are written."""
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"size {text!r} not understood; write e.g. 4GB, 3.5GiB, 512MB or 2e9")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_range(text: str, steps: int) -> list[float]:
    """``"A..B"`` → ``steps`` sizes evenly spaced from A to B inclusive."""
    if ".." not in text:
        raise ValueError(f"range {text!r} not understood; write A..B, e.g. 2GB..8GB")
    a, b = (parse_size(x) for x in text.split("..", 1))
    if not 0 < a < b:
        raise ValueError(f"range {text!r}: need 0 < A < B")
    if steps < 2:
        raise ValueError(f"steps must be >= 2 for a range, got {steps}")
    return [a + (b - a) * i / (steps - 1) for i in range(steps)]
