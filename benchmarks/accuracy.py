"""SmolLM2-135M WikiText-2 perplexity of every sparse method at ρ ∈ {0.4, 0.5, 0.6, 0.75}.

Protocol of docs/method.md (seqlen 2048, ≥16 windows of the test split, calibration on validation).
Configurations run in priority order and each finished row is kept in a partial file, so an
interrupted run resumes where it stopped and the table always shows what was measured so far.

    python benchmarks/accuracy.py            # full: 16 windows × 2048 tokens
    python benchmarks/accuracy.py --quick    # 2 windows × 512 tokens, ρ = 0.5 only (≈2 min)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _common import machine, md_table, write_rows_json

from dipdeploy.eval import EvalConfig, Evaluator, reachable

RESULTS = Path(__file__).resolve().parent / "results"
PEERS = ("dip", "dip-ca", "teal", "cats", "gate", "up")


def configs(quick: bool) -> list[tuple[str, float, dict]]:
    """Priority order: the ρ = 0.5 comparison first (with two DIP-CA operating points: γ = 0.2 lets the
    cache dominate the mask when the capacity is below K_in), then ρ = 0.75, 0.6, 0.4."""
    if quick:
        return [("dense", 1.0, {})] + [(m, 0.5, {}) for m in ("dip", "teal", "cats", "dip-ca")]
    out = [("dense", 1.0, {})]
    for rho in (0.5, 0.75, 0.6, 0.4):
        out += [(m, rho, {}) for m in ("dip", "dip-ca", "teal", "cats")]
        if rho == 0.5:
            out += [("dip-ca", 0.5, {"gamma": 0.5}), ("dip", 0.5, {"allocation": "greedy"})]
        if rho == 0.75:
            out.append(("glu", 0.75, {}))
        out += [(m, rho, {}) for m in ("gate", "up")]
        if rho == 0.5:
            out.append(("dip", 0.5, {"score": "wina"}))
    return [c for c in out if reachable(c[0], c[1])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 windows × 512 tokens, ρ = 0.5 (≈2 min)")
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=2048)
    args = ap.parse_args()
    windows, seqlen = (2, 512) if args.quick else (args.windows, args.seqlen)
    name = f"accuracy-{args.model.split('-')[0]}" + ("-quick" if args.quick else "")
    partial = RESULTS / f".{name}.partial.json"
    done = json.loads(partial.read_text()) if partial.is_file() else []
    key = lambda m, d, o: f"{m}|{d}|{json.dumps(o, sort_keys=True)}"  # noqa: E731
    have = {r["key"] for r in done}
    ev = Evaluator(EvalConfig(model=args.model, seqlen=seqlen, max_windows=windows, progress=True))
    for r in done:  # a resumed run reuses the split searches of earlier rows (they take minutes each)
        if r["method"] in ("dip", "dip-ca", "teal") and r["allocation"] == "uniform":
            ev.splits.setdefault((round(r["target_density"], 6), r["score"]), (r["rho_in"], {"split": "resumed"}))
    info = machine()
    for method, rho, over in configs(args.quick):
        k = key(method, rho, over)
        if k in have:
            continue
        t = time.time()
        row = ev.row(method, rho, **over)
        row.update(key=k, variant=",".join(f"{a}={b}" for a, b in over.items()) or "-", wall_s=round(time.time() - t, 1))
        done.append(row)
        partial.write_text(json.dumps(done, indent=1))
        print(f"{method:7s} ρ={rho:<5} {row['variant']:18s} ppl={row['ppl']:.3f}  ({row['wall_s']} s)", flush=True)
        write_table(done, name, info, windows, seqlen, configs(args.quick))
    write_table(done, name, info, windows, seqlen, configs(args.quick))
    write_rows_json(done, args.json)


def write_table(rows: list[dict], name: str, info: dict, windows: int, seqlen: int, planned: list) -> None:
    dense = next((r["ppl"] for r in rows if r["method"] == "dense"), None)
    for r in rows:
        r["ppl_x_dense"] = r["ppl"] / dense if dense else None
    ordered = sorted(rows, key=lambda r: (r["target_density"], r["method"], r["variant"]))
    cols = ["method", "variant", "target_density", "density", "rho_in", "allocation", "score", "gamma",
            "policy", "cache_frac", "ppl", "ppl_x_dense", "calib_s", "eval_s"]
    text = (f"# {name}: WikiText-2 test perplexity of sparse MLP methods\n\n"
            f"Model {rows[0]['model']}, {windows} windows × {seqlen} tokens ({rows[0]['tokens']} predicted tokens), "
            f"prefill and decode both sparsified; calibration: WikiText-2 validation (4 × 512 tokens).\n"
            f"Machine: {info['cpu']}, {info['cores']} cores, load {info['load_1min']} at start "
            f"(other jobs shared the CPU, so times are indicative only). "
            f"`density` is the realised MLP density ρ = (2ρ_in + ρ_glu)/3 of the plan (thresholds: expected).\n\n"
            f"{md_table(ordered, cols)}\n\n{_missing(rows, planned)}Regenerate: `python benchmarks/accuracy.py` "
            f"(resumes from benchmarks/results/.{name}.partial.json).\n")
    (RESULTS / f"{name}.md").write_text(text)


def _missing(rows: list[dict], planned: list) -> str:
    have = {(r["method"], r["target_density"], r["variant"]) for r in rows}
    todo = [f"{m} ρ={d}" + (f" ({','.join(f'{a}={b}' for a, b in o.items())})" if o else "")
            for m, d, o in planned if (m, d, ",".join(f"{a}={b}" for a, b in o.items()) or "-") not in have]
    return f"**Not measured yet** (the run was stopped; it resumes): {', '.join(todo)}.\n\n" if todo else ""


if __name__ == "__main__":
    main()
