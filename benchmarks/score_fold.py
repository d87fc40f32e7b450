"""Weighted DIP scores folded into SmolLM2's weights (dipdeploy/sparsity/scores.py): validation and test
perplexity of DIP on the folded model, beside plain |x|, on the 2 × 1024 protocol of
results/accuracy-smollm2-2x1024.md.

Variants: ``abs`` (plain DIP), ``s^α`` (input group weighted by the column norm s^α, α = 1 or 0.5: the
``wina-in`` score at α = 0.5), ``s·t`` (both groups at α = 1: the ``wina`` score). Each at the uniform split
the abs rows of that table searched (ρ_in 0.48 / 0.55 / 0.66 / 0.825), so only the score differs. The
variant and α are chosen by the *validation* column (4 × 512 tokens of WikiText-2 validation, the
calibration text); the test column is reported, never used to choose. ``--quant``: DIP ρ = 0.5 under
BQ4 (test only): plain, ``wina-in`` folded before quantising (what export ships), ``wina-in`` scored on the quantised
unfolded weights (what ``eval --quant`` computes).

    python benchmarks/score_fold.py --json rows.json            # ≈ 10 evaluations of 2 × 1024 + 4 × 512 tokens
    python benchmarks/score_fold.py --quant --json q.json
    python benchmarks/score_fold.py --quick                     # ρ = 0.5, 1 × 1024 test tokens
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from _common import md_table, write_rows_json

from dipdeploy.eval import EvalConfig, Evaluator, _quantize
from dipdeploy.eval.perplexity import perplexity
from dipdeploy.sparsity.methods import sparsify_, unsparsify_
from dipdeploy.sparsity.plan import SparsityConfig
from dipdeploy.sparsity.scores import FOLDED, Fold, fold_scores

#: The uniform DIP splits searched for plain |x| (results/accuracy-smollm2-2x1024.md, rho_in column).
SPLITS = {0.4: 0.48, 0.5: 0.55, 0.6: 0.66, 0.75: 0.825}
VARIANTS = {"abs": None, "s^1": Fold(1.0, 0.0), "s^0.5": Fold(0.5, 0.0), "s·t": Fold(1.0, 1.0)}


def row(ev: Evaluator, label: str, rho: float, score: str = "abs", val: bool = True) -> dict:
    """DIP at ``rho`` on ``ev``'s model as it stands (folded or not): validation PPL (``val``) and test PPL."""
    plan = ev.plan_for(SparsityConfig(method="dip", density=rho, rho_in=SPLITS[rho], score=score))
    sparsify_(ev.lm.model, plan)
    t0 = time.time()
    try:
        val_ppl = perplexity(ev.lm.model, ev.calib)[0] if val else None
        test_ppl = perplexity(ev.lm.model, ev.test)[0]
    finally:
        unsparsify_(ev.lm.model)
    out = {"variant": label, "rho": rho, "density": round(plan.density, 4), "rho_in": SPLITS[rho],
           "quant": ev.qinfo["quant"], "val_ppl": None if val_ppl is None else round(val_ppl, 2),
           "test_ppl": round(test_ppl, 2), "eval_s": round(time.time() - t0, 1)}
    print(out, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--densities", default="0.5,0.4,0.6,0.75")
    ap.add_argument("--quant", action="store_true", help="the BQ4 rows at ρ = 0.5 instead")
    ap.add_argument("--quick", action="store_true", help="ρ = 0.5 only, 1 × 1024 test tokens")
    args = ap.parse_args()
    if args.quick:
        args.densities = "0.5"
    cfg = EvalConfig(seqlen=1024, max_windows=1 if args.quick else 2, progress=False)
    rows = []
    if args.quant:
        ev = Evaluator(cfg)
        fold_scores(ev.lm.model, FOLDED["wina-in"])
        ev.qinfo = _quantize(ev.lm, replace(cfg, quant="bq4"))
        rows.append(row(ev, "wina-in folded, then BQ4 (export)", 0.5, val=False))
        ev = Evaluator(replace(cfg, quant="bq4"))
        rows += [row(ev, "abs", 0.5, val=False),
                 row(ev, "wina-in on BQ4 unfolded (eval --quant)", 0.5, "wina-in", val=False)]
    else:
        ev = Evaluator(cfg)
        original = {k: v.clone() for k, v in ev.lm.model.state_dict().items()}
        for label, fold in VARIANTS.items():
            ev.lm.model.load_state_dict(original)
            if fold is not None:
                fold_scores(ev.lm.model, fold)
            rows += [row(ev, label, float(r)) for r in args.densities.split(",")]
    print(md_table(rows, list(rows[0])))
    write_rows_json(rows, args.json)


if __name__ == "__main__":
    main()
