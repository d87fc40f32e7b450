"""A fresh cgroup memory group for one benchmark run: its limit, its peak, the times it hit the limit.

The group is made under this process's own memory group (cgroup v1: the ``memory`` hierarchy; v2: the
unified one), limited to ``limit`` bytes when one is given, entered by the child process before it
allocates anything (``enter``, a ``preexec_fn``), read after the child ends and removed. v1 counts the
page cache a group's processes fault in against its limit, as a phone's DRAM holds a file's pages; its
peak is ``memory.max_usage_in_bytes``. v2's is ``memory.peak`` where the kernel has it. Making a group
needs the rights to (root, or a delegated cgroup): ``probe`` says in one line why not, before any run.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
_RMDIR_TRIES = 50  # the group is removable once the child's exit is accounted
_RMDIR_WAIT = 0.1


@dataclass(frozen=True)
class Group:
    path: Path
    version: int

    def enter(self) -> None:
        """Move the calling process into the group (a ``preexec_fn``: the child, before it execs)."""
        with open(self.path / "cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    def _read(self, name: str) -> str | None:
        try:
            return (self.path / name).read_text().strip()
        except OSError:
            return None

    def _events(self) -> dict[str, int]:
        text = self._read("memory.events") or ""
        return {k: int(v) for k, v in (line.split() for line in text.splitlines() if len(line.split()) == 2)}

    def peak(self) -> int | None:
        value = self._read("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")
        return int(value) if value and value.isdigit() else None

    def limit_hits(self) -> int | None:
        """v1: the times usage hit the limit (``memory.failcnt``); v2: ``memory.events``' ``max``."""
        if self.version == 1:
            value = self._read("memory.failcnt")
            return int(value) if value and value.isdigit() else None
        return self._events().get("max")

    def oom_kills(self) -> int | None:
        if self.version == 1:
            for line in (self._read("memory.oom_control") or "").splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
            return None
        return self._events().get("oom_kill")


def _own(root: Path) -> tuple[Path, int]:
    """This process's memory group folder and the cgroup version."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    by = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                by[controller] = parts[2]
    if (root / "cgroup.controllers").is_file():
        base, group, version = root, by.get("", "/"), 2
    elif (root / "memory").is_dir() and "memory" in by:
        base, group, version = root / "memory", by["memory"], 1
    else:
        raise RuntimeError("no cgroup memory controller for this process (/proc/self/cgroup)")
    here = base / group.lstrip("/")
    return (here if here.is_dir() else base), version


@contextmanager
def memory_group(name: str, limit: int | None, root: Path = ROOT):
    """A fresh group under this process's own, limited to ``limit`` bytes (None: no limit), removed
    afterwards; yields the :class:`Group`."""
    parent, version = _own(root)
    path = parent / f"{name}-{os.getpid()}"
    path.mkdir()
    try:
        if limit is not None:
            (path / ("memory.limit_in_bytes" if version == 1 else "memory.max")).write_text(str(limit))
        yield Group(path, version)
    finally:
        for _ in range(_RMDIR_TRIES):
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(_RMDIR_WAIT)


def probe(root: Path = ROOT) -> str | None:
    """None when a limited group can be made here, else why not (one line, with the fix)."""
    try:
        with memory_group("dipdeploy-bench-probe", 1 << 40, root) as group:
            if group.version == 2 and not (group.path / "memory.max").is_file():
                return "the cgroup v2 group has no memory controller (enable +memory in the parent's subtree_control)"
    except (OSError, RuntimeError) as err:
        return f"cannot make a cgroup memory group ({' '.join(str(err).split())})"
    return None


def require(root: Path = ROOT) -> None:
    """Refuse, in one line with the fix, a ``--limit`` where no limited group can be made."""
    why = probe(root)
    if why is not None:
        raise ValueError(f"--limit needs a cgroup memory group: {why}; run as root or in a delegated cgroup, or "
                         f"give --limit none")
