"""The torch device a stage computes on: ``auto`` | ``cpu`` | ``cuda`` (one rule for every stage that asks:
``calibrate``, ``eval``, ``finetune`` and ``export``).

``auto`` is cuda when torch sees a GPU, else cpu. ``cuda`` without one is refused in one line before any
work, rather than failing minutes later inside torch. What a stage writes (plans, adapters, figures) is
read back to the CPU whatever the device, so its format does not depend on where it was computed.
"""

from __future__ import annotations

DEVICES = ("auto", "cpu", "cuda")
#: every stage's default (``ExportConfig.device``, ``EvalConfig.device``, the CLI's ``--device``)
DEFAULT_DEVICE = "auto"


def resolve_device(name: str) -> str:
    """``auto`` → ``cuda`` or ``cpu``; ``cuda`` checked against what torch sees (ValueError if absent)."""
    import torch

    if name not in DEVICES:
        raise ValueError(f"--device {name!r} is unknown; choose auto, cpu or cuda")
    available = torch.cuda.is_available()
    if name == "cuda" and not available:
        raise ValueError("--device cuda: torch sees no CUDA GPU (torch.cuda.is_available() is False); use "
                         "--device cpu or --device auto")
    if name == "auto":
        return "cuda" if available else "cpu"
    return name


def device_of(module):
    """The torch device ``module``'s parameters are on: inputs follow the model, so a caller that swaps
    in another model (a benchmark loading an adapter on the CPU) keeps working."""
    return next(module.parameters()).device
