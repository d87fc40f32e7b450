"""The iso-accuracy view: per method, the lowest MLP density within +1 % and +3 % of dense perplexity,
and the simulated throughput there; plus the Pareto plots (PPL vs density, PPL vs tokens/s).

Each method's WikiText-2 test perplexity is swept over a density grid (default 0.4–0.95, step 0.05),
then bisected between the last failing and the first passing grid point (``dipdeploy.eval.iso``; every
midpoint is a real evaluation, not an interpolation). Calibration is the Evaluator's (WikiText-2
validation, never test).

Throughput comes from the HW simulator (``dipdeploy/sim``): a DIP trace of the model at each density
(uniform plan, default split, the first ``--trace-tokens`` tokens of the validation text) replayed with
LFU on ``--device`` at a DRAM budget that holds the non-MLP weights plus ``--mlp-frac`` of the MLP
(BQ4). TEAL and CATS read the same bytes per token at the same ρ, but their selections are not
top-K, so their throughput is DIP's at that density (their reuse pattern is not simulated).

    # full protocol (16 × 2048), the dense end swept, the rows of the accuracy table as further grid points:
    python benchmarks/iso_accuracy.py --methods dip,teal --grid 0.75,0.95,0.05 --refine 1 \
        --seed-from benchmarks/results/accuracy-smollm2.md --part a &
    python benchmarks/iso_accuracy.py --methods dip-greedy --refine 0 ... --part b   # beside it
    python benchmarks/iso_accuracy.py --methods dip,teal,dip-greedy --refine-for dip-greedy=0 ... --table-only --force
    python benchmarks/iso_accuracy.py --quick    # 2 windows × 512 tokens, DIP only, ρ ≥ 0.85 (≈3 min)
    python benchmarks/iso_accuracy.py --rows results/.accuracy-smollm2-2x1024.a.partial.json,...  # no new evals

Every evaluation is kept in a partial file (``--part`` names this process's), so a killed run resumes
and several processes can share the methods; each run reads every partial file of its protocol.
``--seed-from`` adds the rows of an ``accuracy.py`` table of the same protocol as measured grid points
(not re-run; the sweep table names each point's source). With ``--rows`` (the partial files of
``benchmarks/accuracy.py``) nothing is evaluated: each method's measured densities are its grid and the
result is the lowest measured density within the bound (no bisection); only the traces for the
throughput are recorded. A protocol other than 16 × 2048 writes its own table
(``iso-accuracy-<model>-<windows>x<seqlen>.md``), never over the full one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from _common import machine, md_table, save_figure, write_rows_json

from dipdeploy.eval import EvalConfig, Evaluator
from dipdeploy.eval.iso import lowest_density, sweep_grid

RESULTS = Path(__file__).resolve().parent / "results"
#: (label, method, calibration overrides) of each swept method. ``dip-greedy``: the DIP allocation with
#: the lowest perplexity at ρ = 0.5–0.75 in accuracy-smollm2.md (16 × 2048).
METHODS = {
    "dip-joint": ("dip", {"allocation": "joint"}),
    "dip": ("dip", {}),
    "dip-greedy": ("dip", {"allocation": "greedy"}),
    "teal-joint": ("teal", {"allocation": "joint"}),
    "teal": ("teal", {}),
    "cats": ("cats", {}),
}
TOLERANCES = (0.01, 0.03)
#: The source of a point this script evaluated (a seeded point names its table; only those are grid points).
MEASURED = "iso_accuracy.py"
FULL = (16, 2048)
#: The lower plots' PPL range, × dense: past +3 % with room for the points just below the crossings.
ZOOM = 1.08


@dataclass
class Point:
    """One measured (method, density): ``rho`` is the grid coordinate (the target density),
    ``density_test`` the density realised on the test tokens, ``source`` where the figure comes from."""

    label: str
    rho: float
    ppl: float
    density_test: float | None
    source: str
    calib_s: float | None = None
    eval_s: float | None = None


def refuse(message: str) -> None:
    """Bad input: one line naming the problem and the fix, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def table_name(model: str, windows: int, seqlen: int) -> str:
    name = f"iso-accuracy-{model.split('-')[0]}"
    return name if (windows, seqlen) == FULL else f"{name}-{windows}x{seqlen}"


def variant(over: dict) -> str:
    """An override dict as accuracy.py's ``variant`` column spells it."""
    return ",".join(f"{k}={v}" for k, v in over.items()) or "-"


def seeded(table: Path, labels: list[str], windows: int, seqlen: int) -> list[Point]:
    """The points of ``labels`` in an accuracy.py results table, which must be of the protocol of this
    run (its rows were measured by the same Evaluator, so they are grid points here). Its dense row is
    not used: this run measures dense itself, at full precision (the table keeps four digits)."""
    from accuracy import kept_rows

    if not table.is_file():
        refuse(f"--seed-from {table}: no such file")
    rows = kept_rows(table)
    if rows and (rows[0]["windows"], rows[0]["seqlen"]) != (windows, seqlen):
        refuse(f"--seed-from {table} is {rows[0]['windows']} × {rows[0]['seqlen']}, this run {windows} × {seqlen}")
    points = []
    for label in labels:
        method, over = METHODS[label]
        for r in rows:
            if r["method"] == method and r["variant"] == variant(over):
                points.append(Point(label, round(r["target_density"], 6), r["ppl"], r.get("density_test"),
                                    table.name, r.get("calib_s"), r.get("eval_s")))
    return points


class Partial:
    """This process's partial file and the points of every other partial file of the same table."""

    def __init__(self, name: str, part: str, model: str, windows: int, seqlen: int):
        self.name, self.protocol = name, {"model": model, "windows": windows, "seqlen": seqlen}
        self.path = RESULTS / f".{name}{'.' + part if part else ''}.partial.json"
        self.dense: float | None = None
        self.points: list[Point] = []
        if self.path.is_file():
            data = json.loads(self.path.read_text())
            self.dense, self.points = data["dense"], [Point(**p) for p in data["points"]]

    def all_points(self) -> tuple[float | None, list[Point]]:
        dense, points = self.dense, list(self.points)
        for other in sorted([*RESULTS.glob(f".{self.name}.partial.json"), *RESULTS.glob(f".{self.name}.*.partial.json")]):
            if other == self.path:
                continue
            data = json.loads(other.read_text())
            if {k: data.get(k) for k in self.protocol} == self.protocol:
                dense = dense if dense is not None else data["dense"]
                points += [Point(**p) for p in data["points"]]
        return dense, points

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({**self.protocol, "dense": self.dense,
                                   "points": [asdict(p) for p in self.points]}, indent=1))
        tmp.replace(self.path)


def throughput_at(ev: Evaluator, rho: float, device: str, mlp_frac: float, tokens: int, memo: dict) -> float:
    """Simulated tokens/s of uniform DIP at density ρ (module docstring)."""
    key = round(rho, 6)
    if key in memo:
        return memo[key]
    from dipdeploy.registry import get_model
    from dipdeploy.sim import SimConfig, simulate
    from dipdeploy.sim.memory import minimum_budget
    from dipdeploy.sim.precision import bytes_per_weight
    from dipdeploy.sparsity.plan import SparsityConfig, uniform_plan
    from dipdeploy.sparsity.trace import record_trace

    c = ev.lm.model.config
    plan = uniform_plan(SparsityConfig(method="dip", density=min(rho, 1.0)), ev.lm.name, c.num_hidden_layers,
                        c.hidden_size, c.intermediate_size)
    trace = record_trace(ev.lm, plan, ev.calib.reshape(1, -1)[:, :tokens])
    shape = get_model(ev.lm.name).shape
    bpw = bytes_per_weight("bq4")
    budget = minimum_budget(shape, bpw) + mlp_frac * shape.mlp_params_per_layer() * shape.num_hidden_layers * bpw
    res = simulate(trace, SimConfig(device=device, dram_budget=budget, precision="bq4", method="traced",
                                    policy="lfu", warmup=16))
    memo[key] = res.tok_s
    return res.tok_s


def _measured(files: str) -> dict:
    """Per method label (method, or method+variant), density → PPL of accuracy.py rows; "dense" → (PPL,
    windows, seqlen). A row's density is the one it realised on the test tokens."""
    out: dict = {}
    for f in files.split(","):
        for r in json.loads(Path(f).read_text()):
            if r["method"] == "dense":
                out["dense"] = (r["ppl"], r["windows"], r["seqlen"])
                continue
            label = r["method"] + ("" if r["variant"] == "-" else "+" + r["variant"].replace("allocation=", ""))
            out.setdefault(label, {})[round(r.get("density_test", r["density"]), 6)] = r["ppl"]
    if "dense" not in out:
        refuse("no dense row in --rows; run benchmarks/accuracy.py with dense first")
    return out


def plot(curves: dict, dense_ppl: float, tput: dict, dense_tput: float, out: Path, title: str) -> None:
    """PPL against density and against tokens/s: the whole sweep (log scale) above, the band up to
    ZOOM × dense below, where the +1 % / +3 % crossings lie (CATS' low-density points, thousands, would
    otherwise flatten every method onto the dense line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), dpi=120)
    for row, zoom in zip(axes, (False, True)):
        a, b = row
        for label, pts in curves.items():
            rs = sorted(pts)
            a.plot(rs, [pts[r] for r in rs], marker="o", ms=3, label=label)
            b.plot([tput[round(r, 6)] for r in rs], [pts[r] for r in rs], marker="o", ms=3, label=label)
        for ax in row:
            for tol, ls in zip(TOLERANCES, (":", "--")):
                ax.axhline(dense_ppl * (1 + tol), color="grey", ls=ls, lw=0.8, label=f"dense +{tol:.0%}")
            if zoom:
                ax.set_ylim(dense_ppl * 0.995, dense_ppl * ZOOM)
            else:
                ax.set_yscale("log")
            ax.set_ylabel("WikiText-2 perplexity" + (f" (up to {ZOOM:g} × dense)" if zoom else ""))
            ax.grid(alpha=0.3)
        b.plot([dense_tput], [dense_ppl], marker="*", ms=10, color="k", ls="", label="dense")
        a.set_xlabel("MLP density ρ (fraction of MLP weight bytes read per token)")
        b.set_xlabel("simulated tokens/s")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 windows × 512 tokens, DIP at ρ ≥ 0.85, no bisection")
    ap.add_argument("--json", help="write the iso rows and the sweep as JSON")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--windows", type=int, default=FULL[0])
    ap.add_argument("--seqlen", type=int, default=FULL[1])
    ap.add_argument("--methods", default="dip-joint,teal-joint,cats", help=f"comma list of {', '.join(METHODS)}")
    ap.add_argument("--grid", default="0.4,0.95,0.05", help="lo,hi,step of the density sweep")
    ap.add_argument("--refine", type=int, default=2, help="bisection steps after the sweep")
    ap.add_argument("--refine-for", default="", help="comma list of LABEL=N: another number of bisection "
                    "steps for these methods (e.g. dip-greedy=0, whose calibration takes minutes per density)")
    ap.add_argument("--device", default="a18")
    ap.add_argument("--mlp-frac", type=float, default=0.5, help="share of the MLP the DRAM budget holds")
    ap.add_argument("--trace-tokens", type=int, default=256)
    ap.add_argument("--rows", help="comma list of accuracy.py partial JSON files: use their rows, evaluate nothing")
    ap.add_argument("--seed-from", type=Path, help="an accuracy.py results table of the same protocol: its rows "
                    "of these methods are measured grid points (not re-run)")
    ap.add_argument("--part", default="", help="name of this process's partial file (several processes may "
                    "share the methods; each reads every partial file of the protocol)")
    ap.add_argument("--table-only", action="store_true", help="evaluate nothing: every point the search needs "
                    "must be in the partial files (or --seed-from)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing results table")
    args = ap.parse_args()
    if args.quick:
        args.windows, args.seqlen, args.methods, args.grid, args.refine = 2, 512, "dip", "0.85,0.95,0.05", 0
    labels = args.methods.split(",")
    bad = [m for m in labels if m not in METHODS]
    if bad:
        refuse(f"--methods {','.join(bad)}: unknown; choose from {', '.join(METHODS)}")
    try:
        lo, hi, step = (float(v) for v in args.grid.split(","))
    except ValueError:
        refuse(f"--grid {args.grid!r}: give lo,hi,step, e.g. 0.75,0.95,0.05")
    if not (0 < lo <= hi < 1 and step > 0):
        refuse(f"--grid {args.grid}: need 0 < lo <= hi < 1 and step > 0")
    try:
        refine_for = {k: int(v) for k, v in (kv.split("=") for kv in args.refine_for.split(",") if kv)}
    except ValueError:
        refuse(f"--refine-for {args.refine_for!r}: give LABEL=N[,LABEL=N], e.g. dip-greedy=0")
    if set(refine_for) - set(labels):
        refuse(f"--refine-for names {','.join(sorted(set(refine_for) - set(labels)))}, not among --methods")
    name = table_name(args.model, args.windows, args.seqlen) if not args.quick else f"iso-accuracy-{args.model.split('-')[0]}-quick"
    out_md = RESULTS / f"{name}.md"
    if out_md.exists() and not args.force:
        refuse(f"{out_md} exists; pass --force to overwrite it")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    info, t0 = machine(), time.time()
    measured = _measured(args.rows) if args.rows else None
    seeds = seeded(args.seed_from, labels, args.windows, args.seqlen) if args.seed_from else []
    ev = Evaluator(EvalConfig(model=args.model, seqlen=args.seqlen, max_windows=args.windows, progress=True))
    partial = Partial(name, args.part, args.model, args.windows, args.seqlen)
    points: list[Point] = []
    if measured is not None:
        dense, args.windows, args.seqlen = measured.pop("dense")
        labels, args.refine, args.grid = list(measured), 0, "measured densities"
    else:
        dense, points = partial.all_points()
        if dense is None:
            if args.table_only:
                refuse("--table-only: no dense perplexity in the partial files; run without --table-only first")
            partial.dense = dense = ev.row("dense", 1.0)["ppl"]
            partial.save()
        known = {(p.label, p.rho) for p in points}
        points += [p for p in seeds if (p.label, p.rho) not in known]
    tput: dict = {}
    dense_tput = throughput_at(ev, 1.0, args.device, args.mlp_frac, args.trace_tokens, tput)
    curves, rows = {}, []
    by_point = {(p.label, p.rho): p for p in points}
    for label in labels:
        if measured is not None:
            memo, grid = dict(measured[label]), sorted(measured[label])
        else:
            memo = {p.rho: p.ppl for p in points if p.label == label}
            grid = sorted(set(sweep_grid(lo, hi, step)) | {p.rho for p in points if p.label == label
                                                           and p.source != MEASURED})

        def ppl_at(rho, label=label):
            if args.table_only or measured is not None:
                refuse(f"--table-only: {label} at ρ = {rho:g} is not in the partial files; run without --table-only")
            method, over = METHODS[label]
            r = ev.row(method, rho, **over)
            p = Point(label, round(rho, 6), r["ppl"], r["density_test"], MEASURED, r["calib_s"], r["eval_s"])
            partial.points.append(p)
            partial.save()
            by_point[(label, p.rho)] = p
            print(f"{label:11s} ρ={rho:<8g} ppl={r['ppl']:.3f} realised ρ={r['density_test']} "
                  f"({r['calib_s']} + {r['eval_s']} s)", flush=True)
            return r["ppl"]

        for tol in TOLERANCES:
            refine = refine_for.get(label, args.refine)
            iso = lowest_density(ppl_at, dense, tol, grid, refine, memo)
            rho = iso.density
            rows.append({"method": label, "tolerance": f"+{tol:.0%}", "refine": refine, "ppl_limit": iso.limit,
                         "lowest_density": rho if rho is not None else "none in grid",
                         "at_grid_floor": iso.at_grid_floor, "bracket": iso.bracket, "ppl": iso.ppl,
                         "tok_s": throughput_at(ev, rho, args.device, args.mlp_frac, args.trace_tokens, tput)
                         if rho is not None else None})
        curves[label] = dict(memo)
        for r in memo:
            throughput_at(ev, r, args.device, args.mlp_frac, args.trace_tokens, tput)
    how = (f"Grid: the densities each method was measured at (rows of {args.rows}; density = the one realised "
           f"on the test tokens), no bisection" if measured is not None else
           f"Sweep {args.grid} (lo,hi,step)" + (f" plus the densities of --seed-from {args.seed_from.name}"
                                                 if args.seed_from else "")
           + f", then {args.refine} bisection steps (each a real evaluation)"
           + "".join(f"; {k}: {v}" for k, v in refine_for.items()))
    title = (f"{args.model}, WikiText-2 test {args.windows}×{args.seqlen}; tok/s simulated on {args.device}, "
             f"BQ4, DRAM = non-MLP + {args.mlp_frac:.0%} of MLP, LFU")
    plot(curves, dense, tput, dense_tput, RESULTS / f"{name}.png", title)
    sweep_rows = []
    for k, pts in curves.items():
        for r, v in sorted(pts.items()):
            p = by_point.get((k, r))
            sweep_rows.append({"method": k, "density": r, "density_test": p.density_test if p else None,
                               "ppl": v, "ppl_x_dense": v / dense, "tok_s": tput[round(r, 6)],
                               "source": p.source if p else (args.rows or "")})
    write_rows_json([{"dense": dense, "iso": rows, "sweep": sweep_rows}], args.json)
    regen = (f"python benchmarks/iso_accuracy.py --windows {args.windows} --seqlen {args.seqlen} "
             f"--methods {','.join(labels)} --grid {args.grid} --refine {args.refine}"
             + (f" --refine-for {args.refine_for}" if refine_for else "")
             + (f" --seed-from benchmarks/results/{args.seed_from.name}" if args.seed_from else "") + " --force"
             if not args.quick else "python benchmarks/iso_accuracy.py --quick --force")
    text = (f"# {name}: lowest MLP density within +1 % / +3 % of dense perplexity (`benchmarks/iso_accuracy.py`)\n\n"
            f"Model {args.model}, WikiText-2 test {args.windows} windows × {args.seqlen} tokens, dense PPL "
            f"{dense:.4g}; calibration WikiText-2 validation (4 × 512). {how}; a method "
            f"passes at ρ only if every denser grid point passes. Throughput: {title.split('; ')[1]} "
            f"(dense {dense_tput:.4g} tok/s); TEAL and CATS take DIP's figure at the same ρ (same bytes per "
            f"token; their reuse pattern is not simulated). Machine: {info['cpu']}, {info['cores']} cores, "
            f"load {info['load_1min']} at the start of this run; {time.time() - t0:.0f} s.\n\n"
            f"{md_table(rows, ['method', 'tolerance', 'refine', 'ppl_limit', 'lowest_density', 'at_grid_floor', 'bracket', 'ppl', 'tok_s'])}"
            f"\n\nThe sweep (plotted in {name}.png; `density` is the grid coordinate, the target density, "
            f"`density_test` the one realised on the test tokens where recorded, `source` where the figure "
            f"was measured):\n\n"
            f"{md_table(sweep_rows, ['method', 'density', 'density_test', 'ppl', 'ppl_x_dense', 'tok_s', 'source'])}\n\n"
            f"Regenerate: `{regen}` (add `--part NAME` to split the methods over processes; each evaluation "
            f"is kept in `benchmarks/results/.{name}[.NAME].partial.json`).\n")
    tmp = out_md.with_name(f".{out_md.name}.tmp")
    tmp.write_text(text)
    tmp.replace(out_md)


if __name__ == "__main__":
    main()
