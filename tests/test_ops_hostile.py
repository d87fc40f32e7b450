"""Hostile inputs through both op paths: a clean error (ORT raises) or the contract's defined result.

The inputs are ones that once crashed the native library or made it read undefined memory: VQ3
group attributes near INT64_MAX (the codebook count wrapped to 0 and empty codebooks were read),
output widths whose code size overflows int64, string attributes longer than a fixed buffer, bool
tensors holding bytes other than 0 and 1, and NaN/±Inf at accuracy level 4 (custom_ops/README.md).
Every native case runs in a fresh interpreter (:func:`isolated`), so a crash fails its test instead of
ending the run; ``make ops-sanitize`` runs this file against the ASan/UBSan build, where a sanitizer
report also ends that interpreter with an error.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from dipdeploy.ops.formats import OpWeights
from dipdeploy.ops.native import library_path, session_options
from dipdeploy.ops.nodes import make_sgmm_model, make_topk_model
from dipdeploy.ops.reference import level4_takes_int8, sparse_gather_matmul_ref, topk_column_mask_ref

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
INT64_MAX = 2**63 - 1
ORT_ERRORS = (ort.capi.onnxruntime_pybind11_state.InvalidArgument, ort.capi.onnxruntime_pybind11_state.Fail,
              ort.capi.onnxruntime_pybind11_state.RuntimeException)
native_only = pytest.mark.skipif(library_path() is None, reason="native op library not built (run `make ops`)")


def isolated(case: str, *args) -> None:
    """Runs ``case(*args)`` of this module in a new interpreter (same environment, so the same library,
    kernel set and sanitizer settings); a crash or sanitizer report fails the calling test."""
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_ops_hostile as t; t.{case}(*{args!r})"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    # A sanitizer report starts with its one-line summary, then a long stack: keep those lines whole.
    reports = [ln for ln in done.stderr.splitlines() if "runtime error:" in ln or "Sanitizer" in ln]
    assert done.returncode == 0, (
        f"{case}{args} ended with status {done.returncode}:\n" + "\n".join(reports[:20])
        + f"\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )


def paths(case: str):
    """Parameters (path, runner): the fallback in this process, the native library in a fresh one."""
    return [
        pytest.param("fallback", lambda *a: globals()[case]("fallback", *a), id="fallback"),
        pytest.param("native", lambda *a: isolated(case, "native", *a), id="native", marks=native_only),
    ]


def session(model: onnx.ModelProto, path: str) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), session_options(1, path == "native"),
                                providers=["CPUExecutionProvider"])


def set_attr(model: onnx.ModelProto, name: str, value) -> onnx.ModelProto:
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept + [onnx.helper.make_attribute(name, value)])
    return model


def set_init(model: onnx.ModelProto, i: int, arr: np.ndarray) -> onnx.ModelProto:
    model.graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(arr, model.graph.initializer[i].name))
    return model


# --- VQ3 group shape and output width near INT64_MAX ------------------------------------------------


def vq3_case():
    from test_ops_harness import weights_for

    w = weights_for("vq3", 64, 96)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    idx = np.stack([rng.permutation(64)[:24] for _ in range(2)]).astype(np.int64)
    return w, x, idx


GROUPS = [(INT64_MAX, INT64_MAX - 1), (2**62, 2), (1, INT64_MAX - 1), (INT64_MAX - 64, 2**62)]


def case_vq3_huge_groups_empty_codebooks(path: str, gr: int, gc: int) -> None:
    w, x, idx = vq3_case()
    model = set_attr(set_attr(make_sgmm_model(w, 64), "group_rows", gr), "group_cols", gc)
    set_init(set_init(model, 1, np.zeros((0, 0, 64, 2), np.int8)), 2, np.zeros((0, 0), np.float16))
    match = "codebooks must be" if path == "native" else None  # the fallback's Gather names no input
    with pytest.raises(ORT_ERRORS, match=match):
        session(model, path).run(None, {"X": x, "indices": idx})


@pytest.mark.parametrize("gr,gc", GROUPS)
@pytest.mark.parametrize("path,run", paths("case_vq3_huge_groups_empty_codebooks"))
def test_vq3_huge_groups_with_empty_codebooks_are_an_error(path, run, gr, gc) -> None:
    run(gr, gc)


def case_vq3_huge_groups_one_codebook(path: str, gr: int, gc: int) -> None:
    """Groups larger than the matrix are one group: codebooks [1, 1, 64, 2] are the valid shape, and the
    native result equals the fallback's (an independent decode of the same group arithmetic)."""
    w, x, idx = vq3_case()
    if gr < 64 or gc < 96:
        return  # more than one group along an axis: the single-codebook shape does not apply
    model = set_attr(set_attr(make_sgmm_model(w, 64), "group_rows", gr), "group_cols", gc)
    set_init(set_init(model, 1, w.arrays[1][:1, :1].copy()), 2, w.arrays[2][:1, :1].copy())
    y = session(model, path).run(None, {"X": x, "indices": idx})[0]
    y_fb = session(model, "fallback").run(None, {"X": x, "indices": idx})[0]
    assert np.isfinite(y).all() and np.abs(y).max() > 0
    np.testing.assert_allclose(y, y_fb, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gr,gc", [g for g in GROUPS if g[0] >= 64 and g[1] >= 96])
@native_only
def test_vq3_huge_groups_are_one_group(gr, gc) -> None:
    isolated("case_vq3_huge_groups_one_codebook", "native", gr, gc)


def case_huge_cols(path: str, fmt: str, cols: int) -> None:
    from test_ops_harness import weights_for

    w = weights_for(fmt, 64, 96)
    x, idx = vq3_case()[1:]
    model = set_attr(make_sgmm_model(w, 64), "cols", cols)
    with pytest.raises(ORT_ERRORS, match="cols"):
        session(model, path).run(None, {"X": x, "indices": idx})


# The fallback is not run here: its body would try to build a Range of cols/2 elements.
@native_only
@pytest.mark.parametrize("fmt,cols", [("vq3", INT64_MAX - 1), ("vq3", 2**62), ("vq3", -2), ("bq4", INT64_MAX),
                                      ("bq4", -INT64_MAX), ("fp32", INT64_MAX)])
def test_huge_cols_are_an_error(fmt, cols) -> None:
    isolated("case_huge_cols", "native", fmt, cols)


# --- string attributes: compared exactly, whatever their length -------------------------------------

BAD_SCORES = ["abs" + "x" * 29, "abs" + "x" * 60, "a" * 32, "wina" + " " * 40, "abs\x00", "ABS", ""]


def case_long_score(path: str, score: str) -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 32)).astype(np.float32)
    model = set_attr(make_topk_model(32, k=4), "score", score.encode())
    if path == "native":
        with pytest.raises(ORT_ERRORS, match=r"score='.*' is not allowed \(%d bytes\)" % len(score.encode())):
            session(model, path)
        return
    # The fallback function is picked by the node's overload (kattr_abs_dip), not by the attribute.
    np.testing.assert_array_equal(session(model, path).run(None, {"X": x})[0], topk_column_mask_ref(x, 4))


@pytest.mark.parametrize("score", BAD_SCORES)
@pytest.mark.parametrize("path,run", paths("case_long_score"))
def test_score_attribute_is_compared_exactly(path, run, score) -> None:
    run(score)


def case_long_format(path: str, fmt: str) -> None:
    from test_ops_harness import weights_for

    model = set_attr(make_sgmm_model(weights_for("fp32", 64, 96), 64), "format", fmt.encode())
    with pytest.raises(ORT_ERRORS, match=r"format='.*' is not allowed \(%d bytes\)" % len(fmt.encode())):
        session(model, path)


@native_only
@pytest.mark.parametrize("fmt", ["fp32" + "x" * 28, "fp32" + "x" * 100, "fp32\x00"])
def test_format_attribute_is_compared_exactly(fmt) -> None:
    isolated("case_long_format", "native", fmt)


# --- bool inputs: every nonzero byte is true ------------------------------------------------------


def case_bool_bytes(path: str, per_row: bool) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    raw = rng.integers(0, 256, (3, 64) if per_row else (64,), dtype=np.uint8)
    raw[..., :8] = np.arange(248, 256, dtype=np.uint8)  # bytes far from 1
    assert (raw > 1).sum() > raw.size // 2
    c = np.ascontiguousarray(np.broadcast_to(raw, (3, 64))) if per_row else raw
    model = make_topk_model(64, k=8, cache=True, gamma=0.25, fixed_top_n=2)
    if not per_row:  # declare C as [D]
        model.graph.input[1].CopyFrom(onnx.helper.make_tensor_value_info("C", onnx.TensorProto.BOOL, [64]))
    sess = session(model, path)
    got = sess.run(None, {"X": x, "C": c.view(bool)})[0]
    want = topk_column_mask_ref(x, 8, c != 0, gamma=0.25, fixed_top_n=2)
    np.testing.assert_array_equal(got, want)
    # and the canonical bools give the same selection
    np.testing.assert_array_equal(sess.run(None, {"X": x, "C": c != 0})[0], want)


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("path,run", paths("case_bool_bytes"))
def test_bool_bytes_above_one_are_true(path, run, per_row) -> None:
    run(per_row)


# --- accuracy level 4 with NaN / ±Inf: such rows are computed as at level 0 ------------------------

HOSTILE = ["x=+inf", "x=-inf", "x=nan", "scale=+inf", "scale=nan", "overflow", "tiny"]


def level4_case(kind: str):
    from dipdeploy.quant.api import quantize
    from dipdeploy.quant.config import Block4QuantConfig

    rng = np.random.default_rng(8)
    packed = quantize(rng.standard_normal((120, 256)).astype(np.float32), Block4QuantConfig())
    x = rng.standard_normal((2, 120)).astype(np.float32)
    idx = np.stack([rng.permutation(120)[:70] for _ in range(2)]).astype(np.int64)
    row = next(int(r) for r in idx[1] if r not in idx[0])  # selected by output row 1 only
    if kind == "tiny":
        x[1] *= np.float32(1e-38)  # every |c| of row 1 below 127 / FLT_MAX: 127 / max|c| overflows
    elif kind.startswith("x="):
        x[1, row] = np.float32(kind[2:])
    else:
        packed.scales[row, 2] = {"scale=+inf": np.inf, "scale=nan": np.nan, "overflow": 65504.0}[kind]
        if kind == "overflow":
            x[1, row] = np.float32(1e35)  # finite, but x · 65504 is not
    return OpWeights.from_packed(packed), x, idx


def case_level4_non_finite(path: str, kind: str) -> None:
    w, x, idx = level4_case(kind)
    y = session(make_sgmm_model(w, 120, accuracy_level=4), path).run(None, {"X": x, "indices": idx})[0]
    ref0 = sparse_gather_matmul_ref(x, idx, w, accuracy_level=0)
    ref4 = sparse_gather_matmul_ref(x, idx, w, accuracy_level=4)
    assert not level4_takes_int8(x[1, idx[1]], w.packed.codes_rows(idx[1])[1])
    assert level4_takes_int8(x[0, idx[0]], w.packed.codes_rows(idx[0])[1])
    if kind == "tiny":
        assert np.isfinite(ref4[1]).all() and 0 < np.abs(ref4[1]).max() < 1e-30
    else:
        assert not np.isfinite(ref4[1]).all(), "the hostile value must reach row 1"
    # Row 1 as at level 0: NaN where level 0 has NaN, infinities of the same sign, finite values close
    # (relative to the row's finite values: "tiny" is ~1e-37 throughout).
    atol = 1e-5 * np.abs(ref4[1][np.isfinite(ref4[1])]).max(initial=0.0)
    np.testing.assert_allclose(y[1], ref4[1], rtol=1e-4, atol=atol)
    if kind not in ("overflow", "tiny"):
        # Level 0 proper (x · w): the same. Not for "overflow": in the coefficient order x · s is Inf
        # and gives NaN where (q − z) = 0, x · w gives 0 there (README, "accuracy level"); not for
        # "tiny": x · s is subnormal in float32 and loses digits that x · w keeps.
        np.testing.assert_allclose(ref4[1], ref0[1], rtol=1e-5, atol=atol)
    # Row 0 is finite and stays on the int8 path (it differs from level 0 by the int8 rounding).
    err = float(((y[0].astype(np.float64) - ref4[0]) ** 2).sum() / (ref4[0].astype(np.float64) ** 2).sum())
    assert np.isfinite(y[0]).all() and err <= 1e-10
    assert not np.allclose(ref4[0], ref0[0], rtol=1e-6, atol=0)


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("path,run", paths("case_level4_non_finite"))
def test_level4_non_finite_rows_follow_level0(path, run, kind) -> None:
    run(kind)
