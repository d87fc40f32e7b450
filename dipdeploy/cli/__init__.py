"""Command line (floor 6): parses, calls one stage function, presents. No logic of its own.

Each stage's commands live in their own module and register on the shared ``app``.
"""

from dipdeploy.cli._app import app
from dipdeploy.cli import bench, chat, core, export, finetune, ops, quant, run, sim  # noqa: F401  (registers the commands)

__all__ = ["app"]
