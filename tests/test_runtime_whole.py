"""One session per token (``dipdeploy.runtime.backends.whole``): at a budget that holds every MLP row the engine
runs ``model.onnx`` once per token. Every row is resident from the start, so it must decode what the
per-layer path decodes with plain DIP (γ = 1), near-tie-aware; the auto rule picks it only where the
budget holds every row; what only the per-layer path has is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from dipdeploy.runtime import Engine

from twin_checks import assert_generations_agree

PROMPT = [3, 17, 42, 9, 100, 7, 64, 5, 11]


@pytest.mark.parametrize("attention", ["standard", "gqa"])
@pytest.mark.parametrize("prefill", ["batch", "token"])
def test_one_session_decodes_what_the_per_layer_path_decodes_with_plain_dip(tiny_dipca_bundle, attention, prefill):
    bundle = tiny_dipca_bundle(attention)
    per_layer = Engine(bundle, dram_budget="100%", single_session=False, fused=False, gamma=1.0,
                       prefill="token")
    one = Engine(bundle, dram_budget="100%", prefill=prefill, prefill_chunk=4)  # the prompt in 3 chunks
    assert one.single_session and not per_layer.single_session
    ref = per_layer.generate(PROMPT, 12, keep_logits=True, stop_at_eos=False)
    got = one.generate(PROMPT, 12, keep_logits=True, stop_at_eos=False)
    assert_generations_agree(ref, got)
    assert got.stats.single_session and got.stats.hit_rate == 1.0 and got.stats.flash_mb_per_token == 0
    # the engine is reusable: a second sequence starts from an empty KV cache
    again = one.generate(PROMPT, 12, keep_logits=True, stop_at_eos=False)
    assert again.tokens == got.tokens
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(again.logits, got.logits))


@pytest.mark.parametrize("attention,native", [("standard", None), ("gqa", None), ("standard", False)])
def test_truncate_and_extend_continue_the_kv_cache(tiny_dipca_bundle, attention, native):
    """A chat re-reads from a kept prefix: the shifted KV buffers (standard) must hold each layer's own
    positions after ``truncate``, so feeding the dropped tokens again gives the same logits (also on
    stock ORT, through model.onnx's fallback functions: ``native=False``)."""
    from dipdeploy.runtime.sampler import Sampler

    eng = Engine(tiny_dipca_bundle(attention), dram_budget="100%", prefill="token", native=native)
    assert eng.single_session
    g = eng.generate(PROMPT, 8, keep_logits=True, stop_at_eos=False)
    keep = len(PROMPT) + 2
    eng.truncate(keep)
    assert eng.sequence == (PROMPT + g.tokens)[:keep]
    again = eng.extend(g.tokens[2:7], 2, Sampler(), keep_logits=True, stop_at_eos=False)
    assert np.allclose(again.logits[0], g.logits[7], atol=1e-5)
    assert again.tokens[0] == g.tokens[7]


def test_the_auto_rule_runs_one_session_only_where_the_budget_holds_every_row(tiny_dipca_bundle):
    bundle = tiny_dipca_bundle()
    full = Engine(bundle, dram_budget="100%")
    assert full.single_session
    r = full.residency
    m = full.manifest
    assert (r.dense, r.caches, r.staging, r.kv) == (m.sizes["bytes_dense"], m.sizes["bytes_mlp"], 0, full.kv.nbytes)
    assert Engine(bundle, dram_budget=f"{r.total}B").single_session  # a size that covers model.onnx
    with pytest.raises(ValueError, match="below the"):
        Engine(bundle, dram_budget=f"{r.total - 1}B", single_session=True)
    assert not Engine(bundle, dram_budget="50%").single_session
    assert not Engine(bundle, dram_budget="100%", policy="none").single_session  # none holds no row
    assert not Engine(bundle, dram_budget="100%", single_session=False).single_session
    with pytest.raises(ValueError, match="does not hold every MLP row"):
        Engine(bundle, dram_budget="50%", single_session=True)


def test_what_needs_the_per_layer_graphs_is_refused_in_one_line(tiny_dipca_bundle):
    eng = Engine(tiny_dipca_bundle(), dram_budget="100%")
    with pytest.raises(ValueError, match="single_session=False"):
        eng.generate(PROMPT, 4, trace=eng.trace_recorder())
    with pytest.raises(ValueError, match="single_session=False"):
        eng.teacher_forced(PROMPT, [5, 6])
    # every row resident: Belady has nothing to foresee, so no recording pass, and LFU's tokens
    lfu = eng.generate(PROMPT, 6, stop_at_eos=False)
    belady = Engine(tiny_dipca_bundle(), dram_budget="100%", policy="belady", gamma=1.0)
    assert belady.single_session and belady.generate(PROMPT, 6, stop_at_eos=False).tokens == lfu.tokens


def test_cli_run_picks_the_path_and_trace_keeps_the_per_layer_one(tiny_dipca_bundle, tmp_path):
    import json

    from typer.testing import CliRunner

    from dipdeploy.cli import app

    bundle, runner = tiny_dipca_bundle(), CliRunner()
    base = ["run", str(bundle), "-p", "hello", "-n", "3", "--dram-budget", "100%"]
    for extra, single in (([], True), (["--per-layer"], False), (["--trace", str(tmp_path / "t.json")], False)):
        out = tmp_path / f"{len(extra)}{single}.json"
        res = runner.invoke(app, [*base, *extra, "--json", str(out)])
        assert res.exit_code == 0, res.output
        assert json.loads(out.read_text())["single_session"] is single
    res = runner.invoke(app, [*base, "--single-session", "--trace", str(tmp_path / "u.json")])
    assert res.exit_code == 2 and "--trace" in res.output
    res = runner.invoke(app, [*base[:-1], "50%", "--single-session"])
    assert res.exit_code == 2 and "every MLP row" in res.output
