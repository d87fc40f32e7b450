"""CLI commands of the foundation: models, calibrate, eval, trace, demo."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from dipdeploy.cli._app import app
from dipdeploy.registry import list_models

console = Console()


@app.command("models")
def models_cmd() -> None:
    """List the model registry (models/*.toml)."""
    table = Table("name", "architecture", "layout", "layers", "d", "F", "source")
    for m in list_models():
        s = m.shape
        src = "tiny (random, seed %d)" % m.tiny["seed"] if m.tiny else (
            f"pypi:{m.source['pypi']}" if m.source else (m.hf_id or ""))
        table.add_row(m.name, m.architecture, m.mlp_layout, str(s.num_hidden_layers),
                      str(s.hidden_size), str(s.intermediate_size), src)
    console.print(table)
