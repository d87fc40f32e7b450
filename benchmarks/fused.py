"""The joined decoder against the per-layer graphs on real reads: the same bundles, budget and cgroup limit,
the paths paired in one run (``dipdeploy.runtime.backends.joined``; benchmarks/flash.py's child and memory
groups, ``--io direct``, cold).

Per model (SmolLM2-135M BQ4 and the ≈1 B random-weight Llama of flash.py), at a 50 % MLP budget under the
cgroup v1 limit flash.py sets (the group's warmed-up anonymous + mapped pages + ``--slack``), for DIP-CA
(LFU, the bundle's γ 0.5) and dense-static (ρ = 1, static pinning), each with the even and the ``reads``
cache split: the per-layer path (3 graphs per layer, the host cache step between them) and ``fused``
(one session per token, CacheStep/CacheSettle in the graph reading the misses with the same reader and
requests), once reading a group's misses before its product (``fused-serial``, ``overlap_reads=False``),
once while it multiplies the resident rows (``fused-overlap``, CacheBegin/CacheEnd, ``prefetch=False``)
and once also reading each layer's predicted up|gate misses while its attention runs (``fused``,
CachePrefetch: the default). The
configurations of one repeat run back to back, repeats interleave them, and the table
gives the median per configuration; ratios are taken inside the run. Both paths feed the prompt token by
token here (``--prefill token``), so the caches a decode starts from are the same.

    python benchmarks/fused.py                      # both models, 2 repeats, 16 tokens (~40 min on 2 cores)
    python benchmarks/fused.py --quick --json o.json   # SmolLM2 only, 1 repeat, 8 tokens
    python benchmarks/fused.py --models llama-1b --splits reads --paths fused-overlap,fused \
        --accuracy-level 4 --name fused-a4      # a subset, int8 activations, into results/fused-a4.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from _common import lscpu, machine, md_table, write_rows_json

import flash

from dipdeploy.cache.split import CACHE_SPLIT
from dipdeploy.paths import write_atomic

RESULTS = Path(__file__).resolve().parent / "results"
SPLITS = ("even", "reads")
# each path's engine options, in the order the x_* columns compare them
PATHS = {"per-layer": dict(fused=False, overlap_reads=False, prefetch=False),
         "fused-serial": dict(fused=True, overlap_reads=False, prefetch=False),
         "fused-overlap": dict(fused=True, overlap_reads=True, prefetch=False),
         "fused": dict(fused=True, overlap_reads=True, prefetch=True)}
COLS = ["model", "method", "split", "path", "tok_s", "x_per_layer", "x_serial", "x_overlap", "device_mb", "requests",
        "ahead_rows", "ahead_used", "hit_rate", "peak_group_mb", "limit_mb", "repeats", "load_1min"]


def configs(models: tuple[str, ...], splits=SPLITS, paths=PATHS) -> list[dict]:
    return [dict(model=m, method=method, split=split, path=path) for m in models for method in flash.BUNDLES
            for split in splits for path in paths]


def run(c: dict, paths: dict, tokens: int, args) -> dict:
    bundle = paths[c["model"]][c["method"], "natural"]
    spec = dict(method=c["method"], policy=flash.POLICY[c["method"]], bundle=str(bundle), budget="50%", io="direct",
                limited=True, io_threads=None, io_engine=flash.IO_ENGINE, cache_split=c["split"],
                **PATHS[c["path"]], tokens=tokens,
                slack=args.slack_1b if c["model"] == flash.LLAMA_1B else args.slack,
                prefill="token", accuracy_level=args.accuracy_level)
    return flash.run_in_group(spec, args.timeout)


def median_rows(samples: dict[tuple, list[dict]]) -> list[dict]:
    rows = []
    for key, runs in samples.items():
        ok = [r for r in runs if r.get("tok_s")]
        model, method, split, path = key
        row = dict(model=model, method=method, split=split, path=path, repeats=len(ok))
        if not ok:
            row["error"] = runs[-1].get("error")
            rows.append(row)
            continue
        for k in ("tok_s", "device_mb", "requests", "ahead_rows", "ahead_used", "hit_rate", "peak_group_mb", "limit_mb",
                  "load_1min"):
            row[k] = statistics.median(r.get(k, 0) for r in ok)
        rows.append(row)
    by = {(r["model"], r["method"], r["split"], r["path"]): r for r in rows}
    order = list(PATHS)
    for r in rows:
        for col, path, over in (("x_per_layer", "per-layer", order[1:]), ("x_serial", "fused-serial", order[2:]),
                                ("x_overlap", "fused-overlap", order[3:])):
            base = by.get((r["model"], r["method"], r["split"], path), {})
            if r["path"] in over and r.get("tok_s") and base.get("tok_s"):
                r[col] = r["tok_s"] / base["tok_s"]
    return rows


def goals(rows: list[dict]) -> list[str]:
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        at = {(r["method"], r["split"], r["path"]): r.get("tok_s") for r in rows if r["model"] == model}
        for path in PATHS:
            dip, dense = at.get(("dip-ca", CACHE_SPLIT, path)), at.get(("dense-static", CACHE_SPLIT, path))
            best_dip = max((v for (m, _, p), v in at.items() if m == "dip-ca" and p == path and v), default=None)
            best_dense = max((v for (m, _, p), v in at.items() if m == "dense-static" and p == path and v), default=None)
            if dip and dense:
                line = f"- {model}, {path}: DIP-CA / dense-static at 50 % {dip / dense:.2f}× ({CACHE_SPLIT} split, the default)"
                if best_dip and best_dense:
                    line += f", best split each {best_dip / best_dense:.2f}×"
                if model == flash.LLAMA_1B:
                    line += f" (goal ≥ 1.5×: {'met' if dip / dense >= 1.5 else 'not met'})"
                out.append(line)
        fused = [r["x_per_layer"] for r in rows if r["model"] == model and r["path"] == "fused" and r.get("x_per_layer")]
        if fused:
            out.append(f"- {model}: the joined decoder / the per-layer path, same configuration: "
                       f"{min(fused):.2f}–{max(fused):.2f}×")
        overlap = [r["x_serial"] for r in rows if r["model"] == model and r["path"] == "fused-overlap" and r.get("x_serial")]
        if overlap:
            out.append(f"- {model}: reads overlapped with the resident rows' product / read first: "
                       f"{min(overlap):.2f}–{max(overlap):.2f}×")
        ahead = [r["x_overlap"] for r in rows if r["model"] == model and r.get("x_overlap")]
        if ahead:
            out.append(f"- {model}: predicted up|gate misses also read during the attention / not: "
                       f"{min(ahead):.2f}–{max(ahead):.2f}×")
    return out


def plot(rows: list[dict], path: Path) -> None:
    """tok/s per configuration, the two paths side by side, one panel per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        labels = list(dict.fromkeys(f"{r['method']}\n{r['split']}" for r in rows if r["model"] == model))
        width = 0.8 / len(PATHS)
        for j, mode in enumerate(PATHS):
            got = {f"{r['method']}\n{r['split']}": r.get("tok_s") or 0 for r in rows
                   if r["model"] == model and r["path"] == mode}
            ax.bar([i + width * j for i in range(len(labels))], [got.get(x, 0) for x in labels], width, label=mode)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels, fontsize=8)
        ax.set(title=f"{model}, 50 % budget, cgroup-limited, --io direct", ylabel="decode tok/s")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="SmolLM2 only, 1 repeat, 8 tokens")
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--models", default=f"smollm2-135m,{flash.LLAMA_1B}")
    ap.add_argument("--splits", default=",".join(SPLITS), help=f"cache splits, of {', '.join(SPLITS)}")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"paths, of {', '.join(PATHS)}")
    ap.add_argument("--slack", type=int, default=4 << 20, help="SmolLM2: bytes above the warmed-up charge")
    ap.add_argument("--slack-1b", type=int, default=64 << 20, help="the 1 B model: bytes above the warmed-up charge "
                    "(flash.py's; its dense-static child needs it)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per configuration")
    ap.add_argument("--accuracy-level", type=int, choices=(0, 4), help="run every bundle at this MatMulNBits / BQ4 "
                    "accuracy level (4: int8 activations); default: the bundles' own (0)")
    ap.add_argument("--name", help="the results' file name (default: fused, or fused-quick with --quick)")
    args = ap.parse_args()
    splits, paths_run = tuple(args.splits.split(",")), tuple(args.paths.split(","))
    bad = [x for x in splits if x not in SPLITS] + [x for x in paths_run if x not in PATHS]
    if bad:
        ap.exit(2, f"fused.py: unknown split or path {bad[0]!r}; choose splits from {', '.join(SPLITS)} and paths "
                   f"from {', '.join(PATHS)}\n")
    models = ("smollm2-135m",) if args.quick else tuple(args.models.split(","))
    tokens, repeats = (8, 1) if args.quick else (args.tokens, args.repeats)
    paths = {m: flash.ensure_bundles(m) for m in models}
    info, cpu = machine(), lscpu()
    disk = flash.storage(next(iter(paths[models[0]].values())))
    samples: dict[tuple, list[dict]] = {}
    t0 = time.time()
    for rep in range(repeats):
        for c in configs(models, splits, paths_run):
            t = time.time()
            res = {**run(c, paths, tokens, args), "load_1min": round(os.getloadavg()[0], 2)}
            samples.setdefault((c["model"], c["method"], c["split"], c["path"]), []).append(res)
            print(f"repeat {rep + 1} {c['model']:12s} {c['method']:12s} {c['split']:5s} {c['path']:12s} "
                  + (res.get("error") or
                  f"{res['tok_s']:.2f} tok/s, device {res['device_mb']:.1f} MB/token") + f" ({time.time() - t:.0f} s)",
                  flush=True)
    rows = median_rows(samples)
    write_rows_json(rows, args.json)
    errors = [f"- {r['model']} {r['method']} {r['split']} {r['path']}: {' '.join(str(r['error']).split())}"
              for r in rows if r.get("error")]
    name = args.name or "fused" + ("-quick" if args.quick else "")
    if "/" in name or not name:
        ap.exit(2, f"fused.py: --name {name!r} must be a plain file name, e.g. fused-a4\n")
    text = "\n".join([
        f"# {name}: the joined decoder against the per-layer graphs on real reads (benchmarks/fused.py)", "",
        f"`python benchmarks/fused.py {' '.join(sys.argv[1:])}` · {info} · {tokens} greedy tokens after "
        f"\"{flash.PROMPT}\", cold, `--io direct`, native kernels, 1 ORT thread, accuracy level "
        f"{'of the bundles (0)' if args.accuracy_level is None else args.accuracy_level}, prompt token by token; median of "
        f"{repeats} interleaved repeat(s); {time.time() - t0:.0f} s", "",
        f"- machine (lscpu): {cpu}",
        f"- storage: {disk}",
        "- budget 50 % of the MLP bytes; cgroup v1 limit `limit_mb` = the group's anonymous + mapped pages after "
        f"warm-up (slabs touched, MLP file dropped) + {args.slack >> 20} MiB (SmolLM2) or {args.slack_1b >> 20} "
        "MiB (1 B), as benchmarks/flash.py; `peak_group_mb` the group's peak charge while decoding",
        f"- {flash.LLAMA_1B}: random weights (benchmarks/llama-1b.json); its tokens mean nothing, bytes and speed carry over",
        "- `path`: per-layer = 3 graphs per layer with the host cache step between them; fused-serial = one session "
        "per token, the cache step inside the graph, a group's misses read before its product; "
        "fused-overlap = the misses read while the group's resident rows are multiplied (CacheBegin/CacheEnd); "
        "fused = that, and each layer's up|gate misses predicted from its input and read while its attention runs "
        "(CachePrefetch, the default); `x_per_layer` = tok/s over the per-layer row of the same configuration, "
        "`x_serial` over the fused-serial row, `x_overlap` over the fused-overlap row; `ahead_rows` / `ahead_used`: "
        "rows read ahead per token / those the selection then missed", "",
        md_table(rows, COLS), "", f"![tok/s per configuration]({name}.png)", "", "Against the goals (this run):", "",
        *goals(rows), "", *errors, ""])
    write_atomic(RESULTS / f"{name}.md", text, force=True)
    plot(rows, RESULTS / f"{name}.png")
    print(text)


if __name__ == "__main__":
    main()
