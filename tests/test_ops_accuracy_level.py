"""``with_accuracy_level``: one graph, either level, each equal to its own reference."""

import numpy as np
import onnx
import pytest

import onnxruntime as ort

from dipdeploy.ops.formats import OpWeights
from dipdeploy.ops.native import library_path, session_options
from dipdeploy.ops.nodes import make_sgmm_model, with_accuracy_level
from dipdeploy.ops.reference import sparse_gather_matmul_ref
from dipdeploy.quant.api import quantize
from dipdeploy.quant.config import Block4QuantConfig

# compared across implementations: CI runs these under every kernel set too (Makefile: test-kernel-sets)
pytestmark = pytest.mark.numerics


def run_model(model, feeds, path):
    if path == "native" and library_path() is None:
        pytest.skip("native op library not built (run `make ops`)")
    so = session_options(1, native=path == "native")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def nmse(y, ref):
    return float(((y.astype(np.float64) - ref) ** 2).sum() / (ref.astype(np.float64) ** 2).sum())


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(3)
    w = OpWeights.from_packed(quantize(rng.standard_normal((120, 256)).astype(np.float32), Block4QuantConfig()))
    x = rng.standard_normal((2, 120)).astype(np.float32)
    idx = np.stack([rng.permutation(120)[:70] for _ in range(2)]).astype(np.int64)
    return w, x, idx


@pytest.mark.parametrize("path", ["fallback", "native"])
@pytest.mark.parametrize("start,target", [(0, 4), (4, 0), (4, 4)])
def test_rewritten_level_matches_its_reference(case, path, start, target):
    w, x, idx = case
    model = with_accuracy_level(make_sgmm_model(w, 120, accuracy_level=start), target)
    y = run_model(model, {"X": x, "indices": idx}, path)
    assert nmse(y, sparse_gather_matmul_ref(x, idx, w, accuracy_level=target)) <= 1e-10
    assert nmse(y, sparse_gather_matmul_ref(x, idx, w, accuracy_level=4 - target)) > 1e-8  # the level changed
    # exactly the fallback functions the nodes use
    used = {n.overload for n in model.graph.node}
    assert {f.overload for f in model.functions} == used


def test_rejects_unknown_level(case):
    with pytest.raises(ValueError, match="0..4"):
        with_accuracy_level(make_sgmm_model(case[0], 120), 7)


def test_input_model_is_left_alone(case):
    m = make_sgmm_model(case[0], 120)
    before = m.SerializeToString()
    with_accuracy_level(m, 4)
    assert m.SerializeToString() == before
    onnx.checker.check_model(with_accuracy_level(m, 4))
