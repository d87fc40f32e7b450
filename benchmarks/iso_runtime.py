"""The iso-accuracy view measured by the runtime: ``dipdeploy run``'s decode speed on this disk at the MLP
densities of ``iso_accuracy.py``'s sweep, beside dense-static under the same DRAM budget.

``iso_accuracy.py`` finds each method's lowest density within +1 % / +3 % of dense perplexity and prices
it with the HW simulator. This script prices the same densities with the host runtime instead, reading
the rows that miss from this disk (``--io auto``: O_DIRECT where the plan leaves rows on Flash): for each
DIP density of the sweep table, a BQ4 bundle (uniform plan, ρ_in = 1.1ρ, the split ``dipdeploy demo``
uses; bundles are cached under ``build/iso-runtime/``), run with LFU and plain DIP selection (γ = 1, the
method whose perplexity the sweep measured), and dense-static: the ρ = 1 bundle with its most used rows
pinned, the README's fair dense baseline. Each budget is the engine's ``--dram-budget`` (the share of the
MLP rows' bytes cached; the dense weights and the KV cache are resident on top). Every configuration
starts cold (the MLP file dropped from the page cache), decodes ``--tokens`` tokens after each of two
fixed prompts, and the repeats interleave the configurations, so each ratio to dense-static comes from
one repeat on one machine state; the table gives medians over repeats. TEAL and CATS cannot be exported
(their thresholds give no fixed K for the runtime's slots), so they have no measured row; perplexity is
the sweep table's, on WikiText-2 test.

DIP-CA (``--dip-ca``) is not in the sweep: its perplexity depends on the cache, so at each of its
densities (default: DIP's lowest densities within tolerance) and budgets it is evaluated here, the torch
reference with the budget's cache fraction, the runtime's ``reads`` split, LFU and the plan's γ, on the
sweep table's protocol (``dipdeploy eval --method dip-ca --cache-frac``; memoised in
``benchmarks/results/.iso-runtime-<model>.ppl.json``). A budget that holds every row makes the
cache-aware score the plain one (every row resident), so there its perplexity is DIP's.

    python benchmarks/iso_runtime.py                  # the sweep's DIP densities, budgets 50 % and 100 %
    python benchmarks/iso_runtime.py --dip-ca         # ... and DIP-CA at DIP's iso densities
    python benchmarks/iso_runtime.py --quick          # ρ 0.825 and dense, 50 %, 8 tokens, 1 repeat
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
import sys
import time
from pathlib import Path

from _common import lscpu, machine, md_table, md_tables, positive_int, publish, save_figure
from flash import storage

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ("The history of the city begins in the early", "In mathematics, a prime number is")
INPUT_SHARE = 1.1  # ρ_in = 1.1ρ, capped at 1 (docs/method.md, "The in/glu split")
COLS = ["method", "density", "ppl", "ppl_x_dense", "budget", "io", "tok_s", "x_dense_static", "flash_mb_per_token",
        "device_mb_per_token", "requests_per_token", "hit_rate", "repeats"]


def refuse(message: str) -> None:
    """Bad input: one line naming the problem and the fix, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def sweep(table: Path) -> tuple[str, float, dict[str, dict[float, float]], list[dict]]:
    """(model, dense PPL, method → {density: PPL}, iso rows) of an ``iso_accuracy.py`` results table."""
    text = table.read_text()
    model = re.search(r"^Model (\S+),", text, re.M)
    dense = re.search(r"dense PPL ([\d.]+)", text)
    if not (model and dense):
        refuse(f"{table}: not an iso_accuracy.py table (no 'Model …, dense PPL …' line); give one with --from")
    tables = md_tables(text)
    iso = next((t for t in tables if t and "lowest_density" in t[0]), None)
    points = next((t for t in tables if t and "ppl_x_dense" in t[0]), None)
    if iso is None or points is None:
        refuse(f"{table}: no iso table and sweep table in it; regenerate it with benchmarks/iso_accuracy.py")
    curves: dict[str, dict[float, float]] = {}
    for r in points:
        curves.setdefault(r["method"], {})[float(r["density"])] = float(r["ppl"])
    return model.group(1), float(dense.group(1)), curves, iso


def bundle_for(model: str, density: float, root: Path, method: str = "dip") -> Path:
    """The BQ4 bundle of uniform ``method`` (dip, dip-ca) at ``density`` (ρ = 1: every row, the dense-static
    bundle), exported once."""
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    path = root / f"{model}-{method}-{density:g}-bq4"
    if not (path / "manifest.json").is_file():
        t0 = time.time()
        export_model(ExportConfig(model=model, method=method, density=density, rho_in=min(1.0, INPUT_SHARE * density),
                                  quant="bq4", validate_tokens=0), path, force=True)
        print(f"exported {path.name} in {time.time() - t0:.0f} s", flush=True)
    return path


def budget_fraction(budget: str) -> float:
    """``--dram-budget`` as the share of the MLP rows' bytes cached ("50%" → 0.5), what DIP-CA's
    perplexity depends on; a budget in bytes cannot be priced without a bundle, so --dip-ca refuses it."""
    if not re.fullmatch(r"\d+(\.\d+)?%", budget):
        refuse(f"--budgets {budget!r}: with --dip-ca give each budget as a percentage (e.g. 50%), the cache "
               "fraction its perplexity is evaluated at")
    return min(float(budget[:-1]) / 100, 1.0)


def dipca_ppl(model: str, density: float, frac: float, protocol: tuple[int, int], memo: Path) -> float:
    """WikiText-2 test perplexity of uniform DIP-CA at ``density`` with caches of ``frac`` of the MLP bytes
    (the torch reference: LFU, the plan's γ, the ``reads`` split, ρ_in = 1.1ρ), memoised in ``memo``."""
    windows, seqlen = protocol
    key = f"{model}|{density:g}|{frac:g}|{windows}x{seqlen}"
    cache = json.loads(memo.read_text()) if memo.is_file() else {}
    if key not in cache:
        from dipdeploy.paths import write_atomic

        cache[key] = evaluator(model, windows, seqlen).row("dip-ca", density, rho_in=min(1.0, INPUT_SHARE * density),
                                                           policy="lfu", cache_frac=frac)["ppl"]
        write_atomic(memo, json.dumps(cache, indent=1), force=True)
    return cache[key]


@functools.cache
def evaluator(model: str, windows: int, seqlen: int):
    """One Evaluator (the model, its calibration and test windows loaded once) for every DIP-CA row."""
    from dipdeploy.eval import EvalConfig, Evaluator

    return Evaluator(EvalConfig(model=model, seqlen=seqlen, max_windows=windows, progress=True))


def measure(bundle: Path, policy: str, budget: str, tokens: int, gamma: float | None = 1.0) -> dict:
    """One cold run of a configuration: token-weighted decode figures over the prompts (``gamma`` None:
    the bundle's)."""
    from dipdeploy.runtime import Engine

    eng = Engine(bundle, dram_budget=budget, policy=policy, gamma=gamma, native=True, cold=True, context=512)
    try:
        eng.generate(PROMPTS[0], 4, stop_at_eos=False)  # the sessions' first-run allocations
        eng.flash.drop_page_cache()
        steps = seconds = flash = device = requests = hits = 0.0
        for prompt in PROMPTS:
            s = eng.generate(prompt, tokens, stop_at_eos=False).stats
            n = s.new_tokens - 1
            steps, seconds = steps + n, seconds + s.decode_s
            flash += s.flash_mb_per_token * n
            device += (s.flash_device_mb_per_token or 0.0) * n
            requests += s.flash_requests_per_token * n
            hits += s.hit_rate * n
        io = eng.cfg.io
    finally:
        eng.close()
    return {"io": io, "tok_s": steps / seconds, "flash_mb_per_token": flash / steps,
            "device_mb_per_token": device / steps if io == "direct" else None,
            "requests_per_token": requests / steps, "hit_rate": hits / steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="table", type=Path, default=RESULTS / "iso-accuracy-smollm2.md",
                    help="an iso_accuracy.py results table (default: %(default)s)")
    ap.add_argument("--densities", help="comma list of DIP densities to run (default: every DIP density of the sweep)")
    ap.add_argument("--budgets", default="50%,100%", help="comma list of --dram-budget values (default: %(default)s)")
    ap.add_argument("--tokens", type=positive_int, default=64, help="tokens decoded after each prompt")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "iso-runtime", help="where the bundles are cached")
    ap.add_argument("--dip-ca", action="store_true", help="also DIP-CA (LFU, the plan's γ), its perplexity evaluated "
                    "here at each budget's cache fraction")
    ap.add_argument("--dip-ca-densities", help="comma list of DIP-CA densities (default: DIP's lowest densities "
                    "within tolerance in the iso table)")
    ap.add_argument("--quick", action="store_true", help="ρ 0.825 and dense at 50 %%, 8 tokens, 1 repeat")
    ap.add_argument("--json", help="write the rows as JSON")
    args = ap.parse_args()
    if not args.table.is_file():
        refuse(f"--from {args.table}: no such file; run benchmarks/iso_accuracy.py first")
    model, dense_ppl, curves, iso = sweep(args.table)
    protocol = re.search(r"(\d+) windows × (\d+) tokens", args.table.read_text())
    if "dip" not in curves:
        refuse(f"{args.table}: its sweep has no 'dip' rows; run iso_accuracy.py with --methods dip")
    if args.quick:
        args.densities, args.budgets, args.tokens, args.repeats = "0.825", "50%", 8, 1
    try:
        densities = sorted({float(d) for d in args.densities.split(",")} if args.densities else set(curves["dip"]))
    except ValueError:
        refuse(f"--densities {args.densities!r}: give a comma list of numbers, e.g. 0.75,0.825")
    if not all(0 < d < 1 for d in densities):
        refuse(f"--densities {args.densities}: each must lie in (0, 1); dense-static runs anyway")
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    ca_densities = []
    if args.dip_ca:
        try:
            ca_densities = sorted({float(d) for d in args.dip_ca_densities.split(",")} if args.dip_ca_densities else
                                  {float(r["lowest_density"]) for r in iso if r["method"] == "dip"
                                   and r["lowest_density"] not in ("", "none in grid")})
        except ValueError:
            refuse(f"--dip-ca-densities {args.dip_ca_densities!r}: give a comma list of numbers, e.g. 0.75,0.825")
        if not all(0 < d < 1 for d in ca_densities) or protocol is None:
            refuse(f"--dip-ca-densities must lie in (0, 1) and {args.table.name} must state its windows × tokens")
        fractions = {b: budget_fraction(b) for b in budgets}
    info, t0 = machine(), time.time()
    bundles = {("dip", d): bundle_for(model, d, args.out) for d in [1.0, *densities]}
    bundles.update({("dip-ca", d): bundle_for(model, d, args.out, "dip-ca") for d in ca_densities})
    configs = ([("dense-static", 1.0, "static")] + [("dip", d, "lfu") for d in densities]
               + [("dip-ca", d, "lfu") for d in ca_densities])
    runs: dict[tuple[str, float, str], list[dict]] = {}
    for rep in range(args.repeats):
        for budget in budgets:
            base = None
            for method, d, policy in configs:
                r = measure(bundles["dip-ca" if method == "dip-ca" else "dip", d], policy, budget, args.tokens,
                            None if method == "dip-ca" else 1.0)
                base = r["tok_s"] if method == "dense-static" else base
                r["x_dense_static"] = r["tok_s"] / base
                runs.setdefault((method, d, budget), []).append(r)
                print(f"repeat {rep + 1}/{args.repeats} {budget:>5} {method:12s} ρ {d:<6g} {r['tok_s']:6.1f} tok/s "
                      f"({r['x_dense_static']:.2f}× dense-static, {r['io']})", flush=True)
    rows = []
    memo = RESULTS / f".iso-runtime-{model.split('-')[0]}.ppl.json"
    for (method, d, budget), rs in runs.items():
        ppl = dense_ppl if method == "dense-static" else curves["dip"].get(d)
        if method == "dip-ca" and fractions[budget] < 1.0:  # every row resident: the plain score, DIP's PPL
            ppl = dipca_ppl(model, d, fractions[budget], (int(protocol[1]), int(protocol[2])), memo)
        row = {"method": method, "density": d, "ppl": ppl, "ppl_x_dense": ppl / dense_ppl if ppl else None,
               "budget": budget, "io": rs[0]["io"], "repeats": len(rs)}
        for k in ("tok_s", "x_dense_static", "flash_mb_per_token", "device_mb_per_token", "requests_per_token",
                  "hit_rate"):
            vals = [r[k] for r in rs if r[k] is not None]
            row[k] = statistics.median(vals) if vals else None
        rows.append(row)
    rows.sort(key=lambda r: (r["budget"], r["method"] == "dip-ca", -r["density"]))
    plot_path = RESULTS / f"iso-runtime-{model.split('-')[0]}{'-quick' if args.quick else ''}.png"
    plot(rows, curves, dense_ppl, budgets, plot_path, f"{model}, {info['cpu']}, this disk (O_DIRECT), cold")
    text = report(args, rows, iso, model, info, budgets, plot_path, time.time() - t0)
    publish(RESULTS, f"iso-runtime-{model.split('-')[0]}", args.quick, text, rows, args.json)


def iso_lines(rows: list[dict], iso: list[dict], budgets: list[str]) -> list[str]:
    """Each tolerance's lowest DIP density (from the iso table) with the runtime's figures there; the
    other methods' lowest densities, which have no runtime, beside it."""
    out = []
    for r in iso:
        rho = r["lowest_density"]
        if r["method"] != "dip":
            out.append(f"- {r['method']} {r['tolerance']}: lowest ρ {rho} (not exportable: no runtime figure; "
                       f"DIP's at the same ρ reads the same bytes per token)")
            continue
        for b in budgets:
            hit = next((x for x in rows if x["method"] == "dip" and b == x["budget"]
                        and rho not in ("", "none in grid") and abs(x["density"] - float(rho)) < 1e-9), None)
            fig = (f"{hit['tok_s']:.1f} tok/s, {hit['x_dense_static']:.2f}× dense-static" if hit else "not run")
            out.append(f"- dip {r['tolerance']}: lowest ρ {rho}; budget {b}: {fig}")
            ca = next((x for x in rows if x["method"] == "dip-ca" and b == x["budget"]
                       and rho not in ("", "none in grid") and abs(x["density"] - float(rho)) < 1e-9), None)
            if ca:
                within = "within" if ca["ppl"] <= float(r["ppl_limit"]) else "outside"
                out.append(f"  - dip-ca at the same ρ, budget {b}: PPL {ca['ppl']:.2f} ({within} {r['tolerance']}), "
                           f"{ca['tok_s']:.1f} tok/s, {ca['x_dense_static']:.2f}× dense-static")
    return out


def report(args, rows, iso, model, info, budgets, plot_path, elapsed) -> str:
    return "\n".join([
        f"# iso-runtime-{model.split('-')[0]}: `dipdeploy run` at the iso-accuracy densities (`benchmarks/iso_runtime.py`)",
        "",
        f"Model {model}; perplexity (WikiText-2 test) from `{args.table.name}`; speed measured here. Machine: "
        f"{lscpu()}; load {info['load_1min']} at the start; {elapsed:.0f} s. Storage: the bundles under "
        f"`{args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}`, {storage(args.out)}; "
        f"no cgroup limit (O_DIRECT reads bypass the page cache, so the misses come from the device). "
        f"Each run: `Engine(bundle, dram_budget=B, policy=lfu|static, gamma=1, io=auto, cold=True)` (DIP-CA: "
        f"its bundle's γ, LFU; its perplexity evaluated here at the budget's cache fraction, the `reads` split, "
        f"the same test windows, `{RESULTS.name}/.iso-runtime-{model.split('-')[0]}.ppl.json`), {args.tokens} "
        f"decode tokens after each of {len(PROMPTS)} prompts, {args.repeats} interleaved repeats, medians; "
        f"`x_dense_static` is the median of each repeat's ratio to dense-static at the same budget. "
        f"`device_mb_per_token`: the 4 KiB blocks read (O_DIRECT only); plotted in {plot_path.name}.",
        "",
        md_table(rows, COLS),
        "",
        "At each method's lowest density within tolerance (the iso table of the source):",
        "",
        *iso_lines(rows, iso, budgets),
        "",
        f"Regenerate: `python benchmarks/iso_runtime.py{' --quick' if args.quick else ''}"
        f"{' --dip-ca' if args.dip_ca else ''}` (the bundles are kept "
        f"under `build/iso-runtime/`).",
        "",
    ])


def plot(rows: list[dict], curves: dict, dense_ppl: float, budgets: list[str], out: Path, title: str) -> None:
    """PPL against measured decode tokens/s, one panel per budget: DIP's densities as a curve, DIP-CA's as
    squares, dense-static a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(budgets), figsize=(5.5 * len(budgets), 4.2), dpi=120, squeeze=False)
    for ax, b in zip(axes[0], budgets):
        dip = sorted((r for r in rows if r["budget"] == b and r["method"] == "dip" and r["ppl"]),
                     key=lambda r: r["density"])
        ax.plot([r["tok_s"] for r in dip], [r["ppl"] for r in dip], marker="o", ms=3, label="DIP (LFU, γ 1)")
        for r in dip:
            ax.annotate(f"{r['density']:g}", (r["tok_s"], r["ppl"]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
        ca = [r for r in rows if r["budget"] == b and r["method"] == "dip-ca" and r["ppl"]]
        if ca:
            ax.plot([r["tok_s"] for r in ca], [r["ppl"] for r in ca], marker="s", ms=5, ls="",
                    label="DIP-CA (LFU, the plan's γ)")
        ds = next(r for r in rows if r["budget"] == b and r["method"] == "dense-static")
        ax.plot([ds["tok_s"]], [dense_ppl], marker="*", ms=11, color="k", ls="", label="dense-static")
        for tol, ls in ((0.01, ":"), (0.03, "--")):
            ax.axhline(dense_ppl * (1 + tol), color="grey", ls=ls, lw=0.8, label=f"dense +{tol:.0%}")
        ax.set_yscale("log")
        ax.set_xlabel(f"decode tokens/s, budget {b} (dipdeploy run, measured)")
        ax.set_ylabel("WikiText-2 perplexity")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, out)


if __name__ == "__main__":
    main()
