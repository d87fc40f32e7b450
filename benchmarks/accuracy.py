"""SmolLM2-135M WikiText-2 perplexity of every sparse method at ρ ∈ {0.4, 0.5, 0.6, 0.75}.

Protocol of docs/method.md (seqlen 2048, ≥16 windows of the test split, calibration on validation).
Configurations run in priority order and each finished row is kept in a partial file, so an
interrupted run resumes where it stopped and the table always shows what was measured so far.

    python benchmarks/accuracy.py            # full: 16 windows × 2048 tokens
    python benchmarks/accuracy.py --quick    # 2 windows × 512 tokens, ρ = 0.5 only (≈2 min)
    python benchmarks/accuracy.py --windows 2 --seqlen 1024 --part a --only dense,dip:-,teal:-,cats &
    python benchmarks/accuracy.py --windows 2 --seqlen 1024 --part b --only dip:allocation=joint,teal:allocation=joint,dip-ca

Several processes may share the plan (``--part``, ``--only``, ``--densities``): each keeps its own partial
file and every table is written from all of them. A protocol other than 16 × 2048 writes its own table
(``accuracy-<model>-<windows>x<seqlen>.md``), never over the full one.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _common import machine, md_table, write_rows_json

from dipdeploy.eval import EvalConfig, Evaluator, reachable

RESULTS = Path(__file__).resolve().parent / "results"
NOTES = ("How each method was tuned (all on WikiText-2 validation, 4 × 512 tokens, never test): **DIP uniform** "
         "one K_in, K_glu for every layer, the split searched among ρ_in ∈ {1.0, 1.1, 1.2, 1.3}·ρ by calibration NLL; "
         "**joint** per-layer density and split together by a Lagrangian over Fisher-weighted per-layer error "
         "curves (docs/method.md, \"Joint allocation\"), kept only if it beats the uniform plan (default split "
         "1.1ρ) on held-out calibration tokens (else the row says uniform); **greedy** per-layer density from "
         "end-to-end sensitivity; **TEAL** per-layer thresholds on |x| and |GLU~| at the (1 − share) quantiles, "
         "uniform: DIP's searched split, joint: each layer's shares from the same joint allocation (the role of "
         "TEAL's own greedy per-layer allocation); **CATS** per-layer threshold on |act(W_g x)|; **DIP-CA** the "
         "joint DIP plan, γ = 0.5, LFU, cache half of each group's rows. Rows are compared at equal MLP bytes "
         "read per token (`density_test`).")
PEERS = ("dip", "dip-ca", "teal", "cats", "gate", "up")


def configs(quick: bool) -> list[tuple[str, float, dict]]:
    """Priority order: per density (0.5 first, then 0.75, 0.6, 0.4) DIP uniform and joint (per-layer
    density and split, docs/method.md "Joint allocation"), TEAL uniform and with the same joint
    allocation, CATS, DIP-CA (γ = 0.5) on the joint plan; at ρ = 0.5 also the greedy allocation and the
    WINA score under the joint allocation; then the single-group baselines."""
    if quick:
        return [("dense", 1.0, {})] + [(m, 0.5, {}) for m in ("dip", "teal", "cats", "dip-ca")]
    joint = {"allocation": "joint"}
    out = [("dense", 1.0, {})]
    for rho in (0.5, 0.75, 0.6, 0.4):
        out += [("dip", rho, {}), ("dip", rho, joint), ("teal", rho, {}), ("teal", rho, joint), ("cats", rho, {}),
                ("dip-ca", rho, joint)]
        if rho == 0.5:
            out += [("dip", 0.5, {"allocation": "greedy"}), ("dip", 0.5, {**joint, "score": "wina"})]
    for rho in (0.5, 0.75, 0.6, 0.4):
        out += [(m, rho, {}) for m in ("gate", "up")] + ([("glu", rho, {})] if rho == 0.75 else [])
    return [c for c in out if reachable(c[0], c[1])]


def splits_from(table: Path) -> dict:
    """(density, score) → searched ρ_in of the uniform DIP/TEAL rows of an earlier results table: the
    split search is deterministic on the same calibration text, so a rerun need not repeat it."""
    lines = [ln for ln in table.read_text().splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    found = {}
    for ln in lines[2:]:
        row = dict(zip(head, (c.strip() for c in ln.strip("|").split("|"))))
        if row.get("method") in ("dip", "teal") and row.get("allocation") == "uniform" and row.get("variant") == "-":
            found[(round(float(row["target_density"]), 6), row["score"])] = (float(row["rho_in"]), {"split": f"from {table.name}"})
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 windows × 512 tokens, ρ = 0.5 (≈2 min)")
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--splits-from", type=Path, help="reuse the searched splits of an earlier results table")
    ap.add_argument("--only", help="comma list of methods (or method:variant, e.g. dip:- or "
                    "dip:allocation=joint) to run; the rest of the plan is left out")
    ap.add_argument("--densities", help="comma list of target densities to run (default: all)")
    ap.add_argument("--part", default="", help="name of this process's partial file, so several processes "
                    "can share the plan (the table is written from all partial files)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--curves", type=Path, help="the joint allocation's error curves (score abs) as an .npz with "
                    "`cost` [L, 10, 10] on sparsity.allocate.GRID, measured on the same calibration tokens, "
                    "so that several processes need not each measure them")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    windows, seqlen = (2, 512) if args.quick else (args.windows, args.seqlen)
    name = f"accuracy-{args.model.split('-')[0]}" + ("-quick" if args.quick else "")
    if not args.quick and (windows, seqlen) != (16, 2048):  # a smaller protocol never replaces the full table
        name += f"-{windows}x{seqlen}"
    partial = RESULTS / f".{name}{'.' + args.part if args.part else ''}.partial.json"
    done = json.loads(partial.read_text()) if partial.is_file() else []
    key = lambda m, d, o: f"{m}|{d}|{json.dumps(o, sort_keys=True)}"  # noqa: E731
    have = {r["key"] for r in done}
    ev = Evaluator(EvalConfig(model=args.model, seqlen=seqlen, max_windows=windows, progress=True))
    for r in done:  # a resumed run reuses the split searches of earlier rows (they take minutes each)
        if r["method"] in ("dip", "dip-ca", "teal") and r["allocation"] == "uniform":
            ev.splits.setdefault((round(r["target_density"], 6), r["score"]), (r["rho_in"], {"split": "resumed"}))
    if args.curves:
        import numpy as np

        from dipdeploy.sparsity.allocate import CURVE_TOKENS, GRID, ErrorCurves

        g = np.array(GRID)
        ev.curves["abs"] = ErrorCurves(g, g, np.load(args.curves)["cost"], CURVE_TOKENS, "abs")
    if args.splits_from:
        for k, v in splits_from(args.splits_from).items():
            ev.splits.setdefault(k, v)
    info = machine()
    only = set(args.only.split(",")) if args.only else None
    rhos = {float(r) for r in args.densities.split(",")} if args.densities else None
    for method, rho, over in configs(args.quick):
        variant = ",".join(f"{a}={b}" for a, b in over.items()) or "-"
        if (only is not None and not {method, f"{method}:{variant}"} & only) or (rhos is not None and rho not in rhos):
            continue
        k = key(method, rho, over)
        if k in have:
            continue
        t = time.time()
        row = ev.row(method, rho, **over)
        row.update(key=k, variant=",".join(f"{a}={b}" for a, b in over.items()) or "-", wall_s=round(time.time() - t, 1))
        done.append(row)
        partial.write_text(json.dumps(done, indent=1))
        done_all = _all_parts(name, done, partial)
        print(f"{method:7s} ρ={rho:<5} {row['variant']:18s} ppl={row['ppl']:.3f}  ({row['wall_s']} s)", flush=True)
        write_table(done_all, name, info, windows, seqlen, configs(args.quick))
    write_table(_all_parts(name, done, partial), name, info, windows, seqlen, configs(args.quick))
    write_rows_json(done, args.json)


def _all_parts(name: str, done: list[dict], partial: Path) -> list[dict]:
    """This process's rows and those of every other partial file of the same table."""
    rows = list(done)
    for other in sorted(RESULTS.glob(f".{name}*.partial.json")):
        if other != partial:
            rows += json.loads(other.read_text())
    return rows


def write_table(rows: list[dict], name: str, info: dict, windows: int, seqlen: int, planned: list) -> None:
    dense = next((r["ppl"] for r in rows if r["method"] == "dense"), None)
    for r in rows:
        r["ppl_x_dense"] = r["ppl"] / dense if dense else None
    ordered = sorted(rows, key=lambda r: (r["target_density"], r["method"], r["variant"]))
    cols = ["method", "variant", "target_density", "density", "density_test", "rho_in", "allocation", "score", "gamma",
            "policy", "cache_frac", "ppl", "ppl_x_dense", "calib_s", "eval_s"]
    text = (f"# {name}: WikiText-2 test perplexity of sparse MLP methods\n\n"
            f"Model {rows[0]['model']}, {windows} windows × {seqlen} tokens ({rows[0]['tokens']} predicted tokens), "
            f"prefill and decode both sparsified; calibration: WikiText-2 validation (4 × 512 tokens).\n"
            f"Machine: {info['cpu']}, {info['cores']} cores, load {info['load_1min']} at start "
            f"(other jobs shared the CPU, so times are indicative only). "
            f"`density` is the MLP density ρ = (2ρ_in + ρ_glu)/3 of the plan (thresholds: expected on calibration text), "
            f"`density_test` the density realised on the test tokens (TEAL, CATS: measured; top-K methods: exact); "
            f"`rho_in` the mean input share.\n\n{NOTES}\n\n"
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
