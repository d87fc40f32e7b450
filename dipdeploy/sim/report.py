"""Writing results: the ``simulate`` JSON document (atomic, never clobbering without ``force``:
``dipdeploy.paths``' rule; its schema keys from ``dipdeploy.jsonout``)."""

from __future__ import annotations

import os
from pathlib import Path

from dipdeploy.jsonout import dumps
from dipdeploy.paths import write_atomic


def to_json(rows: list[dict]) -> str:
    """The text of ``simulate --json``: the rows under the schema keys."""
    return dumps("simulate", rows)


def write_json(rows: list[dict], path: str | os.PathLike, force: bool = False) -> Path:
    return write_atomic(Path(path), to_json(rows), force=force)
