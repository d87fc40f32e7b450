"""Replay an access pattern through the shared DRAM row caches (``dipdeploy.cache.RowCache``), token by
token, and count per token what the cost model needs: rows selected, rows missed, Flash requests.

What the missed rows cost in Flash bytes and requests (block granularity, coalescing of adjacent rows)
is worked out afterwards from the recorded miss masks (``dipdeploy.flash.flash_reads``), so one replay serves
every device and row size.

Layers with the same K are replayed together as one batched ``RowCache`` (each batch entry has its own
state), in chunks that bound memory (Belady's next-use table is [T, B, R]).

Methods (``SimConfig.method``): ``traced`` replays the recorded rows; ``dip`` re-masks with top-K of the
magnitudes (γ = 1); ``dipca`` re-scores each token with ``dipca_scores(|x|, resident, γ)`` against the
simulator's own cache state and takes the top-K row set (``topk_rows``: the set ``topk_indices`` picks)
— the GLU magnitudes were recorded under the
trace's own input mask, so the GLU group's re-masking is an approximation. ``dense`` needs no replay:
every row every token, the pinned rows hit (``static``: the lowest indices — for dense any fixed subset
is equal, and a contiguous one streams the rest as one request per layer and group).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dipdeploy.cache import RowCache, dipca_scores, gamma_at, policy_of, static_rows, topk_rows
from dipdeploy.flash import flash_reads
from dipdeploy.sim.config import SimConfig
from dipdeploy.sim.pattern import AccessPattern

_CHUNK_BYTES = 96 << 20


@dataclass
class GroupCounts:
    """One row group, per measured token, summed over target layers (simulated layers × ``weights``).

    ``masks[i]``: simulated layer i's missed rows per measured token, bit-packed [T, ⌈R/8⌉]; how many
    bytes and requests they cost depends on the row size and the device (``reads``).
    """

    rows: int
    selected: np.ndarray
    missed: np.ndarray
    masks: list[np.ndarray]
    weights: np.ndarray
    _reads: dict = field(default_factory=dict, repr=False)

    @property
    def hit_rows(self) -> float:
        return float((self.selected - self.missed).sum())

    def reads(self, row_bytes: float, unit: int, gap: int = 0, max_request: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(Flash bytes [T], requests [T]) for rows of ``row_bytes`` read in blocks of ``unit`` bytes, through
        gaps of ``gap`` blocks, in requests of at most ``max_request`` bytes (``dipdeploy.flash.flash_reads``)."""
        key = (float(row_bytes), int(unit), int(gap), int(max_request))
        if key not in self._reads:
            nbytes = np.zeros(len(self.selected))
            requests = np.zeros(len(self.selected))
            for packed, w in zip(self.masks, self.weights):
                missed = np.unpackbits(packed, axis=-1, count=self.rows).astype(bool)
                b, r = flash_reads(missed, row_bytes, unit, gap, max_request)
                nbytes += w * b
                requests += w * r
            self._reads[key] = (nbytes, requests)
        return self._reads[key]


@dataclass
class ReplayCounts:
    tokens: int
    inp: GroupCounts
    glu: GroupCounts

    @property
    def hit_rate(self) -> float:
        sel = float(self.inp.selected.sum() + self.glu.selected.sum())
        return (self.inp.hit_rows + self.glu.hit_rows) / sel if sel else 0.0


def _counts(sels: np.ndarray, rows: int) -> np.ndarray:
    """[B, rows] how often each row was selected in ``sels`` [T, B, K]."""
    B = sels.shape[1]
    flat = (np.arange(B)[None, :, None] * rows + sels).ravel()
    return np.bincount(flat, minlength=B * rows).reshape(B, rows)


def _dense_group(rows: int, capacity: int, layers: int, tokens: int) -> GroupCounts:
    """Every row every token; the pinned rows are the lowest indices, the rest streams (contiguous)."""
    missed = np.zeros((tokens, rows), dtype=bool)
    missed[:, capacity:] = True
    ones = np.ones(tokens)
    return GroupCounts(rows=rows, selected=ones * rows * layers, missed=ones * (rows - capacity) * layers,
                       masks=[np.packbits(missed, axis=-1)], weights=np.array([float(layers)]))


def _selections(pattern: AccessPattern, group: str, i: int, method: str) -> np.ndarray:
    """[T, K] rows of simulated layer i: as traced, or top-K of the magnitudes (DIP, γ = 1)."""
    sel = (pattern.sel_in if group == "in" else pattern.sel_glu)[i]
    if method in ("dip", "dip-ca"):
        mags = pattern.magnitudes(group, i).astype(np.float32)
        sel = topk_rows(mags, sel.shape[1])
    return sel


def _replay_group(pattern: AccessPattern, group: str, capacity: int, cfg: SimConfig) -> GroupCounts:
    rows = pattern.rows_in if group == "in" else pattern.rows_glu
    T = pattern.num_tokens
    ks = [(pattern.sel_in if group == "in" else pattern.sel_glu)[i].shape[1] for i in range(len(pattern.weights))]
    measured = slice(cfg.warmup, T)
    selected, missed = np.zeros(T), np.zeros(T)
    masks: list = [None] * len(ks)
    # per layer: miss log (1 B/row), magnitudes (2), Belady's next-use table (4), selections (4 B/pick)
    policy = policy_of(cfg.policy)
    per_row = 1 + (2 if cfg.method == "dip-ca" else 0) + (4 if policy.needs_future else 0)
    per_layer_bytes = T * (rows * per_row + 4 * max(ks)) + 1
    chunk = max(1, _CHUNK_BYTES // per_layer_bytes)
    for k in sorted(set(ks)):
        members = [i for i, kk in enumerate(ks) if kk == k]
        for c0 in range(0, len(members), chunk):
            batch = members[c0:c0 + chunk]
            w = pattern.weights[batch]
            # [T, B, K]; for DIP-CA the calibration uses plain DIP's masks (the cache-aware ones need a cache)
            sels = np.empty((T, len(batch), k), dtype=np.int32)
            for j, i in enumerate(batch):
                sels[:, j] = _selections(pattern, group, i, cfg.method)
            warm = None
            if policy.pinned or (cfg.preload and not policy.zero_capacity):
                warm = static_rows(_counts(sels[: cfg.warmup] if cfg.warmup else sels, rows), capacity)
            cache = RowCache(rows=rows, capacity=capacity, policy=cfg.policy, batch=len(batch),
                             future=sels if policy.needs_future else None,
                             pinned=warm if policy.pinned else None)
            if warm is not None:
                cache.resident = warm.copy()  # preload: what a runtime loads at start-up
            mags = None
            if cfg.method == "dip-ca":
                mags = np.empty((T, len(batch), rows), dtype=np.float16)
                for j, i in enumerate(batch):
                    mags[:, j] = pattern.magnitudes(group, i)
            b_idx = np.arange(len(batch))[:, None]
            miss_log = np.zeros((T - cfg.warmup, len(batch), rows), dtype=bool)
            for t in range(T):
                if mags is not None:
                    x = mags[t].astype(np.float32)
                    g = gamma_at(cfg.gamma, t, cfg.gamma_warmup)
                    sel_t = topk_rows(dipca_scores(x, cache.resident, g, cfg.fixed_top_n), k)
                else:
                    sel_t = sels[t]
                hit = cache.access(sel_t)
                selected[t] += k * w.sum()
                missed[t] += ((~hit).sum(axis=1) * w).sum()
                if t >= cfg.warmup:
                    miss_log[t - cfg.warmup][np.broadcast_to(b_idx, sel_t.shape)[~hit], sel_t[~hit]] = True
            for j, i in enumerate(batch):
                masks[i] = np.packbits(miss_log[:, j], axis=-1)
    return GroupCounts(rows=rows, selected=selected[measured], missed=missed[measured], masks=masks,
                       weights=pattern.weights.astype(float))


def replay(pattern: AccessPattern, capacity_in: int, capacity_glu: int, cfg: SimConfig) -> ReplayCounts:
    """Rows selected and missed per measured token, and which (see the module docstring)."""
    T = pattern.num_tokens
    if cfg.warmup >= T and cfg.method != "dense":
        raise ValueError(f"warmup ({cfg.warmup} tokens) must be below the trace length ({T} tokens)")
    if cfg.method == "dense":
        none = policy_of(cfg.policy).zero_capacity
        cap_in = 0 if none else capacity_in
        cap_glu = 0 if none else capacity_glu
        # every token reads the same rows: one representative token
        return ReplayCounts(tokens=1, inp=_dense_group(pattern.rows_in, cap_in, pattern.num_layers, 1),
                            glu=_dense_group(pattern.rows_glu, cap_glu, pattern.num_layers, 1))
    if cfg.method in ("dip", "dip-ca") and not pattern.has_magnitudes:
        raise ValueError(f"method {cfg.method!r} re-masks from magnitudes, but the trace has no x_abs/glu_abs; "
                         f"re-trace keeping magnitudes, or use --method traced")
    return ReplayCounts(tokens=T - cfg.warmup, inp=_replay_group(pattern, "in", capacity_in, cfg),
                        glu=_replay_group(pattern, "glu", capacity_glu, cfg))
