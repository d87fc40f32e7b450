"""The one-session backend: the bundle's ``model.onnx`` once per token (and once per prefill chunk)
where the budget holds every MLP row (``dipdeploy.runtime.whole``: the rule, the plan and the session;
``EngineConfig.single_session``). Every row is resident from the start: every lookup is a hit, nothing is
read from Flash, and no per-layer selections exist to record. Torch-free (floor 5).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from dipdeploy.runtime.backends import HostBound
from dipdeploy.runtime.budget import DramBudget, Residency
from dipdeploy.runtime.sessions import shared_arena
from dipdeploy.runtime.stats import Timer
from dipdeploy.runtime.threadpool import pool_options


def open_whole(host, session_options, native: bool) -> WholeDecoder | None:
    """The one-session mode's decoder with its plan, or None for the per-layer graphs
    (``EngineConfig.single_session``; the rule is ``whole.why_not``)."""
    from dipdeploy.runtime.whole import WholeModel, whole_residency, why_not

    cfg, m = host.cfg, host.manifest
    if cfg.single_session is False:
        return None
    chunk = min(cfg.prefill_chunk, cfg.context) if cfg.prefill == "batch" else 1
    vocab = host.decoder["vocab_size"]
    plan = whole_residency(m, host.kv.nbytes, vocab, chunk, [(host.d, host.f)] * host.num_layers)
    reason = why_not(m, DramBudget.parse(cfg.dram_budget), cfg.policy, plan)
    if reason is not None:
        if cfg.single_session:
            raise ValueError(f"one session per token: {reason}; or run the per-layer graphs (--per-layer)")
        return None
    options = pool_options(session_options(cfg.threads, native), cfg.threads, cfg.thread_pool)
    whole = WholeModel(host.path, shared_arena(options), host.kv, cfg.context, chunk, vocab, cfg.accuracy_level)
    return WholeDecoder(host, whole, plan)


class WholeDecoder(HostBound):
    """``model.onnx`` in one session (``dipdeploy.runtime.whole.WholeModel``)."""

    all_resident = True
    records_selections = False
    fused = None  # the joined decoder's model: not this one
    read_ahead = read_ahead_setting = None
    shared_staging = embedding = None

    def __init__(self, host, whole, plan: Residency):
        from dipdeploy.runtime.whole import mlp_row_bytes

        super().__init__(host)
        self.whole = whole
        self.residency = plan
        self.slabs = []
        self.row_bytes = [mlp_row_bytes(self.manifest, i) for i in range(self.num_layers)]
        self.dram_dense_per_token = self.manifest.sizes.get("bytes_dense", 0) - host._embedding_bytes()
        self._resident = np.repeat(np.array(self.k, np.int64)[:, :, None], 2, axis=2)  # every lookup a hit
        self._fed = 0

    def open_slabs(self) -> None:
        pass  # every row is in model.onnx's session

    def reset(self, future=None, policy: str | None = None) -> None:
        self._fed = 0

    def lookups(self) -> np.ndarray:
        return self._fed * self._resident

    def step(self, token: int, timer: Timer, record=None) -> np.ndarray:
        return self._run([int(token)], timer, record)

    def prefill(self, ids: list[int], timer: Timer, record=None,
                progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """``ids`` in chunks of the session's chunk, one run each; the logits [V] after the last."""
        size, n = self.whole.chunk, len(ids)
        for start in range(0, n, size):
            logits = self._run(ids[start:start + size], timer, record)
            if progress is not None:
                progress(min(start + size, n), n)
        return logits

    def _run(self, ids: list[int], timer: Timer, record) -> np.ndarray:
        """One ``model.onnx`` run on ``ids``; the logits [V] after the last of them."""
        if record is not None:
            raise ValueError(self.per_layer_only("per-layer selections"))
        st = self._state
        timer.start()
        logits = self.whole.run(ids, st["pos"])[-1].copy()
        timer.lap("model.onnx")
        st["pos"] += len(ids)
        st["ids"].extend(int(t) for t in ids)
        self._fed += len(ids)
        return logits

    def per_layer_only(self, what: str) -> str:
        return (f"{what} need the per-layer graphs, and this engine runs model.onnx in one session (the budget "
                f"holds every row): give single_session=False (--per-layer)")

    def close(self) -> None:
        pass
