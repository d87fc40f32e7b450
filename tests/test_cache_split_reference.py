"""The torch DIP-CA reference under the ``reads`` cache split (the runtime's equality with it is in
test_runtime.py): the split reaches the reference's caches, plans keep it, and eval reports it."""

import json

import pytest
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.export.mlp import stored_row_bytes
from dipdeploy.flash import miss_cost
from dipdeploy.quant.config import calibrated_config
from dipdeploy.sparsity.methods import reset_caches, sparse_mlps, sparsify_, unsparsify_
from dipdeploy.sparsity.plan import SparsityConfig, SparsityPlan, uniform_plan


def test_stored_row_bytes_are_the_bundle_rows():
    """SmolLM2's shapes (d 576, F 1536): BQ4 rows of 64-value blocks with an fp16 scale each."""
    assert stored_row_bytes(calibrated_config("bq4"), 576, 1536) == [1536 + 96, 288 + 18]
    assert stored_row_bytes(calibrated_config("bq4-b32"), 576, 1536) == [1536 + 192, 288 + 36]
    assert stored_row_bytes(None, 576, 1536) == [4 * 3072, 4 * 576]
    with pytest.raises(ValueError, match="codebooks"):
        stored_row_bytes(calibrated_config("vq3"), 576, 1536)


def _plan(lm, split, row_bytes=None):
    c = lm.model.config
    plan = uniform_plan(SparsityConfig(method="dip-ca", density=0.5, rho_in=0.55, cache_split=split), lm.name,
                        c.num_hidden_layers, c.hidden_size, c.intermediate_size)
    plan.row_bytes = row_bytes
    return plan


def test_reference_caches_take_the_split(tiny_llama):
    lm = tiny_llama
    c = lm.model.config
    rb = stored_row_bytes(calibrated_config("bq4"), c.hidden_size, c.intermediate_size)
    ids = lm.tokenizer("The quick brown fox jumps over the lazy dog", return_tensors="pt").input_ids
    caps = {}
    for split in ("even", "reads"):
        plan = _plan(lm, split, rb)
        sparsify_(lm.model, plan)
        try:
            reset_caches(lm.model)
            lm.model(ids)
            caps[split] = [[m.caches[0].capacity, m.caches[1].capacity] for m in sparse_mlps(lm.model)]
        finally:
            unsparsify_(lm.model)
        assert caps[split] == plan.cache_capacity(miss_cost)
    even, reads = caps["even"], caps["reads"]
    assert even == [[round(0.5 * c.hidden_size), round(0.5 * c.intermediate_size)]] * c.num_hidden_layers
    # the same bytes, more of them on the smaller down rows, whose misses cost the most per byte
    assert all(r[1] > e[1] and r[0] < e[0] for r, e in zip(reads, even))
    assert sum(r[0] * rb[0] + r[1] * rb[1] for r in reads) <= sum(e[0] * rb[0] + e[1] * rb[1] for e in even)


def test_reads_is_the_default_priced_in_fp32_without_row_bytes(tiny_llama):
    """A plan without row bytes prices the reads split in fp32 rows, as eval without --quant does."""
    c = tiny_llama.model.config
    assert SparsityConfig(method="dip-ca").cache_split == "reads"
    plan = _plan(tiny_llama, "reads")
    fp32 = _plan(tiny_llama, "reads", stored_row_bytes(None, c.hidden_size, c.intermediate_size))
    assert plan.cache_capacity(miss_cost) == fp32.cache_capacity(miss_cost)
    assert plan.cache_capacity(miss_cost) != _plan(tiny_llama, "even").cache_capacity(miss_cost)


def test_plans_keep_the_split_and_row_bytes(tiny_llama):
    plan = _plan(tiny_llama, "reads")
    plan.row_bytes = [100, 40]
    back = SparsityPlan.from_json(plan.to_json())
    assert back.cache_split == "reads" and back.row_bytes == [100, 40]
    with pytest.raises(ValueError, match="cache split"):
        SparsityConfig(method="dip-ca", cache_split="odd")


def test_eval_cache_split_reads(tmp_path, data_dir):
    out = tmp_path / "rows.json"
    res = CliRunner().invoke(app, ["eval", "--model", "tiny-llama", "--method", "dip-ca", "--density", "0.5",
                                   "--rho-in", "0.55", "--seqlen", "64", "--max-windows", "1", "--data-dir",
                                   str(data_dir), "--quant", "bq4", "--cache-split", "reads", "--json", str(out)])
    assert res.exit_code == 0, res.output
    [row] = json.loads(out.read_text())["rows"]
    assert row["cache_split"] == "reads" and row["ppl"] > 1
    res = CliRunner().invoke(app, ["eval", "--model", "tiny-llama", "--method", "dip-ca", "--cache-split", "odd",
                                   "--data-dir", str(data_dir)])
    assert res.exit_code == 2 and "cache split" in res.output
