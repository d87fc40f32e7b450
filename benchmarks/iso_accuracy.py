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

    python benchmarks/iso_accuracy.py --windows 2 --seqlen 1024
    python benchmarks/iso_accuracy.py --rows results/.accuracy-smollm2-2x1024.a.partial.json,...  # no new evals

With ``--rows`` (the partial files of ``benchmarks/accuracy.py``) nothing is evaluated: each method's
measured densities are its grid and the result is the lowest measured density within the bound (no
bisection); only the traces for the throughput are recorded.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _common import machine, md_table

from dipdeploy.eval import EvalConfig, Evaluator
from dipdeploy.eval.iso import lowest_density, sweep_grid

RESULTS = Path(__file__).resolve().parent / "results"
#: (label, method, calibration overrides) of each swept method.
METHODS = {
    "dip-joint": ("dip", {"allocation": "joint"}),
    "dip": ("dip", {}),
    "teal-joint": ("teal", {"allocation": "joint"}),
    "teal": ("teal", {}),
    "cats": ("cats", {}),
}
TOLERANCES = (0.01, 0.03)


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
        raise SystemExit("error: no dense row in --rows; run benchmarks/accuracy.py with dense first")
    return out


def plot(curves: dict, dense_ppl: float, tput: dict, dense_tput: float, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120)
    for label, pts in curves.items():
        rs = sorted(pts)
        a.plot(rs, [pts[r] for r in rs], marker="o", ms=3, label=label)
        b.plot([tput[round(r, 6)] for r in rs], [pts[r] for r in rs], marker="o", ms=3, label=label)
    for ax in (a, b):
        for tol, ls in zip(TOLERANCES, (":", "--")):
            ax.axhline(dense_ppl * (1 + tol), color="grey", ls=ls, lw=0.8, label=f"dense +{tol:.0%}")
        ax.set_yscale("log")
        ax.set_ylabel("WikiText-2 perplexity")
        ax.grid(alpha=0.3)
    b.plot([dense_tput], [dense_ppl], marker="*", ms=10, color="k", ls="", label="dense")
    a.set_xlabel("MLP density ρ (fraction of MLP weight bytes read per token)")
    b.set_xlabel("simulated tokens/s")
    a.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--methods", default="dip-joint,teal-joint,cats", help=f"comma list of {', '.join(METHODS)}")
    ap.add_argument("--grid", default="0.4,0.95,0.05", help="lo,hi,step of the density sweep")
    ap.add_argument("--refine", type=int, default=2, help="bisection steps after the sweep")
    ap.add_argument("--device", default="a18")
    ap.add_argument("--mlp-frac", type=float, default=0.5, help="share of the MLP the DRAM budget holds")
    ap.add_argument("--trace-tokens", type=int, default=256)
    ap.add_argument("--rows", help="comma list of accuracy.py partial JSON files: use their rows, evaluate nothing")
    args = ap.parse_args()
    name = f"iso-accuracy-{args.model.split('-')[0]}"
    info, t0 = machine(), time.time()
    ev = Evaluator(EvalConfig(model=args.model, seqlen=args.seqlen, max_windows=args.windows, progress=True))
    measured = _measured(args.rows) if args.rows else None
    if measured is not None:
        dense, args.windows, args.seqlen = measured.pop("dense")
        args.methods, args.refine, args.grid = ",".join(measured), 0, "measured densities"
    else:
        dense = ev.row("dense", 1.0)["ppl"]
    tput: dict = {}
    dense_tput = throughput_at(ev, 1.0, args.device, args.mlp_frac, args.trace_tokens, tput)
    curves, rows = {}, []
    for label in args.methods.split(","):
        memo: dict = dict(measured[label]) if measured is not None else {}
        grid = sorted(memo) if measured is not None else sweep_grid(*(float(v) for v in args.grid.split(",")))

        def ppl_at(rho, label=label):
            method, over = METHODS[label]
            r = ev.row(method, rho, **over)
            print(f"{label:11s} ρ={rho:<8g} ppl={r['ppl']:.3f} realised ρ={r['density_test']}", flush=True)
            return r["ppl"]

        for tol in TOLERANCES:
            iso = lowest_density(ppl_at, dense, tol, grid, args.refine, memo)
            rho = iso.density
            rows.append({"method": label, "tolerance": f"+{tol:.0%}", "ppl_limit": iso.limit,
                         "lowest_density": rho if rho is not None else "none in grid",
                         "at_grid_floor": iso.at_grid_floor, "bracket": iso.bracket, "ppl": iso.ppl,
                         "tok_s": throughput_at(ev, rho, args.device, args.mlp_frac, args.trace_tokens, tput)
                         if rho is not None else None})
        curves[label] = dict(memo)
        for r in memo:
            throughput_at(ev, r, args.device, args.mlp_frac, args.trace_tokens, tput)
    how = (f"Grid: the densities each method was measured at (rows of {args.rows}; density = the one realised "
           f"on the test tokens), no bisection" if measured is not None else
           f"Sweep {args.grid} (lo,hi,step), then {args.refine} bisection steps (each a real evaluation)")
    title = (f"{args.model}, WikiText-2 test {args.windows}×{args.seqlen}; tok/s simulated on {args.device}, "
             f"BQ4, DRAM = non-MLP + {args.mlp_frac:.0%} of MLP, LFU")
    plot(curves, dense, tput, dense_tput, RESULTS / f"{name}.png", title)
    sweep_rows = [{"method": k, "density": r, "ppl": v, "ppl_x_dense": v / dense, "tok_s": tput[round(r, 6)]}
                  for k, pts in curves.items() for r, v in sorted(pts.items())]
    (RESULTS / f".{name}.json").write_text(json.dumps({"dense": dense, "iso": rows, "sweep": sweep_rows}, indent=1))
    text = (f"# {name}: lowest MLP density within +1 % / +3 % of dense perplexity (`benchmarks/iso_accuracy.py`)\n\n"
            f"Model {args.model}, WikiText-2 test {args.windows} windows × {args.seqlen} tokens, dense PPL "
            f"{dense:.4g}; calibration WikiText-2 validation (4 × 512). {how}; a method "
            f"passes at ρ only if every denser grid point passes. Throughput: {title.split('; ')[1]} "
            f"(dense {dense_tput:.4g} tok/s); TEAL and CATS take DIP's figure at the same ρ (same bytes per "
            f"token; their reuse pattern is not simulated). Machine: {info['cpu']}, {info['cores']} cores, "
            f"load {info['load_1min']} at start; {time.time() - t0:.0f} s.\n\n"
            f"{md_table(rows, ['method', 'tolerance', 'ppl_limit', 'lowest_density', 'at_grid_floor', 'bracket', 'ppl', 'tok_s'])}"
            f"\n\nThe sweep (plotted in {name}.png):\n\n"
            f"{md_table(sweep_rows, ['method', 'density', 'ppl', 'ppl_x_dense', 'tok_s'])}\n\n"
            f"Regenerate: `python benchmarks/iso_accuracy.py --windows {args.windows} --seqlen {args.seqlen} "
            f"--methods {args.methods} --grid {args.grid} --refine {args.refine}`.\n")
    (RESULTS / f"{name}.md").write_text(text)


if __name__ == "__main__":
    main()
