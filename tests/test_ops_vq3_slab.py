"""VQ3 in slab mode: a slab row decodes with the codebooks of the *original* row it holds.

A host runtime copies only a row's codes into a DRAM slab slot; the codebooks and scales stay whole
(indexed by original row group), because they are shared by every row of a group. So the codebook
group of a selected row must come from ``indices`` (the original row), never from ``slots`` (where
the runtime happened to put it). These cases use several row groups and slab rows ≠ D, so a
slot-derived group decodes with the wrong codebook (or, natively, fails the shape check).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from dipdeploy.ops.formats import OpWeights
from dipdeploy.ops.native import library_path, session_options
from dipdeploy.ops.nodes import make_sgmm_model
from dipdeploy.ops.reference import sparse_gather_matmul_ref
from dipdeploy.quant.api import dequantize_rows, quantize
from dipdeploy.quant.config import VQ3QuantConfig
from dipdeploy.quant.vq import VQTensor

D, O, N, K = 64, 64, 3, 16


def full_vq3() -> VQTensor:
    """A [D, O] VQ3 matrix with group 8 × 32: 8 row groups, 2 column groups."""
    w = np.random.default_rng(5).standard_normal((D, O)).astype(np.float32)
    vq = quantize(w, VQ3QuantConfig(group_size=256, max_group_cols=32, n_iter=2))
    assert (vq.group_rows, vq.group_cols) == (8, 32)
    return vq


def slab_of(vq: VQTensor, held: np.ndarray) -> OpWeights:
    """The weights a runtime binds: slab row s holds the codes of original row ``held[s]``; tables whole."""
    slab = VQTensor(vq.config, len(held), vq.cols, vq.group_rows, vq.group_cols, vq.codes[held].copy(),
                    vq.codebooks, vq.codebook_scales)
    return OpWeights.from_packed(slab)


def slab_case(slab_rows: int, seed: int):
    """X, indices (original rows, all held), slots (a slab row holding each) and the slab weights.

    A row held twice may be selected twice by one token; the dense sum counts it twice as the op does.
    """
    rng = np.random.default_rng(seed)
    held = rng.permutation(D)[:slab_rows] if slab_rows <= D else rng.permutation(
        np.concatenate([np.arange(D), rng.integers(0, D, slab_rows - D)]))
    vq = full_vq3()
    x = rng.standard_normal((N, D)).astype(np.float32)
    slots = np.stack([rng.choice(slab_rows, K, replace=False) for _ in range(N)]).astype(np.int64)
    return x, held[slots].astype(np.int64), slots, vq, slab_of(vq, held)


def dense(x: np.ndarray, idx: np.ndarray, vq: VQTensor) -> np.ndarray:
    """Y[n] = X[n, idx[n]] @ dequantised W[idx[n]]: what the slab must reproduce."""
    w = dequantize_rows(vq)
    return np.stack([x[n, idx[n]].astype(np.float64) @ w[idx[n]] for n in range(len(x))]).astype(np.float32)


def rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max())


CASES = [(40, 1), (100, 2)]  # slab smaller than D (a subset of rows) and larger (some rows twice)


@pytest.mark.parametrize("slab_rows,seed", CASES)
def test_reference_decodes_slab_rows_with_original_groups(slab_rows: int, seed: int) -> None:
    x, idx, slots, vq, w = slab_case(slab_rows, seed)
    assert rel_err(sparse_gather_matmul_ref(x, idx, w, slots), dense(x, idx, vq)) <= 1e-4


@pytest.mark.parametrize("path", ["fallback", "native"])
@pytest.mark.parametrize("slab_rows,seed", CASES)
def test_slab_matches_dense(slab_rows: int, seed: int, path: str) -> None:
    if path == "native" and library_path() is None:
        pytest.skip("native op library not built (run `make ops`)")
    x, idx, slots, vq, w = slab_case(slab_rows, seed)
    so = session_options(2, native=path == "native")
    sess = ort.InferenceSession(make_sgmm_model(w, D, slab=True).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    y = sess.run(None, {"X": x, "indices": idx, "slots": slots})[0]
    assert rel_err(y, dense(x, idx, vq)) <= 1e-4


def test_opweights_slab_gathers_codes_and_keeps_tables_whole() -> None:
    vq, held = full_vq3(), np.array([9, 3, 63, 3, 17])
    got, want = OpWeights.from_packed(vq).slab(held), slab_of(vq, held)
    assert got.rows == len(held) and got.attrs == want.attrs
    for a, b in zip(got.arrays, want.arrays):
        np.testing.assert_array_equal(a, b)


def test_native_rejects_codebooks_that_do_not_cover_d() -> None:
    """Slab mode: ngr must be ceil(D / group_rows), whatever the slab's row count."""
    if library_path() is None:
        pytest.skip("native op library not built (run `make ops`)")
    x, idx, slots, vq, w = slab_case(40, 1)
    so = session_options(1, native=True)
    sess = ort.InferenceSession(make_sgmm_model(w, 2 * D, slab=True).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    x2 = np.concatenate([x, x], axis=1)
    with pytest.raises(Exception, match=r"codebooks must be \[16, 2, 64, 2\].*over 128 rows.*got codebooks \[8, 2, 64, 2\]"):
        sess.run(None, {"X": x2, "indices": idx, "slots": slots})
