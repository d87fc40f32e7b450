"""SmolLM2-135M: WikiText-2 test PPL of dense, DIP, DIP+LoRA (adapter applied) and DIP+LoRA merged.

For each ρ: the evaluator calibrates the DIP plan on WikiText-2 validation (4 × 512 tokens), `finetune`
trains LoRA (up/gate/down) under that plan on WikiText-2 validation windows, and the evaluator reports
test PPL with the adapter live and merged (both through `apply_lora`, the function eval/export call).
A control row trains the same LoRA on the *dense* model: WikiText validation → test is in-domain, so part
of any gain is domain adaptation, not recovery from pruning; the control measures that part.

Rows are kept in a partial file, so an interrupted run resumes where it stopped.

    python benchmarks/lora.py --quick    # 1 × 512 test tokens, 4 training steps: a pipeline check
    python benchmarks/lora.py            # 4 × 2048 test tokens, 60 steps × 1024 tokens per ρ
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _common import machine, md_table, write_rows_json
from distill import SECTION

from dipdeploy.eval import EvalConfig, Evaluator
from dipdeploy.finetune import LoraConfig, apply_lora, finetune
from dipdeploy.loading import load_model
from dipdeploy.sparsity.plan import SparsityConfig

RESULTS = Path(__file__).resolve().parent / "results"
COLS = ["method", "density", "lora", "ppl", "ppl_x_dense", "gap_closed", "train_tokens", "steps", "wall_s",
        "first_loss", "last_loss"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--densities", default="0.5,0.6")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--control", action="store_true", help="also train LoRA on the dense model (domain control)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; 1 is far faster than 2 on a shared, oversubscribed 2-core machine")
    ap.add_argument("--work", default="/tmp/dipdeploy-lora-bench", help="where adapters go (not in git)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    windows, seqlen = (1, 512) if args.quick else (args.windows, args.seqlen)
    lcfg = LoraConfig(steps=4 if args.quick else args.steps, seqlen=256, batch_size=4, lr=args.lr,
                      warmup_steps=1 if args.quick else 5, logging_steps=1 if args.quick else 5,
                      save_steps=20, bf16=True)
    name = f"lora-{args.model.split('-')[0]}" + ("-quick" if args.quick else "")
    partial = RESULTS / f".{name}.partial.json"
    rows = json.loads(partial.read_text()) if partial.is_file() else []
    have = {(r["method"], r["target_density"], r["lora"]) for r in rows}
    ev = Evaluator(EvalConfig(model=args.model, seqlen=seqlen, max_windows=windows, progress=False))
    base_lm = ev.lm
    info = machine()
    work = Path(args.work)

    def keep(row: dict) -> None:
        rows.append(row)
        partial.write_text(json.dumps(rows, indent=1))
        print(f"{row['method']:6s} ρ={row['target_density']:<4} lora={row['lora']:8s} ppl={row['ppl']:.3f} "
              f"tokens={row['train_tokens']} wall={row['wall_s']} s", flush=True)
        write_table(rows, name, info, windows, seqlen, lcfg)

    def evaluate(method: str, rho: float, lora: str, adapter: Path | None, train: dict) -> None:
        t = time.time()
        ev.lm = apply_lora(load_model(args.model), adapter, merge=lora == "merged") if adapter else base_lm
        ev.cfg.plan = str(adapter / "plan.json") if adapter and method != "dense" else None
        try:
            row = ev.row(method, rho)
        finally:
            ev.lm, ev.cfg.plan = base_lm, None
        keep({**row, "lora": lora, "eval_wall_s": round(time.time() - t, 1), **train})

    if ("dense", 1.0, "none") not in have:
        evaluate("dense", 1.0, "none", None, {"train_tokens": 0, "steps": 0, "wall_s": 0.0})
    todo = [("dip", float(r)) for r in args.densities.split(",")] + ([("dense", 1.0)] if args.control else [])
    for method, rho in todo:
        if method == "dip" and (method, rho, "none") not in have:
            evaluate(method, rho, "none", None, {"train_tokens": 0, "steps": 0, "wall_s": 0.0})
        if (method, rho, "merged") in have:
            continue
        adapter = work / f"{name}-{method}-{rho}"
        if not (adapter / "adapter_config.json").is_file():
            plan = ev.plan_for(SparsityConfig(method="dip", density=1.0 if method == "dense" else rho))
            lm = load_model(args.model)
            res = finetune(lm, plan, lcfg, adapter, resume=True, force=False, progress=False)
            print(f"trained {adapter}: {res.steps} steps, loss {res.first_loss:.3f} → {res.last_loss:.3f}, "
                  f"{res.wall_s} s", flush=True)
        meta = json.loads((adapter / "dipdeploy-lora.json").read_text())["train"]
        train = {k: meta[k] for k in ("train_tokens", "steps", "wall_s", "first_loss", "last_loss")}
        for lora in ("adapter", "merged"):
            if (method, rho, lora) not in have:
                evaluate(method, rho, lora, adapter, train)
    write_table(rows, name, info, windows, seqlen, lcfg)
    write_rows_json([{k: r[k] for k in ("method", "density", "lora", "ppl", "train_tokens", "wall_s")} for r in rows],
                    args.json)


def goals(rows: list[dict]) -> str:
    """The goals of LoRA recovery (gap closed, merged = adapter), checked on the rows measured so far."""
    out = ["Goals of LoRA recovery:"]
    for rho in sorted({r["target_density"] for r in rows if r["method"] == "dip"}):
        by = {r["lora"]: r for r in rows if r["method"] == "dip" and r["target_density"] == rho}
        if "adapter" in by and by["adapter"].get("gap_closed") is not None:
            out.append(f"- ρ={rho}: DIP+LoRA (adapter) closes {by['adapter']['gap_closed']:.0%} of the DIP→dense gap "
                       f"(goal ≥ 33 % at ρ=0.5); DIP+LoRA is {by['adapter']['ppl_x_dense']:.3f}× dense (stretch ≤ 1.15×).")
        if "adapter" in by and "merged" in by:
            rel = by["merged"]["ppl"] / by["adapter"]["ppl"] - 1
            out.append(f"- ρ={rho}: merged vs adapter PPL {rel:+.2%} (goal within ±0.5 %).")
    ctrl = {r["lora"]: r for r in rows if r["method"] == "dense" and r["lora"] != "none"}
    if "adapter" in ctrl:
        c = ctrl["adapter"]["ppl"]
        out.append(f"- Control: the same LoRA on the dense model gives {c:.3f} ({ctrl['adapter']['ppl_x_dense']:.3f}× "
                   f"untuned dense): that much is WikiText domain adaptation, not recovery from pruning.")
        for rho in sorted({r["target_density"] for r in rows if r["method"] == "dip"}):
            by = {r["lora"]: r for r in rows if r["method"] == "dip" and r["target_density"] == rho}
            if "adapter" in by and "none" in by:
                out.append(f"- ρ={rho}, like for like: DIP is {by['none']['ppl_x_dense']:.3f}× dense untuned; DIP+LoRA "
                           f"is {by['adapter']['ppl'] / c:.3f}× dense+LoRA (the pruning penalty that LoRA leaves).")
    return "\n".join(out)


def write_table(rows: list[dict], name: str, info: dict, windows: int, seqlen: int, lcfg: LoraConfig) -> None:
    dense = next((r["ppl"] for r in rows if r["method"] == "dense" and r["lora"] == "none"), None)
    dip = {r["target_density"]: r["ppl"] for r in rows if r["method"] == "dip" and r["lora"] == "none"}
    for r in rows:
        r["ppl_x_dense"] = r["ppl"] / dense if dense else None
        base = dip.get(r["target_density"])
        r["gap_closed"] = ((base - r["ppl"]) / (base - dense) if r["method"] == "dip" and r["lora"] != "none"
                           and base and dense and base != dense else None)
    ordered = sorted(rows, key=lambda r: (r["method"] != "dense", r["target_density"], ["none", "adapter", "merged"].index(r["lora"])))
    text = (f"# {name}: LoRA recovery with DIP active (WikiText-2 test perplexity)\n\n"
            f"## LM objective on WikiText-2 validation, with a dense control\n\n"
            f"The first measurement, kept as measured: LoRA trained with next-token cross-entropy on WikiText-2 "
            f"validation (`benchmarks/lora.py`). Its control rows show that this mostly adapts the model to "
            f"WikiText; the next section measures recovery by distillation on other text.\n\n"
            f"Model {rows[0]['model']}; evaluation: the project's evaluator, {windows} windows × {seqlen} tokens of "
            f"WikiText-2 test ({rows[0]['tokens']} predicted tokens; reduced from the 16 × 2048 protocol to fit "
            f"this machine), fp32, prefill and decode both sparsified. DIP plan: calibrated on WikiText-2 "
            f"validation (4 × 512 tokens). LoRA: rank {lcfg.rank}, α {lcfg.lora_alpha:g}, targets "
            f"{','.join(lcfg.targets)}, lr {lcfg.lr:g} ({lcfg.scheduler}, {lcfg.warmup_steps} warm-up steps), "
            f"batch {lcfg.batch_size} × {lcfg.seqlen} tokens, bf16 autocast forward, trained on WikiText-2 validation "
            f"windows with the DIP masks active. `gap_closed` = (PPL_DIP − PPL) / (PPL_DIP − PPL_dense); "
            f"`wall_s` is training time. Rows with method `dense` and lora ≠ none are the domain control "
            f"(LoRA trained the same way on the dense model).\n"
            f"Machine: {info['cpu']}, {info['cores']} cores shared with other jobs (load {info['load_1min']} at start), "
            f"torch 1 thread; up to three training runs of this table overlapped, so wall times are indicative only.\n\n{md_table(ordered, COLS)}\n\n{goals(rows)}\n\n"
            f"Regenerate: `python benchmarks/lora.py` (resumes from benchmarks/results/.{name}.partial.json; "
            f"adapters under /tmp/dipdeploy-lora-bench).\n")
    path = RESULTS / f"{name}.md"
    old = path.read_text() if path.is_file() else ""
    rest = old[old.index(SECTION):] if SECTION in old else ""  # benchmarks/distill.py's section stays
    path.write_text(text + ("\n" + rest if rest else ""))


if __name__ == "__main__":
    main()
