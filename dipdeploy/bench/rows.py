"""The one row schema of ``dipdeploy bench`` and its three writings: a markdown table, CSV and JSON.

A row is one configuration and one test (``pp512``: prefill tokens/s of a 512-token prompt; ``tg128``:
decode tokens/s over 128 generated tokens), its figures the mean and the sample standard deviation
(n − 1; 0 for one repetition) over the repetitions, as llama-bench prints ``t/s``. Flash megabytes per
token, device megabytes per token and the hit rate are means too, left empty where the engine does not
report them (device bytes are counted by ``--io direct`` only; a bundle whose every row is resident reads
nothing). Every writing names the machine: the markdown's first lines, the CSV's machine columns on each
row (as llama-bench's CSV carries its CPU and commit), the JSON's ``header`` object.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, fields

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


@dataclass(frozen=True)
class Row:
    model: str
    method: str
    density: float
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

    def as_dict(self) -> dict:
        return asdict(self)


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


def row(labels: dict, test: str, samples: list[Sample]) -> Row:
    """The row of one configuration (``labels``: model, method, density, budget, io, threads) and test."""
    mean, std = mean_std([s.tok_s for s in samples])
    used = {s.io_used for s in samples}
    return Row(**labels, test=test, tok_s=mean, tok_s_std=std, repetitions=len(samples),
               io_used=used.pop() if len(used) == 1 else ",".join(sorted(u or "?" for u in used)),
               flash_mb_per_token=_mean([s.flash_mb_per_token for s in samples]),
               device_mb_per_token=_mean([s.device_mb_per_token for s in samples]),
               hit_rate=_mean([s.hit_rate for s in samples]))


def _io(r: Row) -> str:
    return r.io if r.io_used in (None, r.io) else f"{r.io}→{r.io_used}"


def _figure(value: float | None, digits: int) -> str:
    """``digits`` significant figures (a tiny model's megabytes stay visible); empty where not reported."""
    return "" if value is None else f"{value:.{digits}g}"


MD_COLUMNS = ("model", "method", "ρ", "budget", "io", "threads", "test", "t/s", "Flash MB/tok", "device MB/tok",
              "hit rate")


def markdown(rows: list[Row], header: dict) -> str:
    """A line naming the command (and one naming the scenario, if any), one naming the machine, then the
    table, llama-bench's columns first and ``t/s`` as mean ± standard deviation."""
    m = header["machine"]
    sc = header.get("scenario")
    lines = [f"`{header['command']}`", ""]
    if sc:
        lines += [f"scenario `{sc['path']}`: {sc['title']}" + (f" (backs {sc['published']})" if sc.get("published")
                                                               else ""), ""]
    lines += [f"machine: {m['line']}", "",
             "| " + " | ".join(MD_COLUMNS) + " |",
             "|" + "|".join("---:" if c in ("ρ", "threads", "t/s", "Flash MB/tok", "device MB/tok", "hit rate")
                            else "---" for c in MD_COLUMNS) + "|"]
    for r in rows:
        cells = (r.model, r.method, f"{r.density:g}", r.budget, _io(r), str(r.threads), r.test,
                 f"{r.tok_s:.2f} ± {r.tok_s_std:.2f}", _figure(r.flash_mb_per_token, 4),
                 _figure(r.device_mb_per_token, 4), "" if r.hit_rate is None else f"{r.hit_rate:.3f}")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def to_csv(rows: list[Row], header: dict) -> str:
    machine = header["machine"]
    names = [f.name for f in fields(Row)] + [f"machine_{k}" for k in CSV_MACHINE]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(names)
    for r in rows:
        w.writerow([("" if v is None else v) for v in r.as_dict().values()] + [machine.get(k, "") for k in CSV_MACHINE])
    return out.getvalue()


def to_json(rows: list[Row], header: dict) -> str:
    return json.dumps({"header": header, "rows": [r.as_dict() for r in rows]}, indent=1, ensure_ascii=False) + "\n"


def render(rows: list[Row], header: dict, fmt: str) -> str:
    """The rows in ``fmt`` (one of ``FORMATS``)."""
    if fmt not in FORMATS:
        raise ValueError(f"-o {fmt!r} is not one of {', '.join(FORMATS)}")
    return {"md": markdown, "csv": to_csv, "json": to_json}[fmt](rows, header)
