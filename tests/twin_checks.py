"""Checks the runtime tests share: ``model.onnx`` teacher forced with its selections exposed, against
which another ORT run (the host runtime's per-layer graphs) is judged by ``dipdeploy.agreement``."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from dipdeploy.agreement import Tolerance, compare_runs
from dipdeploy.export.validate import ort_teacher_forced_selections
from dipdeploy.ops.native import session_options
from dipdeploy.ops.nodes import with_accuracy_level, with_selection_outputs


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


def assert_runs_agree(ref_logits, ref_sel, got_logits, got_sel, prompt_len: int, tol: Tolerance, tokens=()):
    """Both fed the same ``tokens``: ``dipdeploy.agreement.compare_runs`` must hold."""
    res = compare_runs(ref_logits, tokens, ref_sel, got_logits, tokens, got_sel, prompt_len, tol)
    assert res.ok, res.describe()
    return res


def assert_generations_agree(ref, got) -> None:
    """``got`` free-running against the reference generation ``ref`` (greedy, ``keep_logits``): tokens equal
    up to a near-tie of the reference's logits, and the logits close on the steps before any parting."""
    from dipdeploy.agreement import compare_free_running, compare_logits, tolerance_for

    tol = tolerance_for(sparse=True, quantised=True)
    run = compare_free_running(ref.logits, ref.tokens, got.tokens, tie=tol.tie)
    assert run.ok, run
    same = run.first_difference if run.first_difference is not None else len(ref.tokens)
    assert same >= 1
    logits = compare_logits(ref.logits[:same], got.logits[:same], tol)
    assert logits.ok, logits.describe()
