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

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

GB = 1e9
_NUMBERS = ("dram_bandwidth_gbs", "dram_capacity_gb", "flash_seq_read_gbs")


@dataclass(frozen=True)
class FlashModel:
    """Flash reads: per-request cost plus bytes over the sequential bandwidth."""

    seq_bandwidth: float  # bytes / s
    request_s: float  # seconds per request (after coalescing adjacent rows)
    read_unit: int = 1  # bytes: reads transfer whole blocks of this size (1: no granularity)

    def __post_init__(self) -> None:
        if self.seq_bandwidth <= 0:
            raise ValueError(f"flash seq_bandwidth must be > 0 bytes/s, got {self.seq_bandwidth}")
        if self.request_s < 0:
            raise ValueError(f"flash request_s must be >= 0 s, got {self.request_s}")
        if self.read_unit < 1:
            raise ValueError(f"flash read_unit must be >= 1 byte, got {self.read_unit}")

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
        if self.dram_bandwidth <= 0:
            raise ValueError(f"device {self.name}: dram_bandwidth must be > 0, got {self.dram_bandwidth}")
        if self.dram_capacity <= 0:
            raise ValueError(f"device {self.name}: dram_capacity must be > 0, got {self.dram_capacity}")

    @property
    def assumptions(self) -> list[str]:
        return [k for k, v in self.sources.items() if str(v).lower().startswith("assumption")]


def devices_dir() -> Path:
    return Path(__file__).resolve().parent / "devices"


def _parse(path: Path) -> DeviceProfile:
    raw = tomllib.loads(path.read_text())
    numbers = list(_NUMBERS) + [k for k in ("flash_request_us", "flash_random_4k_iops", "flash_read_unit_bytes")
                                if k in raw]
    if not any(k in raw for k in ("flash_request_us", "flash_random_4k_iops")):
        raise ValueError(f"device profile {path}: give flash_request_us or flash_random_4k_iops")
    missing = [k for k in numbers if k not in raw]
    if missing:
        raise ValueError(f"device profile {path}: missing {', '.join(missing)}")
    unsourced = [k for k in numbers if not str(raw.get(f"{k}_source", "")).strip()]
    if unsourced:
        raise ValueError(f"device profile {path}: numbers without a source: {', '.join(unsourced)} "
                         f"(add '<field>_source', or mark it 'assumption: …')")
    seq = float(raw["flash_seq_read_gbs"]) * GB
    if "flash_request_us" in raw:
        request_s = float(raw["flash_request_us"]) * 1e-6
    else:
        request_s = max(0.0, 1.0 / float(raw["flash_random_4k_iops"]) - 4096.0 / seq)
    return DeviceProfile(
        name=raw["name"], description=raw.get("description", ""),
        dram_bandwidth=float(raw["dram_bandwidth_gbs"]) * GB, dram_capacity=float(raw["dram_capacity_gb"]) * GB,
        flash=FlashModel(seq_bandwidth=seq, request_s=request_s, read_unit=int(raw.get("flash_read_unit_bytes", 1))),
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
