"""SmolLM2-135M WikiText-2 perplexity of every sparse method at ρ ∈ {0.4, 0.5, 0.6, 0.75}.

Protocol of docs/method.md (seqlen 2048, ≥16 windows of the test split, calibration on validation).
Configurations run in priority order and each finished row is kept in a partial file, so an
interrupted run resumes where it stopped and the table always shows what was measured so far.

    python benchmarks/accuracy.py            # full: 16 windows × 2048 tokens
    python benchmarks/accuracy.py --quick    # 2 windows × 512 tokens, ρ = 0.5 only (≈2 min)
    python benchmarks/accuracy.py --windows 2 --seqlen 1024 --part a --only dense,dip:-,teal:-,cats &
    python benchmarks/accuracy.py --windows 2 --seqlen 1024 --part b --only dip:allocation=joint,teal:allocation=joint,dip-ca

    # new rows beside those of an earlier table (kept, not re-run), then the table from every partial file:
    python benchmarks/accuracy.py --rows-from benchmarks/results/accuracy-smollm2.md \
        --splits-from benchmarks/results/accuracy-smollm2.md --part greedy --only dip:allocation=greedy
    python benchmarks/accuracy.py --table-only
    # kept rows measured again (on this machine, with their windows' NLLs for the Goals' intervals):
    python benchmarks/accuracy.py --remeasure --part again --only teal:- --densities 0.6

Several processes may share the plan (``--part``, ``--only``, ``--densities``): each keeps its own partial
file and every table is written from all of them; a row another process finished is not run again. A
protocol other than 16 × 2048 writes its own table (``accuracy-<model>-<windows>x<seqlen>.md``), never
over the full one.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from _common import machine, md_table, md_tables, write_rows_json

from dipdeploy.eval import EvalConfig, Evaluator, reachable
from dipdeploy.eval.paired import paired_rows
from dipdeploy.paths import write_atomic

RESULTS = Path(__file__).resolve().parent / "results"
NOTES = ("How each method was tuned (all on WikiText-2 validation, 4 × 512 tokens, never test): **DIP uniform** "
         "one K_in, K_glu for every layer, the split searched among ρ_in ∈ {1.0, 1.1, 1.2, 1.3}·ρ by calibration NLL; "
         "**joint** per-layer density and split together by a Lagrangian over Fisher-weighted per-layer error "
         "curves (docs/method.md, \"Joint allocation\"), kept only if it beats the uniform plan (default split "
         "1.1ρ) on held-out calibration tokens (else the row says uniform); **greedy** per-layer density from "
         "end-to-end sensitivity; **greedy-split** the greedy densities, each layer's in/glu split then taken from "
         "its own error curve (the joint allocation's per-layer split), kept only if it beats greedy on held-out "
         "calibration tokens (else the row says greedy); **TEAL** per-layer thresholds on |x| and |GLU~| at the (1 − share) quantiles, "
         "uniform: DIP's searched split, joint: each layer's shares from the same joint allocation (the role of "
         "TEAL's own greedy per-layer allocation); **CATS** per-layer threshold on |act(W_g x)|; **DIP-CA** the "
         "joint DIP plan (variant allocation=greedy: the greedy one), γ = 0.5, LFU, a cache of half the MLP rows' "
         "bytes shared by the row's `cache_split` (even: half of each group's rows; reads, the default: as `run "
         "--cache-split reads` shares them); "
         "**wina-in** DIP's input score |x_i|·s_i^0.5, its split searched like abs's. Rows are compared at equal MLP bytes "
         "read per token (`density_test`).")
PEERS = ("dip", "dip-ca", "teal", "cats", "gate", "up")
REGENERATE = "Regenerate: "  # the generated part of a table ends with this line; what follows is kept
#: What the table is read against: at every goal density the best DIP row at most the best TEAL row, and
#: at ρ = 0.5 the best DIP row within this multiple of dense perplexity.
GOAL_DENSITIES = (0.4, 0.5, 0.6, 0.75)
GOAL_X_DENSE = (0.5, 1.25)


def configs(quick: bool) -> list[tuple[str, float, dict]]:
    """Priority order: per density (0.5 first, then 0.4, 0.6, 0.75: where DIP trails TEAL most first) DIP
    uniform and joint (per-layer density and split, docs/method.md "Joint allocation"), TEAL uniform and
    with the same joint allocation, CATS, DIP-CA (γ = 0.5) on the joint plan, DIP with the greedy
    allocation (alone and with each layer's split from its error curve, ``greedy-split``) and with the `wina-in` score (docs/method.md "Scores"), alone and together; at ρ = 0.5
    also the WINA score under the joint allocation and DIP-CA on the greedy plans (with either score, and
    under the ``reads`` cache split);
    then the single-group baselines."""
    if quick:
        return [("dense", 1.0, {})] + [(m, 0.5, {}) for m in ("dip", "teal", "cats", "dip-ca")]
    joint, greedy, wina_in = {"allocation": "joint"}, {"allocation": "greedy"}, {"score": "wina-in"}
    greedy_split = {"allocation": "greedy-split"}
    out = [("dense", 1.0, {})]
    for rho in (0.5, 0.4, 0.6, 0.75):
        out += [("dip", rho, {}), ("dip", rho, joint), ("teal", rho, {}), ("teal", rho, joint), ("cats", rho, {}),
                ("dip-ca", rho, joint), ("dip", rho, greedy), ("dip", rho, greedy_split), ("dip", rho, wina_in),
                ("dip", rho, {**greedy, **wina_in})]
        if rho == 0.5:
            out += [("dip", 0.5, {**joint, "score": "wina"}), ("dip-ca", 0.5, greedy),
                    ("dip-ca", 0.5, {**greedy, **wina_in}), ("dip-ca", 0.5, {**greedy, "cache_split": "reads"})]
    for rho in (0.5, 0.4, 0.6, 0.75):
        out += [(m, rho, {}) for m in ("gate", "up")] + ([("glu", rho, {})] if rho == 0.75 else [])
    return [c for c in out if reachable(c[0], c[1])]


def splits_from(table: Path) -> dict:
    """(density, score) → searched ρ_in of the uniform DIP/TEAL rows of an earlier results table: the
    split search is deterministic on the same calibration text, so a rerun need not repeat it."""
    found = {}
    for row in _generated_table(table.read_text()):
        if row.get("method") in ("dip", "teal") and row.get("allocation") == "uniform" and row.get("variant") == "-":
            found[(round(float(row["target_density"]), 6), row["score"])] = (float(row["rho_in"]), {"split": f"from {table.name}"})
    return found


def _generated_table(text: str) -> list[dict[str, str]]:
    """The rows of a results file's generated table, the first one: the notes written by hand below it
    hold tables of their own, with other columns."""
    return md_tables(text)[0]


def kept_rows(table: Path) -> list[dict]:
    """The rows of an earlier results table of the same protocol, as rows of this script (with their
    keys), so rows measured once are kept in the regenerated table without being run again. Columns the
    earlier table did not have (e.g. ``density_test``) stay empty."""
    text = table.read_text()
    model = re.search(r"Model (\S+),", text).group(1)
    windows, seqlen = (int(v) for v in re.search(r"(\d+) windows × (\d+) tokens", text).groups())
    tokens = int(re.search(r"\((\d+) predicted tokens\)", text).group(1))
    rows = []
    for cells in _generated_table(text):
        row = {c: _cell(v) for c, v in cells.items() if c != "ppl_x_dense"}
        over = {} if row["variant"] == "-" else dict(_override(kv) for kv in row["variant"].split(","))
        if row["method"] == "dip-ca" and row.get("cache_split") in (None, ""):  # a table from before the column
            row["cache_split"] = over.get("cache_split", "even")  # the only split there was, unless the variant says
        row.update(model=model, tokens=tokens, seqlen=seqlen, windows=windows, kept_from=table.name,
                   key=_key(row["method"], row["target_density"], over))
        rows.append(row)
    return rows


def _cell(v: str):
    if v == "":
        return None
    try:
        return float(v)
    except ValueError:
        return v


def _override(kv: str) -> tuple[str, object]:
    a, b = kv.split("=", 1)
    return a, _cell(b)


def _key(method: str, rho: float, over: dict) -> str:
    return f"{method}|{rho}|{json.dumps(over, sort_keys=True)}"


def _variant(over: dict) -> str:
    """A configuration's overrides as its table's `variant` (``allocation=greedy,score=wina-in``; ``-``: none)."""
    return ",".join(f"{a}={b}" for a, b in over.items()) or "-"


def _selected(method: str, rho: float, over: dict, only: set[str] | None, rhos: set[float] | None) -> bool:
    """Whether ``--only`` (method or method:variant entries) and ``--densities`` select a configuration."""
    return (only is None or bool({method, f"{method}:{_variant(over)}"} & only)) and (rhos is None or rho in rhos)


def forget_kept(name: str, keys: set[str], partial: Path) -> int:
    """Drop ``keys`` from the table's `kept` partial file (and from this process's own, ``partial``) so that
    they are measured again; how many kept rows went. A key another process measured is refused: its row
    would stand twice in the table."""
    kept = RESULTS / f".{name}.kept.partial.json"
    for other in sorted(RESULTS.glob(f".{name}.*partial.json")):
        if other not in (kept, partial) and keys & {r["key"] for r in json.loads(other.read_text())}:
            raise ValueError(f"{other.name} has a row of the configurations to re-measure; remove it there (or "
                             f"run with that file's --part) to measure it again")
    dropped = 0
    for path in (kept, partial):
        if path.is_file():
            rows = json.loads(path.read_text())
            left = [r for r in rows if r["key"] not in keys]
            dropped += (len(rows) - len(left)) if path == kept else 0
            write_atomic(path, json.dumps(left, indent=1), force=True)
    return dropped


def _only(text: str) -> set[str]:
    """``--only``'s entries: a variant of several overrides keeps its commas (``dip:allocation=greedy,
    score=wina-in`` is one entry: a piece with ``=`` and no ``:`` continues the entry before it)."""
    out: list[str] = []
    for piece in text.split(","):
        if out and "=" in piece and ":" not in piece:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return set(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 windows × 512 tokens, ρ = 0.5 (≈2 min)")
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--splits-from", type=Path, help="reuse the searched splits of an earlier results table")
    ap.add_argument("--rows-from", type=Path, help="keep the measured rows of an earlier table of the same "
                    "protocol (written once to the partial file `kept`; their configurations are not run again)")
    ap.add_argument("--only", help="comma list of methods (or method:variant, e.g. dip:- or "
                    "dip:allocation=joint) to run; the rest of the plan is left out")
    ap.add_argument("--densities", help="comma list of target densities to run (default: all)")
    ap.add_argument("--part", default="", help="name of this process's partial file, so several processes "
                    "can share the plan (the table is written from all partial files)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--table-only", action="store_true", help="write the table from the partial files and stop "
                    "(no model is loaded)")
    ap.add_argument("--remeasure", action="store_true", help="measure the configurations --only and --densities "
                    "select again although the `kept` partial file has them (rows of another machine, or without "
                    "their windows' NLLs): their kept rows are dropped from it first")
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
    if args.rows_from:
        kept = RESULTS / f".{name}.kept.partial.json"
        if not kept.is_file():
            kept.write_text(json.dumps(kept_rows(args.rows_from), indent=1))
    done = json.loads(partial.read_text()) if partial.is_file() else []
    only = _only(args.only) if args.only else None
    rhos = {float(r) for r in args.densities.split(",")} if args.densities else None
    selected = [c for c in configs(args.quick) if _selected(*c, only, rhos)]
    if args.remeasure:
        keys = {_key(*c) for c in selected}
        try:
            dropped = forget_kept(name, keys, partial)
        except ValueError as err:
            print(f"accuracy.py: error: {err}", file=sys.stderr)
            sys.exit(2)
        done = [r for r in done if r["key"] not in keys]
        print(f"--remeasure: {dropped} kept row(s) dropped", flush=True)
    info = machine()
    if args.table_only:
        info["load_1min"] = "the load of each run: see the notes below (this table was written from the partial files)"
        write_table(_all_parts(name, done, partial), name, info, windows, seqlen, configs(args.quick))
        return
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
    for method, rho, over in selected:
        k = _key(method, rho, over)
        if k in {r["key"] for r in _all_parts(name, done, partial)}:  # done here or by another process
            continue
        t = time.time()
        row = ev.row(method, rho, **over)
        row.update(key=k, variant=_variant(over), wall_s=round(time.time() - t, 1),
                   cpu=info["cpu"])
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
    for other in sorted([*RESULTS.glob(f".{name}.partial.json"), *RESULTS.glob(f".{name}.*.partial.json")]):
        if other != partial:
            rows += json.loads(other.read_text())
    return rows


def write_table(rows: list[dict], name: str, info: dict, windows: int, seqlen: int, planned: list) -> None:
    dense = next((r["ppl"] for r in rows if r["method"] == "dense"), None)
    for r in rows:
        r["ppl_x_dense"] = r["ppl"] / dense if dense else None
    ordered = sorted(rows, key=lambda r: (r["target_density"], r["method"], r["variant"]))
    load = info["load_1min"]
    load = f"load {load} at start" if isinstance(load, (int, float)) else load
    cols = ["method", "variant", "target_density", "density", "density_test", "rho_in", "allocation", "greedy_strength",
            "score", "gamma", "policy", "cache_frac", "cache_split", "ppl", "ppl_x_dense", "calib_s", "eval_s", "cpu"]
    text = (f"# {name}: WikiText-2 test perplexity of sparse MLP methods\n\n"
            f"Model {rows[0]['model']}, {windows} windows × {seqlen} tokens ({rows[0]['tokens']} predicted tokens), "
            f"prefill and decode both sparsified; calibration: WikiText-2 validation (4 × 512 tokens).\n"
            f"Machine: {_machines(rows)}, {info['cores']} cores, {load} "
            f"(other jobs shared the CPU, so times are indicative only). "
            f"`density` is the MLP density ρ = (2ρ_in + ρ_glu)/3 of the plan (thresholds: expected on calibration text), "
            f"`density_test` the density realised on the test tokens (TEAL, CATS: measured; top-K methods: exact); "
            f"`rho_in` the mean input share; `greedy_strength` the skew the greedy allocation chose by held-out KL "
            f"(0: it kept the uniform plan; empty: not greedy, or not recorded).\n\n{NOTES}\n\n"
            f"{md_table(ordered, cols)}\n\n{goals(rows)}{_missing(rows, planned)}"
            f"{REGENERATE}`python benchmarks/accuracy.py` "
            f"(resumes from benchmarks/results/.{name}.partial.json).\n")
    path = RESULTS / f"{name}.md"
    write_atomic(path, text + _notes(path), force=True)


def _machines(rows: list[dict]) -> str:
    """The header's machine: rows kept from an earlier table or measured by another process may come from
    another machine than the one writing the table, so each row names its own (``cpu``)."""
    cpus = sorted({r["cpu"] for r in rows if r.get("cpu")})
    if len(cpus) == 1 and all(r.get("cpu") for r in rows):
        return cpus[0]
    return (f"each row's `cpu` ({'; '.join(cpus) or 'none recorded'}; empty: a row kept from an earlier table, "
            "whose machine the notes below name)")


def _notes(path: Path) -> str:
    """What follows the generated part of an existing table (the conditions of each run, written by hand):
    kept when the table is rewritten."""
    old = path.read_text() if path.is_file() else ""
    at = old.find(REGENERATE)
    return old[old.index("\n", at) + 1:] if at >= 0 and "\n" in old[at:] else ""


#: Beside the intervals of the Goals: what they measure and what they do not (dipdeploy.eval.paired).
PAIRED_NOTE = ("The intervals: the two rows' per-window NLLs on the same test windows, resampled together; "
               "they show how much the verdict depends on the windows of text drawn, not on the machine's "
               "arithmetic (compare rows of one `cpu`).")


def _versus(a: dict, b: dict) -> str:
    """``a``'s perplexity against ``b``'s as a change in percent, with its paired interval where there is one."""
    paired = paired_rows(a, b)
    return paired.percent() if paired else f"{100 * (a['ppl'] / b['ppl'] - 1):+.2f} %"


def goals(rows: list[dict]) -> str:
    """The Goals section: per goal density, the best DIP row against the best TEAL row (each method's
    lowest perplexity over its measured variants, so TEAL keeps its own best calibration), and the best DIP
    row at GOAL_X_DENSE's density against that multiple of dense."""
    best = {}
    for r in rows:
        k = (r["method"], r["target_density"])
        if r["method"] in ("dip", "teal") and (k not in best or r["ppl"] < best[k]["ppl"]):
            best[k] = r
    dense_row = next((r for r in rows if r["method"] == "dense"), None)
    dense = dense_row["ppl"] if dense_row else None
    lines = []
    for rho in GOAL_DENSITIES:
        dip, teal = best.get(("dip", rho)), best.get(("teal", rho))
        if dip is None or teal is None:
            lines.append(f"- ρ = {rho}: not measured (DIP or TEAL row missing)")
            continue
        met = "met" if dip["ppl"] <= teal["ppl"] else "NOT met"
        lines.append(f"- ρ = {rho}, DIP ≤ TEAL: **{met}**: best DIP {dip['ppl']:.2f} ({dip['variant']}) vs best TEAL "
                     f"{teal['ppl']:.2f} ({teal['variant']}), {_versus(dip, teal)}")
    rho, limit = GOAL_X_DENSE
    dip = best.get(("dip", rho))
    if dip is not None and dense is not None:
        met = "met" if dip["ppl"] <= limit * dense else "NOT met"
        lines.append(f"- ρ = {rho}, DIP ≤ {limit} × dense: **{met}**: best DIP {dip['ppl']:.2f} ({dip['variant']}) = "
                     f"{dip['ppl'] / dense:.3f} × dense {dense:.2f} (limit {limit * dense:.2f})"
                     + (f"; against dense {paired.percent()}" if (paired := paired_rows(dip, dense_row)) else ""))
    lines += [f"- {PAIRED_NOTE}"] if any("paired bootstrap" in line for line in lines) else []
    for method in ("dip", "teal"):
        measured = {rho: sorted(r["variant"] for r in rows if r["method"] == method and r["target_density"] == rho)
                    for rho in GOAL_DENSITIES}
        lines.append(f"- {method.upper()} variants measured: " + "; ".join(
            f"ρ = {rho}: {', '.join(v) or 'none'}" for rho, v in measured.items()))
    return "## Goals\n\n" + "\n".join(lines) + "\n\n"


def _missing(rows: list[dict], planned: list) -> str:
    have = {(r["method"], r["target_density"], r["variant"]) for r in rows}
    todo = [f"{m} ρ={d}" + (f" ({_variant(o)})" if o else "")
            for m, d, o in planned if (m, d, _variant(o)) not in have]
    return (f"**Planned, not measured at this protocol** (a run resumes them): {', '.join(todo)}.\n\n"
            if todo else "")


if __name__ == "__main__":
    main()
