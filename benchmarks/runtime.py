"""The host runtime on SmolLM2-135M BQ4 bundles: hit rate, Flash per token, tokens/s, perplexity.

The paper's Figure 11 and throughput table on our model, measured with ``dipdeploy.runtime.Engine``:
DRAM budgets of 25/50/75 % of the MLP bytes (the caches; dense weights and the KV cache are resident
on top), 128 greedy tokens after each of two fixed prompts, for

* dense-static — a ρ = 1 bundle (every row selected) whose caches pin a fixed set (the fair dense
  baseline: what fits stays, the rest streams every token);
* dense-mmap — the dense bundle's ``model.onnx`` with ORT's own mmap (the llama.cpp-style page-cache
  baseline; no budget can be imposed on it, so it has one row and no emulated figure);
* DIP ρ = 0.5 with LRU, LFU and Belady (the offline optimum for a selection that ignores the cache);
* DIP-CA ρ = 0.5, γ ∈ {0.1, 0.2, 0.3} with LRU and LFU (and γ ∈ {0.5, 0.7} at the 50 % budget, where
  γ ≤ 0.3 costs much perplexity).

Measured rows are memoised in ``benchmarks/results/.runtime-<model>.rows.json`` (with the machine load
at the time) and perplexities in ``.runtime-<model>.ppl.json``: an interrupted run resumes, and new
configurations are measured alone. ``--remeasure`` runs all measurements again.

``tok_s_emulated``: decode tokens/s with Flash paced at 1 GB/s (the file read through the page cache,
then the store sleeps until the 4 KiB blocks holding the rows, ``flash_block_mb_per_token``, have passed
at that bandwidth: a device returns whole blocks); ``tok_s_cold``: unthrottled, the MLP file
dropped from the page cache before each prompt (``Engine(cold=True)``, also after Belady's recording
pass). ``ppl``: WikiText-2 test perplexity of the same
configuration from ``dipdeploy eval`` (torch reference, BQ4 fake-quantised MLP, the cache fraction =
budget), on fewer windows than the accuracy table (stated in the output).

    python benchmarks/runtime.py            # full grid (~45 min on 2 cores, PPL included)
    python benchmarks/runtime.py --quick    # 50 % budget, 4 configurations, 24 tokens, no PPL (<2 min)
    python benchmarks/runtime.py --flash-device a18 --budgets 0.5   # a phone profile's Flash instead:
                                            # its bandwidth and cost per request (runtime-smollm2-a18.md)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from _common import machine, md_table, write_rows_json

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = (
    "The history of the city begins in the early",
    "In mathematics, a prime number is",
)
BUDGETS = (0.25, 0.5, 0.75)  # the MLP budget fractions of the full grid
RHO_IN = 0.55  # the calibrated split of the accuracy table at ρ = 0.5 (benchmarks/results/accuracy-smollm2.md)
COLS = ["method", "policy", "gamma", "density", "budget_frac", "hit_rate", "flash_mb_per_token",
        "flash_block_mb_per_token", "flash_block_requests_per_token", "tok_s_emulated", "tok_s_cold", "ppl",
        "ppl_x_dense", "load_1min"]


def bundles(model: str, root: Path) -> dict[str, Path]:
    """Export (once, cached under build/) the three BQ4 bundles the grid needs."""
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    specs = {"dip": dict(method="dip", density=0.5, rho_in=RHO_IN),
             "full": dict(method="dip", density=1.0, rho_in=1.0),
             "dense": dict(method="dense")}
    out = {}
    for name, kw in specs.items():
        path = root / f"{model}-{name}-bq4"
        if not (path / "manifest.json").is_file():
            print(f"exporting {path.name} …", flush=True)
            export_model(ExportConfig(model=model, quant="bq4", validate_tokens=8, **kw), path, force=True)
        out[name] = path
    return out


def configs(quick: bool, budgets: tuple[float, ...] = BUDGETS) -> list[dict]:
    budgets = (0.5,) if quick else budgets
    out = []
    for b in budgets:
        out.append(dict(method="dense-static", bundle="full", policy="static", gamma=1.0, budget_frac=b))
        for p in (("lfu", "belady") if quick else ("lru", "lfu", "belady")):
            out.append(dict(method="dip", bundle="dip", policy=p, gamma=1.0, budget_frac=b))
        gammas = (0.2,) if quick else (0.1, 0.2, 0.3) + ((0.5, 0.7) if b == 0.5 else ())
        for g in gammas:
            for p in (("lfu",) if quick else ("lru", "lfu")):
                out.append(dict(method="dip-ca", bundle="dip", policy=p, gamma=g, budget_frac=b))
    return out


def measure(bundle: Path, c: dict, tokens: int, prompts: tuple[str, ...], bandwidth: float | None,
            device: str | None = None) -> dict:
    """Emulated (at ``bandwidth``, or as the device profile ``device``) and cold runs of one configuration,
    averaged over the prompts (token-weighted)."""
    from dipdeploy.runtime import Engine

    agg = {"steps": 0, "emu_s": 0.0, "cold_s": 0.0, "flash": 0.0, "blocks": 0.0, "requests": 0.0, "hits": 0.0}
    for mode in ("emulated", "cold"):
        emulated = mode == "emulated"
        eng = Engine(bundle, dram_budget=f"{100 * c['budget_frac']:g}%", policy=c["policy"], gamma=c["gamma"],
                     native=True, flash_bandwidth=bandwidth if emulated and not device else None,
                     flash_device=device if emulated else None, cold=mode == "cold", context=512, io="mmap")
        eng.generate(prompts[0], 4, stop_at_eos=False)  # warm the sessions (first-run allocations)
        for prompt in prompts:
            s = eng.generate(prompt, tokens, stop_at_eos=False).stats
            steps = s.new_tokens - 1
            if mode == "emulated":
                agg["steps"] += steps
                agg["emu_s"] += s.decode_s
                agg["flash"] += s.flash_mb_per_token * steps
                agg["blocks"] += s.flash_block_mb_per_token * steps
                agg["requests"] += s.flash_block_requests_per_token * steps
                agg["hits"] += s.hit_rate * steps
            else:
                agg["cold_s"] += s.decode_s
        eng.close()
    n = agg["steps"]
    density = sum((2 * ki / eng.d + kg / eng.f) / 3 for ki, kg in eng.k) / len(eng.k)
    return {"density": round(density, 4), "hit_rate": agg["hits"] / n, "flash_mb_per_token": agg["flash"] / n,
            "flash_block_mb_per_token": agg["blocks"] / n, "flash_block_requests_per_token": agg["requests"] / n,
            "tok_s_emulated": n / agg["emu_s"],
            "tok_s_cold": n / agg["cold_s"]}


def dense_mmap(bundle: Path, tokens: int, prompts: tuple[str, ...]) -> dict:
    """ORT's own mmap of the dense model.onnx, page cache dropped before each prompt."""
    from dipdeploy.export.generate import generate

    generate(bundle, prompts[0], 4, native=True)
    steps, seconds = 0, 0.0
    for prompt in prompts:
        for name in ("dense.bin", "mlp.bin"):
            fd = os.open(bundle / name, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        g = generate(bundle, prompt, tokens, native=True)
        steps += len(g.tokens)
        seconds += len(g.tokens) / g.tokens_per_s
    return {"method": "dense-mmap", "policy": "page cache", "gamma": 1.0, "density": 1.0, "budget_frac": None,
            "hit_rate": None, "flash_mb_per_token": None, "flash_block_mb_per_token": None,
            "flash_block_requests_per_token": None, "tok_s_emulated": None,
            "tok_s_cold": steps / seconds}


def ppl_for(row: dict, windows: int, cache: dict, partial: Path) -> float:
    """WikiText-2 PPL of the row's configuration (torch reference), memoised in the partial file."""
    key = f"{row['method']}|{row['policy']}|{row['gamma']}|{row['budget_frac']}|{windows}"
    if row["method"] == "dip" or row["method"].startswith("dense"):
        key = f"{row['method'].split('-')[0]}|{windows}"
    if key not in cache:
        from dipdeploy.eval import EvalConfig, Evaluator

        ev = cache.setdefault("_evaluator", None) or Evaluator(EvalConfig(seqlen=2048, max_windows=windows,
                                                                          quant="bq4", quant_scope="mlp",
                                                                          progress=True))
        cache["_evaluator"] = ev
        if row["method"].startswith("dense"):
            r = ev.row("dense", 1.0)
        elif row["method"] == "dip":
            r = ev.row("dip", 0.5, rho_in=RHO_IN)
        else:
            r = ev.row("dip-ca", 0.5, rho_in=RHO_IN, gamma=row["gamma"], policy=row["policy"],
                       cache_frac=row["budget_frac"])
        cache[key] = r["ppl"]
        partial.write_text(json.dumps({k: v for k, v in cache.items() if not k.startswith("_")}, indent=1))
    return cache[key]


def ppl_memo(model: str) -> Path:
    """Where the perplexities are memoised: one file per model, since they do not depend on the Flash
    emulated (every table of the model shares it)."""
    return RESULTS / f".runtime-{model.split('-')[0]}.ppl.json"


def _budgets(value: str) -> tuple[float, ...]:
    return tuple(float(b) for b in value.split(","))


def _budget_list(budgets: tuple[float, ...]) -> str:
    return ",".join(f"{b:g}" for b in budgets)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50 %% budget, 4 configurations, 24 tokens, no PPL")
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--bandwidth", default="1GB/s")
    ap.add_argument("--flash-device", help="emulate this device profile's Flash instead of --bandwidth (its "
                    "bandwidth and cost per request; `dipdeploy simulate --device` names): a table of its own")
    ap.add_argument("--budgets", type=_budgets, default=BUDGETS, help="comma list of MLP budget fractions "
                    f"(default {_budget_list(BUDGETS)})")
    ap.add_argument("--ppl-windows", type=int, default=4, help="WikiText-2 test windows × 2048 for the ppl column")
    ap.add_argument("--no-ppl", action="store_true")
    ap.add_argument("--remeasure", action="store_true", help="ignore the memoised measurements and run them all again")
    ap.add_argument("--bundles", default=str(ROOT / "build" / "bench-bundles"))
    args = ap.parse_args()
    from dipdeploy.runtime import parse_bandwidth

    quick = args.quick
    tokens = 24 if quick else args.tokens
    prompts = PROMPTS[:1] if quick else PROMPTS
    paths = bundles(args.model, Path(args.bundles))
    info = machine()
    name = f"runtime-{args.model.split('-')[0]}" + (f"-{args.flash_device}" if args.flash_device else "") + (
        "-quick" if quick else "")
    pace = args.flash_device or args.bandwidth
    memo_path = RESULTS / f".{name}.rows.json"
    memo = json.loads(memo_path.read_text()) if memo_path.is_file() and not args.remeasure else {}
    rows = []
    for c in configs(quick, args.budgets):
        key = (f"{c['method']}|{c['policy']}|{c['gamma']}|{c['budget_frac']}|{tokens}|{len(prompts)}|"
               f"{pace}|blocks+requests")
        if key in memo:
            rows.append(dict(memo[key]))
            continue
        t = time.time()
        row = {**{k: c[k] for k in ("method", "policy", "gamma", "budget_frac")},
               **measure(paths[c["bundle"]], c, tokens, prompts, parse_bandwidth(args.bandwidth), args.flash_device),
               "load_1min": round(os.getloadavg()[0], 2)}
        rows.append(row)
        memo[key] = row
        memo_path.write_text(json.dumps(memo, indent=1))
        print(f"{row['method']:12s} {row['policy']:6s} γ={row['gamma']:<4} budget {row['budget_frac']:.2f}: hit "
              f"{row['hit_rate']:.3f}, Flash {row['flash_mb_per_token']:.2f} MB/tok in "
              f"{row['flash_block_mb_per_token']:.2f} MB of blocks, {row['tok_s_emulated']:.1f} tok/s "
              f"emulated, {row['tok_s_cold']:.1f} cold ({time.time() - t:.0f} s)", flush=True)
    rows.append(dense_mmap(paths["dense"], tokens, prompts))
    if not (quick or args.no_ppl):
        partial = ppl_memo(args.model)
        cache = json.loads(partial.read_text()) if partial.is_file() else {}
        for row in rows:
            row["ppl"] = ppl_for(row, args.ppl_windows, cache, partial)
    write_table(rows, name, info, tokens, prompts, args)
    write_rows_json(rows, args.json)
    plot(rows, RESULTS / f"{name}.png")


def goals(rows: list[dict]) -> str:
    """The issue's two goals, checked on the measured rows."""
    out = []
    for b in sorted({r["budget_frac"] for r in rows if r["budget_frac"] is not None}):
        at = [r for r in rows if r["budget_frac"] == b]
        bel = next((r for r in at if r["method"] == "dip" and r["policy"] == "belady"), None)
        ca = [r for r in at if r["method"] == "dip-ca" and r["policy"] == "lfu"]
        dense = next((r for r in at if r["method"] == "dense-static"), None)
        if bel and ca:
            best = min(ca, key=lambda r: r["flash_mb_per_token"])
            out.append(f"- budget {b:.0%}: DIP-CA+LFU γ={best['gamma']} reads {best['flash_mb_per_token']:.2f} MB/token vs "
                       f"Belady on DIP {bel['flash_mb_per_token']:.2f} → "
                       f"{'met' if best['flash_mb_per_token'] < bel['flash_mb_per_token'] else 'NOT met'}")
        if dense and ca and b == 0.5:
            for r in ca:
                ratio = r["tok_s_emulated"] / dense["tok_s_emulated"]
                cost = (f", PPL {r['ppl']:.2f} vs dense {dense['ppl']:.2f}" if r.get("ppl") and dense.get("ppl") else "")
                out.append(f"- budget 50%: DIP-CA+LFU γ={r['gamma']} {r['tok_s_emulated']:.1f} tok/s emulated = "
                           f"{ratio:.2f}× dense-static ({'met' if ratio >= 1.5 else 'NOT met'}, goal ≥ 1.5×){cost}")
    return "\n".join(out)


def write_table(rows: list[dict], name: str, info: dict, tokens: int, prompts, args) -> None:
    dense = next((r.get("ppl") for r in rows if r["method"] == "dense-static"), None)
    if args.flash_device:
        from dipdeploy.sim.devices import get_device

        flash = get_device(args.flash_device).flash
        emulated = (f"and their requests paced as the `{args.flash_device}` profile's Flash ({flash.seq_bandwidth / 1e9:g} "
                    f"GB/s and {flash.request_s * 1e6:.3g} µs a request, `run --flash-device`)")
    else:
        emulated = f"paced at {args.bandwidth}"
    command = (f" --flash-device {args.flash_device}" if args.flash_device else "") + (
        "" if args.budgets == BUDGETS else f" --budgets {_budget_list(args.budgets)}")
    for r in rows:
        r["ppl_x_dense"] = r["ppl"] / dense if dense and r.get("ppl") else None
    ppl_note = ("" if args.quick or args.no_ppl else
                f"`ppl`: WikiText-2 test, {args.ppl_windows} windows × 2048 tokens, torch reference with the BQ4 MLP "
                "(fake-quantised), DIP-CA with cache fraction = budget; fewer windows than accuracy-smollm2.md, so "
                "compare within this table. ")
    text = (f"# {name}: the host runtime under a DRAM budget\n\n"
            f"SmolLM2-135M-Instruct BQ4 bundles (ρ = 0.5 with ρ_in = {RHO_IN}; dense-static = a ρ = 1 bundle), "
            f"{tokens} greedy tokens after each of {len(prompts)} prompts, native kernels, 1 ORT thread, Flash reads "
            f"through mmap (MADV_RANDOM), the engine's default path and cache split (`reads`: the small down rows "
            f"cached first). `budget_frac`: share of the MLP bytes the caches may hold (dense weights "
            f"and KV cache resident on top). `flash_block_mb_per_token`: the 4 KiB blocks holding the missed rows "
            f"(a device returns whole blocks), `flash_block_requests_per_token` the requests a device serves them in "
            f"(a run of touching blocks each, up to 128 KiB). `tok_s_emulated`: decode tokens/s with those blocks "
            f"{emulated}; "
            f"`tok_s_cold`: unthrottled, MLP file dropped from the page cache before each prompt (this machine's "
            f"disk; evicted rows read again may come from the OS page cache). Decode tokens/s are measured on this "
            f"machine's CPU, not a phone's: the Python host loop costs a fixed few ms per layer, so they compare "
            f"configurations, not devices (the simulator projects onto phones). {ppl_note}\n\n"
            f"Machine: {info['cpu']}, {info['cores']} cores, load {info['load_1min']} at start.\n\n"
            f"{md_table(rows, COLS)}\n\n![Flash, throughput and perplexity]({name}.png)\n\n"
            f"## Goals\n\n{goals(rows)}\n\n"
            f"Reading the table: γ trades perplexity for Flash traffic. When the cache holds about K rows or more "
            f"(budget ≥ ρ_in), a small γ lets resident rows win almost every slot, the mask stops following the "
            f"activations and perplexity explodes while the hit rate approaches 1; the `ppl` column says where.\n\n"
            f"Regenerate: `python benchmarks/runtime.py{command}` (PPL memoised in "
            f"benchmarks/results/{ppl_memo(args.model).name}).\n")
    (RESULTS / f"{name}.md").write_text(text)


def plot(rows: list[dict], path: Path) -> None:
    """Flash MB/token and emulated tokens/s against the budget, one line per method/policy/γ, and the
    perplexity each configuration pays for its Flash traffic at the 50 % budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    series: dict[str, list] = {}
    for r in rows:
        if r["budget_frac"] is not None:
            label = r["method"] + ("" if r["method"] == "dense-static" else f" {r['policy']}") + (
                f" γ={r['gamma']}" if r["method"] == "dip-ca" else "")
            series.setdefault(label, []).append(r)
    colours = plt.get_cmap("tab20")(np.linspace(0, 1, max(len(series), 2)))
    # one budget: the first two panels against the device requests a token instead (what a run of
    # scattered rows costs beside its blocks)
    one = len({r["budget_frac"] for r in rows if r["budget_frac"] is not None}) == 1
    for (label, rs), colour in zip(series.items(), colours):
        rs.sort(key=lambda r: r["budget_frac"])
        x = [r["flash_block_requests_per_token"] if one else 100 * r["budget_frac"] for r in rs]
        kw = dict(color=colour, marker="o", linestyle="--" if "belady" in label else "-", label=label)
        axes[0].plot(x, [r["flash_block_mb_per_token"] for r in rs], **kw)
        axes[1].plot(x, [r["tok_s_emulated"] for r in rs], **kw)
        half = [r for r in rs if r["budget_frac"] == 0.5 and r.get("ppl")]
        if half:
            axes[2].scatter([r["flash_block_mb_per_token"] for r in half], [r["ppl"] for r in half], color=colour,
                            label=label)
    budget = (f"device requests / token (budget {100 * rows[0]['budget_frac']:g} %)" if one
              else "DRAM budget (% of MLP bytes)")
    axes[0].set(xlabel=budget, ylabel="Flash MB / token (4 KiB blocks)", title="Flash traffic")
    axes[1].set(xlabel=budget, ylabel="tokens/s (Flash emulated)", title="Throughput")
    axes[2].set(xlabel="Flash MB / token (4 KiB blocks)", ylabel="WikiText-2 PPL (log)", yscale="log",
                title="50 % budget: perplexity vs Flash traffic")
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
