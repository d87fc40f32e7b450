"""CLI commands of the sim stage."""

from dipdeploy.cli._app import app  # noqa: F401
