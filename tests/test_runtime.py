"""The host runtime: equal to model.onnx with an unlimited budget and γ = 1, equal to the torch DIP-CA
reference under a budget, bytes counted, budgets and bad bundles refused clearly."""

import copy
import json
import shutil

import numpy as np
import pytest

from dipdeploy.agreement import Tolerance, tolerance_for
from dipdeploy.export.bundle import export
from dipdeploy.export.config import ExportConfig
from dipdeploy.export.prepare import make_plan
from dipdeploy.export.validate import torch_greedy
from dipdeploy.runtime import BundleError, DramBudget, Engine, parse_bandwidth, parse_bytes
from dipdeploy.runtime.budget import GroupShape, plan_residency
from dipdeploy.sparsity.twin import compare_with_twin
from twin_checks import assert_runs_agree, model_onnx_run

# compared across implementations: CI runs these under every kernel set too (Makefile: test-kernel-sets)
pytestmark = pytest.mark.numerics

PROMPT = [3, 14, 15, 92, 65, 35]


@pytest.fixture(scope="module")
def dipca_bundle(tmp_path_factory):
    """A tiny-llama DIP-CA BQ4 bundle, and the torch model it was exported from (fake-quantised)."""
    from dipdeploy.loading import load_model

    lm = load_model("tiny-llama")
    cfg = ExportConfig(model="tiny-llama", method="dip-ca", rho_in=0.6, gamma=0.3, quant="bq4", validate_tokens=4)
    plan = make_plan(lm, cfg)
    out = tmp_path_factory.mktemp("rt") / "bundle"
    export(lm, cfg, out, plan)
    return out, lm, plan


class _Spec:
    num_kv_heads, head_dim, num_layers = 2, 16, 2


@pytest.mark.parametrize("io", ["pread", "mmap", "direct"])
@pytest.mark.parametrize("native", [False, True])
def test_unlimited_budget_and_gamma_1_equals_model_onnx(dipca_bundle, io, native):
    out, _, _ = dipca_bundle
    if native:
        from dipdeploy.ops.native import library_path

        if library_path() is None:
            pytest.skip("native library not built (make ops)")
    eng = Engine(out, dram_budget="100%", single_session=False, fused=False, gamma=1.0, native=native, io=io,
                 prefill="token")
    g = eng.generate(PROMPT, 8, keep_logits=True, stop_at_eos=False)
    logits, sel = eng.teacher_forced(PROMPT, g.tokens)
    assert all(np.array_equal(a, b) for a, b in zip(logits, g.logits))  # one engine: bit-equal by contract
    ref_logits, ref_sel = model_onnx_run(out / "model.onnx", _Spec, PROMPT, g.tokens)
    assert_runs_agree(ref_logits, ref_sel, logits, sel, len(PROMPT), Tolerance(1e-4, 1e-4))


@pytest.mark.parametrize("native", [False, True])
def test_accuracy_level_override_equals_model_onnx_at_that_level(dipca_bundle, native, tmp_path):
    """--accuracy-level 4 on a level-0 bundle: the per-layer graphs run what model.onnx at level 4 runs."""
    from dipdeploy.ops.native import library_path

    if native and library_path() is None:
        pytest.skip("native library not built (make ops)")
    out, _, _ = dipca_bundle
    eng = Engine(out, dram_budget="100%", single_session=False, fused=False, gamma=1.0, native=native,
                 accuracy_level=4)
    g = eng.generate(PROMPT, 8, stop_at_eos=False)
    logits, sel = eng.teacher_forced(PROMPT, g.tokens)
    ref_logits, ref_sel = model_onnx_run(out / "model.onnx", _Spec, PROMPT, g.tokens, native=native, level=4)
    assert_runs_agree(ref_logits, ref_sel, logits, sel, len(PROMPT), Tolerance(1e-4, 1e-4))
    with pytest.raises(ValueError, match="accuracy level"):
        Engine(out, accuracy_level=2)


@pytest.mark.parametrize("policy,budget,split", [("lfu", "50%", "even"), ("lru", "25%", "even"), ("none", "50%", "even"),
                                                 ("lfu", "50%", "reads"), ("lru", "25%", "reads")])
def test_dipca_equals_torch_reference_under_a_budget(dipca_bundle, policy, budget, split):
    """Same γ, policy and capacities (round(frac·rows) per group, re-spent by the cache split) as the torch
    DIP-CA reference: fed the reference's tokens, the runtime's selections pass the top-K check and the twin's
    logits agree."""
    from dipdeploy.export.mlp import stored_row_bytes
    from dipdeploy.flash import miss_cost
    from dipdeploy.quant.config import calibrated_config
    from dipdeploy.sparsity.methods import reset_caches, sparsify_

    out, lm, plan = dipca_bundle
    ref_plan = copy.deepcopy(plan)
    frac = DramBudget.parse(budget).cache_frac
    ref_plan.method, ref_plan.gamma, ref_plan.policy, ref_plan.cache_frac = "dip-ca", 0.3, policy, frac
    ref_plan.cache_split = split
    ref_plan.row_bytes = stored_row_bytes(calibrated_config("bq4"), plan.hidden_size, plan.intermediate_size)
    if policy == "none":
        ref_plan.cache_frac = 0.0
    model = copy.deepcopy(lm.model)
    sparsify_(model, ref_plan)
    reset_caches(model)
    ref_tokens, _ = torch_greedy(model, np.array(PROMPT), 10)
    eng = Engine(out, dram_budget=budget, policy=policy, native=False, cache_split=split)
    assert eng.gamma == pytest.approx(0.3)
    if policy != "none":
        assert ref_plan.cache_capacity(miss_cost) == eng.residency.capacity
        if split == "reads":  # the down rows are the smaller ones: they get a larger share than even gives
            even = [[round(frac * plan.hidden_size), round(frac * plan.intermediate_size)]] * len(plan.layers)
            assert eng.residency.capacity != even
            assert all(c[1] > e[1] for c, e in zip(eng.residency.capacity, even))
    logits, sel = eng.teacher_forced(PROMPT, ref_tokens)
    token, twin = compare_with_twin(model, PROMPT, ref_tokens, logits, sel, tolerance_for(sparse=True, quantised=True))
    assert token.ok and twin.ok, f"{token.describe()}; {twin.as_dict()}"
    assert twin.topk_checked == len(sel) * 2 * 2
    g = eng.generate(PROMPT, 10, stop_at_eos=False)
    assert 0.0 <= g.stats.hit_rate < 1.0


def test_cache_aware_reads_less_flash_than_plain_dip(dipca_bundle):
    out, _, _ = dipca_bundle
    dip = Engine(out, dram_budget="50%", policy="lfu", gamma=1.0, native=False).generate(PROMPT, 12, stop_at_eos=False)
    ca = Engine(out, dram_budget="50%", policy="lfu", gamma=0.1, native=False).generate(PROMPT, 12, stop_at_eos=False)
    assert ca.stats.flash_mb_per_token < dip.stats.flash_mb_per_token
    assert ca.stats.hit_rate > dip.stats.hit_rate


def test_flash_bytes_are_the_misses(dipca_bundle):
    out, _, _ = dipca_bundle
    eng = Engine(out, dram_budget="0%", policy="none", gamma=1.0, native=False)
    g = eng.generate(PROMPT, 4, stop_at_eos=False)
    (ki, kg), (rb_in, rb_glu) = eng.k[0], eng.row_bytes[0]
    per_token = eng.num_layers * (ki * rb_in + kg * rb_glu)  # every selected row, every token
    assert g.stats.flash_mb_per_token * 1e6 == pytest.approx(per_token)
    assert g.stats.hit_rate == 0.0


def test_belady_is_the_lower_bound_for_plain_dip(dipca_bundle):
    out, _, _ = dipca_bundle
    runs = {p: Engine(out, dram_budget="40%", policy=p, gamma=1.0, native=False).generate(PROMPT, 12, stop_at_eos=False)
            for p in ("lru", "lfu", "belady")}
    # one engine, γ = 1: the cache never changes a mask or the arithmetic (bit-equal by contract)
    assert runs["belady"].tokens == runs["lru"].tokens == runs["lfu"].tokens
    assert runs["belady"].stats.flash_mb_per_token <= min(runs["lru"].stats.flash_mb_per_token,
                                                          runs["lfu"].stats.flash_mb_per_token)
    with pytest.raises(ValueError, match="γ = 1"):
        Engine(out, dram_budget="40%", policy="belady", gamma=0.5, native=False).generate(PROMPT, 4)


def test_static_pins_rows_before_the_first_token(dipca_bundle):
    out, _, _ = dipca_bundle
    eng = Engine(out, dram_budget="50%", policy="static", gamma=1.0, native=False)
    g = eng.generate(PROMPT, 6, stop_at_eos=False)
    assert all(s.cache.resident.sum() == s.capacity for pair in eng.slabs for s in pair)
    assert g.stats.hit_rate > 0.0


def test_trace_from_the_runtime_round_trips(dipca_bundle, tmp_path):
    from dipdeploy.trace import Trace

    out, _, _ = dipca_bundle
    eng = Engine(out, dram_budget="50%", policy="lru", native=False)
    rec = eng.trace_recorder()
    g = eng.generate(PROMPT, 5, trace=rec, stop_at_eos=False)
    path = rec.finish().save(tmp_path / "t.npz")
    t = Trace.load(path)
    assert t.source == "runtime" and t.policy == "lru"
    assert t.sel_in[0].shape == (len(PROMPT) + len(g.tokens) - 1, eng.k[0][0])
    assert t.hits_in is not None and t.hits_in[0].dtype == bool
    counts_in, counts_glu = t.row_counts()[0]  # what --pin-from gives the static policy
    assert counts_in.shape == (eng.d,) and counts_glu.shape == (eng.f,)
    assert counts_in.sum() == t.sel_in[0].size and (counts_in[t.sel_in[0][0]] >= 1).all()


def test_budget_parsing_and_errors():
    assert parse_bytes("120MB") == 120_000_000 and parse_bytes("1GiB") == 2**30
    assert parse_bandwidth("1GB/s") == 1e9
    assert DramBudget.parse("50%").cache_frac == 0.5
    assert DramBudget.parse("2.5MB").total_bytes == 2_500_000
    for bad, msg in (("150%", r"\[0%, 100%\]"), ("lots", "not a size"), ("x%", "not a percentage")):
        with pytest.raises(ValueError, match=msg):
            DramBudget.parse(bad)
    with pytest.raises(ValueError, match="rate"):
        parse_bandwidth("1GB")
    groups = [[GroupShape(64, 40, 30), GroupShape(128, 20, 60)]]
    with pytest.raises(ValueError, match=r"resident minimum of .* MB"):
        plan_residency(DramBudget(total_bytes=1000), groups, 5000, 100, "lfu")
    r = plan_residency(DramBudget(total_bytes=5000 + 100 + 30 * 40 + 60 * 20 + 2560), groups, 5000, 100, "lfu",
                       split="even")
    assert r.cache_frac == pytest.approx(0.5) and r.capacity == [[32, 64]]


def test_reads_split_spends_the_even_bytes_on_the_small_rows_first():
    """SmolLM2's shapes: 306 B down rows cost a block and a request each, so split ``reads`` caches the down
    groups first with the bytes the even split would give; equal groups get equal fractions."""
    smol = [[GroupShape(576, 1632, 317), GroupShape(1536, 306, 614)] for _ in range(3)]
    even = plan_residency(DramBudget(cache_frac=0.5), smol, 1000, 100, "lfu", split="even")
    reads = plan_residency(DramBudget(cache_frac=0.5), smol, 1000, 100, "lfu")  # the default
    assert even.capacity == [[288, 768]] * 3
    assert reads.capacity == [[144, 1536]] * 3  # down whole, up|gate gets the rest: 288·1632 − 768·306 = 144·1632
    assert reads.caches <= even.caches and even.caches - reads.caches < 3 * 1632
    small = plan_residency(DramBudget(cache_frac=0.1), smol, 1000, 100, "lfu", split="reads")
    assert all(c[0] == 0 and 0 < c[1] < 1536 for c in small.capacity) and len({tuple(c) for c in small.capacity}) == 1
    # a byte budget: the same total as even, whatever the split
    total = DramBudget(total_bytes=1000 + 100 + sum(g.k * g.row_bytes for l in smol for g in l) + even.caches)
    assert plan_residency(total, smol, 1000, 100, "lfu", split="reads").capacity == reads.capacity
    assert plan_residency(DramBudget(cache_frac=0.5), smol, 1000, 100, "none", split="reads").caches == 0
    with pytest.raises(ValueError, match="cache split 'odd' unknown"):
        plan_residency(DramBudget(cache_frac=0.5), smol, 1000, 100, "lfu", split="odd")


def test_bad_bundles_and_options_are_refused(dipca_bundle, tmp_path):
    out, _, _ = dipca_bundle
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    with open(broken / "mlp.bin", "r+b") as f:
        f.truncate(100)
    with pytest.raises(BundleError, match=r"mlp.bin: size 100 .*truncated"):
        Engine(broken)
    shutil.copy2(out / "mlp.bin", broken / "mlp.bin")
    with open(broken / "mlp.bin", "r+b") as f:  # two bytes of a weight row (a row position would be refused)
        f.seek(json.loads((out / "manifest.json").read_text())["tensors"]["model.layers.0.mlp.down.qweight"]["offset"] + 10)
        f.write(b"\xff\xfe")
    Engine(broken, native=False)  # sizes fine; only --verify reads the checksums
    with pytest.raises(BundleError, match="sha256 mismatch"):
        Engine(broken, verify=True)
    m = json.loads((broken / "manifest.json").read_text())
    m["version"] = 99
    (broken / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="version 99 is not supported"):
        Engine(broken)
    with pytest.raises(ValueError, match=r"gamma must lie in \[0, 1\]"):
        Engine(out, gamma=1.5)
    with pytest.raises(ValueError, match="policy 'mru' unknown"):
        Engine(out, policy="mru")
    with pytest.raises(ValueError, match="exceed the context"):
        Engine(out, context=8, native=False).generate(PROMPT, 8)


def test_missing_native_library_falls_back_with_a_warning(dipca_bundle, monkeypatch):
    import dipdeploy.ops.native as native

    monkeypatch.setattr(native, "library_path", lambda arch=None: None)
    with pytest.warns(UserWarning, match="no native op library: running the ONNX fallback"):
        eng = Engine(dipca_bundle[0], dram_budget="50%")
    assert eng.native is False


def test_cli_run_writes_json_and_refuses_to_clobber(dipca_bundle, tmp_path):
    from typer.testing import CliRunner

    from dipdeploy.cli import app

    out = dipca_bundle[0]
    js = tmp_path / "r.json"
    args = ["run", str(out), "--prompt", "ab", "-n", "4", "--no-native", "--dram-budget", "50%", "--json", str(js)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    row = json.loads(js.read_text())
    assert row["new_tokens"] == len(row["tokens"]) and "hit_rate" in row
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "exists" in res.output


def test_cli_run_emulates_a_device_profiles_flash(dipca_bundle, tmp_path):
    """--flash-device: the profile's bandwidth and request cost, said in the stats and the JSON."""
    from typer.testing import CliRunner

    from dipdeploy.cli import app
    from dipdeploy.sim.devices import get_device

    js = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["run", str(dipca_bundle[0]), "--prompt", "ab", "-n", "4", "--io", "mmap",
                                   "--dram-budget", "50%", "--flash-device", "sd8gen3", "--json", str(js)])
    assert res.exit_code == 0, res.output
    row, flash = json.loads(js.read_text()), get_device("sd8gen3").flash
    assert row["flash_device"] == "sd8gen3" and row["flash_emulated_bandwidth"] == flash.seq_bandwidth
    assert row["flash_emulated_request_us"] == pytest.approx(flash.request_s * 1e6)
    assert row["flash_block_requests_per_token"] > 0 and "µs a request (sd8gen3)" in res.output


def test_flash_emulation_paces_reads_to_the_bandwidth(tmp_path):
    """1 MB at 100 MB/s must take ≥ 10 ms of emulated wait in total (paid once it passes 1 ms)."""
    from dipdeploy.runtime.flash import FlashStore, RowArray, emulation

    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    store = FlashStore(path, emulate=emulation(100e6, None))
    arr = RowArray("a", 0, 1024, 1024, "uint8", (1024,))
    slab = np.zeros((1024, 1024), np.uint8)
    for start in range(0, 1024, 64):
        rows = np.arange(start, start + 64)
        store.read([arr], [slab], rows, rows)
    store.settle()
    assert store.counters.bytes == 1024 * 1024
    assert store.counters.emulated_wait + store.counters.io_seconds >= 1024 * 1024 / 100e6 * 0.999
    assert np.array_equal(slab[5], np.frombuffer(bytes(range(256)) * 4, np.uint8))


@pytest.mark.parametrize("native", [False, True])
def test_vq3_bundle_streams_codes_and_keeps_codebooks(tmp_path, native):
    """VQ3: codes stream into the slab, codebooks stay whole; under a budget the tokens equal an
    unlimited run (γ = 1: the cache never changes a mask, only where rows live)."""
    from dipdeploy.export.bundle import export_model
    from dipdeploy.ops.native import library_path

    if native and library_path() is None:
        pytest.skip("native library not built (make ops)")

    out = tmp_path / "vq3"
    export_model(ExportConfig(model="tiny-llama", method="dip", rho_in=0.6, quant="vq3", vq_hessian="none",
                              validate_tokens=2), out)
    full = Engine(out, dram_budget="100%", single_session=False, native=native, io="mmap").generate(PROMPT, 8, keep_logits=True, stop_at_eos=False)
    tight = Engine(out, dram_budget="25%", policy="lru", native=native, io="mmap")
    g = tight.generate(PROMPT, 8, keep_logits=True, stop_at_eos=False)
    assert [a.name for a in tight.slabs[0][0].arrays.per_row] == ["up_gate.codes"]
    assert set(tight.slabs[0][0].arrays.shared) == {"up_gate.codebooks", "up_gate.codebook_scales"}
    # one path, γ = 1: the budget changes where rows live, not the arithmetic (bit-equal by contract; --io
    # direct on the joined decoder sums the resident and the missed rows apart, another order of addition)
    assert g.tokens == full.tokens and g.stats.flash_mb_per_token > full.stats.flash_mb_per_token
    assert all(np.array_equal(a, b) for a, b in zip(g.logits, full.logits))


def test_stats_are_per_run_on_a_reused_engine(dipca_bundle):
    """Flash figures come from this run's counters, also when nothing is decoded (prompt only)."""
    out, _, _ = dipca_bundle
    eng = Engine(out, dram_budget="0%", policy="none", gamma=1.0, native=False)
    first, second = (eng.generate(PROMPT, 1, stop_at_eos=False).stats for _ in range(2))
    assert first.flash_mb_per_token == second.flash_mb_per_token > 0


@pytest.mark.parametrize("native", [False, True])
def test_reads_split_keeps_plain_dip_bit_equal_and_moves_the_misses(tiny_dipca_bundle, native):
    """With γ = 1 the selections do not depend on the cache, so how its bytes are split cannot change a
    token or a logit; split ``reads`` holds more of the small-row group (down) and the same cache bytes."""
    if native:
        from dipdeploy.ops.native import library_path

        if library_path() is None:
            pytest.skip("native library not built (make ops)")
    bundle = tiny_dipca_bundle()
    runs = {}
    for split in ("even", "reads"):
        eng = Engine(bundle, dram_budget="40%", policy="lfu", gamma=1.0, native=native, cache_split=split,
                     io="mmap")  # direct on the joined decoder adds resident and missed rows apart
        g = eng.generate([3, 14, 15, 92, 65, 35, 8, 9, 7], 10, keep_logits=True, stop_at_eos=False)
        runs[split] = (g.tokens, g.logits, eng.residency, [[s.capacity for s in pair] for pair in eng.slabs])
        eng.close()
    (t0, l0, r0, c0), (t1, l1, r1, c1) = runs["even"], runs["reads"]
    assert t0 == t1 and all(np.array_equal(x, y) for x, y in zip(l0, l1))
    assert r1.caches <= r0.caches and r1.total <= r0.total
    assert c1 == r1.capacity and c1 != c0
    assert sum(c[1] for c in c1) > sum(c[1] for c in c0)  # more down rows cached
