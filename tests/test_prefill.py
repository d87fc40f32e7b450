"""Batched prefill (``EngineConfig.prefill = "batch"``, the default) against the token-by-token path.

The batch selects by plain DIP (every row counted resident), so its contract is a token-mode run at
γ = 1 under the same budget, whose selections do not depend on the cache either: the first generated
token's logits agree within the sparse tolerance (``dipdeploy.agreement``), the KV cache within it,
and each group's cache after the prompt is its policy's rule applied to the prompt's selections in
token order, with every resident row's slot holding that row (docs/runtime.md)."""

import numpy as np
import pytest
from typer.testing import CliRunner

from dipdeploy.agreement import compare_logits, tolerance_for
from dipdeploy.cache import RowCache
from dipdeploy.cli import app
from dipdeploy.ops.native import library_path
from dipdeploy.runtime import Engine, Sampler
from dipdeploy.runtime.native_cache import graph_step_library
from dipdeploy.runtime.chat import Chat

pytestmark = pytest.mark.numerics

PROMPT = [3, 14, 15, 92, 65, 35, 8, 97, 93, 23, 84, 62]
TOL = tolerance_for(sparse=True, quantised=True)


@pytest.fixture(scope="module", params=["standard", "gqa"])
def bundle(request, tiny_dipca_bundle):
    """The shared tiny-llama DIP-CA BQ4 bundle (γ = 0.3) per attention variant: the KV layouts differ."""
    return tiny_dipca_bundle(request.param)


def _first(engine, prompt=PROMPT, n=1):
    return engine.generate(prompt, n, keep_logits=True, stop_at_eos=False)


def test_batch_first_token_agrees_with_token_mode_at_gamma_1(bundle):
    batch = Engine(bundle, native=False, dram_budget="50%", policy="lfu")  # the bundle's γ = 0.3
    token = Engine(bundle, native=False, dram_budget="50%", policy="lfu", gamma=1.0, prefill="token")
    got, ref = _first(batch), _first(token)
    agree = compare_logits(ref.logits, got.logits, TOL)
    assert agree.ok, agree.describe()
    assert batch.cfg.prefill == "batch" and got.stats.prefill == "batch"


def test_kv_cache_after_batch_prefill_agrees_with_token_mode(bundle):
    batch = Engine(bundle, native=False, dram_budget="100%", single_session=False, gamma=1.0)
    token = Engine(bundle, native=False, dram_budget="100%", single_session=False, gamma=1.0, prefill="token")
    _first(batch), _first(token)
    assert batch.kv.length == token.kv.length == len(PROMPT)
    for i in range(batch.num_layers):
        for a, b in zip(batch.kv.layer(i), token.kv.layer(i)):
            np.testing.assert_allclose(a, b, atol=TOL.logits, rtol=0)


@pytest.mark.parametrize("policy", ["lfu", "lru"])
def test_caches_are_warmed_by_the_policy_rule_in_token_order(bundle, policy):
    eng = Engine(bundle, native=False, dram_budget="50%", policy=policy)
    sel = {}

    def keep(i, s_in, s_glu, _h_in, _h_glu):
        sel.setdefault(i, []).append((s_in, s_glu))

    eng.reset()
    eng.extend(PROMPT, 0, Sampler(), record=keep)
    assert all(len(v) == len(PROMPT) for v in sel.values())
    full = 0  # groups whose cache the prompt filled and then had to evict from
    for i, pair in enumerate(eng.slabs):
        for g, slab in enumerate(pair):
            ref = RowCache(slab.rows, slab.capacity, policy)
            for step in sel[i]:
                ref.access(step[g][None])
            assert np.array_equal(ref.resident[0], slab.resident)
            distinct = len(np.unique(np.concatenate([step[g] for step in sel[i]])))
            assert slab.resident.sum() == min(slab.capacity, distinct)
            full += distinct > slab.capacity
            rows = np.flatnonzero(slab.resident)
            slots = slab.table.slot_of[rows]
            for arr, data in zip(slab.arrays.per_row, slab.slabs):
                want = np.zeros((len(rows), *arr.row_shape), arr.dtype)
                eng.flash.read([arr], [want], rows, np.arange(len(rows)))
                assert np.array_equal(data[slots], want)  # each resident slot holds its row's bytes
    assert full >= len(eng.slabs)  # the policy's eviction order was exercised


def test_chat_continues_after_a_batched_prefill(chat_bundle):
    """Two batched turns (the second extends the first's KV cache) hold the KV cache that token mode
    builds over the same whole sequence (γ = 1, so decode's selections do not depend on the cache)."""
    eng = Engine(chat_bundle, native=False, dram_budget="100%", single_session=False, gamma=1.0, context=256)
    chat = Chat(eng, Sampler())
    first = chat.say("hello", 4)
    second = chat.say("and then?", 4)
    assert first.generation.tokens and second.generation.tokens
    seq = eng.sequence
    assert eng.kv.length == len(seq) > len(first.generation.tokens) + 4
    token = Engine(chat_bundle, native=False, dram_budget="100%", single_session=False, gamma=1.0, context=256, prefill="token")
    token.reset()
    token.extend(seq, 0, Sampler())
    for i in range(eng.num_layers):
        for a, b in zip(eng.kv.layer(i), token.kv.layer(i)):
            np.testing.assert_allclose(a, b, atol=TOL.logits, rtol=0)


def test_prefill_option_is_checked():
    res = CliRunner().invoke(app, ["run", "nowhere", "-p", "x", "--prefill", "chunked"])
    assert res.exit_code == 2
    assert "--prefill" in res.output and "batch" in res.output and "Traceback" not in res.output


def test_prefill_mode_is_refused_in_the_config():
    from dipdeploy.runtime.config import EngineConfig

    with pytest.raises(ValueError, match="prefill"):
        EngineConfig(prefill="chunked")


@pytest.mark.parametrize("chunk", [1, 5])
def test_chunked_prefill_agrees_with_one_batch(bundle, chunk):
    """Chunks attend to the earlier ones through the KV cache: the same first token's logits and KV cache
    as one batch within the sparse tolerance (the summation order differs, so not bit-equal)."""
    whole = Engine(bundle, native=False, dram_budget="50%", policy="lfu", prefill_chunk=len(PROMPT))
    chunked = Engine(bundle, native=False, dram_budget="50%", policy="lfu", prefill_chunk=chunk)
    ref, got = _first(whole, n=2), _first(chunked, n=2)
    agree = compare_logits(ref.logits, got.logits, TOL)
    assert agree.ok, agree.describe()
    assert chunked.kv.length == whole.kv.length == len(PROMPT) + 1
    for i in range(whole.num_layers):
        for a, b in zip(whole.kv.layer(i), chunked.kv.layer(i)):
            np.testing.assert_allclose(a, b, atol=TOL.logits, rtol=0)


def test_prefill_runs_chunks_of_at_most_the_chunk_size(bundle, monkeypatch):
    """A 12-token prompt with chunks of 5 runs each layer's graphs on 5, 5 and 2 tokens, in that order;
    the head runs once, after the last chunk."""
    from dipdeploy.runtime import sessions

    eng = Engine(bundle, native=False, dram_budget="50%", prefill_chunk=5)
    seen = []
    run = sessions.Bound.run

    def spy(self):
        kept = self._keep.get("in:hidden")
        if kept is not None:
            seen.append((self.session, kept[0].shape))
        run(self)

    monkeypatch.setattr(sessions.Bound, "run", spy)
    eng.reset()
    progress = []
    eng.extend(PROMPT, 0, Sampler(), on_prefill=lambda done, total: progress.append((done, total)))
    attn = [shape for s, shape in seen if s is eng.attn[0].session]
    assert attn == [(1, 5, eng.d), (1, 5, eng.d), (1, 2, eng.d)]
    assert progress == [(5, 12), (10, 12), (12, 12)]  # the progress follows each chunk
    assert [shape for s, shape in seen if s is eng.head.session] == [(1, 1, eng.d)]
    assert eng.kv.length == len(PROMPT)


def test_the_plan_holds_one_chunk_and_a_budget_below_it_is_refused(bundle):
    """The chunk's activations are planned (``Residency.prefill``): a larger chunk plans more, and a total
    budget that holds everything but the larger chunk is refused with the chunk named in the fix."""
    from dipdeploy.runtime.config import EngineConfig

    def fixed(chunk):
        eng = Engine(bundle, native=False, dram_budget="0%", prefill_chunk=chunk, io="mmap")
        r = eng.residency
        eng.close()
        return r.prefill, r.total - r.caches

    (small, small_fixed), (large, large_fixed) = fixed(4), fixed(64)
    assert 0 < small < large and large_fixed - small_fixed == large - small
    between = f"{(small_fixed + large_fixed) // 2}B"
    Engine(bundle, native=False, dram_budget=between, prefill_chunk=4, io="mmap").close()
    res = CliRunner().invoke(app, ["run", str(bundle), "-p", "hi", "--no-native", "--dram-budget", between,
                                   "--prefill-chunk", "64", "--io", "mmap"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "prefill buffers" in res.output and "--prefill-chunk" in res.output
    assert EngineConfig().prefill_chunk == EngineConfig.prefill_chunk  # one default, the CLI's too


def test_prefill_chunk_is_refused_in_the_config():
    from dipdeploy.runtime.config import EngineConfig

    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="prefill chunk"):
            EngineConfig(prefill_chunk=bad)


@pytest.mark.skipif(library_path() is None or graph_step_library(str(library_path())) is None,
                    reason="needs the op library with the graph's cache step (make ops)")
def test_the_groups_hold_no_chunk_selection_after_a_batched_prefill(tiny_dipca_bundle):
    """The joined graph's batched prefill copies each chunk's selection into its group for the settle; the
    settle gives it back, or every group of every layer would keep tokens × k indices after a prompt."""
    eng = Engine(tiny_dipca_bundle(), dram_budget="50%", io="direct", fused=True)
    try:
        got = eng.generate(PROMPT, 2, stop_at_eos=False)
        assert got.stats.prefill == "batch" and type(eng.backend).__name__ == "JoinedDecoder"
        states = [slab.native_state() for pair in eng.slabs for slab in pair]
        assert states and all(s.chunk_bytes() == 0 for s in states)
    finally:
        eng.close()
