"""What every benchmark prints about the machine it ran on (docs/design.md §12: claims carry their conditions)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path


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


def write_rows_json(rows: list[dict], path: str | None) -> None:
    if path:
        tmp = Path(path).with_suffix(".tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        tmp.replace(path)


def md_table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out)
