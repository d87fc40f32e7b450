"""CLI commands of the quant stage."""

from dipdeploy.cli._app import app  # noqa: F401
