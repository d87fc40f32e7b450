"""The one agreement rule (dipdeploy.agreement): near-ties pass, real mismatches fail, for tokens and for
top-K sets; the torch reference follows the one tie rule."""

import numpy as np
import pytest

from dipdeploy.agreement import (TOPK_TIE, Tolerance, compare_free_running, compare_logits, compare_topk,
                                 tolerance_for)

# compared across implementations: CI runs these under every kernel set too (Makefile: test-kernel-sets)
pytestmark = pytest.mark.numerics

V = 50


def _steps(seed=0, n=8):
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 3, V) for _ in range(n)]


def _with_top2(logits: np.ndarray, margin: float) -> np.ndarray:
    """Logits whose top-1 (index 7) leads the runner-up (index 11) by ``margin``."""
    out = logits.copy()
    out[7], out[11] = out.max() + 5.0, out.max() + 5.0 - margin
    return out


def test_equal_logits_agree_and_rounding_noise_stays_inside_the_tolerance():
    ref = _steps()
    got = [r + np.random.default_rng(1).uniform(-4e-4, 4e-4, V) for r in ref]
    res = compare_logits(ref, got, Tolerance(logits=1e-3, tie=1e-3))
    assert res.ok and res.near_ties == [] and res.tokens_agree == len(ref), res.describe()
    assert 0 < res.max_abs_diff <= 4e-4


def test_injected_near_tie_passes_and_is_counted():
    """Logits perturbed by less than the tolerance around a close top-2: the other pick is a near-tie."""
    tol = Tolerance(logits=1e-2, tie=1e-2)
    ref = _steps()
    ref[3] = _with_top2(ref[3], margin=4e-3)
    got = [r.copy() for r in ref]
    got[3][7] -= 3e-3
    got[3][11] += 3e-3  # now 11 leads by 2e-3: both sides see the two within the tie margin
    res = compare_logits(ref, got, tol)
    assert res.ok, res.describe()
    assert res.near_ties == [3] and res.mismatches == [] and res.tokens_agree == len(ref) - 1


def test_injected_real_mismatch_fails():
    """The other side prefers a token the reference puts far below its top-1: a mismatch, also when the
    logits alone would pass a loose tolerance."""
    ref = _steps()
    ref[5] = _with_top2(ref[5], margin=0.5)
    got = [r.copy() for r in ref]
    got[5][11] += 0.6  # 11 now leads by 0.1, the reference's margin is 0.5
    res = compare_logits(ref, got, Tolerance(logits=1.0, tie=0.2))
    assert not res.ok and res.mismatches == [5] and res.steps_above == []
    far = compare_logits(ref, [g + (t == 2) * 0.05 for t, g in enumerate(got)], Tolerance(logits=1e-2, tie=1.0))
    assert not far.ok and 2 in far.steps_above and far.mismatches == []  # near-tie at 5, logits beyond at 2


def test_prefill_steps_compare_every_position_and_lengths_must_match():
    ref = [np.zeros((4, V)), np.zeros(V)]
    got = [np.zeros((4, V)), np.zeros(V)]
    got[0][1, 3] = 0.5  # an earlier prompt position, not the next token
    assert compare_logits(ref, got, Tolerance(1e-3, 1e-3)).steps_above == [0]
    assert compare_logits([np.zeros((4, V))], [np.zeros(V)], Tolerance(1e-3, 1e-3)).ok  # last position only
    with pytest.raises(ValueError, match="same tokens"):
        compare_logits(ref, got[:1], Tolerance(1e-3, 1e-3))


def test_free_running_may_part_only_at_a_near_tie():
    ref = _steps()
    ref[2] = _with_top2(ref[2], margin=1e-3)
    ref_tokens = [int(r.argmax()) for r in ref]
    assert compare_free_running(ref, ref_tokens, ref_tokens, tie=1e-2).ok
    parted = ref_tokens[:2] + [11, 0, 0]  # after the parting the contexts differ: nothing more compared
    res = compare_free_running(ref, ref_tokens, parted, tie=1e-2)
    assert res.ok and res.first_difference == 2 and res.compared == 3
    wrong = ref_tokens[:4] + [(ref_tokens[4] + 1) % V]
    bad = compare_free_running(ref, ref_tokens, wrong, tie=1e-2)
    assert not bad.ok and bad.first_difference == 4, bad.describe()


def test_tolerances_state_their_cases():
    assert tolerance_for(sparse=False, quantised=False) == Tolerance(1e-3, 1e-3)
    assert tolerance_for(sparse=False, quantised=True) == Tolerance(1e-2, 1e-2)
    assert tolerance_for(sparse=True, quantised=False) == Tolerance(1e-2, 1e-2)
    with pytest.raises(ValueError, match=">= 0"):
        Tolerance(-1.0, 0.0)


# --- top-K sets ---------------------------------------------------------------------------------------


def _scores(seed=0, rows=6, r=64):
    return np.random.default_rng(seed).random((rows, r)).astype(np.float32)


def test_topk_swap_within_the_tie_margin_passes():
    s = _scores()
    k = 10
    order = np.argsort(-s[0], kind="stable")
    s[0, order[k]] = s[0, order[k - 1]] * (1 - TOPK_TIE / 4)  # K-th and (K+1)-th within the margin
    from dipdeploy.cache import topk_rows

    sel = topk_rows(s, k)
    sel[0][sel[0] == order[k - 1]] = order[k]  # the other implementation kept the runner-up
    res = compare_topk(s, sel, k)
    assert res.ok and res.swaps == 1, res.describe()


def test_topk_real_mismatch_duplicates_and_wrong_k_fail():
    from dipdeploy.cache import topk_rows

    s, k = _scores(), 10
    sel = topk_rows(s, k)
    low = int(np.argmin(s[2]))
    bad = sel.copy()
    bad[2, 0] = low if low not in bad[2] else bad[2, 0]
    assert compare_topk(s, bad, k).mismatched_rows == [2]
    dup = sel.copy()
    dup[4, 1] = dup[4, 0]
    assert compare_topk(s, dup, k).mismatched_rows == [4]
    assert not compare_topk(s, sel[:, :-1], k).ok
    assert compare_topk(s, sel, k).ok and compare_topk(s, sel, k).swaps == 0


# --- the torch reference's tie rule ---------------------------------------------------------------------


def test_torch_topk_follows_the_lower_index_rule():
    import torch

    from dipdeploy.cache import topk_indices, topk_rows
    from dipdeploy.sparsity.methods import topk_indices as torch_topk_indices
    from dipdeploy.sparsity.methods import topk_mask

    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, (32, 40)).astype(np.float32)  # many ties at every K-th value
    for k in (1, 7, 20, 40):
        mask = topk_mask(torch.from_numpy(scores), k).numpy()
        assert (mask.sum(-1) == k).all()
        np.testing.assert_array_equal(np.nonzero(mask)[1].reshape(32, k), topk_rows(scores, k))
        np.testing.assert_array_equal(torch_topk_indices(torch.from_numpy(scores), k).numpy(),
                                      topk_indices(scores, k))


# --- export validation still catches a broken graph ------------------------------------------------------


@pytest.fixture(scope="module")
def dip_bundle(tmp_path_factory):
    """A tiny-llama DIP fp32 bundle (not validated) and its torch reference, sparsified as model.onnx."""
    from dipdeploy.export.bundle import export, reference_plan
    from dipdeploy.export.config import ExportConfig
    from dipdeploy.export.prepare import make_plan
    from dipdeploy.loading import load_model
    from dipdeploy.sparsity.methods import sparsify_

    lm = load_model("tiny-llama")
    cfg = ExportConfig(model="tiny-llama", method="dip", rho_in=0.6, validate_tokens=0, per_layer=False)
    plan = make_plan(lm, cfg)
    out = tmp_path_factory.mktemp("agree") / "bundle"
    export(lm, cfg, out, plan)
    sparsify_(lm.model, reference_plan(plan))
    return out, lm, plan


class _Spec:
    num_kv_heads, head_dim = 2, 16


PROMPT = np.array([3, 14, 15, 92, 65, 35], dtype=np.int64)


def _validate(path, lm):
    from dipdeploy.export.validate import validate

    return validate(path, lm.model, _Spec, PROMPT, 12, sparse=True, quantised=False)


def test_intact_bundle_validates(dip_bundle):
    out, lm, _ = dip_bundle
    v = _validate(out / "model.onnx", lm)
    assert v.ok and v.stock.max_abs_diff < 1e-4 and v.stock.topk["topk_checked"] > 0, v.as_dict()


def test_flipped_mlp_row_fails_validation(dip_bundle, tmp_path):
    """One up|gate row of layer 1 negated in mlp.bin (the input feature with the largest |x| there, so
    DIP selects it at every step): validation must fail."""
    import shutil

    import torch

    from dipdeploy.bundle.manifest import read_manifest

    out, lm, _ = dip_bundle
    seen = []
    hook = lm.model.model.layers[1].mlp.register_forward_hook(lambda mod, inp, _o: seen.append(inp[0].abs()))
    with torch.no_grad():
        lm.model(torch.from_numpy(PROMPT)[None])
    hook.remove()
    row = int(seen[0][0].mean(0).argmax())
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    t = read_manifest(broken).tensors["model.layers.1.mlp.up_gate.rows"]
    width = t["shape"][1] * 4
    with open(broken / t["file"], "r+b") as f:
        f.seek(t["offset"] + row * width)
        vals = -np.frombuffer(f.read(width), np.float32)
        f.seek(t["offset"] + row * width)
        f.write(vals.tobytes())
    v = _validate(broken / "model.onnx", lm)
    assert not v.ok and not v.stock.agrees and v.stock.max_abs_diff > v.tolerance, v.as_dict()


def test_wrong_k_fails_validation(dip_bundle, tmp_path):
    """K_in of every layer's TopKColumnMask halved in model.onnx: validation must fail."""
    import onnx

    out, lm, plan = dip_bundle
    g = onnx.load(str(out / "model.onnx"), load_external_data=False)
    changed = 0
    for node in g.graph.node:
        if node.op_type == "TopKColumnMask" and "up_gate" in node.name:
            for a in node.attribute:
                if a.name == "k":
                    a.i //= 2
                    changed += 1
    assert changed == len(plan.layers)
    wrong = out / "model.wrong-k.onnx"
    onnx.save(g, str(wrong))
    try:
        v = _validate(wrong, lm)
    finally:
        wrong.unlink()
    assert not v.ok and v.stock.topk["topk_mismatch_count"] > 0, v.as_dict()


def test_twin_refuses_a_selection_beyond_the_near_ties(dip_bundle):
    """ORT's own selections pass the twin's top-K check; the same with one selected row replaced by the
    lowest-scoring one of that point fails it."""
    import onnx
    import onnxruntime as ort

    from dipdeploy.agreement import tolerance_for
    from dipdeploy.export.validate import ort_teacher_forced_selections, torch_greedy
    from dipdeploy.ops.nodes import with_selection_outputs
    from dipdeploy.sparsity.twin import compare_with_twin

    out, lm, _ = dip_bundle
    proto, names = with_selection_outputs(onnx.load(str(out / "model.onnx"), load_external_data=False), scored=True)
    path = out / "model.sel.onnx"
    onnx.save(proto, str(path))
    try:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        tokens, _ = torch_greedy(lm.model, PROMPT, 6)
        _, logits, sel = ort_teacher_forced_selections(sess, _Spec, PROMPT, tokens, names)
    finally:
        path.unlink()
    tol = tolerance_for(sparse=True, quantised=False)
    token, twin = compare_with_twin(lm.model, PROMPT.tolist(), tokens, logits, sel, tol)
    assert token.ok and twin.ok and twin.topk_checked == len(sel) * 2 * 2, twin.as_dict()
    bad = [dict(s) for s in sel]
    x, idx = np.abs(bad[7][(1, "in", "x")]), bad[7][(1, "in")].copy()
    idx[-1] = int(np.argmin(x))
    bad[7][(1, "in")] = idx
    _, twin = compare_with_twin(lm.model, PROMPT.tolist(), tokens, logits, bad, tol)
    # the first fault is where it was injected (later ones may follow from it: ORT's GLU came from other rows)
    assert not twin.ok and twin.topk_mismatches[0] == (7, 1, "in")


def test_runs_may_part_only_at_a_near_tie_of_the_reference_scores():
    """Two runs with selections: equal until a parting at a near-tie of |X| (then not compared further),
    refused when the parting is beyond the near-ties."""
    from dipdeploy.agreement import compare_runs

    rng = np.random.default_rng(0)
    k, r, prompt = 4, 16, 3
    x = [rng.random(r) for _ in range(prompt + 2)]
    sel = [{(0, "in"): np.argsort(-xi)[:k], (0, "in", "x"): xi} for xi in x]
    steps = [rng.normal(0, 3, (prompt, V)), rng.normal(0, 3, V), rng.normal(0, 3, V)]
    tol = Tolerance(1e-3, 1e-3)
    assert compare_runs(steps, [], sel, steps, [], sel, prompt, tol).ok
    tied = [dict(s) for s in sel]
    order = np.argsort(-x[3])
    x[3][order[k]] = x[3][order[k - 1]]  # an exact tie at the K-th score of position 3 (step 1)
    tied[3] = {(0, "in"): np.r_[order[:k - 1], order[k]], (0, "in", "x"): x[3]}
    moved = [steps[0], steps[1] + 1.0, steps[2] + 1.0]  # logits after the parting are not compared
    res = compare_runs(steps, [], sel, moved, [], tied, prompt, tol)
    assert res.ok and res.selection_parting == 3 and res.steps_compared == 1, res.describe()
    wrong = [dict(s) for s in sel]
    wrong[1] = {(0, "in"): np.argsort(x[1])[:k], (0, "in", "x"): x[1]}  # the k smallest: a real fault
    assert not compare_runs(steps, [], sel, steps, [], wrong, prompt, tol).ok
