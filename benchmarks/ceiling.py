"""The compute ceiling of DIP-CA against dense-static: what a decode token costs when nothing is read.

At a budget that holds every MLP row (``--dram-budget 100%``, static pinning, so no row is ever read), the
joined decoder's token is compute only: the attention's and the head's MatMulNBits, the MLP's
SparseGatherMatMul over the selected rows, the selection (TopKColumnMask and the cache ops) and the
rest. Both bundles of benchmarks/flash.py run here, at accuracy levels 0 (the bundles' fp32 activations)
and 4 (int8 activations). With every row resident DIP-CA selects as plain DIP does, so the token is the
one a run at any budget computes; what reads add on top of it can be hidden behind compute at best,
never subtracted from it. The ratio ``dense-static / DIP-CA`` of these tokens is therefore the most that
hiding reads better can give at a lower budget, on this CPU and at this level: the ceiling the
1.5× goal of benchmarks/flash.py's 1 B section is measured against.

Two measurements per configuration, in one process each (benchmarks/flash.py's child conventions: 1 ORT
thread, native kernels, the prompt batched): the unprofiled decode time per token (median of
``--repeats`` interleaved runs), and one run under ORT's profiler for the split into op kinds. The
profiler adds a few µs to every node, so the split is compared with the other profiles here, not with
the unprofiled token.

    python benchmarks/ceiling.py                     # the 1 B model, levels 0 and 4, 3 repeats (~8 min)
    python benchmarks/ceiling.py --quick --json o.json   # SmolLM2 only, 1 repeat, 8 tokens
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import lscpu, machine, md_table, positive_int, write_rows_json

import flash

from dipdeploy.paths import write_atomic

RESULTS = Path(__file__).resolve().parent / "results"
LEVELS = (0, 4)
#: op kinds of the split, each a set of ORT op types; everything else is "other"
KINDS = {"matmulnbits_ms": {"MatMulNBits"},
         "sparse_ms": {"SparseGatherMatMul"},
         "select_ms": {"TopKColumnMask", "CacheStep", "CacheSettle", "CacheBegin", "CacheEnd", "CachePrefetch"}}
COLS = ["model", "level", "method", "token_ms", "tok_s", "kernel_ms", *KINDS, "other_ms", "repeats", "load_1min"]


def child(spec: dict) -> dict:
    """One configuration: decode ms per token unprofiled, or (``profile``) kernel ms per op kind."""
    from dipdeploy.runtime import Engine
    from dipdeploy.runtime.config import EngineConfig

    from _ortprofile import profiled_sessions, session_runs

    cfg = EngineConfig(dram_budget="100%", policy="static", io="direct", fused=True, single_session=False,
                       accuracy_level=spec["level"], context=256)
    with tempfile.TemporaryDirectory() as tmp:
        with profiled_sessions(tmp) if spec["profile"] else contextlib.nullcontext():
            eng = Engine(spec["bundle"], cfg)
        g = eng.generate(flash.PROMPT, spec["tokens"], stop_at_eos=False)
        if g.stats.flash_mb_per_token:
            raise RuntimeError(f"{spec['bundle']}: {g.stats.flash_mb_per_token:.3f} MB read per token at 100 %")
        row = {"token_ms": 1e3 / g.stats.decode_tok_s}
        if spec["profile"]:
            runs = session_runs(Path(eng.fused.bound.session.end_profiling()), 0)
            runs = runs[len(runs) - (g.stats.new_tokens - 1):]  # the decode steps, as decode_tok_s counts them
            ms = collections.Counter()
            for r in runs:
                for k in r.kernels:
                    ms[next((kind for kind, ops in KINDS.items() if k.op in ops), "other_ms")] += k.us / 1e3
            row = {kind: ms[kind] / len(runs) for kind in [*KINDS, "other_ms"]}
            row["kernel_ms"] = sum(row.values())
        eng.close()
    return row


def run_child(spec: dict, timeout: float) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                          timeout=timeout, cwd=Path(__file__).resolve().parent)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def ceilings(rows: list[dict]) -> list[str]:
    """dense-static / DIP-CA per model and level, from the unprofiled tokens of this run."""
    at = {(r["model"], r["level"], r["method"]): r.get("token_ms") for r in rows}
    out = []
    for model, level in dict.fromkeys((r["model"], r["level"]) for r in rows):
        dip, dense = at.get((model, level, "dip-ca")), at.get((model, level, "dense-static"))
        if dip and dense:
            out.append(f"- {model}, accuracy level {level}: dense-static / DIP-CA with nothing read "
                       f"{dense / dip:.2f}× ({dense:.0f} against {dip:.0f} ms a token)")
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("kernel_ms")]
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(rows)), 4))
    labels = [f"{r['model']}\nlevel {r['level']}\n{r['method']}" for r in rows]
    bottom = [0.0] * len(rows)
    for kind in [*KINDS, "other_ms"]:
        vals = [r[kind] for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=kind.removesuffix("_ms"))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(ylabel="profiled kernel ms / decode token", title="every MLP row resident: compute only")
    ax.legend(fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="SmolLM2 only, 1 repeat, 8 tokens")
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--models", default=flash.LLAMA_1B, help=f"comma-separated: {flash.LLAMA_1B}, smollm2-135m")
    ap.add_argument("--tokens", type=positive_int, default=16, help="greedy tokens per run (the first is the prefill's)")
    ap.add_argument("--repeats", type=positive_int, default=3, help="unprofiled runs per configuration, interleaved")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per child")
    ap.add_argument("--name", default="ceiling", help="results/NAME.md and its plot (default: ceiling; another "
                    "machine's run beside it, e.g. ceiling-xeon)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.tokens < 2:
        ap.error("--tokens: give at least 2 (the first token comes from the prompt's run, the rest are timed)")
    models = ("smollm2-135m",) if args.quick else tuple(args.models.split(","))
    unknown = set(models) - {flash.LLAMA_1B, "smollm2-135m"}
    if unknown:
        ap.error(f"unknown model(s) {sorted(unknown)}: give {flash.LLAMA_1B} and/or smollm2-135m")
    tokens, repeats = (8, 1) if args.quick else (args.tokens, args.repeats)
    paths = {m: flash.ensure_bundles(m) for m in models}
    configs = [(m, level, method) for m in models for level in LEVELS for method in flash.BUNDLES]

    def spec(m: str, level: int, method: str, profile: bool) -> dict:
        return dict(bundle=str(paths[m][method, "natural"]), level=level, tokens=tokens, profile=profile)

    samples, profiles, loads = collections.defaultdict(list), {}, collections.defaultdict(list)
    t0 = time.time()
    for rep in range(repeats):
        for c in configs:
            samples[c].append(run_child(spec(*c, False), args.timeout))
            loads[c].append(machine()["load_1min"])
            print(f"repeat {rep + 1}/{repeats} {' '.join(map(str, c))}: {samples[c][-1]} ({time.time() - t0:.0f} s)",
                  flush=True)
    for c in configs:
        profiles[c] = run_child(spec(*c, True), args.timeout)
        print(f"profile {' '.join(map(str, c))}: {profiles[c]}", flush=True)
    rows = []
    for c in configs:
        ok = [s["token_ms"] for s in samples[c] if "token_ms" in s]
        row = dict(model=c[0], level=c[1], method=c[2], repeats=len(ok), load_1min=statistics.median(loads[c]))
        if ok:
            row.update(token_ms=statistics.median(ok), tok_s=1e3 / statistics.median(ok))
        row.update({k: v for k, v in profiles[c].items() if k != "error"})
        errors = [s["error"] for s in [*samples[c], profiles[c]] if "error" in s]
        if errors:
            row["error"] = errors[-1]
        rows.append(row)
    name = args.name + ("-quick" if args.quick else "")
    text = "\n".join([
        "# The compute ceiling: DIP-CA and dense-static with nothing read (benchmarks/ceiling.py)", "",
        f"`python benchmarks/ceiling.py {' '.join(sys.argv[1:])}` · {machine()} · {tokens} greedy tokens after "
        f"\"{flash.PROMPT}\", the prompt batched, 1 ORT thread, native kernels", "",
        f"- machine (lscpu): {lscpu()}",
        "- bundles: benchmarks/flash.py's (DIP-CA ρ_in 0.55, ρ 0.5; dense-static ρ = 1), BQ4, at a 100 % budget "
        "with static pinning (every MLP row resident from the start, no read), the joined decoder; `level`: "
        "the MatMulNBits / BQ4 accuracy level (4: int8 activations)",
        f"- `token_ms`: unprofiled decode ms per token, median of {repeats} interleaved run(s); the `*_ms` split: "
        "one profiled run, kernel ms per decode token by op kind (`matmulnbits`: the attention's projections "
        "and the head; `sparse`: SparseGatherMatMul, the MLP; `select`: TopKColumnMask and the cache ops; "
        "`other`: the rest), the profiler's own cost included", "",
        md_table(rows, COLS), "",
        "The ceiling (what hiding every read could give at most, this CPU and level):", "",
        *ceilings(rows), "",
        *[f"- {r['model']} {r['level']} {r['method']}: {r['error']}" for r in rows if r.get("error")], ""])
    write_atomic(RESULTS / f"{name}.md", text, force=True)
    write_rows_json(rows, args.json)
    plot(rows, RESULTS / f"{name}.png")
    print(text)


if __name__ == "__main__":
    main()
