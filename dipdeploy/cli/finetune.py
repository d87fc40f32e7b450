"""CLI commands of the finetune stage."""

from dipdeploy.cli._app import app  # noqa: F401
