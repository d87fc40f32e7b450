"""Writing results: JSON rows (atomic, never clobbering without ``force``: ``dipdeploy.paths``' rule)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dipdeploy.paths import write_atomic


def write_json(rows: list[dict], path: str | os.PathLike, force: bool = False) -> Path:
    return write_atomic(Path(path), json.dumps(rows, indent=1), force=force)
