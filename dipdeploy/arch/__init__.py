"""Architecture families, one record each (:class:`Arch`), registered by HF class name.

``arch_of(config)`` is how every stage finds the record of a checkpoint; an architecture without one
is refused with the reason (no gated MLP, a mixture of experts, or simply not registered yet, with the
recipe to add it: dipdeploy/export/DESIGN.md). ``registered(record)`` adds one for the duration of a
block (tests; a plugin may call :func:`register`). Floor 1: no torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from contextlib import contextmanager
from typing import Any, Iterator

from dipdeploy.arch import refused
from dipdeploy.arch.record import (ACTIVATIONS, Arch, ArchitectureError, AttnModules, MlpModules, NormModules,
                                   config_dict)

__all__ = ["ACTIVATIONS", "Arch", "ArchitectureError", "AttnModules", "MlpModules", "NormModules", "arch_of",
           "arch_of_model", "families", "get_arch", "register", "registered", "unregister"]


def _packaged() -> dict[str, Arch]:
    """Every module of this package that defines ``RECORD`` is a family (adding one is adding its file)."""
    records = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        record = getattr(importlib.import_module(f"{__name__}.{info.name}"), "RECORD", None)
        if isinstance(record, Arch):
            records[record.name] = record
    return records


_FAMILIES: dict[str, Arch] = _packaged()


def families() -> tuple[str, ...]:
    """The registered HF class names: the packaged ones by module name, then those registered at run time."""
    return tuple(_FAMILIES)


def register(record: Arch) -> Arch:
    if record.name in _FAMILIES:
        raise ValueError(f"architecture {record.name} is registered already")
    _FAMILIES[record.name] = record
    return record


def unregister(name: str) -> None:
    _FAMILIES.pop(name, None)


@contextmanager
def registered(record: Arch) -> Iterator[Arch]:
    """``record`` registered inside the block only."""
    register(record)
    try:
        yield record
    finally:
        unregister(record.name)


def get_arch(name: str) -> Arch:
    """The record of HF class ``name``; :class:`ArchitectureError` says why there is none."""
    if name in _FAMILIES:
        return _FAMILIES[name]
    if name in refused.NOT_GLU:
        raise ArchitectureError(refused.not_glu(name))
    if name in refused.MIXTURES or "Moe" in name:
        raise ArchitectureError(refused.mixture(name))
    raise ArchitectureError(
        f"architecture {name!r} has no family record; registered: {', '.join(_FAMILIES)} "
        f"(adding one: docs/contributing/family.md)")


def arch_of(config: Any) -> Arch:
    """The record for a checkpoint's config (``PretrainedConfig`` or dict), checked against it."""
    c = config_dict(config)
    names = c.get("architectures") or []
    if not names:
        raise ArchitectureError(f"config (model_type {c.get('model_type')!r}) names no architectures; "
                                f"set \"architectures\": [\"<HF class>\"] in config.json")
    if c.get("num_local_experts") or c.get("num_experts"):
        raise ArchitectureError(refused.mixture(names[0]))
    record = get_arch(names[0])
    record.check(c)
    return record


def arch_of_model(model: Any) -> Arch:
    """The record of a built HF model: its config's ``architectures``, else its own class name (a model
    built from a config in code has no ``architectures`` until it is saved)."""
    c = config_dict(model.config)
    if not c.get("architectures"):
        c["architectures"] = [type(model).__name__]
    return arch_of(c)
