"""A bundle whose MLP rows are in the calibrated order (``export --row-order``): same rows, same tokens,
bit-equal logits as the natural bundle (only the file order differs), the permutation round-trips through
the manifest, and bundles without ``row_order`` still load (natural)."""

import json
import shutil

import numpy as np
import pytest

from dipdeploy.bundle.manifest import BundleError, open_tensor, read_manifest, row_positions
from dipdeploy.export.bundle import export
from dipdeploy.export.config import ExportConfig
from dipdeploy.export.prepare import make_plan
from dipdeploy.runtime import Engine

PROMPT = [3, 14, 15, 92, 65, 35]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, data_dir):
    from dipdeploy.loading import load_model

    out = {}
    root = tmp_path_factory.mktemp("order")
    for order in ("calibrated", "natural"):
        lm = load_model("tiny-llama")
        cfg = ExportConfig(model="tiny-llama", method="dip-ca", rho_in=0.6, gamma=0.3, quant="bq4", validate_tokens=4,
                           row_order=order, calib_windows=2, calib_seqlen=128, data_dir=str(data_dir))
        out[order] = root / order
        plan = make_plan(lm, cfg)
        # under the default reads split tiny-llama caches every down row, leaving no misses to order
        plan.cache_split = "even"
        export(lm, cfg, out[order], plan)
    return out


def test_the_manifest_records_a_permutation_per_group(bundles):
    m = read_manifest(bundles["calibrated"])
    assert m.row_order["order"] == "calibrated"
    assert m.row_order["tokens"] == 256 and m.row_order["blocks_calibrated"] <= m.row_order["blocks_natural"]
    assert sum(n for kept, n in m.row_order["kept"].items() if kept != "natural") > 0
    assert m.validation["agrees_stock"]  # model.onnx gathers the file rows: it still matches torch
    nat = read_manifest(bundles["natural"])
    assert nat.row_order == {"order": "natural"}
    c = m.source["config"]
    for layer in range(c["num_hidden_layers"]):
        for group, rows in (("up_gate", c["hidden_size"]), ("down", c["intermediate_size"])):
            assert row_positions(bundles["natural"], nat, layer, group, rows) is None
            position = row_positions(bundles["calibrated"], m, layer, group, rows)
            assert sorted(position.tolist()) == list(range(rows))
            for label in ("qweight", "scales"):
                name = f"model.layers.{layer}.mlp.{group}.{label}"
                ordered = np.asarray(open_tensor(bundles["calibrated"], m, name))
                natural = np.asarray(open_tensor(bundles["natural"], nat, name))
                assert np.array_equal(ordered[position], natural)  # file row position[r] holds logical row r


@pytest.mark.parametrize("io", ["mmap", "direct"])
def test_the_same_tokens_and_logits_as_the_natural_bundle(bundles, io):
    runs = []
    for order in ("calibrated", "natural"):
        # the host cache step for both: the joined decoder, the default for the natural order, is another
        # implementation (tests/test_runtime_fused.py compares it near-tie-aware)
        eng = Engine(bundles[order], dram_budget="50%", policy="lfu", io=io, context=64, fused=False)
        g = eng.generate(PROMPT, 12, keep_logits=True, stop_at_eos=False)
        runs.append((g.tokens, g.logits, g.stats.flash_mb_per_token))
        eng.close()
    (t1, l1, b1), (t2, l2, b2) = runs
    assert t1 == t2 and b1 == b2
    assert all(np.array_equal(a, b) for a, b in zip(l1, l2))  # one implementation, same rows: bit-equal


def test_a_bundle_without_row_order_reads_as_natural(bundles, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(bundles["natural"], old)
    raw = json.loads((old / "manifest.json").read_text())
    del raw["row_order"]  # what bundles exported before the row order hold
    (old / "manifest.json").write_text(json.dumps(raw))
    m = read_manifest(old)
    assert m.row_order is None
    want = Engine(bundles["natural"], dram_budget="50%", context=64).generate(PROMPT, 8, stop_at_eos=False).tokens
    assert Engine(old, dram_budget="50%", context=64).generate(PROMPT, 8, stop_at_eos=False).tokens == want


def test_a_damaged_position_tensor_is_refused(bundles, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(bundles["calibrated"], bad)
    m = read_manifest(bad)
    t = m.tensors["model.layers.0.mlp.down.position"]
    with open(bad / t["file"], "r+b") as f:  # two logical rows at one file row: not a permutation
        f.seek(t["offset"])
        f.write(np.zeros(2, np.int64).tobytes())
    with pytest.raises(BundleError, match="not a permutation"):
        Engine(bad, dram_budget="50%", context=64)


def test_calibrated_is_refused_where_nothing_can_be_traced(tmp_path):
    from dipdeploy.loading import load_model

    lm = load_model("tiny-llama")
    cfg = ExportConfig(model="tiny-llama", rho_in=0.6, row_order="calibrated", validate_tokens=0)
    with pytest.raises(ValueError, match="--row-order natural"):
        export(lm, cfg, tmp_path / "b", None)  # no plan: a dense bundle, nothing streamed
    assert not (tmp_path / "b").exists()


def test_the_joined_decoder_refuses_a_calibrated_order(bundles):
    """The cache step in the graph reads logical rows at natural offsets; only the Flash store maps them:
    insisting is refused, the default runs the host cache step."""
    with pytest.raises(ValueError, match="calibrated order"):
        Engine(bundles["calibrated"], dram_budget="50%", fused=True)
    assert Engine(bundles["calibrated"], dram_budget="50%").fused is None
    assert Engine(bundles["natural"], dram_budget="50%", fused=True).fused is not None
