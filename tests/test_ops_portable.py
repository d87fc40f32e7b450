"""The portable (non-AVX2) kernel set, forced with $DIPDEPLOY_OPS_ISA=portable in a fresh process.

It is the set aarch64 builds run (plus NEON auto-vectorisation), so x86 CI must cover it too.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dipdeploy.ops.native import library_path

SCRIPT = r"""
import ctypes, numpy as np, onnxruntime as ort
from dipdeploy.ops.formats import OpWeights
from dipdeploy.ops.native import require_library, session_options
from dipdeploy.ops.nodes import make_sgmm_model, make_topk_model
from dipdeploy.ops.reference import sparse_gather_matmul_ref, topk_column_mask_ref
from dipdeploy.quant.api import quantize
from dipdeploy.quant.config import Block4QuantConfig, VQ3QuantConfig

lib = ctypes.CDLL(str(require_library()))
lib.dd_ops_isa.restype = ctypes.c_char_p
assert lib.dd_ops_isa() == b"portable", lib.dd_ops_isa()
rng = np.random.default_rng(0)
d, o = 200, 640
w = rng.standard_normal((d, o)).astype(np.float32)
held = rng.integers(0, d, 2 * d)  # a slab of 2·d slots holding rows of W (VQ3 codebooks stay whole)
weights = [OpWeights.from_matrix(w).slab(held), OpWeights.from_matrix(w.astype(np.float16)).slab(held),
           OpWeights.from_packed(quantize(w, Block4QuantConfig(block_size=64, symmetric=False))).slab(held),
           OpWeights.from_packed(quantize(w, VQ3QuantConfig(group_size=1024, max_group_cols=128, n_iter=2))).slab(held)]
x = rng.standard_normal((2, d)).astype(np.float32)
idx = np.stack([rng.permutation(d)[:150] for _ in range(2)])
slots = np.stack([rng.permutation(2 * d)[:150] for _ in range(2)])
for wt in weights:
    sess = ort.InferenceSession(make_sgmm_model(wt, d, slab=True).SerializeToString(), session_options(2, True))
    y = sess.run(None, {"X": x, "indices": idx, "slots": slots})[0]
    ref = sparse_gather_matmul_ref(x, idx, wt, slots)
    nmse = float(((y - ref) ** 2).sum() / (ref ** 2).sum())
    assert nmse <= 1e-10, (wt.format, nmse)
sess = ort.InferenceSession(make_topk_model(d, k=50).SerializeToString(), session_options(1, True))
assert (sess.run(None, {"X": x})[0] == topk_column_mask_ref(x, 50)).all()
print("ok")
"""


@pytest.mark.skipif(library_path() is None, reason="native op library not built (run `make ops`)")
def test_portable_kernels_match_reference() -> None:
    env = dict(os.environ, DIPDEPLOY_OPS_ISA="portable")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")
