"""Checks the runtime tests share: two implementations fed the same tokens agree by the project's rule
(``dipdeploy.agreement``), near-ties of the top-K allowed, nothing else."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from dipdeploy.agreement import Tolerance, compare_logits, compare_topk
from dipdeploy.export.validate import ort_teacher_forced_selections, with_selection_outputs
from dipdeploy.ops.native import session_options
from dipdeploy.ops.nodes import with_accuracy_level


def model_onnx_run(path: Path, spec, prompt, tokens, native: bool = False, level: int | None = None):
    """``model.onnx`` teacher forced: its logits per step and, per fed position, its selections and the
    TopKColumnMask inputs X (under (layer, group, "x"))."""
    proto, names = with_selection_outputs(onnx.load(str(path), load_external_data=False), scored=True)
    if level is not None:
        proto = with_accuracy_level(proto, level)
    checked = path.with_name("model.checked.onnx")
    onnx.save(proto, str(checked))
    try:
        sess = ort.InferenceSession(str(checked), session_options(1, native), providers=["CPUExecutionProvider"])
        _, logits, sel = ort_teacher_forced_selections(sess, spec, np.asarray(prompt), list(tokens), names)
    finally:
        checked.unlink()
    return logits, sel


def assert_runs_agree(ref_logits, ref_sel, got_logits, got_sel, prompt_len: int, tol: Tolerance):
    """Two ORT runs of plain DIP (γ = 1, score |X|) fed the same tokens: the same selections, and the
    logits within ``tol``, up to the first position where a selection differs; that difference must be
    a near-tie of the reference's |X| (``compare_topk``). After it the two compute different (equally
    valid) sparse functions, so the logits of later steps are not compared. Returns that position."""
    first = None
    for p, (a, b) in enumerate(zip(ref_sel, got_sel)):
        for key in [k for k in a if len(k) == 2]:
            if set(np.asarray(a[key]).tolist()) != set(np.asarray(b[key]).tolist()):
                res = compare_topk(np.abs(a[key + ("x",)]), b[key], len(a[key]))
                assert res.ok, f"position {p}, layer {key[0]} {key[1]}: {res.describe()}"
                first = p
                break
        if first is not None:
            break
    # step 0 holds every prompt position, step j >= 1 position prompt_len - 1 + j
    steps = len(ref_logits) if first is None else max(0, first - prompt_len + 1)
    res = compare_logits(ref_logits[:steps], got_logits[:steps], tol)
    assert res.ok, res.describe()
    return first
