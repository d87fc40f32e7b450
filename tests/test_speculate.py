"""Speculative decoding (``dipdeploy.runtime.speculate``): greedy output equals plain greedy output where
the module docstring guarantees it (γ = 1 on the joined decoder, every row resident on the one-session
path), near-tie-aware; the cache draft reads nothing and changes no cache; the KV cache holds the answer
after a generation; the sampling rule draws from the target's distribution; refusals are one line."""

from __future__ import annotations

import numpy as np
import pytest

from dipdeploy.ops.native import library_path
from dipdeploy.runtime import Engine
from dipdeploy.runtime.config import EngineConfig, FieldError
from dipdeploy.runtime.native_cache import graph_step_library
from dipdeploy.runtime.sampler import Sampler
from dipdeploy.runtime.speculate import CacheDraft, ModelDraft, SpeculationStats, accept, open_model_draft

from twin_checks import assert_generations_agree

LIB = library_path()
native = pytest.mark.skipif(LIB is None or graph_step_library(str(LIB)) is None,
                            reason="native library with the graph cache step not built (make ops)")
PROMPT = [3, 17, 42, 9, 100, 7, 64, 5, 11]
JOINED = dict(dram_budget="50%", io="direct", fused=True)


def _plain(bundle, n=20, **kw):
    eng = Engine(bundle, **kw)
    try:
        return eng.generate(PROMPT, n, keep_logits=True)
    finally:
        eng.close()


def _speculative(bundle, draft, n=20, sampler=None, **kw):
    eng = Engine(bundle, **kw)
    try:
        eng.reset()
        draft = draft(eng) if callable(draft) else draft
        gen = eng.extend(PROMPT, n, sampler or Sampler(), keep_logits=True, draft=draft)
        return gen, eng.sequence
    finally:
        eng.close()


@native
@pytest.mark.parametrize("k", [1, 3, 6])
def test_cache_draft_greedy_equals_plain_at_gamma_one(tiny_dipca_bundle, k):
    bundle = tiny_dipca_bundle()
    ref = _plain(bundle, gamma=1.0, **JOINED)
    got, sequence = _speculative(bundle, CacheDraft(), gamma=1.0, speculate=k, **JOINED)
    assert_generations_agree(ref, got)
    assert sequence == PROMPT + got.tokens[:-1]  # the rejected drafts are cut off the KV cache
    spec = got.stats.speculation
    assert spec["draft"] == "cache" and spec["k"] == k and spec["passes"] >= 1
    assert 0 <= spec["accepted"] <= spec["drafted"]
    # the first token comes from the prompt's logits, the last may be a plain step (no room for a draft)
    assert len(got.tokens) - 1 - spec["accepted"] - spec["passes"] in (0, 1)


@native
def test_model_draft_on_the_one_session_path(tiny_dipca_bundle):
    """Every row resident: the selection ignores the cache, so speculation with any draft gives the plain
    greedy tokens; the bundle drafting for itself is kept almost always (a batched run and a step differ
    only in summation)."""
    bundle = tiny_dipca_bundle()
    ref = _plain(bundle, dram_budget="100%")
    got, sequence = _speculative(bundle, lambda _: ModelDraft(Engine(bundle, dram_budget="100%")),
                                 dram_budget="100%", speculate=4)
    assert_generations_agree(ref, got)
    assert got.stats.single_session
    assert got.stats.speculation["acceptance"] > 0.5
    assert sequence == PROMPT + got.tokens[:-1]


@native
def test_cache_draft_reads_nothing_and_changes_no_cache(tiny_dipca_bundle):
    eng = Engine(tiny_dipca_bundle(), speculate=4, **JOINED)
    try:
        eng.reset()
        eng.prefill(PROMPT, _timer())
        states = [slab.native_state().state for pair in eng.slabs for slab in pair]
        before = [tuple(np.copy(getattr(s, f)) for f in ("resident", "last_use", "uses", "counters", "slot_of"))
                  for s in states]
        flash = eng.flash.counters.snapshot()
        seq = eng.sequence
        drafts, dists = CacheDraft().propose(eng, 5, 4, Sampler(), _timer())
        assert len(drafts) == 4 and dists == [None] * 4
        assert eng.sequence == seq
        after = [tuple(np.copy(getattr(s, f)) for f in ("resident", "last_use", "uses", "counters", "slot_of"))
                 for s in states]
        for b, a in zip(before, after):
            for x, y in zip(b, a):
                np.testing.assert_array_equal(x, y)
        eng.backend._drain_graph_reads()
        assert (eng.flash.counters - flash).bytes == 0
    finally:
        eng.close()


def _timer():
    from dipdeploy.runtime.stats import Timer

    return Timer()


def test_sampling_rule_draws_from_the_target():
    """One draft token drawn from q, kept by min(1, p/q), else replaced from max(0, p − q): the emitted token
    is distributed as p (fixed seed; 20,000 draws resolve ±0.01)."""
    p_logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    q = np.array([0.1, 0.1, 0.2, 0.3, 0.3])
    sampler = Sampler(temperature=1.0, seed=7)
    rng = np.random.default_rng(3)
    counts = np.zeros(5)
    logits = np.stack([p_logits, p_logits])
    for _ in range(20_000):
        d = int(rng.choice(5, p=q))
        kept, nxt = accept(sampler, [d], [q], logits, [0])
        counts[d if kept else nxt] += 1
    np.testing.assert_allclose(counts / counts.sum(), np.exp(p_logits), atol=0.012)


def test_greedy_acceptance_keeps_the_matching_prefix():
    sampler = Sampler()
    logits = np.zeros((4, 6))
    logits[0, 2] = logits[1, 4] = logits[2, 1] = logits[3, 5] = 1.0
    assert accept(sampler, [2, 4, 1], [None] * 3, logits, [0]) == (3, 5)
    assert accept(sampler, [2, 3, 1], [None] * 3, logits, [0]) == (1, 4)
    assert accept(sampler, [0, 4, 1], [None] * 3, logits, [0]) == (0, 2)


def test_stats_figures():
    s = SpeculationStats(passes=4, drafted=12, accepted=6)
    assert s.acceptance == 0.5 and s.tokens_per_pass == 2.5
    assert SpeculationStats().as_dict()["acceptance"] == 0.0


def test_config_refusals():
    with pytest.raises(FieldError, match="over the cap"):
        EngineConfig(speculate=10_000)
    with pytest.raises(FieldError, match="--prefill batch"):
        EngineConfig(speculate=4, prefill="token")
    with pytest.raises(FieldError, match="--prefill-chunk 5 or more"):
        EngineConfig(speculate=4, prefill_chunk=4)
    with pytest.raises(FieldError, match="whole number"):
        EngineConfig(speculate=-1)


@native
def test_refusals_in_one_line(tiny_dipca_bundle):
    bundle = tiny_dipca_bundle()
    with pytest.raises(ValueError, match="every row is resident"):
        _speculative(bundle, CacheDraft(), dram_budget="100%", speculate=2)
    with pytest.raises(ValueError, match="--io direct"):
        _speculative(bundle, CacheDraft(), dram_budget="50%", io="mmap", fused=True, speculate=2)
    with pytest.raises(ValueError, match="per-layer graphs"):
        _speculative(bundle, CacheDraft(), dram_budget="50%", fused=False, speculate=2)
    with pytest.raises(ValueError, match="opened without speculation"):
        _speculative(bundle, CacheDraft(), **JOINED)
    with pytest.raises(ValueError, match="as a size"):
        open_model_draft(EngineConfig(dram_budget="50%", speculate=2), bundle)
    with pytest.raises(ValueError, match="the whole --dram-budget"):
        open_model_draft(EngineConfig(dram_budget="8KB", speculate=2), bundle)


@native
def test_model_draft_comes_out_of_the_budget(tiny_dipca_bundle):
    bundle = tiny_dipca_bundle()
    draft, cfg = open_model_draft(EngineConfig(dram_budget="50MB", speculate=2), bundle)
    try:
        held = draft.engine.backend.residency.total
        assert held > 0 and cfg.dram_budget == f"{50_000_000 - held}B" and cfg.speculate == 2
    finally:
        draft.close()


@native
def test_cli_run_speculates_and_reports(tiny_dipca_bundle, tmp_path):
    import json

    from typer.testing import CliRunner

    from dipdeploy.cli import app

    bundle, out = tiny_dipca_bundle(), tmp_path / "run.json"
    res = CliRunner().invoke(app, ["run", str(bundle), "-p", "hello", "-n", "12", "--dram-budget", "50%", "--io",
                                   "direct", "--speculate", "3", "--json", str(out)])
    assert res.exit_code == 0, res.output
    spec = json.loads(out.read_text())["speculation"]
    assert spec["draft"] == "ngram" and spec["k"] == 3  # the default draft
    res = CliRunner().invoke(app, ["run", str(bundle), "-p", "hello", "--draft", str(bundle)])
    assert res.exit_code == 2 and "--speculate" in res.output and len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(app, ["run", str(bundle), "-p", "hello", "--speculate", "99"])
    assert res.exit_code == 2 and "cap" in res.output, res.output


def test_ngram_draft_copies_what_followed_the_last_occurrence():
    from types import SimpleNamespace

    from dipdeploy.runtime.speculate import NgramDraft

    eng = SimpleNamespace(_state={"ids": [5, 6, 7, 8, 9, 1, 6, 7]}, vocab_rows=16)
    # the sequence ends 6 7 + first 8: the trigram 6 7 8 occurred at 1, followed by 9 1 6
    assert NgramDraft().propose(eng, 8, 3, Sampler(), _timer()) == ([9, 1, 6], [None] * 3)
    assert NgramDraft().propose(eng, 8, 9, Sampler(), _timer())[0] == [9, 1, 6, 7, 8]  # up to the end
    assert NgramDraft().propose(eng, 2, 3, Sampler(), _timer()) == ([], [])  # 2 never occurred
    drafts, dists = NgramDraft().propose(eng, 8, 2, Sampler(temperature=1.0), _timer())
    assert drafts == [9, 1] and [int(np.argmax(q)) for q in dists] == [9, 1] and all(q.sum() == 1 for q in dists)


@native
def test_ngram_draft_greedy_equals_plain_on_the_one_session_path(tiny_dipca_bundle):
    from dipdeploy.runtime.speculate import NgramDraft

    bundle = tiny_dipca_bundle()
    ref = _plain(bundle, n=32, dram_budget="100%")
    got, sequence = _speculative(bundle, NgramDraft(), n=32, dram_budget="100%", speculate=4)
    assert_generations_agree(ref, got)
    assert sequence == PROMPT + got.tokens[:-1]
    spec = got.stats.speculation
    assert len(got.tokens) == 1 + spec["accepted"] + spec["passes"] + spec["plain"]
