"""The memory suite: what a run holds against what its budget planned, and whether it keeps to a limit.

Each configuration of the grid (the decode suite's, ``--limit`` included) runs, per repetition and
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

import time
from dataclasses import asdict, dataclass
from typing import Callable, ClassVar

from dipdeploy.bench.bundles import BundleSpec, ensure
from dipdeploy.bench.grid import Case, DecodeGrid, order, parse_limit
from dipdeploy.bench.rows import SuiteResult, io_label

Notice = Callable[[str], None]
#: ``-r`` of the memory suite: a peak needs one run, not five
DEFAULT_REPETITIONS = 1
_MB = 1e6


@dataclass
class MemoryGrid(DecodeGrid):
    """The decode grid, one repetition by default. Its test is ``ppP+tgN``, one per pair of a ``-p`` and
    an ``-n`` value."""

    repetitions: int = DEFAULT_REPETITIONS

    def runs(self) -> list[tuple[int, int]]:
        return [(p, n) for p in self.n_prompt for n in self.n_gen]


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
    #: its JSON document (``dipdeploy.jsonout``)
    SCHEMA: ClassVar[str] = "bench.memory"

    def as_dict(self) -> dict:
        return asdict(self)

    def cells(self) -> tuple[str, ...]:
        def f(v, digits=1):
            return "" if v is None else f"{v:.{digits}f}"

        return (self.model, self.method, f"{self.density:g}", self.budget, io_label(self.io, self.io_used),
                self.limit, self.test, self.status, f(self.planned_mb), f(self.peak_rss_mb), f(self.cgroup_peak_mb),
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


def run_one(case: Case, p: int, n: int, use_group: bool) -> Run:
    """One child for ``case`` under its limit (in a group when ``use_group``)."""
    from dipdeploy.bench.child import spawn
    from dipdeploy.bench.decode import engine_options

    spec: BundleSpec = case.bundle
    options = engine_options(case, max(p, 1) + n + 1, cold=False)  # spawn drops the bundle's pages already
    done = spawn({"suite": "memory", "bundle": str(spec.path), "options": options, "n_prompt": p, "n_gen": n},
                 parse_limit(case.limit), use_group)
    cg = None if done.cgroup_peak is None else done.cgroup_peak / _MB
    if done.status != "ok":
        return Run(done.status, why=done.why, cgroup_peak_mb=cg, limit_hits=done.limit_hits)
    out = done.reply
    return Run("ok", planned_mb=out["planned"] / _MB, peak_rss_mb=out["end"].get("VmHWM", 0) / _MB,
               cgroup_peak_mb=cg, limit_hits=done.limit_hits, decode_tok_s=out["decode_tok_s"], io_used=out["io"])


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


def check_groups(grid: MemoryGrid) -> bool:
    """Whether the runs go in groups: always where they can; a limit where they cannot is refused."""
    from dipdeploy.bench.cgroup import probe, require

    if any(parse_limit(t) is not None for t in grid.limits):
        require()
    return probe() is None


def run_memory(grid: MemoryGrid, notice: Notice = lambda line: None) -> SuiteResult:
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

    rows = [aggregate(labels(case), f"pp{p}+tg{n}", runs[(i, j)])
            for i, case in enumerate(cases) for j, (p, n) in enumerate(tests) if (i, j) in runs]
    return SuiteResult(rows, time.perf_counter() - t0, notes, interrupted)
