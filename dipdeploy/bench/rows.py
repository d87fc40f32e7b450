"""The one row schema of ``dipdeploy bench`` and its three writings: a markdown table, CSV and JSON.

A row is one configuration and one test (``pp512``: prefill tokens/s of a 512-token prompt; ``tg128``:
decode tokens/s over 128 generated tokens), its figures the mean and the sample standard deviation
(n − 1; 0 for one repetition) over the repetitions, as llama-bench prints ``t/s``. Flash megabytes per
token, device megabytes and requests per token and the hit rate are means too, left empty where the engine
does not report them (device bytes and requests are counted by ``--io direct`` only; a bundle whose every
row is resident reads nothing; a peer reports device bytes alone, from ``/proc/self/io``). The cgroup peak
is the largest over the repetitions (runs in a group only), and ``kept`` a row's tokens/s over its
configuration's at limit ``none`` where the grid ran that too: what the limit leaves of the speed. A peer's
row (``dipdeploy.bench.peers``) has no density, budget or Flash figures. Every writing names the machine:
the markdown's first lines, the CSV's machine columns on each row (as llama-bench's CSV carries its CPU and
commit), the JSON's ``header`` object. Another suite's
rows (``dipdeploy.bench.memory.MemoryRow``) are written the same way: a row class names its markdown
columns (``MD_COLUMNS``) and cells (``cells``) and its JSON document (``SCHEMA``), its fields are the CSV's
and the JSON's.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import ClassVar

from dipdeploy.jsonout import dumps

#: ``-o`` values
FORMATS = ("md", "csv", "json")
#: the machine's fields each CSV row carries
CSV_MACHINE = ("cpu", "cores", "flags", "onnxruntime", "dipdeploy", "git", "date")


@dataclass(frozen=True)
class Sample:
    """One repetition of one test: what the engine's ``RunStats`` reported for it."""

    tok_s: float
    flash_mb_per_token: float | None = None
    device_mb_per_token: float | None = None
    hit_rate: float | None = None
    io_used: str | None = None
    cgroup_peak_mb: float | None = None  # the group's peak over the test (a run in a group only)
    device_requests_per_token: float | None = None  # the requests the device served (``--io direct`` only)


@dataclass(frozen=True)
class Row:
    model: str
    method: str
    density: float | None  # None: a peer's row (no MLP density)
    budget: str
    io: str
    threads: int
    test: str
    tok_s: float
    tok_s_std: float
    repetitions: int
    io_used: str | None = None
    flash_mb_per_token: float | None = None
    device_mb_per_token: float | None = None
    hit_rate: float | None = None
    limit: str = "none"  # the cgroup memory limit of the runs (none: in this process)
    failed: int = 0  # repetitions under the limit that did not finish (refused or killed)
    device_requests_per_token: float | None = None
    cgroup_peak_mb: float | None = None  # the largest over the repetitions
    kept: float | None = None  # t/s over the same configuration's at limit none (``with_kept``)

    MD_COLUMNS: ClassVar[tuple[str, ...]] = ("model", "method", "ρ", "budget", "io", "threads", "limit", "test",
                                             "t/s", "kept", "Flash MB/tok", "device MB/tok", "device req/tok",
                                             "hit rate", "cgroup peak MB", "failed")
    #: columns left out of the markdown when every row has this value (the CSV and JSON keep them)
    MD_OPTIONAL: ClassVar[dict[str, str]] = {"limit": "none", "failed": "0", "kept": "", "device req/tok": "",
                                             "cgroup peak MB": ""}
    #: its JSON document (``dipdeploy.jsonout``)
    SCHEMA: ClassVar[str] = "bench.decode"

    def as_dict(self) -> dict:
        return asdict(self)

    def cells(self) -> tuple[str, ...]:
        """The markdown cells, in ``MD_COLUMNS``' order."""
        return (self.model, self.method, "" if self.density is None else f"{self.density:g}", self.budget,
                io_label(self.io, self.io_used), str(self.threads), self.limit, self.test,
                f"{self.tok_s:.2f} ± {self.tok_s_std:.2f}", "" if self.kept is None else f"{self.kept:.2f}",
                _figure(self.flash_mb_per_token, 4), _figure(self.device_mb_per_token, 4),
                _figure(self.device_requests_per_token, 4), "" if self.hit_rate is None else f"{self.hit_rate:.3f}",
                "" if self.cgroup_peak_mb is None else f"{self.cgroup_peak_mb:.1f}", str(self.failed))


@dataclass
class SuiteResult:
    """What a suite's run gives ``dipdeploy bench``: its rows (of one row class), the whole run's wall time,
    the notes written under the table, and whether Ctrl-C ended it (the rows then hold the repetitions
    measured before it)."""

    rows: list
    seconds: float
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False


def mean_std(values: list[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (n − 1), 0 for a single value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present and len(present) == len(values) else None


def row(labels: dict, test: str, samples: list[Sample], failed: int = 0) -> Row:
    """The row of one configuration (``labels``: model, method, density, budget, io, threads, limit) and
    test; ``failed``: its repetitions that gave no sample."""
    mean, std = mean_std([s.tok_s for s in samples])
    used = {s.io_used for s in samples}
    return Row(**labels, test=test, tok_s=mean, tok_s_std=std, repetitions=len(samples), failed=failed,
               io_used=used.pop() if len(used) == 1 else ",".join(sorted(u or "?" for u in used)),
               flash_mb_per_token=_mean([s.flash_mb_per_token for s in samples]),
               device_mb_per_token=_mean([s.device_mb_per_token for s in samples]),
               hit_rate=_mean([s.hit_rate for s in samples]),
               device_requests_per_token=_mean([s.device_requests_per_token for s in samples]),
               cgroup_peak_mb=max((s.cgroup_peak_mb for s in samples if s.cgroup_peak_mb is not None), default=None))


#: the labels that name a configuration apart from its limit: rows equal in these are one configuration
_SAME = ("model", "method", "density", "budget", "io", "threads", "test")


def with_kept(rows: list[Row], unlimited: str = "none") -> list[Row]:
    """``rows`` with ``kept`` set on each row under a limit whose configuration also ran at ``unlimited``:
    its tokens/s over that row's, what the limit leaves of the speed (empty where the grid has no such row)."""
    base = {tuple(getattr(r, k) for k in _SAME): r.tok_s for r in rows if r.limit == unlimited}
    out = []
    for r in rows:
        ref = base.get(tuple(getattr(r, k) for k in _SAME))
        out.append(replace(r, kept=r.tok_s / ref) if r.limit != unlimited and ref else r)
    return out


def io_label(asked: str, used: str | None) -> str:
    """The ``--io`` asked for, and what it resolved to where that differs (``auto→direct``)."""
    return asked if used in (None, asked) else f"{asked}→{used}"


def _figure(value: float | None, digits: int) -> str:
    """``digits`` significant figures (a tiny model's megabytes stay visible); empty where not reported."""
    return "" if value is None else f"{value:.{digits}g}"


def markdown(rows: list, header: dict, kind: type = Row) -> str:
    """A line naming the command (and one naming the scenario, if any), one naming the machine, then the
    table: the row class's ``MD_COLUMNS`` (the decode suite's: llama-bench's columns first and ``t/s`` as
    mean ± standard deviation; ``MD_OPTIONAL`` ones only where a row differs from their usual value),
    figures right-aligned, then the notes."""
    m = header["machine"]
    kind = type(rows[0]) if rows else kind
    sc = header.get("scenario")
    lines = [f"`{header['command']}`", ""]
    if header.get("interrupted"):
        lines += ["interrupted: the rows hold the repetitions measured before it (their `repetitions`)", ""]
    if sc:
        lines += [f"scenario `{sc['path']}`: {sc['title']}" + (f" (backs {sc['published']})" if sc.get("published")
                                                               else ""), ""]
    optional = getattr(kind, "MD_OPTIONAL", {})
    cells = [r.cells() for r in rows]
    keep = [k for k, c in enumerate(kind.MD_COLUMNS)
            if c not in optional or any(row_cells[k] != optional[c] for row_cells in cells)]
    columns = [kind.MD_COLUMNS[k] for k in keep]
    end = header.get("load_1min_end")
    numeric = getattr(kind, "MD_NUMERIC", ())
    lines += [f"machine: {m['line']}" + ("" if end is None else f"; load at the end {end:g}"), "",
              "| " + " | ".join(columns) + " |",
              "|" + "|".join("---:" if _numeric(c) or c in numeric else "---" for c in columns) + "|"]
    for row_cells in cells:
        lines.append("| " + " | ".join(row_cells[k].replace("|", "\\|") for k in keep) + " |")
    notes = header.get("notes") or []
    lines += [""] * bool(notes) + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def _numeric(column: str) -> bool:
    return (column in ("ρ", "threads", "t/s", "tg t/s", "kept", "hit rate", "limit hits", "failed") or "MB" in column
            or column.endswith("/tok"))


def to_csv(rows: list, header: dict, kind: type = Row) -> str:
    machine = header["machine"]
    kind = type(rows[0]) if rows else kind
    names = [f.name for f in fields(kind)] + [f"machine_{k}" for k in CSV_MACHINE]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(names)
    for r in rows:
        w.writerow([("" if v is None else v) for v in r.as_dict().values()] + [machine.get(k, "") for k in CSV_MACHINE])
    return out.getvalue()


def to_json(rows: list, header: dict, kind: type = Row) -> str:
    """The row class's document (its ``SCHEMA``): the header, then the rows."""
    kind = type(rows[0]) if rows else kind
    return dumps(kind.SCHEMA, {"header": header, "rows": [r.as_dict() for r in rows]}, ensure_ascii=False) + "\n"


def render(rows: list, header: dict, fmt: str, kind: type = Row) -> str:
    """The rows (of one row class, ``kind`` when there are none) in ``fmt`` (one of ``FORMATS``)."""
    if fmt not in FORMATS:
        raise ValueError(f"-o {fmt!r} is not one of {', '.join(FORMATS)}")
    return {"md": markdown, "csv": to_csv, "json": to_json}[fmt](rows, header, kind)
