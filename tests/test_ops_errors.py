"""Bad input gives an error (an ORT status or a ValueError naming the fix), never a crash or a bad read.

Out-of-range indices and wrong dtypes/shapes reach the native kernel, which must refuse them before
touching memory; the stock-ORT fallback refuses out-of-range indices through Gather's own checks.
Each native case runs in this process: a crash would take the test run down with it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from dipdeploy.ops.formats import OpWeights
from dipdeploy.ops.native import ENV_LIB, library_path, require_library, session_options
from dipdeploy.ops.nodes import make_sgmm_model, make_topk_model, sparse_gather_matmul_node, topk_column_mask_node

native_only = pytest.mark.skipif(library_path() is None, reason="native op library not built (run `make ops`)")
RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 32)).astype(np.float32)
W = OpWeights.from_matrix(RNG.standard_normal((32, 40)).astype(np.float32))


def session(model: onnx.ModelProto, native: bool) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), session_options(1, native), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    "native,bad",
    # The fallback follows ONNX Gather, where -1 counts from the end (README: negative indices are
    # outside the contract); the native kernel refuses it.
    [(False, 32), (False, 10**12)] + [pytest.param(True, b, marks=native_only) for b in (32, -1, 10**12)],
)
def test_sgmm_out_of_range_index_is_an_error(native: bool, bad: int) -> None:
    idx = np.tile(np.arange(8, dtype=np.int64), (2, 1))
    idx[1, 3] = bad
    with pytest.raises((ort.capi.onnxruntime_pybind11_state.InvalidArgument, ort.capi.onnxruntime_pybind11_state.Fail),
                       match="out of|range|bounds"):
        session(make_sgmm_model(W, 32), native).run(None, {"X": X, "indices": idx})


@native_only
def test_sgmm_out_of_range_slot_is_an_error() -> None:
    idx = np.tile(np.arange(8, dtype=np.int64), (2, 1))
    slots = idx.copy()
    slots[0, 0] = 32
    with pytest.raises(Exception, match="slots.*out of range"):
        session(make_sgmm_model(W, 32, slab=True), True).run(None, {"X": X, "indices": idx, "slots": slots})


@native_only
def test_sgmm_wrong_weight_dtype_is_an_error() -> None:
    model = make_sgmm_model(W, 32)
    # Declare format fp32 but store W as float16: only the kernel can notice (the weights input is variadic).
    w16 = W.arrays[0].astype(np.float16)
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(w16, model.graph.initializer[0].name))
    idx = np.zeros((2, 4), dtype=np.int64)
    with pytest.raises(Exception, match="'W' must be float32, got float16"):
        session(model, True).run(None, {"X": X, "indices": idx})


@native_only
def test_sgmm_bad_quant_shapes_are_errors() -> None:
    from dipdeploy.quant.api import quantize
    from dipdeploy.quant.config import Block4QuantConfig

    w = OpWeights.from_packed(quantize(W.arrays[0], Block4QuantConfig(block_size=32)))
    model = make_sgmm_model(w, 32)
    scales = onnx.numpy_helper.to_array(model.graph.initializer[1])[:-1]  # one row short
    model.graph.initializer[1].CopyFrom(onnx.numpy_helper.from_array(scales, model.graph.initializer[1].name))
    with pytest.raises(Exception, match="scales .* do not match qweight"):
        session(model, True).run(None, {"X": X, "indices": np.zeros((2, 4), dtype=np.int64)})


@native_only
def test_sgmm_unknown_format_fails_at_session_creation() -> None:
    model = make_sgmm_model(W, 32)
    next(a for a in model.graph.node[0].attribute if a.name == "format").s = b"int2"
    with pytest.raises(Exception, match="format='int2' is not allowed"):
        session(model, True)


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=native_only)])
def test_topk_k_larger_than_d_is_an_error(native: bool) -> None:
    with pytest.raises(Exception):
        session(make_topk_model(32), native).run(None, {"X": X, "K": np.array([33], dtype=np.int64)})


@native_only
@pytest.mark.parametrize("k", [0, -5, 33])
def test_topk_native_k_out_of_range_names_the_bounds(k: int) -> None:
    with pytest.raises(Exception, match=r"k=-?\d+ must lie in \[1, D=32\]"):
        session(make_topk_model(32), True).run(None, {"X": X, "K": np.array([k], dtype=np.int64)})


@native_only
def test_topk_cache_of_wrong_shape_is_an_error() -> None:
    model = make_topk_model(32, k=4, cache=True, gamma=0.5)
    with pytest.raises(Exception):
        session(model, True).run(None, {"X": X, "C": np.zeros((3, 32), dtype=bool)})


def test_builders_reject_bad_arguments() -> None:
    with pytest.raises(ValueError, match="exactly one of k"):
        topk_column_mask_node("n", "x", "y")
    with pytest.raises(ValueError, match="gamma"):
        topk_column_mask_node("n", "x", "y", k=3, gamma=1.5)
    with pytest.raises(ValueError, match="takes 1..1 weight inputs"):
        sparse_gather_matmul_node("n", "x", "i", ["a", "b"], "y", fmt="fp32", cols=4)
    with pytest.raises(ValueError, match="not a SparseGatherMatMul weight format"):
        sparse_gather_matmul_node("n", "x", "i", ["a"], "y", fmt="int2", cols=4)
    with pytest.raises(ValueError, match="vq3 needs group_rows"):
        sparse_gather_matmul_node("n", "x", "i", ["a", "b", "c"], "y", fmt="vq3", cols=4)
    with pytest.raises(ValueError, match="float32 or float16"):
        OpWeights.from_matrix(np.zeros((4, 4), dtype=np.int32))


def test_missing_library_error_names_the_fix(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(ENV_LIB, str(tmp_path / "nope.so"))
    with pytest.raises(FileNotFoundError, match="unset it"):
        require_library()


def test_import_has_no_side_effects() -> None:
    code = (
        "import sys, onnx.defs, dipdeploy, dipdeploy.ops, dipdeploy.ops.nodes, dipdeploy.ops.native;"
        "assert not onnx.defs.has('TopKColumnMask', 'ai.dipdeploy');"
        "assert 'onnxruntime' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != ENV_LIB}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_register_schemas_makes_onnx_accept_the_ops() -> None:
    from dipdeploy.ops.schemas import register_schemas

    register_schemas()
    register_schemas()  # idempotent
    assert onnx.defs.has("TopKColumnMask", "ai.dipdeploy") and onnx.defs.has("SparseGatherMatMul", "ai.dipdeploy")
    onnx.checker.check_model(make_sgmm_model(W, 32), full_check=True)
    onnx.checker.check_model(make_topk_model(32, cache=True, gamma=0.5), full_check=True)


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "bq4", "bq4_asym64", "vq3"])
@pytest.mark.parametrize("slab", [False, True])
def test_every_sgmm_variant_passes_checker_and_shape_inference(fmt: str, slab: bool) -> None:
    from test_ops_harness import weights_for

    model = make_sgmm_model(weights_for(fmt, 64, 96), 64, slab=slab)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    assert inferred.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


@pytest.mark.parametrize("k_attr", [False, True])
@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("wina", [False, True])
def test_every_topk_variant_passes_checker(k_attr: bool, cache: bool, wina: bool) -> None:
    model = make_topk_model(32, k=4 if k_attr else None, cache=cache, wina=wina, gamma=0.5)
    onnx.checker.check_model(model, full_check=True)
