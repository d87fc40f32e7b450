"""The typer application object; command modules register on it (one module per stage)."""

import typer

app = typer.Typer(
    name="dipdeploy",
    help="Dynamic Input Pruning (DIP / DIP-CA) for SwiGLU LLMs: calibrate, evaluate, quantise, export, run, simulate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from dipdeploy import __version__

        typer.echo(f"dipdeploy {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """dipdeploy: run large language models from phone-class memory with Dynamic Input Pruning."""
