"""Device profiles: DRAM and Flash of NPU-class phones and a laptop, as data files (``devices/*.toml``).

Flash cost model (ours, docs/method.md "The HW simulator"): reading ``n`` requests totalling ``b`` bytes takes

    t = n · request_s + b / seq_bandwidth

i.e. an effective bandwidth ``s / (request_s + s / seq_bandwidth)`` for a request of ``s`` bytes: small
random reads are far slower than sequential ones, and row size decides what DIP's reads cost. A profile
gives ``request_us`` directly or derives it from a random-read figure (``random_4k_iops``: one 4 KiB
request takes 1/IOPS, so request_s = 1/IOPS − 4096/seq_bandwidth). Vendor IOPS are measured at a high
queue depth; the model assumes the runtime issues one layer's misses concurrently (DIP knows every row a
layer needs before it reads), which is what makes that figure the right one.

``flash_read_unit_bytes`` (optional, default 1 = none): reads transfer whole blocks of this size, so a
row smaller than a block costs the whole block (dipdeploy/flash.py, ``flash_reads``).

Every number in a profile file carries a ``<field>_source`` string; those starting with "assumption"
are ours. The loader refuses a profile with an unsourced number.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from dipdeploy.paths import read_capped

GB = 1e9
PROFILE_MAX = 1 << 20  # bytes of a profile file read at most: a profile is a few dozen lines
MAX_READ_UNIT = 1 << 24  # bytes: a Flash read unit is a page of a few KiB; the cap only stops a mistyped one
_NUMBERS = ("dram_bandwidth_gbs", "dram_capacity_gb", "flash_seq_read_gbs")
#: request sizes (bytes) at which ``devices`` shows each profile's effective Flash bandwidth
CURVE_SIZES = (4096, 65536, 1 << 20)


@dataclass(frozen=True)
class FlashModel:
    """Flash reads: per-request cost plus bytes over the sequential bandwidth."""

    seq_bandwidth: float  # bytes / s
    request_s: float  # seconds per request (after coalescing adjacent rows)
    read_unit: int = 1  # bytes: reads transfer whole blocks of this size (1: no granularity)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.seq_bandwidth) and self.seq_bandwidth > 0):  # nan and inf compare False
            raise ValueError(f"flash seq_bandwidth must be a finite rate > 0 bytes/s, got {self.seq_bandwidth}")
        if not (math.isfinite(self.request_s) and self.request_s >= 0):
            raise ValueError(f"flash request_s must be a finite time >= 0 s, got {self.request_s}")
        if not 1 <= self.read_unit <= MAX_READ_UNIT:
            raise ValueError(f"flash read_unit must lie in [1, {MAX_READ_UNIT}] bytes (the cap), got {self.read_unit}")

    def read_time(self, requests, nbytes):
        """Seconds for ``requests`` requests carrying ``nbytes`` bytes in total (scalars or arrays)."""
        return requests * self.request_s + nbytes / self.seq_bandwidth

    def effective_bandwidth(self, request_bytes: float) -> float:
        """The read-size curve: bytes/s achieved with requests of ``request_bytes`` each."""
        return request_bytes / self.read_time(1, request_bytes)


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    description: str
    dram_bandwidth: float  # bytes / s
    dram_capacity: float  # bytes
    flash: FlashModel
    sources: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("dram_bandwidth", "dram_capacity"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"device {self.name}: {name} must be finite and > 0, got {value}")

    @property
    def assumptions(self) -> list[str]:
        return [k for k, v in self.sources.items() if str(v).lower().startswith("assumption")]

    def as_dict(self) -> dict:
        """The profile in base units (bytes, bytes/s, seconds), with its read-size curve at
        :data:`CURVE_SIZES`: the entry of ``devices --json``."""
        f = self.flash
        return {"name": self.name, "description": self.description, "dram_bytes_per_s": self.dram_bandwidth,
                "dram_capacity_bytes": self.dram_capacity, "flash_seq_bytes_per_s": f.seq_bandwidth,
                "flash_request_s": f.request_s, "flash_read_unit_bytes": f.read_unit,
                "flash_effective_bytes_per_s": {str(size): f.effective_bandwidth(size) for size in CURVE_SIZES},
                "assumptions": self.assumptions, "sources": dict(self.sources)}


def devices_dir() -> Path:
    return Path(__file__).resolve().parent / "devices"


def _number(raw: dict, key: str, path: Path, positive: bool = True) -> float:
    """A profile's number: finite, and > 0 (``positive``) or >= 0; anything else refused by name, so no
    profile divides by zero or turns every result into nan or inf."""
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise ValueError(f"device profile {path}: {key} must be a finite number {'>' if positive else '>='} 0, "
                         f"got {value!r}")
    return float(value)


def _parse(path: Path) -> DeviceProfile:
    data = read_capped(path, PROFILE_MAX)
    if data is None:
        raise ValueError(f"device profile {path} is over the cap of {PROFILE_MAX} bytes (a profile is a few "
                         "dozen lines); give a profile file")
    raw = tomllib.loads(data.decode("utf-8"))
    numbers = list(_NUMBERS) + [k for k in ("flash_request_us", "flash_random_4k_iops", "flash_read_unit_bytes")
                                if k in raw]
    if not any(k in raw for k in ("flash_request_us", "flash_random_4k_iops")):
        raise ValueError(f"device profile {path}: give flash_request_us or flash_random_4k_iops")
    missing = [k for k in ["name", *numbers] if k not in raw]
    if missing:
        raise ValueError(f"device profile {path}: missing {', '.join(missing)}")
    unsourced = [k for k in numbers if not str(raw.get(f"{k}_source", "")).strip()]
    if unsourced:
        raise ValueError(f"device profile {path}: numbers without a source: {', '.join(unsourced)} "
                         f"(add '<field>_source', or mark it 'assumption: …')")
    seq = _number(raw, "flash_seq_read_gbs", path) * GB
    if "flash_request_us" in raw:
        request_s = _number(raw, "flash_request_us", path, positive=False) * 1e-6
    else:
        request_s = max(0.0, 1.0 / _number(raw, "flash_random_4k_iops", path) - 4096.0 / seq)
    unit = raw.get("flash_read_unit_bytes", 1)
    if type(unit) is not int:
        raise ValueError(f"device profile {path}: flash_read_unit_bytes must be a whole number of bytes, got {unit!r}")
    return DeviceProfile(
        name=str(raw["name"]), description=str(raw.get("description", "")),
        dram_bandwidth=_number(raw, "dram_bandwidth_gbs", path) * GB,
        dram_capacity=_number(raw, "dram_capacity_gb", path) * GB,
        flash=FlashModel(seq_bandwidth=seq, request_s=request_s, read_unit=unit),
        sources={k: raw[f"{k}_source"] for k in numbers},
    )


def list_devices() -> list[DeviceProfile]:
    return [_parse(p) for p in sorted(devices_dir().glob("*.toml"))]


def get_device(name: str) -> DeviceProfile:
    """A profile by name, or by path to a profile file of the same schema."""
    path = Path(name)
    if path.suffix == ".toml" and path.is_file():
        return _parse(path)
    candidate = devices_dir() / f"{name}.toml"
    if not candidate.is_file():
        known = ", ".join(d.name for d in list_devices())
        raise KeyError(f"unknown device {name!r}; profiles: {known} (or pass a path to a .toml profile)")
    return _parse(candidate)
