"""The host runtime's memory: the KV cache allocated once for the context and written in place (both
attention variants), embedding rows read from dense.bin instead of a resident table, and a residency
plan that counts what is resident (docs/runtime.md, "Budget")."""

import numpy as np
import pytest

from dipdeploy.agreement import Tolerance
from dipdeploy.bundle.manifest import open_tensor
from dipdeploy.export.bundle import export
from dipdeploy.export.config import ExportConfig
from dipdeploy.export.prepare import make_plan
from dipdeploy.runtime import Engine
from dipdeploy.runtime.kv import KvCache, KvShape
from twin_checks import assert_runs_agree, model_onnx_run

pytestmark = pytest.mark.numerics

PROMPT = [3, 14, 15, 92, 65, 35]


class _Spec:
    num_kv_heads, head_dim, num_layers = 2, 16, 2


@pytest.fixture(scope="module", params=["standard", "gqa"])
def bundle(request, tiny_dipca_bundle):
    return tiny_dipca_bundle(request.param), request.param


def _kv_addresses(eng: Engine) -> set[int]:
    return {eng.kv.storage.ctypes.data}


def test_kv_storage_is_sized_to_the_context_and_never_reallocated(bundle):
    out, attention = bundle
    eng = Engine(out, dram_budget="50%", context=24, fused=False)  # the per-layer sessions' bindings
    assert eng.kv.attention == attention
    floats = 2 * 16 * 24  # heads × head_dim × context, per layer and K/V
    layers = 2 if attention == "gqa" else 3  # the standard layout keeps one spare layer buffer
    assert eng.kv.storage.shape == (layers, 2, floats)
    assert eng.residency.kv == eng.kv.nbytes == layers * 2 * floats * 4
    storage, address = eng.kv.storage, eng.kv.storage.ctypes.data
    bound = []
    eng.reset()
    from dipdeploy.runtime.stats import Timer

    timer = Timer()
    for t in PROMPT:
        eng.step(t, timer)
        for i in range(2):
            k, v = eng.kv.layer(i)
            for a in (k, v):  # the valid K/V lie inside the one storage, not in a fresh array
                assert np.shares_memory(a, storage)
            bound.append(eng.attn[i]._keep[f"out:present.{i}.key"].array)  # the Buffer bound by address
    assert eng.kv.storage is storage and eng.kv.storage.ctypes.data == address
    assert all(np.shares_memory(b, storage) for b in bound)
    assert eng.kv.layer(0)[0].shape == (1, 2, len(PROMPT), 16)


def test_tokens_and_logits_equal_model_onnx(bundle):
    out, _ = bundle
    eng = Engine(out, dram_budget="100%", single_session=False, gamma=1.0, native=False, prefill="token")
    g = eng.generate(PROMPT, 8, keep_logits=True, stop_at_eos=False)
    logits, sel = eng.teacher_forced(PROMPT, g.tokens)
    assert all(np.array_equal(a, b) for a, b in zip(logits, g.logits))  # a second sequence on the same storage
    ref_logits, ref_sel = model_onnx_run(out / "model.onnx", _Spec, PROMPT, g.tokens)
    assert_runs_agree(ref_logits, ref_sel, logits, sel, len(PROMPT), Tolerance(1e-4, 1e-4))


def test_truncate_then_refeed_equals_the_uncut_sequence(bundle):
    out, _ = bundle
    eng = Engine(out, dram_budget="100%", single_session=False, gamma=1.0, native=False, context=32)
    from dipdeploy.runtime.stats import Timer

    timer, ids = Timer(), PROMPT + [7, 8, 9]
    eng.reset()
    full = [eng.step(t, timer) for t in ids]
    eng.truncate(4)
    again = [eng.step(t, timer) for t in ids[4:]]
    assert all(np.array_equal(a, b) for a, b in zip(full[4:], again))
    with pytest.raises(ValueError, match="cannot keep"):
        eng.truncate(len(ids) + 1)


def test_embedding_rows_read_from_dense_bin_equal_the_table(bundle):
    """fp32 rows are the table's; int4 rows (the quantised default) decode as embed.onnx's
    GatherBlockQuantized does, bit for bit."""
    import onnxruntime as ort

    out, _ = bundle
    eng = Engine(out, dram_budget="50%")
    sess = ort.InferenceSession(str(out / "embed.onnx"), providers=["CPUExecutionProvider"])
    vocab = eng.embedding.vocab
    ids = np.array([[0, 1, 92, vocab - 1]], np.int64)
    want = sess.run(None, {"input_ids": ids})[0]
    row = np.zeros((1, 1, want.shape[-1]), np.float32)
    for j, t in enumerate(ids[0]):
        eng.embedding.read(int(t), row)
        assert np.array_equal(row[0, 0], want[0, j])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.embedding.read(vocab, row)


def test_embedding_multiplier_applies_as_the_graph_does(tmp_path):
    from dipdeploy.loading import load_model

    lm = load_model("tiny-granite")
    cfg = ExportConfig(model="tiny-granite", method="dip", rho_in=0.6, quant="bq4", validate_tokens=2)
    out = tmp_path / "b"
    export(lm, cfg, out, make_plan(lm, cfg))
    eng = Engine(out, dram_budget="100%", single_session=False, native=False)
    import onnxruntime as ort

    sess = ort.InferenceSession(str(out / "embed.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([[5, 17]], np.int64)
    ref = sess.run(None, {"input_ids": ids})[0]
    row = np.zeros((1, 1, ref.shape[-1]), np.float32)
    for j in range(2):
        eng.embedding.read(int(ids[0, j]), row)
        assert np.array_equal(row[0, 0], ref[0, j])
    assert eng.embedding.multiplier != 1.0


def test_residency_plan_counts_one_embedding_row_not_the_table(bundle):
    out, _ = bundle
    eng = Engine(out, dram_budget="50%")
    m = eng.manifest
    names = ("model.embed_tokens.qweight", "model.embed_tokens.scales")  # the int4 table (untied tiny-llama)
    table = sum(m.tensors[n]["length"] for n in names)
    shared = sum(s.arrays.shared_bytes for pair in eng.slabs for s in pair)
    assert eng.residency.dense == m.sizes["bytes_dense"] - table + eng.embedding.nbytes + shared
    d = m.source["config"]["hidden_size"]
    row = sum(m.tensors[n]["length"] // m.tensors[n]["shape"][0] for n in names)
    assert row <= eng.embedding.nbytes <= row + 4 * 2 * d  # the int4 row and its decoded float32 blocks


def test_kv_layouts_refuse_unknown_attention():
    with pytest.raises(ValueError, match="attention 'flash' unknown"):
        KvCache(KvShape(1, 1, 4, 8), "flash")


def test_rope_tables_are_read_once_and_shared_by_the_attention_sessions(bundle):
    out, attention = bundle
    eng = Engine(out, dram_budget="50%")
    names = {"standard": {"model.rope.cos", "model.rope.sin"},
             "gqa": {"model.rope.cos_half", "model.rope.sin_half"}}[attention]
    assert set(eng.shared.arrays) == names
    for name in names:
        assert np.array_equal(eng.shared.arrays[name], np.asarray(open_tensor(out, eng.manifest, name)))
    assert eng.shared.nbytes == sum(eng.manifest.tensors[n]["length"] for n in names)


def test_a_buffer_bound_by_address_refuses_a_shape_past_its_end():
    from dipdeploy.runtime.sessions import Buffer

    buf = Buffer(np.zeros(12, np.float32))
    assert buf.fits((1, 3, 4)) == (1, 3, 4) and buf.address == buf.array.ctypes.data
    with pytest.raises(ValueError, match="exceeds a buffer of 12"):
        buf.fits((1, 3, 5))
    with pytest.raises(ValueError, match="C-contiguous"):
        Buffer(np.zeros((4, 4), np.float32)[:, :2])
