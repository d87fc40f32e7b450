"""CLI commands of the ops stage: build the native custom-op library."""

from __future__ import annotations

import typer

from dipdeploy.cli._app import app
from dipdeploy.cli.core import console, fail
from dipdeploy.terminal import shown


@app.command("build-ops")
def build_ops_cmd(
    arch: str = typer.Option(None, help="x86_64 or aarch64 (default: this machine; aarch64 needs aarch64-linux-gnu-g++)"),
    force: bool = typer.Option(False, "--force", help="rebuild from scratch"),
) -> None:
    """Build the native TopKColumnMask / SparseGatherMatMul library (fetches the ORT headers once, via npm)."""
    from dipdeploy.ops.native import BUILD_SCRIPT, build_ops, packaged_library

    if not BUILD_SCRIPT.is_file() and arch in (None, packaged_library().parent.name) and packaged_library().is_file():
        console.print(f"nothing to build: this installed dipdeploy carries the library, {shown(packaged_library())}")
        return
    try:
        path = build_ops(arch, force=force)
    except (ValueError, FileNotFoundError) as err:  # refused before anything is built
        fail(err)
    except RuntimeError as err:  # the compiler or npm failed: not the user's input, so not exit 2
        console.print(f"[red]error:[/red] {shown(err, lines=True)}")  # the compiler's lines
        raise typer.Exit(1) from err
    console.print(f"built {shown(path)}")
