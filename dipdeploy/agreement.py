"""When two numerically different implementations agree: one rule for tests and export validation.

Torch and onnxruntime, the native kernels and the fallback functions, one CPU's kernels and another's
sum in different orders, so their logits differ by rounding. That is harmless until it meets an argmax
or a top-K: both are discontinuous, and where two candidates are within rounding of each other either
implementation may pick either one. Demanding the same picks then fails on a machine whose summation
order nobody here has seen. So agreement is judged like this:

**Tokens (teacher forced).** Both implementations are fed the same tokens (the reference's), and at
each step ``t`` the next-token logits ``r_t`` (reference) and ``g_t`` (other) are compared:

- ``max |r_t − g_t| ≤ tol.logits`` at every step;
- the top-1 must be equal, unless the step is a **near-tie**: the other side's pick ``b`` and the
  reference's pick ``a`` lie within ``tol.tie`` of each other in *both* implementations' logits
  (``r_t[a] − r_t[b] ≤ tie`` and ``g_t[b] − g_t[a] ≤ tie``). Near-ties are counted and reported, a
  differing top-1 beyond the margin is a **mismatch**.

Free-running comparisons, where only the other side's tokens are known (a generation loop, a CLI), use
:func:`compare_free_running`: the tokens must equal the reference's up to the first difference, and
that difference must be a near-tie in the reference's logits (after it the contexts differ, so nothing
more is compared).

**Top-K selections.** A selected set agrees with the reference scores when it has K distinct indices
and every swap against the reference's own top-K is between scores within ``tie`` of the K-th largest
score (a kept index at least ``s_K − tie``, a dropped one at most ``s_K + tie``).

The tolerances are :func:`tolerance_for` (logits) and :data:`TOPK_TIE` (scores); why each is what it
is, is said there. A sparse model's logits are compared with a reference that made the same top-K
choices where they were near-ties (``dipdeploy.sparsity.twin``), not with a looser tolerance; two runs
of one sparse model with their selections, by :func:`compare_runs`. Exact equality stays where
bit-equality is the contract: integer paths, the cache and slot rules, golden vectors, byte-identical
bundles, and one implementation against itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

#: Top-K score tie margin, relative to the largest score of the row. DIP and DIP-CA scores are
#: |x| / max|x| in float32 (``dipdeploy.cache.score``): two implementations fed the same x compute them
#: within a few ulps (1.2e-7 each), and 1e-5 leaves room for x itself to differ in its last bits
#: (a fused kernel, FMA against mul+add) while staying far below any gap the data makes on purpose.
TOPK_TIE = 1e-5


@dataclass(frozen=True)
class Tolerance:
    """``logits``: the largest |Δlogit| allowed at a step; ``tie``: the margin of a near-tie."""

    logits: float
    tie: float

    def __post_init__(self) -> None:
        if not (self.logits >= 0 and self.tie >= 0):
            raise ValueError(f"tolerances must be >= 0, got logits={self.logits}, tie={self.tie}")


def tolerance_for(*, sparse: bool, quantised: bool) -> Tolerance:
    """The tolerance between torch and ORT (or two ORT graphs) computing the same function.

    - Dense fp32: 1e-3, well above what torch and ORT differ by (docs/numerics.md, the tolerance table).
    - Quantised or sparse: 1e-2. The int4 MatMulNBits blocks and the BQ4 rows, and the sparse kernels
      over the selected rows, sum in another order than torch's masked fp32 matmuls.

    "The same function" for a sparse graph means the same top-K choices: compare it with the twin of
    the reference (``dipdeploy.sparsity.twin``), which takes the other side's selections after checking
    them, because one column kept the other way at a near-tie moves the logits by a few percent
    (docs/numerics.md gives SmolLM2's). A tolerance that absorbed that would also absorb a negated row
    or a wrong K, which move the tiny test model's logits by as much (dipdeploy/export/DESIGN.md).

    The tie margin equals the logit tolerance: when both sides see two tokens within what the logits
    may move, either pick is within the contract.
    """
    tol = 1e-2 if quantised or sparse else 1e-3
    return Tolerance(logits=tol, tie=tol)


@dataclass
class TokenAgreement:
    """Step-by-step comparison of teacher-forced logits (see the module docstring)."""

    steps: int
    tolerance: Tolerance
    max_abs_diff: float
    near_ties: list[int] = field(default_factory=list)     # steps whose top-1 differ within the tie margin
    mismatches: list[int] = field(default_factory=list)    # steps whose top-1 differ beyond it
    steps_above: list[int] = field(default_factory=list)   # steps whose logits differ beyond tolerance.logits

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.steps_above

    @property
    def tokens_agree(self) -> int:
        """Steps whose top-1 are equal."""
        return self.steps - len(self.near_ties) - len(self.mismatches)

    def describe(self) -> str:
        """One line for an assertion or an error message."""
        return (f"{self.steps} steps, max |Δlogit| {self.max_abs_diff:.3g} (tolerance {self.tolerance.logits:.3g}), "
                f"near-ties at {self.near_ties}, mismatches at {self.mismatches}, "
                f"logits beyond tolerance at {self.steps_above}")


def next_token_logits(step: np.ndarray) -> np.ndarray:
    """The next-token logits [V] of a step's output ([V], [S, V] or [1, S, V]: the last position)."""
    a = np.asarray(step, dtype=np.float64)
    return a.reshape(-1, a.shape[-1])[-1]


def _near_tie(ref: np.ndarray, got: np.ndarray, a: int, b: int, tie: float) -> bool:
    return ref[a] - ref[b] <= tie and got[b] - got[a] <= tie


def compare_logits(ref: Sequence[np.ndarray], got: Sequence[np.ndarray], tol: Tolerance) -> TokenAgreement:
    """Teacher-forced logits of the reference and of the other implementation, step by step.

    Each element is one step's output: [V], or [S, V] (a prefill; the last position is the next token
    and, where both sides give the same number of positions, all of them are compared for the logit
    tolerance).
    """
    if len(ref) != len(got):
        raise ValueError(f"{len(ref)} reference steps against {len(got)}: feed both the same tokens")
    res = TokenAgreement(steps=len(ref), tolerance=tol, max_abs_diff=0.0)
    for t, (r_all, g_all) in enumerate(zip(ref, got)):
        r_all, g_all = np.asarray(r_all, np.float64), np.asarray(g_all, np.float64)
        diff = (float(np.abs(r_all - g_all).max()) if r_all.shape == g_all.shape
                else float(np.abs(next_token_logits(r_all) - next_token_logits(g_all)).max()))
        res.max_abs_diff = max(res.max_abs_diff, diff)
        if diff > tol.logits:
            res.steps_above.append(t)
        r, g = next_token_logits(r_all), next_token_logits(g_all)
        a, b = int(r.argmax()), int(g.argmax())
        if a != b:
            (res.near_ties if _near_tie(r, g, a, b, tol.tie) else res.mismatches).append(t)
    return res


@dataclass
class FreeRunAgreement:
    """A free-running token sequence against the reference's greedy tokens and logits."""

    compared: int                 # tokens compared (up to and including the first difference)
    first_difference: int | None  # None: equal throughout
    near_tie: bool                # the first difference was a near-tie of the reference
    margin: float | None          # the reference's logit margin at the first difference

    @property
    def ok(self) -> bool:
        return self.first_difference is None or self.near_tie

    def describe(self) -> str:
        if self.first_difference is None:
            return f"{self.compared} tokens equal"
        kind = "a near-tie" if self.near_tie else "beyond the tie margin"
        return (f"tokens differ first at step {self.first_difference}, {kind} "
                f"(reference margin {self.margin:.3g})")


def compare_free_running(ref_logits: Sequence[np.ndarray], ref_tokens: Sequence[int], tokens: Sequence[int],
                         tie: float) -> FreeRunAgreement:
    """``tokens`` (another implementation, free running) against the reference's greedy ``ref_tokens``,
    whose logits at each step are ``ref_logits``. A shorter ``tokens`` (an early stop) compares its
    prefix."""
    n = min(len(tokens), len(ref_tokens))
    for t in range(n):
        if int(tokens[t]) != int(ref_tokens[t]):
            r = next_token_logits(ref_logits[t])
            margin = float(r[int(ref_tokens[t])] - r[int(tokens[t])])
            return FreeRunAgreement(t + 1, t, margin <= tie, margin)
    return FreeRunAgreement(n, None, False, None)


@dataclass
class TopKAgreement:
    """A selected index set against reference scores (see the module docstring)."""

    rows: int
    swaps: int            # indices exchanged against the reference top-K, all within the tie margin
    mismatched_rows: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatched_rows

    def describe(self) -> str:
        return f"{self.rows} rows, {self.swaps} swaps within the tie margin, mismatched rows {self.mismatched_rows}"


def compare_topk(scores: np.ndarray, selected: np.ndarray, k: int | None = None,
                 tie: float = TOPK_TIE) -> TopKAgreement:
    """``selected`` [..., K] indices against the reference ``scores`` [..., R] (one row per leading index).

    ``tie`` is relative to each row's largest |score| (:data:`TOPK_TIE`). The reference top-K is the
    project's rule (:func:`dipdeploy.cache.score.topk_rows`: ties to the lower index); a swap is allowed
    only between scores within the margin of the K-th score.
    """
    from dipdeploy.cache.score import topk_rows

    scores = np.asarray(scores, np.float64)
    scores = scores.reshape(-1, scores.shape[-1])
    selected = np.asarray(selected).reshape(scores.shape[0], -1)
    k = selected.shape[-1] if k is None else k
    res = TopKAgreement(rows=scores.shape[0], swaps=0)
    if selected.shape[-1] != k:
        res.mismatched_rows = list(range(scores.shape[0]))
        return res
    ref = topk_rows(scores, k)
    for i, (s, sel, want) in enumerate(zip(scores, selected, ref)):
        if len(set(sel.tolist())) != k or sel.min() < 0 or sel.max() >= s.size:
            res.mismatched_rows.append(i)
            continue
        margin = tie * float(np.abs(s).max())
        kth = float(np.sort(s)[-k])
        kept, dropped = np.setdiff1d(sel, want), np.setdiff1d(want, sel)
        if (s[kept] < kth - margin).any() or (s[dropped] > kth + margin).any():
            res.mismatched_rows.append(i)
        else:
            res.swaps += kept.size
    return res


@dataclass
class RunAgreement:
    """Two runs of one sparse model (plain DIP, score |X|) with their selections: see :func:`compare_runs`."""

    steps_compared: int
    selection_parting: int | None    # first fed position whose selections differ (None: equal throughout)
    parting_topk: TopKAgreement | None
    tokens: FreeRunAgreement
    logits: TokenAgreement

    @property
    def ok(self) -> bool:
        return (self.parting_topk is None or self.parting_topk.ok) and self.tokens.ok and self.logits.ok

    def describe(self) -> str:
        part = ("selections equal throughout" if self.selection_parting is None else
                f"selections part at position {self.selection_parting} ({self.parting_topk.describe()})")
        return f"{part}; {self.tokens.describe()}; over {self.steps_compared} steps: {self.logits.describe()}"


def _first_parting(ref_sel: Sequence[dict], got_sel: Sequence[dict]):
    for p, (a, b) in enumerate(zip(ref_sel, got_sel)):
        for key in sorted(k for k in a if len(k) == 2):
            if set(np.asarray(a[key]).tolist()) != set(np.asarray(b[key]).tolist()):
                return p, compare_topk(np.abs(np.asarray(a[key + ("x",)])), b[key], len(a[key]))
    return None, None


def compare_runs(ref_steps: Sequence[np.ndarray], ref_tokens: Sequence[int], ref_sel: Sequence[dict],
                 got_steps: Sequence[np.ndarray], got_tokens: Sequence[int], got_sel: Sequence[dict],
                 prompt_len: int, tol: Tolerance) -> RunAgreement:
    """Two implementations of one plain-DIP model (two ORT graphs, two CPUs), each with its selections
    per fed position (``{(layer, group): indices}``; the reference's also the scored input under
    ``(layer, group, "x")``) and its logits per step (step 0: the prompt, then one per greedy token).

    They compute the same function until their selections part; the parting must be a near-tie of the
    reference's |X| (:func:`compare_topk`). Before it, the logits agree within ``tol`` and the tokens
    by :func:`compare_free_running`; after it (or after the tokens part) the contexts differ and nothing
    more is compared. Teacher-forced runs pass the same tokens twice; the shorter run's steps bound
    the comparison (a generation loop keeps no logits after its last token).
    """
    part, topk = _first_parting(ref_sel, got_sel)
    # token t is the argmax of step t, which sees positions up to prompt_len - 1 + t
    n_tok = len(ref_tokens) if part is None else max(0, part - prompt_len + 1)
    tokens = compare_free_running(ref_steps, list(ref_tokens)[:n_tok], list(got_tokens)[:n_tok], tol.tie)
    # the first fed position where the two differ: selections parted, or another token fed
    fed_part = None if tokens.first_difference is None else prompt_len + tokens.first_difference
    bound = min((b for b in (part, fed_part) if b is not None), default=None)
    # step 0 needs every prompt position, step j >= 1 position prompt_len - 1 + j
    steps = min(len(ref_steps), len(got_steps))
    if bound is not None:
        steps = 0 if bound < prompt_len else min(steps, bound - prompt_len + 1)
    logits = compare_logits(ref_steps[:steps], got_steps[:steps], tol)
    return RunAgreement(steps, part, topk, tokens, logits)
