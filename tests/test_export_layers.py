"""Per-layer graphs: chained by a host loop on full slabs they reproduce model.onnx; DIP-CA's cache
input changes the selection; no weight bytes are duplicated."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from dipdeploy.agreement import Tolerance, compare_topk
from dipdeploy.bundle.manifest import open_tensor, read_manifest
from dipdeploy.export.bundle import export_model
from dipdeploy.export.config import ExportConfig
from dipdeploy.export.decoder import kv_names
from twin_checks import assert_runs_agree, model_onnx_run

# compared across implementations: CI runs these under every kernel set too (Makefile: test-kernel-sets)
pytestmark = pytest.mark.numerics


class _Spec:
    num_kv_heads, head_dim = 2, 16


def _sess(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _chain(out, m, ids, resident: bool):
    """A minimal host loop: full slabs (slot = row), cache residency all ``resident``."""
    spec = m.source["config"]
    L, d, f = spec["num_hidden_layers"], spec["hidden_size"], spec["intermediate_size"]
    hkv = spec["num_key_value_heads"]
    dh = spec.get("head_dim") or d // spec["num_attention_heads"]
    S = ids.shape[1]
    h = _sess(out / "embed.onnx").run(None, {"input_ids": ids})[0]
    pos = _sess(out / "positions.onnx")
    shared = dict(zip([o.name for o in pos.get_outputs()],
                      pos.run(None, {"attention_mask": np.ones((1, S), np.int64), "position_ids": np.arange(S)[None]})))
    sel, pending = [], {}
    for i in range(L):
        a = _sess(out / f"layer.{i}.attn.onnx")
        empty = np.zeros((1, hkv, 0, dh), np.float32)
        feed = {"hidden": h, **pending, kv_names(i)[0]: empty, kv_names(i)[1]: empty,
                "cache_in": np.broadcast_to(resident, (d,)).copy(),
                **{k.name: shared[k.name] for k in a.get_inputs() if k.name in shared}}
        h, x, idx = a.run(["hidden_attn", "x", "in_indices"], feed)
        up = _sess(out / f"layer.{i}.mlp_up.onnx")
        feed = {"x": x, "in_indices": idx, "in_slots": idx, "cache_glu": np.full(f, bool(np.all(resident)))}
        for inp in up.get_inputs():
            if inp.name.startswith("up_gate."):
                feed[inp.name] = np.asarray(open_tensor(out, m, f"model.layers.{i}.mlp.{inp.name}"))
        glu, gidx = up.run(None, feed)
        down = _sess(out / f"layer.{i}.mlp_down.onnx")
        feed = {"glu": glu, "glu_indices": gidx, "glu_slots": gidx, "hidden_attn": h}
        for inp in down.get_inputs():
            if inp.name.startswith("down."):
                feed[inp.name] = np.asarray(open_tensor(out, m, f"model.layers.{i}.mlp.{inp.name}"))
        pending = {"mlp_out": down.run(None, feed)[0]}
        sel.append((x, idx, gidx))
    return _sess(out / "head.onnx").run(None, {"hidden": h, **pending})[0], sel


@pytest.mark.parametrize("model,quant,attn", [("tiny-llama", "none", "standard"), ("tiny-phi3", "bq4", "standard"),
                                              ("tiny-qwen2", "bq4", "gqa")])
def test_layer_chain_equals_model_onnx(tmp_path, model, quant, attn):
    out = tmp_path / "b"
    export_model(ExportConfig(model=model, method="dip-ca", rho_in=0.6, gamma=0.1, quant=quant, per_layer=True,
                              validate_tokens=4, attention=attn), out)
    m = read_manifest(out)
    assert len(m.graphs["layers"]) == 3 * 2 + 3
    ids = np.array([[3, 14, 15, 92, 65]], dtype=np.int64)
    ref, ref_sel = model_onnx_run(out / "model.onnx", _Spec, ids[0], [0])
    got, sel_dip = _chain(out, m, ids, resident=True)
    got_sel = [{key: arr[p] for i, (_, idx, gidx) in enumerate(sel_dip)
                for key, arr in (((i, "in"), idx), ((i, "glu"), gidx))} for p in range(ids.shape[1])]
    assert_runs_agree(ref, ref_sel, [got[0]], got_sel, ids.shape[1], Tolerance(1e-5, 1e-5))
    # nothing resident: γ re-weights every column alike, so the selection is plain DIP's top-K of |x|
    # (up to near-ties: γ·s rounds in float32)
    _, sel_ca = _chain(out, m, ids, resident=False)
    for x, idx, _ in sel_ca:
        res = compare_topk(np.abs(x), idx)
        assert res.ok, res.describe()
    half = np.arange(64) < 32  # DIP-CA: with γ = 0.1 the mask moves toward the resident half
    _, sel_half = _chain(out, m, ids, resident=half)
    frac = lambda sel: np.mean([np.mean(idx < 32) for _, idx, _ in sel])  # noqa: E731
    assert frac(sel_half) > frac(sel_dip)
    # no MLP weights inside any per-layer graph: they are slab inputs or external tensors
    for name in m.graphs["layers"]:
        g = onnx.load(str(out / name), load_external_data=False).graph
        assert all(t.data_location == onnx.TensorProto.EXTERNAL or t.name.startswith("/const/")
                   for t in g.initializer)


def _nodes(path, prefixes: tuple[str, ...]) -> set[tuple[str, str]]:
    """(name, op) of the nodes of a graph file whose names start with one of ``prefixes``."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return {(n.name, n.op_type) for n in graph.node if n.name.startswith(prefixes)}


@pytest.mark.parametrize("fuse", [True, False])
def test_per_layer_graphs_are_model_onnx_cut_at_the_host(tmp_path, fuse):
    """One builder emits both: layer 1's nodes in model.onnx are exactly those the per-layer graphs hold,
    fused norms included (the residual crosses the graph boundary unadded, so the next graph's norm adds
    it as model.onnx's does), and positions.onnx holds exactly model.onnx's RoPE rows and mask nodes, for
    each of Gemma 3's two layer types."""
    out = tmp_path / "b"
    export_model(ExportConfig(model="tiny-gemma3", method="dip-ca", rho_in=0.6, gamma=0.3, validate_tokens=0,
                              fuse_norms=fuse), out)
    files = read_manifest(out).graphs["layers"]
    layer = ("/model/layers.1/",)
    whole = _nodes(out / "model.onnx", layer)
    assert whole == set().union(*(_nodes(out / name, layer) for name in files))
    skip = "SkipSimplifiedLayerNormalization"
    assert ((f"/model/layers.1/input_layernorm/{skip}", skip) in whole) == fuse
    shared = ("/model/rope", "/model/attn_mask")
    kinds = {n.split("/")[2] for n, _ in _nodes(out / "positions.onnx", shared)}
    assert kinds == {"rope_sliding_attention", "rope_full_attention", "attn_mask_sliding_attention",
                     "attn_mask_full_attention"}
    assert _nodes(out / "model.onnx", shared) == _nodes(out / "positions.onnx", shared)
    assert all(not _nodes(out / name, shared) for name in files if name != "positions.onnx")
