"""Row caches: which weight rows of one matrix group are resident in DRAM, for B sequences at once.

A *row* is the unit the sparse layout reads in one piece (docs/method.md, Flash layout): input feature i of
the bundled [W_uᵀ | W_g ᵀ] (R = d rows) or GLU unit j of W_dᵀ (R = F rows). Each layer has one cache per
group; B > 1 lets the evaluation run many windows side by side, each with its own state.

One rule serves every policy (so the runtime, the simulator and the torch reference cannot disagree):

    1. hits = resident[selected]
    2. statistics of the selected rows are updated (last use, use count)
    3. the new resident set is the top-C of (resident ∪ selected) by the policy's key

so a policy is only its key and a few traits: one :class:`Policy` record each in :data:`POLICY_RECORDS`,
which every caller asks (``policy_of(name).needs_future``), never the name. Keys are packed into one
unique int64 per row — (primary, secondary, lower index first) — so the order is total and every
implementation breaks ties the same way.

| policy | key (higher stays)                         | notes                                        |
|--------|--------------------------------------------|----------------------------------------------|
| none   | —                                          | capacity forced to 0: everything from Flash  |
| lru    | last use                                   | the selected rows of this token always stay  |
| lfu    | use count (kept across evictions), last use| "perfect" LFU; a new row may bypass the cache|
| belady | −(next use), from the known future         | offline optimum with bypass (needs a trace)  |
| static | —                                          | a fixed pinned set, never updated            |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

_IDX_BITS = 17  # rows per group < 131072
_SEC_BITS = 24  # steps < 16.7 M
_MAX_ROWS = 1 << _IDX_BITS


def _pack(primary: np.ndarray, secondary: np.ndarray, index: np.ndarray, rows: int) -> np.ndarray:
    """One unique int64 per row: (primary, secondary, lower ``index`` first)."""
    tie = rows - 1 - index  # lower index → larger key
    return ((primary.astype(np.int64) << _SEC_BITS) | np.asarray(secondary, dtype=np.int64)) << _IDX_BITS | tie


def _key_lru(c: "RowCache", pick: Callable, index: np.ndarray) -> np.ndarray:
    return _pack(pick(c.last_use), 0, index, c.rows)


def _key_lfu(c: "RowCache", pick: Callable, index: np.ndarray) -> np.ndarray:
    return _pack(pick(c.uses), pick(c.last_use), index, c.rows)


def _key_belady(c: "RowCache", pick: Callable, index: np.ndarray) -> np.ndarray:
    """Nearer next use → higher key; the future table is indexed by the step just taken."""
    t = min(c.step - 1, c._next_use.shape[0] - 1)  # the step whose selection was just recorded
    horizon = c._next_use.shape[0] + 1
    return _pack(horizon - pick(c._next_use[t]).astype(np.int64), pick(c.last_use), index, c.rows)


@dataclass(frozen=True)
class Policy:
    """One cache policy's record: its key and the traits callers outside ``cache/`` ask about.

    Adding a policy is one record here, one constant of ``RowCache.Policy`` in the Java engine and one
    enumerator of ``custom_ops/src/cache/``'s ``Policy`` (``tests/test_records.py`` holds all three together).

    ``key``: the packed key of the rows (``_pack``), None for a policy whose resident set no access
    changes (``updates`` False). ``zero_capacity``: the capacity is forced to 0 (everything from Flash).
    ``needs_future``: needs the future selections, a recorded trace (so nothing that only knows the
    past can run it: a conversation, DIP-CA whose selections depend on the cache, the cache step
    inside the graph). ``pinned``: resident is a fixed pinned set (``static_rows``) given at the start.
    ``stepwise``: the key depends on the step, not only on the rows' statistics, so several steps
    cannot be admitted at once (``RowCache.access_steps``).
    """

    name: str
    key: Callable[["RowCache", Callable, np.ndarray], np.ndarray] | None = None
    zero_capacity: bool = False
    needs_future: bool = False
    pinned: bool = False
    stepwise: bool = False

    @property
    def updates(self) -> bool:
        """Whether an access changes the resident set."""
        return self.key is not None

    @property
    def offline(self) -> bool:
        """Whether it needs data recorded beforehand (a trace or calibration counts)."""
        return self.needs_future or self.pinned

    @property
    def code(self) -> int:
        """Its number in the native library (``dd_cache_new``) and its ordinal in the Java enum."""
        return POLICIES.index(self.name)


#: The policies, in their native/Java order.
POLICY_RECORDS: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("none", zero_capacity=True),
        Policy("lru", _key_lru),
        Policy("lfu", _key_lfu),
        Policy("belady", _key_belady, needs_future=True, stepwise=True),
        Policy("static", pinned=True),
    )
}
POLICIES = tuple(POLICY_RECORDS)


def policy_of(name: str) -> Policy:
    """The record of cache policy ``name``."""
    if name not in POLICY_RECORDS:
        raise ValueError(f"cache policy {name!r} unknown; choose one of {', '.join(POLICIES)}")
    return POLICY_RECORDS[name]


def _next_use_table(future: np.ndarray, rows: int) -> np.ndarray:
    """next_use[t, b, r] = first step > t at which row r of sequence b is selected (T + 1 if never)."""
    T, B, _ = future.shape
    nu = np.empty((T, B, rows), dtype=np.int32)
    cur = np.full((B, rows), T + 1, dtype=np.int32)
    b_idx = np.arange(B)[:, None]
    for t in range(T - 1, -1, -1):
        nu[t] = cur
        cur = cur.copy()
        cur[b_idx, future[t]] = t
    return nu


@dataclass
class RowCache:
    """Batched cache state for ``batch`` sequences over ``rows`` rows with room for ``capacity`` rows.

    ``future`` ([T, B, K] selections) is required by ``belady``; ``pinned`` ([rows] bool or [B, rows]) by
    ``static``. ``access`` returns the hit mask of the selection and advances one step.
    """

    rows: int
    capacity: int
    policy: str = "lru"
    batch: int = 1
    future: np.ndarray | None = None
    pinned: np.ndarray | None = None
    resident: np.ndarray = field(init=False)
    last_use: np.ndarray = field(init=False)
    uses: np.ndarray = field(init=False)
    step: int = field(init=False, default=0)
    hits: int = field(init=False, default=0)
    misses: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        rec = self._policy = policy_of(self.policy)
        if not 0 < self.rows < _MAX_ROWS:
            raise ValueError(f"rows must lie in [1, {_MAX_ROWS - 1}], got {self.rows}")
        if rec.zero_capacity:
            self.capacity = 0
        self.capacity = int(min(max(self.capacity, 0), self.rows))
        shape = (self.batch, self.rows)
        self.resident = np.zeros(shape, dtype=bool)
        self.last_use = np.zeros(shape, dtype=np.int64)
        self.uses = np.zeros(shape, dtype=np.int64)
        self._next_use = None
        if rec.needs_future:
            if self.future is None:
                raise ValueError(f"policy {self.policy!r} needs the future selections (a recorded trace)")
            fut = np.asarray(self.future)
            if fut.ndim == 2:
                fut = fut[:, None, :]
            self._next_use = _next_use_table(fut, self.rows)
        if rec.pinned:
            if self.pinned is None:
                raise ValueError(f"policy {self.policy!r} needs the pinned rows (see static_rows)")
            pinned = np.broadcast_to(np.asarray(self.pinned, dtype=bool), shape)
            if int(pinned.sum(axis=-1).max()) > self.capacity:
                raise ValueError(f"{self.policy}: {int(pinned.sum(axis=-1).max())} pinned rows exceed capacity "
                                 f"{self.capacity}")
            self.resident = pinned.copy()

    def _key(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The policy's packed key of every row [B, R]; with ``rows``, of those rows of sequence 0 only
        (what the one-sequence path needs)."""
        pick = (lambda a: a) if rows is None else (lambda a: a[0, rows])  # noqa: E731
        index = np.arange(self.rows, dtype=np.int64) if rows is None else rows
        return self._policy.key(self, pick, index)

    def access(self, selected: np.ndarray) -> np.ndarray:
        """Record one step's selection ([B, K] row indices); return hits [B, K] (bool)."""
        selected = np.asarray(selected, dtype=np.int64).reshape(self.batch, -1)
        if selected.size and (selected.min() < 0 or selected.max() >= self.rows):
            raise IndexError(f"selected rows must lie in [0, {self.rows}), got [{selected.min()}, {selected.max()}]")
        if self.batch == 1:
            return self._access_one(selected[0])[None]
        b = np.arange(self.batch)[:, None]
        hit = self.resident[b, selected]
        self.hits += int(hit.sum())
        self.misses += int(hit.size - hit.sum())
        self.step += 1
        self.last_use[b, selected] = self.step
        self.uses[b, selected] += 1
        if self._policy.updates and self.capacity > 0:
            cand = self.resident.copy()
            cand[b, selected] = True
            over = cand.sum(axis=-1) > self.capacity
            if over.any():
                key = np.where(cand, self._key(), -1)
                keep = np.argpartition(-key[over], self.capacity - 1, axis=-1)[:, : self.capacity]
                new = np.zeros((int(over.sum()), self.rows), dtype=bool)
                np.put_along_axis(new, keep, True, axis=-1)
                cand[over] = new
            self.resident = cand
        return hit

    def access_steps(self, selected: np.ndarray) -> np.ndarray:
        """Record ``selected`` ([n, K] row indices of one sequence) as n steps at once, leaving the state
        that n calls of ``access`` leave; returns the rows resident *before* the n steps ([n, K] bool):
        what a batched prefill found in DRAM (docs/runtime.md).

        For LRU and LFU every row's key only grows, so a row that falls out of the top-C stays out until
        it is selected again: after the steps the residency is the top-C by key over the rows resident
        before and the rows selected. Belady's key depends on the step, so it is stepped. A test holds
        this equal to the step-by-step path."""
        sel = np.asarray(selected, dtype=np.int64)
        sel = sel.reshape(len(sel), -1)
        if self.batch != 1 or self._policy.stepwise:
            before = self.resident[0].copy()
            for s in sel:
                self.access(s[None])
            return before[sel]
        if sel.size and (sel.min() < 0 or sel.max() >= self.rows):
            raise IndexError(f"selected rows must lie in [0, {self.rows}), got [{sel.min()}, {sel.max()}]")
        res = self.resident[0]
        hit = res[sel]
        self.hits += int(hit.sum())
        self.misses += hit.size - int(hit.sum())
        flat = sel.reshape(-1)
        steps = np.repeat(np.arange(self.step + 1, self.step + len(sel) + 1, dtype=np.int64), sel.shape[1])
        np.maximum.at(self.last_use[0], flat, steps)
        self.uses[0] += np.bincount(flat, minlength=self.rows)
        self.step += len(sel)
        self._admit(res, flat)
        return hit

    def _access_one(self, sel: np.ndarray) -> np.ndarray:
        """``access`` for one sequence (the runtime's case), the same rule computed on fewer rows.

        Keeping the top-C of the candidates by a unique key is dropping the ``n − C`` lowest keys, so
        only the candidates' keys are packed and partitioned instead of all rows'. A test holds this
        equal to the batched path.
        """
        res = self.resident[0]
        hit = res[sel]
        n_hit = int(hit.sum())
        self.hits += n_hit
        self.misses += len(sel) - n_hit
        self.step += 1
        self.last_use[0, sel] = self.step
        self.uses[0, sel] += 1
        self._admit(res, sel)
        return hit

    def _admit(self, res: np.ndarray, rows: np.ndarray) -> None:
        """The one cache rule on one sequence: resident ∪ ``rows``, minus the lowest keys beyond C."""
        if not self._policy.updates or self.capacity <= 0:
            return
        res = res.copy()
        res[rows] = True
        cand = np.flatnonzero(res)
        over = len(cand) - self.capacity
        if over > 0:
            res[cand[np.argpartition(self._key(cand), over - 1)[:over]]] = False
        self.resident = res[None]

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


def static_rows(counts: np.ndarray, capacity: int) -> np.ndarray:
    """The pinned set of the ``static`` policy: the ``capacity`` most used rows in calibration counts
    ([rows] or [B, rows]), ties → lower index. Returns a bool mask of the same shape."""
    counts = np.asarray(counts)
    capacity = int(min(max(capacity, 0), counts.shape[-1]))
    mask = np.zeros(counts.shape, dtype=bool)
    if capacity:
        order = np.argsort(-counts, axis=-1, kind="stable")[..., :capacity]
        np.put_along_axis(mask, order, True, axis=-1)
    return mask
