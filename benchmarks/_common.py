"""What every benchmark prints about the machine it ran on (docs/design.md §12: claims carry their conditions)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "load_1min": round(load, 2)}


def positive_int(value: str) -> int:
    """An argparse ``type`` for counts (repeats, tokens): a whole number of at least 1, or one line naming the fix."""
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give a whole number of at least 1")
    return int(value)


def write_rows_json(rows: list[dict], path: str | None) -> None:
    if path:
        tmp = Path(path).with_suffix(".tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        tmp.replace(path)


def publish(results: Path, name: str, quick: bool, text: str, rows: list[dict], json_path: str | None) -> Path:
    """Write a benchmark's table to ``<results>/<name>[-quick].md`` (atomically, regenerated in place; the
    benchmark's ``RESULTS``, which tests point elsewhere), its rows to ``--json`` and the table to stdout."""
    from dipdeploy.paths import write_atomic

    results.mkdir(exist_ok=True)
    out = results / f"{name}{'-quick' if quick else ''}.md"
    write_atomic(out, text, force=True)
    write_rows_json(rows, json_path)
    print(text)
    return out


def save_figure(fig, out: Path) -> None:
    """Lay out, write atomically (a reader never finds half a PNG) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)


def md_table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def md_tables(text: str) -> list[list[dict[str, str]]]:
    """Every pipe table of a results file that starts a line, in order, each as its rows {column: cell,
    stripped}: what :func:`md_table` writes, read back (the header and separator lines are not rows)."""
    tables, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip("|").split("|")])
        elif block:
            tables.append([dict(zip(block[0], cells)) for cells in block[2:]])
            block = []
    return tables


def lscpu() -> str:
    """The CPU lines of ``lscpu`` that a figure depends on (model, cores, threads, hypervisor, L3)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "lscpu unavailable"
    keep = ("Model name", "CPU(s)", "Thread(s) per core", "Hypervisor vendor", "L3 cache")
    return "; ".join(" ".join(line.split()) for line in out.splitlines() if line.split(":")[0] in keep)


def own_memory_group() -> Path:
    """This process's cgroup v1 memory group (the mount's root when its path is not visible there)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, group = line.split(":", 2)
        if "memory" in controllers.split(","):
            here = CGROUP_V1 / group.lstrip("/")
            return here if here.is_dir() else CGROUP_V1
    raise RuntimeError("no cgroup v1 memory controller for this process (/proc/self/cgroup)")


@contextmanager
def memory_group(name: str, limit: int | None = None):
    """A fresh cgroup v1 memory group under this process's own, limited to ``limit`` bytes (page cache
    counted, as v1 does), removed afterwards; yields (group directory, a ``preexec_fn`` that moves the
    child into it)."""
    group = own_memory_group() / f"{name}-{os.getpid()}"
    group.mkdir()
    try:
        if limit is not None:
            (group / "memory.limit_in_bytes").write_text(str(limit))
        procs = str(group / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        yield group, enter
    finally:
        for _ in range(50):  # the group is removable once the child's exit is accounted
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
