"""The memory suite: what a run holds against what its budget planned, and whether it keeps to a limit.

Each configuration of the grid (the decode suite's, plus ``--limit``) runs, per repetition and
round-robin, in a fresh process (``dipdeploy.bench.child``) inside a fresh cgroup memory group
(``dipdeploy.bench.cgroup``) limited to the row's ``--limit`` (``none``: no limit, the group only
measures). Before each run the bundle's files are dropped from the page cache, so the group is charged
with every page the run reads, as a device's DRAM would hold them. The run feeds a prompt of ``-p``
tokens and decodes ``-n`` tokens (one row ``ppP+tgN``). A row reports the engine's planned residency, the
process's peak RSS (``VmHWM``), the group's peak (page cache included), the times usage hit the limit,
the decode tokens/s, and the status: ``ok``, ``refused`` (the engine's own check that the budget cannot
fit under the limit), ``killed`` (the limit's OOM killer ended it) or ``failed``. Over repetitions the
peaks are the largest and tokens/s the mean of the runs that finished. An interrupt (Ctrl-C) keeps the
rows of the runs that finished before it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

from dipdeploy.bench.bundles import BundleSpec, ensure
from dipdeploy.bench.grid import Case, DecodeGrid, order

Notice = Callable[[str], None]
NO_LIMIT = "none"
#: a run that has not ended by then is stuck (a thrashing page cache under a tight limit), not slow
CHILD_TIMEOUT = 3600
#: ``-r`` of the memory suite: a peak needs one run, not five
DEFAULT_REPETITIONS = 1
_MB = 1e6


def parse_limit(text: str) -> int | None:
    """``none`` or a size (such as "300MB" or "1.5GiB") in bytes; anything else is refused naming ``--limit``."""
    from dipdeploy.runtime.budget import parse_bytes

    if text.lower() == NO_LIMIT:
        return None
    try:
        value = parse_bytes(text, "--limit")
    except ValueError as err:
        raise ValueError(f"--limit {text}: {err}; give none or a size such as 300MB") from None
    if value <= 0:
        raise ValueError(f"--limit {text} must be above 0 bytes; give none or a size such as 300MB")
    return value


@dataclass
class MemoryGrid(DecodeGrid):
    """The decode grid and ``limits`` (``none`` or sizes). Its one test is ``ppP+tgN`` per pair of the
    first ``-p`` and ``-n`` lists' values."""

    limits: list[str] = field(default_factory=lambda: [NO_LIMIT])
    repetitions: int = DEFAULT_REPETITIONS

    def __post_init__(self) -> None:
        super().__post_init__()
        for text in self.limits:
            parse_limit(text)

    def runs(self) -> list[tuple[int, int]]:
        return [(p, n) for p in self.n_prompt for n in self.n_gen]

    def cases(self, specs: list) -> list[Case]:
        return [Case(c.bundle, c.budget, c.io, c.threads, limit) for c in super().cases(specs) for limit in self.limits]


@dataclass(frozen=True)
class MemoryRow:
    model: str
    method: str
    density: float
    budget: str
    io: str
    threads: int
    limit: str
    test: str
    status: str
    repetitions: int
    planned_mb: float | None = None
    peak_rss_mb: float | None = None
    cgroup_peak_mb: float | None = None
    limit_hits: int | None = None
    decode_tok_s: float | None = None
    io_used: str | None = None

    MD_COLUMNS: ClassVar[tuple[str, ...]] = ("model", "method", "ρ", "budget", "io", "limit", "test", "status",
                                             "planned MB", "peak RSS MB", "cgroup peak MB", "limit hits", "tg t/s")

    def as_dict(self) -> dict:
        return asdict(self)

    def cells(self) -> tuple[str, ...]:
        def f(v, digits=1):
            return "" if v is None else f"{v:.{digits}f}"

        io = self.io if self.io_used in (None, self.io) else f"{self.io}→{self.io_used}"
        return (self.model, self.method, f"{self.density:g}", self.budget, io, self.limit, self.test, self.status,
                f(self.planned_mb), f(self.peak_rss_mb), f(self.cgroup_peak_mb),
                "" if self.limit_hits is None else str(self.limit_hits), f(self.decode_tok_s, 2))


@dataclass(frozen=True)
class Run:
    """One child's result."""

    status: str
    why: str = ""
    planned_mb: float | None = None
    peak_rss_mb: float | None = None
    cgroup_peak_mb: float | None = None
    limit_hits: int | None = None
    decode_tok_s: float | None = None
    io_used: str | None = None


def drop_page_cache(bundle: Path) -> None:
    """Every file of the bundle out of the page cache (clean pages only; a file that cannot be opened is
    left as it is)."""
    for path in Path(bundle).iterdir():
        if path.is_file():
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _child_env() -> dict:
    """The child imports this dipdeploy, wherever it was imported from (a checkout on PYTHONPATH)."""
    here = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": here + (os.pathsep + path if path else "")}


def _spec(case: Case, p: int, n: int) -> dict:
    from dipdeploy.runtime.budget import DEFAULT_CONTEXT

    spec: BundleSpec = case.bundle
    need = max(p, 1) + n + 1
    return {"bundle": str(spec.path), "dram_budget": case.budget, "io": case.io, "threads": case.threads,
            "policy": spec.policy, "context": None if need <= DEFAULT_CONTEXT else need, "n_prompt": p, "n_gen": n}


def run_one(case: Case, p: int, n: int, use_groups: bool) -> Run:
    """One child for ``case`` under its limit (in a group when ``use_groups``)."""
    from dipdeploy.bench.cgroup import memory_group

    drop_page_cache(case.bundle.path)
    cmd = [sys.executable, "-m", "dipdeploy.bench.child", json.dumps(_spec(case, p, n))]
    limit = parse_limit(case.limit)
    peak = hits = kills = None
    if use_groups:
        with memory_group("dipdeploy-bench", limit) as group:
            done = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(), preexec_fn=group.enter,
                                  timeout=CHILD_TIMEOUT)
            peak, hits, kills = group.peak(), group.limit_hits(), group.oom_kills()
    else:
        done = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(), timeout=CHILD_TIMEOUT)
    lines = done.stdout.strip().splitlines()
    cg = None if peak is None else peak / _MB
    if done.returncode != 0 or not lines:
        killed = done.returncode < 0 or bool(kills)
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Run("killed" if killed else "failed", why=f"exit {done.returncode}: {last}", cgroup_peak_mb=cg,
                   limit_hits=hits)
    out = json.loads(lines[-1])
    if out["status"] != "ok":
        return Run(out["status"], why=out.get("why", ""), cgroup_peak_mb=cg, limit_hits=hits)
    return Run("ok", planned_mb=out["planned"] / _MB, peak_rss_mb=out["end"].get("VmHWM", 0) / _MB,
               cgroup_peak_mb=cg, limit_hits=hits, decode_tok_s=out["decode_tok_s"], io_used=out["io"])


def aggregate(labels: dict, test: str, runs: list[Run]) -> MemoryRow:
    ok = [r for r in runs if r.status == "ok"]
    statuses = sorted({r.status for r in runs})
    status = statuses[0] if len(statuses) == 1 else f"{len(ok)}/{len(runs)} ok"

    def most(values):
        present = [v for v in values if v is not None]
        return max(present) if present else None

    return MemoryRow(**labels, test=test, status=status, repetitions=len(runs),
                     planned_mb=most(r.planned_mb for r in ok), peak_rss_mb=most(r.peak_rss_mb for r in ok),
                     cgroup_peak_mb=most(r.cgroup_peak_mb for r in runs), limit_hits=most(r.limit_hits for r in runs),
                     decode_tok_s=sum(r.decode_tok_s for r in ok) / len(ok) if ok else None,
                     io_used=ok[0].io_used if ok else None)


@dataclass
class MemoryResult:
    rows: list[MemoryRow]
    seconds: float
    notes: list[str]
    interrupted: bool = False  # Ctrl-C: the rows hold the runs that finished before it


def check_groups(grid: MemoryGrid) -> bool:
    """Whether the runs go in groups: always where they can; a limit where they cannot is refused."""
    from dipdeploy.bench.cgroup import probe

    why = probe()
    if why is not None and any(parse_limit(t) is not None for t in grid.limits):
        raise ValueError(f"--limit needs a cgroup memory group: {why}; run as root or in a delegated cgroup, or "
                         f"give --limit none")
    return why is None


def run_memory(grid: MemoryGrid, notice: Notice = lambda line: None) -> MemoryResult:
    from dipdeploy.bench.decode import cases_of

    t0 = time.perf_counter()
    cases = cases_of(grid)
    use_groups = check_groups(grid)
    if not use_groups:
        notice("note: no cgroup memory group can be made here; the cgroup peak is left empty")
    for spec in dict.fromkeys(c.bundle for c in cases):
        ensure(spec, notice)
    tests = grid.runs()
    runs: dict[tuple[int, int], list[Run]] = {}
    plan = order(len(cases), grid.repetitions)
    notes, interrupted = [], False
    try:
        for step, (rep, i) in enumerate(plan, 1):
            case = cases[i]
            for j, (p, n) in enumerate(tests):
                r = run_one(case, p, n, use_groups)
                runs.setdefault((i, j), []).append(r)
                b = case.bundle
                what = (f"{b.model} {b.method} ρ {b.density:g}, budget {case.budget}, io {case.io}, "
                        f"limit {case.limit}, pp{p}+tg{n}")
                peak = f", cgroup peak {r.cgroup_peak_mb:.1f} MB" if r.cgroup_peak_mb is not None else ""
                notice(f"[{step}/{len(plan)}] repetition {rep + 1}/{grid.repetitions}: {what}: {r.status}{peak}"
                       + (f" ({r.why})" if r.why else ""))
                if r.why:
                    notes.append(f"{what}: {r.status}: {r.why}")
    except KeyboardInterrupt:
        interrupted = True
        notice("interrupted: the rows hold the runs that finished")
    from dipdeploy.bench.decode import labels

    rows = [aggregate({**labels(case), "limit": case.limit}, f"pp{p}+tg{n}", runs[(i, j)])
            for i, case in enumerate(cases) for j, (p, n) in enumerate(tests) if (i, j) in runs]
    return MemoryResult(rows, time.perf_counter() - t0, notes, interrupted)
