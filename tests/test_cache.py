"""The cache policies and the DIP-CA score: the one definition every implementation mirrors."""

from collections import OrderedDict

import numpy as np
import pytest

from dipdeploy.cache import RowCache, dipca_scores, gamma_at, static_rows, topk_indices, topk_rows


def zipf_trace(T=300, R=64, K=12, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.random(R) ** 3
    w /= w.sum()
    return np.stack([rng.choice(R, K, replace=False, p=w) for _ in range(T)])


def replay(policy, trace, R, C, **kw):
    cache = RowCache(R, C, policy, future=trace if policy == "belady" else None, **kw)
    for sel in trace:
        cache.access(sel[None])
    return cache


def test_lru_matches_textbook_lru():
    """A dict-based LRU: evict the least recent row; among rows of one step, the higher index first."""
    trace, R, C = zipf_trace(), 64, 20
    cache = RowCache(R, C, "lru")
    last: dict[int, int] = {}
    for t, sel in enumerate(trace, 1):
        hit = cache.access(sel[None])[0]
        assert list(hit) == [int(r) in last for r in sel]
        for r in sel:
            last[int(r)] = t
        while len(last) > C:
            del last[min(last, key=lambda r: (last[r], -r))]
        assert set(np.flatnonzero(cache.resident[0]).tolist()) == set(last)


@pytest.mark.parametrize("C", [12, 20, 30, 45])
def test_belady_never_worse(C):
    trace = zipf_trace(seed=C)
    rates = {p: replay(p, trace, 64, C).hit_rate for p in ("lru", "lfu", "belady")}
    assert rates["belady"] >= rates["lru"] and rates["belady"] >= rates["lfu"]


def test_capacity_none_and_static():
    trace = zipf_trace()
    assert replay("none", trace, 64, 30).hits == 0
    pinned = static_rows(np.bincount(trace.ravel(), minlength=64), 16)
    cache = replay("static", trace, 64, 16, pinned=pinned)
    assert (cache.resident[0] == pinned).all()
    expected = sum(pinned[r] for sel in trace for r in sel)
    assert cache.hits == expected
    for p in ("lru", "lfu"):
        assert replay(p, trace, 64, 16).resident.sum() <= 16


def test_batched_equals_independent():
    a, b = zipf_trace(seed=1), zipf_trace(seed=2)
    both = RowCache(64, 20, "lfu", batch=2)
    for sa, sb in zip(a, b):
        both.access(np.stack([sa, sb]))
    one = replay("lfu", a, 64, 20)
    two = replay("lfu", b, 64, 20)
    assert (both.resident[0] == one.resident[0]).all() and (both.resident[1] == two.resident[0]).all()
    assert both.hits == one.hits + two.hits


def test_dipca_score_definition():
    x = np.array([[0.1, -2.0, 0.5, 1.0]], dtype=np.float32)
    c = np.array([[True, False, True, False]])
    s = dipca_scores(np.abs(x), c, gamma=0.25)
    np.testing.assert_allclose(s, [[0.05, 0.25, 0.25, 0.125]], rtol=1e-6)
    np.testing.assert_allclose(dipca_scores(np.abs(x), c, 1.0), np.abs(x) / 2.0)
    s = dipca_scores(np.abs(x), c, 0.25, fixed_top_n=1)  # the top raw |x| keeps weight 1
    assert s[0, 1] == pytest.approx(1.0)


def test_topk_ties_lower_index_first():
    s = np.array([[1.0, 3.0, 3.0, 0.5, 3.0]])
    assert topk_indices(s, 3).tolist() == [[1, 2, 4]]
    with pytest.raises(ValueError, match="k must lie"):
        topk_indices(s, 0)


def test_gamma_warmup_and_validation():
    assert gamma_at(0.2, 0, 10) == 1.0 and gamma_at(0.2, 10, 10) == 0.2
    assert gamma_at(0.2, 5, 10) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="gamma"):
        dipca_scores(np.ones((1, 3)), None, 1.5)
    with pytest.raises(ValueError, match="policy"):
        RowCache(8, 4, "fifo")
    with pytest.raises(ValueError, match="belady"):
        RowCache(8, 4, "belady")
    with pytest.raises(IndexError):
        RowCache(8, 4, "lru").access(np.array([[9]]))


def test_topk_rows_is_the_set_of_topk_indices():
    rng = np.random.default_rng(0)
    s = np.round(rng.random((8, 300)), 2)  # many ties
    for k in (1, 7, 150, 300):
        assert (np.sort(topk_indices(s, k), axis=-1) == topk_rows(s, k)).all()


@pytest.mark.parametrize("policy", ["lru", "lfu", "static", "none", "belady"])
@pytest.mark.parametrize("capacity", [0, 5, 20, 64])
def test_access_steps_equals_step_by_step(policy, capacity):
    """A batched prefill's warm (``access_steps``) leaves the state of the same accesses one by one,
    also after earlier steps (a chat turn after the first) and with rows re-selected after eviction."""
    rng = np.random.default_rng(7)
    rows, k = 64, 12
    before = np.stack([rng.choice(rows, k, replace=False) for _ in range(5)])
    batch = np.stack([rng.choice(rows // 2 if t % 3 else rows, k, replace=False) for t in range(40)])
    extra = {"future": np.concatenate([before, batch])} if policy == "belady" else {}
    if policy == "static":
        extra = {"pinned": np.arange(rows) < capacity}
    one, many = (RowCache(rows, capacity, policy, **extra) for _ in range(2))
    for c in (one, many):
        for s in before:
            c.access(s[None])
    held = one.resident[0].copy()
    hits = many.access_steps(batch)
    for s in batch:
        one.access(s[None])
    assert np.array_equal(hits, held[batch])
    for name in ("resident", "last_use", "uses"):
        assert np.array_equal(getattr(one, name), getattr(many, name)), name
    assert one.step == many.step and one.hits + one.misses == many.hits + many.misses
