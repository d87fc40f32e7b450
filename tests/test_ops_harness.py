"""One harness for both custom ops: op × format × shape × sparsity, each case against the numpy reference.

Every case runs on two paths: ``fallback`` (stock ORT, no library: the model-local functions) and
``native`` (the library registered). Each op has its named metric and threshold:

- TopKColumnMask: ``mismatches`` (indices that differ from ``topk_column_mask_ref``), threshold 0;
- SparseGatherMatMul: ``nmse`` (‖y − ref‖² / ‖ref‖²) ≤ 1e-10 and ``max_abs`` ≤ 1e-5 · max|ref|
  (the reference sums in float64; kernels sum in float32 in another order).

Native cases skip with the reason when the library is not built (``make ops``); CI builds it.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from dipdeploy.agreement import TOPK_TIE, compare_topk
from dipdeploy.ops.formats import OpWeights
from dipdeploy.ops.native import library_path, session_options
from dipdeploy.ops.nodes import make_sgmm_model, make_topk_model
from dipdeploy.ops.reference import sparse_gather_matmul_ref, topk_column_mask_ref, topk_column_mask_scores
from dipdeploy.quant.api import quantize
from dipdeploy.quant.config import Block4QuantConfig, VQ3QuantConfig

# compared across implementations: CI runs these under every kernel set too (Makefile: test-kernel-sets)
pytestmark = pytest.mark.numerics

PATHS = ("fallback", "native")
NATIVE_MISSING = library_path() is None


def run_model(model: onnx.ModelProto, feeds: dict, path: str, threads: int = 2) -> np.ndarray:
    if path == "native" and NATIVE_MISSING:
        pytest.skip("native op library not built (run `make ops`)")
    so = session_options(threads, native=path == "native")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


# --- weights per format (small, deterministic, cached) -------------------------------------------

FORMAT_MAKERS = {
    "fp32": lambda w: OpWeights.from_matrix(w),
    "fp16": lambda w: OpWeights.from_matrix(w.astype(np.float16)),
    "bq4": lambda w: OpWeights.from_packed(quantize(w, Block4QuantConfig(block_size=32))),
    "bq4_asym64": lambda w: OpWeights.from_packed(quantize(w, Block4QuantConfig(block_size=64, symmetric=False))),
    "vq3": lambda w: OpWeights.from_packed(quantize(w, VQ3QuantConfig(group_size=1024, max_group_cols=128, n_iter=2))),
}


@functools.lru_cache(maxsize=None)
def weights_for(fmt: str, rows: int, cols: int) -> OpWeights:
    w = np.random.default_rng(rows * 7 + cols).standard_normal((rows, cols)).astype(np.float32)
    return FORMAT_MAKERS[fmt](w)


# --- SparseGatherMatMul cases ---------------------------------------------------------------------


@dataclass(frozen=True)
class SgmmCase:
    fmt: str
    n: int
    d: int
    o: int
    rho: float
    slab: bool = False
    level: int = 0  # accuracy_level

    def __str__(self) -> str:
        return (f"{self.fmt}-n{self.n}-d{self.d}-o{self.o}-rho{self.rho}{'-slab' if self.slab else ''}"
                + (f"-a{self.level}" if self.level else ""))


SGMM_CASES = [
    SgmmCase(fmt, n, d, o, rho, slab)
    for fmt in FORMAT_MAKERS
    for (n, d, o) in ((1, 64, 96), (3, 96, 640), (2, 520, 200))
    for rho in (0.25, 0.5, 1.0)
    for slab in (False, True)
    if not (slab and rho == 1.0)
] + [
    SgmmCase(fmt, n, d, o, rho, slab, level=4)
    for fmt in ("bq4", "bq4_asym64", "fp32")
    for (n, d, o) in ((1, 64, 96), (3, 96, 640), (2, 520, 200), (1, 80, 2112))
    for rho in (0.25, 1.0)
    for slab in (False, True)
    if not (slab and rho == 1.0)
]


def sgmm_inputs(case: SgmmCase):
    rng = np.random.default_rng(zlib.crc32(str(case).encode()))
    k = max(1, int(case.rho * case.d))
    x = rng.standard_normal((case.n, case.d)).astype(np.float32)
    idx = np.stack([rng.permutation(case.d)[:k] for _ in range(case.n)]).astype(np.int64)
    if case.slab:
        # A slab of 2·d cached rows of the d-row matrix, as a runtime binds it (per-row arrays gathered,
        # VQ3 codebooks whole); the op reads W through slots and X (and VQ3's group) through indices.
        # Slots are random, not the slab rows holding indices: the contract holds for any slot.
        w = weights_for(case.fmt, case.d, case.o).slab(rng.integers(0, case.d, 2 * case.d))
        slots = np.stack([rng.permutation(2 * case.d)[:k] for _ in range(case.n)]).astype(np.int64)
        return x, idx, w, slots
    return x, idx, weights_for(case.fmt, case.d, case.o), None


def sgmm_errors(y: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    err = (y.astype(np.float64) - ref.astype(np.float64))
    return {
        "nmse": float((err**2).sum() / max((ref.astype(np.float64) ** 2).sum(), 1e-30)),
        "max_abs_rel": float(np.abs(err).max() / max(np.abs(ref).max(), 1e-30)),
    }


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", SGMM_CASES, ids=str)
def test_sgmm_matches_reference(case: SgmmCase, path: str) -> None:
    x, idx, w, slots = sgmm_inputs(case)
    ref = sparse_gather_matmul_ref(x, idx, w, slots, accuracy_level=case.level)
    feeds = {"X": x, "indices": idx} | ({"slots": slots} if slots is not None else {})
    y = run_model(make_sgmm_model(w, case.d, slab=slots is not None, accuracy_level=case.level), feeds, path)
    assert y.shape == ref.shape and y.dtype == np.float32
    errs = sgmm_errors(y, ref)
    assert errs["nmse"] <= 1e-10, errs
    assert errs["max_abs_rel"] <= 1e-5, errs


def test_sgmm_level4_is_int8_and_close_to_float() -> None:
    """Level 4 on BQ4 really quantises the coefficients (differs from float32), within int8 rounding."""
    x, idx, w, _ = sgmm_inputs(SgmmCase("bq4", 3, 520, 640, 0.5))
    exact = sparse_gather_matmul_ref(x, idx, w)
    int8 = sparse_gather_matmul_ref(x, idx, w, accuracy_level=4)
    nmse = sgmm_errors(int8, exact)["nmse"]
    assert 1e-8 < nmse < 1e-4, nmse


@pytest.mark.parametrize("threads", [1, 2])
def test_sgmm_native_thread_counts_agree(threads: int) -> None:
    case = SgmmCase("bq4", 2, 96, 640, 0.5)
    x, idx, w, _ = sgmm_inputs(case)
    y = run_model(make_sgmm_model(w, case.d), {"X": x, "indices": idx}, "native", threads=threads)
    assert sgmm_errors(y, sparse_gather_matmul_ref(x, idx, w))["nmse"] <= 1e-10


# --- TopKColumnMask cases --------------------------------------------------------------------------


@dataclass(frozen=True)
class TopKCase:
    n: int
    d: int
    rho: float
    k_input: bool = True
    cache: str = ""  # "", "row" ([D]) or "batch" ([N, D])
    gamma: float = 1.0
    fixed_top_n: int = 0
    wina: bool = False
    ties: bool = False

    def __str__(self) -> str:
        return "-".join(f"{k}={v}" for k, v in self.__dict__.items())


TOPK_CASES = [
    TopKCase(n, d, rho, k_input, cache, gamma, fixed, wina, ties)
    for (n, d) in ((1, 64), (4, 300))
    for rho in (0.25, 0.5)
    for (k_input, cache, gamma, fixed, wina, ties) in (
        (True, "", 1.0, 0, False, False),
        (False, "", 1.0, 0, False, True),
        (True, "row", 0.2, 0, False, True),
        (True, "batch", 0.2, 3, False, False),
        (False, "batch", 0.0, 2, False, True),
        (True, "row", 1.0, 0, False, False),
        (True, "", 1.0, 0, True, False),
        (True, "batch", 0.3, 1, True, True),
    )
]


def topk_inputs(case: TopKCase):
    rng = np.random.default_rng(zlib.crc32(str(case).encode()))
    x = rng.standard_normal((case.n, case.d)).astype(np.float32)
    if case.ties:
        # Ties in |x| and in the score: quantised magnitudes, signs flipped, and an all-zero row.
        x = np.round(x * 2) / 2
        x[:, 1::3] = -x[:, ::3][:, : x[:, 1::3].shape[1]]
        x[0] = 0.0 if case.n > 1 else x[0]
    k = max(1, int(case.rho * case.d))
    shape = {"row": (case.d,), "batch": (case.n, case.d)}.get(case.cache)
    resident = rng.random(shape) < 0.5 if shape else None
    colnorm = rng.random(case.d).astype(np.float32) + 0.5 if case.wina else None
    return x, k, resident, colnorm


def topk_model(case: TopKCase, k: int, resident: np.ndarray | None) -> onnx.ModelProto:
    model = make_topk_model(
        case.d, k=None if case.k_input else k, cache=resident is not None, wina=case.wina,
        gamma=case.gamma, fixed_top_n=case.fixed_top_n,
    )
    if resident is not None and resident.ndim == 1:
        c = next(i for i in model.graph.input if i.name == "C")
        c.type.tensor_type.shape.ClearField("dim")
        c.type.tensor_type.shape.dim.add().dim_value = case.d
    return model


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", TOPK_CASES, ids=str)
def test_topk_matches_reference(case: TopKCase, path: str) -> None:
    x, k, resident, colnorm = topk_inputs(case)
    ref = topk_column_mask_ref(x, k, resident, case.gamma, case.fixed_top_n, colnorm)
    feeds = {"X": x}
    if case.k_input:
        feeds["K"] = np.array([k], dtype=np.int64)
    if resident is not None:
        feeds["C"] = resident
    if colnorm is not None:
        feeds["colnorm"] = colnorm
    got = run_model(topk_model(case, k, resident), feeds, path)
    assert got.shape == (case.n, k) and got.dtype == np.int64
    # the same set up to near-ties of the K-th score, largest first (dipdeploy.agreement)
    scores = topk_column_mask_scores(x, resident, case.gamma, case.fixed_top_n, colnorm)
    res = compare_topk(scores, got, k)
    assert res.ok, res.describe()
    ranked = np.take_along_axis(scores, got, -1)
    assert (np.diff(ranked, axis=-1) <= TOPK_TIE * scores.max(-1, keepdims=True)).all(), "not largest first"


def test_topk_ties_go_to_the_lower_index() -> None:
    x = np.array([[1.0, -3.0, 3.0, 2.0, -3.0, 0.0]], dtype=np.float32)
    expect = np.array([[1, 2, 4, 3]])
    for path in PATHS:
        got = run_model(make_topk_model(6, k=4), {"X": x}, path)
        np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(topk_column_mask_ref(x, 4), expect)


# --- one model with both ops chained (what the exporter emits per MLP) ------------------------------


def test_topk_then_sgmm_chain() -> None:
    from onnx import TensorProto, helper

    from dipdeploy.ops.fallback import fallback_functions
    from dipdeploy.ops.nodes import sparse_gather_matmul_node, topk_column_mask_node
    from dipdeploy.ops.schemas import DOMAIN, IR_VERSION, ONNX_OPSET, OPSET_VERSION

    d, o, k = 64, 96, 16
    w = weights_for("bq4", d, o)
    mask, tv = topk_column_mask_node("/model/layers.0/mlp/TopKColumnMask", "x", "idx", k=k)
    names = [f"/model/layers.0/mlp/up_gate/w{i}" for i in range(len(w.arrays))]
    mm, sv = sparse_gather_matmul_node("/model/layers.0/mlp/up_gate/SparseGatherMatMul", "x", "idx", names, "y",
                                       fmt="bq4", cols=o)
    graph = helper.make_graph(
        [mask, mm], "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", o])],
        initializer=[onnx.numpy_helper.from_array(a, n) for a, n in zip(w.arrays, names)],
    )
    model = helper.make_model(graph, functions=fallback_functions([tv], [sv]), ir_version=IR_VERSION,
                              opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, OPSET_VERSION)])
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(1).standard_normal((2, d)).astype(np.float32)
    ref = sparse_gather_matmul_ref(x, topk_column_mask_ref(x, k), w)
    for path in PATHS:
        assert sgmm_errors(run_model(model, {"x": x}, path), ref)["nmse"] <= 1e-10
