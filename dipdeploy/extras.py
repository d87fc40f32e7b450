"""The optional parts of the install (pyproject's extras) and the one line that names the missing one.

Why: the runtime (``run``, ``chat``, ``inspect``, ``simulate``, ``bench``) installs light, without torch or
plotting; ``export``, ``calibrate``, ``eval``, ``finetune``, ``quantize`` and ``trace`` need the ``torch``
extra, and a PNG the ``plot`` extra. A user who lacks one gets a line naming it, not a traceback
(``dipdeploy.cli.errors``), and a PNG asked for is checked before the work (``require``). The table
below is held to pyproject.toml by a test. Floor 1, and imports nothing of dipdeploy.
"""

from __future__ import annotations

import importlib.util

#: extra name -> the top-level modules it brings (the names ``import`` uses, not the distributions')
EXTRAS: dict[str, tuple[str, ...]] = {
    "torch": ("torch", "transformers", "peft", "gguf", "safetensors", "sentencepiece", "accelerate", "tqdm"),
    "plot": ("matplotlib",),
}
#: what each extra is for, as a user reads it
PURPOSE = {"torch": "export, calibrate, eval, finetune, quantize and trace",
           "plot": "PNG plots (--plot, `bench plot`)"}
#: how each is installed; torch's CPU build first, since an ordinary index resolves `torch` to a CUDA build
INSTALL = {"torch": "pip install torch --index-url https://download.pytorch.org/whl/cpu, then "
                    "pip install 'dipdeploy[torch]' (docs/install.md)",
           "plot": "pip install 'dipdeploy[plot]'"}


class MissingExtra(ModuleNotFoundError):
    """A module of an extra that is not installed; its message is the whole line a user reads."""


def extra_of(module: str | None) -> str | None:
    """The extra that brings ``module`` (a dotted name is judged by its top level), or None."""
    top = (module or "").partition(".")[0]
    return next((extra for extra, modules in EXTRAS.items() if top in modules), None)


def message(extra: str, module: str) -> str:
    return (f"{module} is not installed: {PURPOSE[extra]} need the '{extra}' extra, which the runtime-only "
            f"install leaves out; {INSTALL[extra]}")


def require(extra: str) -> None:
    """Raise :class:`MissingExtra` unless every module of ``extra`` can be imported (found, not loaded)."""
    for module in EXTRAS[extra]:
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(message(extra, module), name=module)
