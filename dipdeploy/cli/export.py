"""CLI commands of the export stage."""

from dipdeploy.cli._app import app  # noqa: F401
