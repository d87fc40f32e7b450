"""The engine's three execution paths behind one decoder interface (:class:`Decoder`).

``Engine`` (``dipdeploy.runtime.engine``) opens the bundle, chooses one backend when it opens and then
only calls the decoder's methods: ``whole`` (the bundle's ``model.onnx`` in one session, where the budget
holds every row), ``joined`` (the per-layer graphs joined into one session with the cache step in the
graph, ``dipdeploy.runtime.backends.joined``) and ``per_layer`` (the per-layer sessions with the host cache step:
slabs, the Flash store, the native cache, staging). The bundle, the configuration, the KV cache, the
Flash store and the sequence state (``pos``, ``ids``) stay the engine's; a backend reads them through
:class:`HostBound`. Torch-free (floor 5).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

if TYPE_CHECKING:
    from dipdeploy.runtime.budget import Residency
    from dipdeploy.runtime.stats import Timer

#: ``record(layer, sel_in, sel_glu, hits_in, hits_glu)``: a layer's selections and hits of one token
Record = Callable[[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]


class Decoder(Protocol):
    """What the engine's generation loop calls. ``step`` and ``prefill`` advance the engine's sequence
    state and KV cache and return the next token's logits [V]; ``lookups`` is the cache's
    [layer, group, (hits, lookups)] since the last ``reset`` (the run's ``--stats``)."""

    all_resident: bool  # every MLP row resident from the start: no Belady pass, every lookup a hit
    records_selections: bool  # ``record`` callbacks (traces, Belady, teacher forcing) are served
    residency: Residency

    def open_slabs(self) -> None:
        """The DRAM plan's slabs over the engine's Flash store, once it is open."""

    def reset(self, future: list[tuple[np.ndarray, np.ndarray]] | None, policy: str) -> None:
        """Fresh caches for a new sequence (before the engine empties the KV cache)."""

    def prefill(self, ids: list[int], timer: Timer, record: Record | None = None,
                progress: Callable[[int, int], None] | None = None) -> np.ndarray: ...

    def step(self, token: int, timer: Timer, record: Record | None = None) -> np.ndarray: ...

    def lookups(self) -> np.ndarray: ...

    def verify(self, ids: list[int], timer: Timer) -> np.ndarray:
        """One speculative verification pass over ``ids`` (at most ``EngineConfig.speculate`` + 1): the
        logits after every one of them, [n, V], valid until the next pass (``dipdeploy.runtime.speculate``)."""

    def draft_mode(self, on: bool) -> None:
        """In draft mode (``--draft cache``) a step multiplies only the rows its caches hold, reads nothing
        and changes no cache; a backend that cannot draft refuses in one line."""

    def per_layer_only(self, what: str) -> str:
        """The one line refusing what only the per-layer path has."""

    def close(self) -> None: ...


def choose_backend(host) -> Residency | None:
    """The plan of ``model.onnx`` in one session where the budget holds every row
    (``EngineConfig.single_session``), else None (the joined or the per-layer graphs), chosen before any
    session opens; ``--io auto`` is resolved on the way (``flash.choose_io``: whether rows stay on Flash),
    into ``host.cfg`` and ``host.io_why``."""
    from dipdeploy.bundle.names import MLP_FILE
    from dipdeploy.runtime.backends.whole import whole_plan
    from dipdeploy.runtime.flash import IO_AUTO, choose_io

    plan = None if host.cfg.fused else whole_plan(host)
    host.io_why = "given"  # why the engine reads with cfg.io: given, or what --io auto saw
    if host.cfg.io == IO_AUTO:
        io, host.io_why = choose_io(host.path / MLP_FILE, rows_on_flash=plan is None, fd=host._open_file(MLP_FILE))
        host.cfg = dataclasses.replace(host.cfg, io=io)
    return plan


def open_backend(host, session_options, native: bool, whole: Residency | None) -> Decoder:
    """The engine's one decoder: ``model.onnx`` in one session where ``whole`` (``choose_backend``) is its
    plan, else the joined graph where it can run (``EngineConfig.fused``), else the per-layer sessions."""
    from dipdeploy.runtime.backends import joined
    from dipdeploy.runtime.backends.per_layer import PerLayerDecoder
    from dipdeploy.runtime.backends.whole import open_whole

    if whole is not None:
        return open_whole(host, session_options, native, whole)
    reason = None if host.cfg.fused is False else joined.why_not(host, native)
    if host.cfg.fused and reason is not None:
        raise ValueError(f"--fused: {reason}; or run the per-layer graphs (drop --fused)")
    joins = host.cfg.fused is not False and reason is None
    return (joined.JoinedDecoder if joins else PerLayerDecoder)(host, session_options, native)


class HostBound:
    """A backend's view of the engine that opened it: the bundle's shape is copied, the configuration
    (resolved while the engine opens), the Flash store and the sequence state are read from the engine."""

    def __init__(self, host):
        self.host = host
        self.path, self.files, self.manifest, self.decoder = host.path, host.files, host.manifest, host.decoder
        self.num_layers, self.d, self.f, self.k = host.num_layers, host.d, host.f, host.k
        self.gamma, self.baked_gamma = host.gamma, host.baked_gamma
        self.kv, self._cache_library = host.kv, host._cache_library

    @property
    def cfg(self):
        return self.host.cfg

    @property
    def flash(self):
        return self.host.flash

    @property
    def _state(self) -> dict:
        return self.host._state
