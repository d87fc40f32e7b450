"""The typer application object; command modules register on it (one module per stage)."""

import os
import sys
import traceback
import warnings

import typer
from typer._click import exceptions as click  # typer vendors click: its usage errors are these classes
from typer.core import TyperGroup


#: set for one invocation by ``--debug`` (or ``DIPDEPLOY_DEBUG=1``): tracebacks are shown
_debug = {"on": False}


def _debug_from_env() -> bool:
    return os.environ.get("DIPDEPLOY_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def _note(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning a command raises (the fallback ops, a plan's warm-up) as one ``note:`` line on stderr,
    not Python's two lines naming a source file; ``--debug`` keeps Python's form."""
    from dipdeploy.terminal import shown

    typer.echo(f"note: {' '.join(shown(str(message), markup=False).split())}", err=True)


class _Group(TyperGroup):
    """Usage errors (an unknown option, a value of the wrong type, a missing option) end like every other
    refusal of bad input: one line naming the problem and where the fix is, exit code 2, instead of
    click's usage block. Every other exception a command lets escape, an interrupt included, ends as one
    line too (``dipdeploy.cli.errors``), with the traceback only under ``--debug``; so does a warning
    (``_note``)."""

    def invoke(self, ctx):
        try:
            with warnings.catch_warnings():  # restores Python's own display afterwards
                if not _debug["on"]:
                    warnings.showwarning = _note
                return super().invoke(ctx)
        except (typer.Exit, typer.Abort, click.ClickException, SystemExit, GeneratorExit, BrokenPipeError):
            raise  # a closed pipe (``dipdeploy models | head``) is typer's: a quiet exit 1
        except BaseException as err:  # noqa: B036  (a KeyboardInterrupt or a Rust panic too: one line each)
            from dipdeploy.cli.errors import line

            if _debug["on"]:
                traceback.print_exception(err)
            text, code = line(err)
            typer.echo(text, err=True)
            raise typer.Exit(code) from err

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        _debug["on"] = _debug_from_env()
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.NoArgsIsHelpError as err:
            err.show()
            sys.exit(err.exit_code)
        except click.UsageError as err:
            where = err.ctx.command_path if err.ctx is not None else "dipdeploy"
            from dipdeploy.terminal import shown

            message = " ".join(shown(err.format_message(), markup=False).split()).rstrip(".")  # it quotes argv
            typer.echo(f"error: {message}; see `{where} --help`", err=True)
            sys.exit(2)
        except click.ClickException as err:
            err.show()
            sys.exit(err.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=_Group,
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
                                       help="print the version and exit"),
          debug: bool = typer.Option(False, "--debug", help="show the traceback of an error (also: "
                                     "DIPDEPLOY_DEBUG=1); give it before the command")) -> None:
    """dipdeploy: run large language models from phone-class memory with Dynamic Input Pruning."""
    from dipdeploy.progress import quiet_libraries

    _debug["on"] = _debug["on"] or debug

    quiet_libraries()
