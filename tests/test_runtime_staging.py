"""Shared staging: every slab's staging rows are the same pages, the cache rows are each slab's own, and
an engine that shares them decodes bit-equal to one that does not while planning less memory."""

import gc

import numpy as np
import pytest

from dipdeploy.runtime import Engine
from dipdeploy.runtime import staging
from dipdeploy.runtime.budget import DramBudget, GroupShape, plan_residency

pytestmark = pytest.mark.skipif(not staging.supported(), reason="shared staging needs memfd_create (Linux)")

PROMPT = [3, 14, 15, 92, 65, 35, 8, 9, 7]


def test_slabs_share_their_staging_rows_and_nothing_else():
    row_shape = (77,)  # 308-byte rows: the cache part does not end on a page, so the slab is padded
    shared = staging.SharedStaging(staging.window_bytes([308], 5))
    a = shared.slab(13, 5, row_shape, np.float32, 0)
    b = shared.slab(2, 5, row_shape, np.float32, 0)
    assert a.shape == (18, 77) and b.shape == (7, 77) and a.dtype == np.float32
    assert not a.any() and not b.any()
    a[:13] = 1.0
    a[13:] = np.arange(5 * 77, dtype=np.float32).reshape(5, 77)
    np.testing.assert_array_equal(b[2:], a[13:])  # the same staging pages
    assert not b[:2].any()  # cache rows are each slab's own
    b[0] = 7.0
    assert (a[:13] == 1.0).all()
    assert shared.resident_bytes() == staging.page_up(5 * 308)
    del a
    gc.collect()
    b[2:] += 1  # the first slab's unmapping leaves the other's pages in place
    assert b[2, 0] == 1.0
    shared.close()


def test_a_window_outside_the_arena_is_refused():
    shared = staging.SharedStaging(staging.PAGE)
    with pytest.raises(ValueError, match="does not lie on pages"):
        shared.slab(4, 2, (4096,), np.uint8, 0)  # two pages of staging in a one-page arena
    with pytest.raises(ValueError, match="does not lie on pages"):
        shared.slab(4, 1, (16,), np.uint8, 100)


def test_plan_reserves_the_largest_window_when_staging_is_shared():
    groups = [[GroupShape(64, 40, 30, 4096), GroupShape(128, 20, 60, 8192)],
              [GroupShape(64, 40, 30, 4096), GroupShape(128, 20, 60, 8192)]]
    own = plan_residency(DramBudget(cache_frac=0.5), groups, 5000, 100, "lfu")
    one = plan_residency(DramBudget(cache_frac=0.5), groups, 5000, 100, "lfu", shared_staging=True)
    assert own.staging == 2 * (30 * 40 + 60 * 20) and one.staging == 8192
    assert own.capacity == one.capacity


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("policy,budget", [("none", "0%"), ("lfu", "30%")])
def test_shared_staging_decodes_bit_equal_and_plans_less(tiny_dipca_bundle, native, policy, budget):
    if native:
        from dipdeploy.ops.native import library_path

        if library_path() is None:
            pytest.skip("native library not built (make ops)")
    bundle = tiny_dipca_bundle()
    runs = {}
    for share in (False, True):
        eng = Engine(bundle, dram_budget=budget, policy=policy, native=native, shared_staging=share)
        g = eng.generate(PROMPT, 10, keep_logits=True, stop_at_eos=False)
        runs[share] = (g.tokens, g.logits, eng.residency.staging, eng.flash.counters.bytes)
        if share:
            assert eng.shared_staging.resident_bytes() > 0  # the rows streamed through it
        eng.close()
    (t0, l0, s0, b0), (t1, l1, s1, b1) = runs[False], runs[True]
    assert t0 == t1 and all(np.array_equal(x, y) for x, y in zip(l0, l1))  # the same bytes: bit-equal
    assert b0 == b1 > 0
    assert s1 < s0
