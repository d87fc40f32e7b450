"""CLI commands of the ops stage."""

from dipdeploy.cli._app import app  # noqa: F401
