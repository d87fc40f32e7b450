"""SmolLM2-135M: recovery of DIP by distillation from the dense model, against equally trained dense controls.

Rows (WikiText-2 test PPL, every adapter merged as `export --lora` merges it):

- ``dense``, training ``none``: the untrained dense model. It is also the dense control of distillation
  itself: distilled from itself, the dense student's KL and its gradient are exactly 0 at the start, so
  the adapter never moves (training would reproduce this row).
- ``dense``, training ``lm``: the dense model given the same adapter training (same text, same steps,
  same optimiser) with the next-token objective: what training on that text does to a model with no
  pruning error to repair.
- ``dip``, training ``none``: DIP with a uniform plan (split calibrated on WikiText-2 validation).
- ``dip``, training ``distill``: DIP plus the LoRA adapter distilled (KL(dense ‖ student), masks active)
  at the density ``adapter_rho``; at other densities the same adapter is applied under that density's plan.
- ``dip``, training ``lm`` (``--dip-lm``): DIP plus the same training with the next-token objective, to
  tell the objective's share from the training text's.

The training text is Python's pydoc topics (``--data``; dipdeploy/finetune/data.py), never WikiText.
`gap_closed` = (PPL_DIP − PPL) / (PPL_DIP − PPL_dense); `x_dense_lm` = PPL / PPL of the dense + LM row.

Adapters and plans go to ``--work`` (not in git) and rows to a partial file, so an interrupted run resumes.
``--train NAME`` only trains one adapter (``distill@RHO``, ``dense-lm``, ``dip-lm@RHO``) and exits: run a few
of those side by side (and the table run with ``--no-train`` meanwhile), then the table run finds them.

    python benchmarks/distill.py --quick    # 1 × 512 test tokens, 4 steps: a pipeline check
    python benchmarks/distill.py            # 4 × 2048 test tokens, 10 steps × 4 × 256 tokens
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from _common import machine, md_table, write_rows_json

from dipdeploy.eval import EvalConfig, Evaluator
from dipdeploy.finetune import LoraConfig, apply_lora, finetune
from dipdeploy.loading import load_model
from dipdeploy.sparsity.plan import SparsityConfig, SparsityPlan

RESULTS = Path(__file__).resolve().parent / "results"
COLS = ["method", "density", "training", "adapter_rho", "ppl", "x_dense", "x_dense_lm", "gap_closed",
        "train_tokens", "steps", "wall_s", "first_loss", "last_loss"]
SECTION = "## Recovery by distillation from the dense model"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--densities", default="0.4,0.5,0.6,0.75")
    ap.add_argument("--adapter-densities", default="0.5", help="ρ at which a distilled adapter is trained")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--data", default="pydoc-topics")
    ap.add_argument("--dip-lm", action="store_true", help="also DIP + the LM objective on the same text")
    ap.add_argument("--train", help="only train this adapter (distill@RHO, dense-lm, dip-lm) and exit")
    ap.add_argument("--no-dense", action="store_true", help="leave the two dense rows to another process")
    ap.add_argument("--table-only", action="store_true", help="rewrite the results section from the partial file")
    ap.add_argument("--trainings", default="none,lm,distill", help="which rows' trainings this process fills")
    ap.add_argument("--no-train", action="store_true",
                    help="skip the rows whose adapter is not trained yet (another process is training it)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; 1 is far faster than 2 on a shared, oversubscribed 2-core machine")
    ap.add_argument("--work", default="/tmp/dipdeploy-distill-bench", help="where adapters and plans go (not in git)")
    return ap.parse_args()


def lora_config(args, objective: str) -> LoraConfig:
    """The one training recipe every adapter of the table shares; only the objective differs."""
    return LoraConfig(objective=objective, data=args.data, steps=4 if args.quick else args.steps, seqlen=256,
                      batch_size=4, lr=args.lr, warmup_steps=1 if args.quick else 2,
                      logging_steps=1 if args.quick else 5, save_steps=20, bf16=True)


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work) / ("quick" if args.quick else "full")
        self.work.mkdir(parents=True, exist_ok=True)
        windows, seqlen = (1, 512) if args.quick else (args.windows, args.seqlen)
        self.ev = Evaluator(EvalConfig(model=args.model, seqlen=seqlen, max_windows=windows, progress=False))
        self.base_lm = self.ev.lm

    def plan(self, rho: float) -> Path:
        """The uniform DIP plan at ρ, calibrated once on the base model and shared by every process."""
        path = self.work / f"plan-dip-{rho}.json"
        if not path.is_file():
            self.ev.plan_for(SparsityConfig(method="dip", density=rho)).save(path, force=True)
        return path

    def adapter(self, name: str) -> Path:
        """Train adapter ``name`` unless it is there (resuming its checkpoints); return its directory."""
        out = self.work / name
        objective, method, rho = parse_name(name)
        cfg = lora_config(self.args, objective)
        if (out / "adapter_config.json").is_file():
            got = LoraConfig.from_dict(json.loads((out / "dipdeploy-lora.json").read_text())["lora"])
            if got != cfg:
                raise SystemExit(f"{out} was trained with another recipe ({got}); remove it or use another --work")
            return out
        plan = SparsityPlan.load(self.plan(1.0 if method == "dense" else rho))
        res = finetune(load_model(self.args.model), plan, cfg, out, resume=True, progress=False,
                       callbacks=(_PrintLog(name),))
        print(f"trained {name}: {res.steps} steps, loss {res.first_loss:.4f} → {res.last_loss:.4f}, {res.wall_s} s",
              flush=True)
        return out

    def row(self, method: str, rho: float, training: str, adapter: Path | None) -> dict:
        t = time.time()
        ev = self.ev
        if adapter is not None:
            plan = SparsityPlan.load(self.plan(rho)) if method == "dip" else None
            ev.lm = apply_lora(load_model(self.args.model), adapter, merge=True, plan=plan, allow_other_plan=True)
        ev.cfg.plan = str(self.plan(rho)) if method == "dip" else None
        try:
            row = ev.row(method, rho)
        finally:
            ev.lm, ev.cfg.plan = self.base_lm, None
        train = {"train_tokens": 0, "steps": 0, "wall_s": 0.0}
        if adapter is not None:
            meta = json.loads((adapter / "dipdeploy-lora.json").read_text())
            train = {k: meta["train"][k] for k in ("train_tokens", "steps", "wall_s", "first_loss", "last_loss")}
            row["adapter_rho"] = parse_name(adapter.name)[2]
        return {**row, "training": training, "eval_wall_s": round(time.time() - t, 1), **train}


def _PrintLog(name: str):
    """A TrainerCallback printing each logged loss with its step (a long run's only sign of life)."""
    from transformers import TrainerCallback

    class PrintLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                print(f"{name} step {state.global_step}: loss {logs['loss']:.4f}", flush=True)

    return PrintLog()


def key(row: dict) -> tuple:
    return row["method"], row["target_density"], row["training"]


def parse_name(name: str) -> tuple[str, str, float]:
    """(objective, method trained under, ρ) of an adapter name: distill@0.5, dense-lm, dip-lm@0.5."""
    head, _, rho = name.partition("@")
    if head == "distill":
        return "distill", "dip", float(rho)
    if head == "dense-lm":
        return "lm", "dense", 1.0
    if head == "dip-lm":
        return "lm", "dip", float(rho)
    raise SystemExit(f"adapter {name!r} unknown; use distill@RHO, dense-lm or dip-lm@RHO")


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    name = "distill-" + args.model.split("-")[0] + ("-quick" if args.quick else "")
    partial = RESULTS / f".{name}.partial.json"

    def all_rows() -> list[dict]:
        return json.loads(partial.read_text()) if partial.is_file() else []

    if args.table_only:
        write_table(all_rows(), name, machine(), args)
        return
    bench = Bench(args)
    if args.train:
        bench.adapter(args.train)
        return
    densities = [float(r) for r in args.densities.split(",")]
    trained_at = [float(r) for r in args.adapter_densities.split(",")]
    test = tuple(bench.ev.test.shape)
    mine: list[dict] = []
    info = machine()

    def merged() -> list[dict]:
        """The partial file's rows of this evaluation size, plus this process's: several processes may fill
        one table side by side (each on its own rows, ``--densities``, ``--no-dense``)."""
        rows = json.loads(partial.read_text()) if partial.is_file() else []
        rows = {key(r): r for r in rows + mine if (r["windows"], r["seqlen"]) == test}
        return list(rows.values())

    def want(method: str, rho: float, training: str, adapter_name: str | None) -> None:
        if training not in args.trainings.split(",") or (method, rho, training) in {key(r) for r in merged()}:
            return
        if adapter_name and args.no_train and not (bench.work / adapter_name / "adapter_config.json").is_file():
            print(f"skipped {method} ρ={rho} {training}: adapter {adapter_name} not trained yet", flush=True)
            return
        row = bench.row(method, rho, training, bench.adapter(adapter_name) if adapter_name else None)
        mine.append(row)
        rows = [r for r in all_rows() if (r["windows"], r["seqlen"]) != test] + merged()  # other sizes kept
        tmp = partial.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        tmp.replace(partial)
        print(f"{method:5s} ρ={rho:<5} {training:8s} ppl={row['ppl']:.3f} eval {row['eval_wall_s']} s", flush=True)
        write_table(all_rows(), name, info, args)

    if not args.no_dense:
        want("dense", 1.0, "none", None)
        want("dense", 1.0, "lm", "dense-lm")
    for rho in sorted(densities, key=lambda r: (r not in trained_at, r)):  # the trained densities first
        want("dip", rho, "none", None)
        want("dip", rho, "distill", f"distill@{min(trained_at, key=lambda a: abs(a - rho))}")
    if args.dip_lm:
        want("dip", trained_at[0], "lm", f"dip-lm@{trained_at[0]}")
    rows = merged()
    write_table(all_rows(), name, info, args)
    write_rows_json([{k: r.get(k) for k in ("method", "density", "training", "adapter_rho", "ppl", "train_tokens",
                                            "wall_s")} for r in rows], args.json)


def derive(rows: list[dict]) -> None:
    dense = next((r["ppl"] for r in rows if r["method"] == "dense" and r["training"] == "none"), None)
    dense_lm = next((r["ppl"] for r in rows if r["method"] == "dense" and r["training"] == "lm"), None)
    dip = {r["target_density"]: r["ppl"] for r in rows if r["method"] == "dip" and r["training"] == "none"}
    for r in rows:
        r["x_dense"] = r["ppl"] / dense if dense else None
        r["x_dense_lm"] = r["ppl"] / dense_lm if dense_lm else None
        base = dip.get(r["target_density"])
        r["gap_closed"] = ((base - r["ppl"]) / (base - dense) if r["method"] == "dip" and r["training"] != "none"
                           and base and dense and base != dense else None)


def goal(rows: list[dict], rho: float) -> str:
    """The issue's goal: DIP at ρ = 0.5 with recovery within 1.10× the equally trained dense model, checked
    against the stricter (lower-PPL) of the two dense controls."""
    dense = [r["ppl"] for r in rows if r["method"] == "dense"]
    rec = next((r for r in rows if r["method"] == "dip" and r["target_density"] == rho and r["training"] == "distill"), None)
    if rec is None or len(dense) < 2:
        return f"Goal (DIP ρ={rho} + distillation ≤ 1.10× the equally trained dense model): not measured yet."
    ratio = rec["ppl"] / min(dense)
    return (f"Goal (DIP ρ={rho} + distillation ≤ 1.10× the equally trained dense model, the lower-PPL dense "
            f"control): {ratio:.3f}×: **{'met' if ratio <= 1.10 else 'not met'}**.")


def write_table(rows: list[dict], name: str, info: dict, args) -> None:
    """The section of the results file: one table per evaluation size found in the rows."""
    if not rows:
        return
    order = ["none", "lm", "distill"]
    cfg = lora_config(args, "distill")
    tables = []
    for windows, seqlen in sorted({(r["windows"], r["seqlen"]) for r in rows}, reverse=True):
        part = [r for r in rows if (r["windows"], r["seqlen"]) == (windows, seqlen)]
        derive(part)
        part.sort(key=lambda r: (r["method"] != "dense", r["target_density"], order.index(r["training"])))
        tables.append(f"### {windows} × {seqlen} tokens of WikiText-2 test ({part[0]['tokens']} predicted tokens)\n\n"
                      f"{md_table(part, COLS)}\n\n{goal(part, 0.5)}\n")
    text = (f"{SECTION}\n\n"
            f"Model {rows[0]['model']}; evaluation: the project's evaluator on WikiText-2 test, fewer windows than "
            f"the 16 × 2048 protocol to fit this machine (the size heads each table), fp32, prefill and decode both "
            f"sparsified, every adapter merged into the fp32 weights (as `export --lora`). DIP: uniform plans, split "
            f"calibrated on WikiText-2 validation (4 × 512 tokens). Training (every adapter alike, only the "
            f"objective differs): LoRA rank {cfg.rank}, α {cfg.lora_alpha:g}, targets {','.join(cfg.targets)}, lr "
            f"{cfg.lr:g} ({cfg.scheduler}, {cfg.warmup_steps} warm-up steps), {cfg.steps} steps × {cfg.batch_size} × "
            f"{cfg.seqlen} tokens, bf16 autocast forward, on `{cfg.data}` (Python's bundled pydoc topics, "
            f"dipdeploy/finetune/data.py: no WikiText). `distill`: KL(dense ‖ student) at temperature 1, the teacher "
            f"the same base weights run dense with the adapter off; `lm`: next-token cross-entropy. One distilled "
            f"adapter per `adapter_rho`, applied under each row's own plan. `x_dense` = PPL / dense untrained; "
            f"`x_dense_lm` = PPL / dense + the same LM training; `gap_closed` = (PPL_DIP − PPL) / (PPL_DIP − "
            f"PPL_dense untrained); `wall_s` = training time, losses = first and last logged (KL in nats/token for "
            f"distill).\n\n"
            f"Which control is which: the dense model distilled from itself does not move (KL and gradient are 0 "
            f"at the start), so for distillation the equally trained dense model *is* the untrained dense row; "
            f"`dense` + `lm` is the dense model given the same text and steps with the LM objective, the control "
            f"for what the training text alone does to WikiText perplexity.\n"
            f"Machine: {info['cpu']}, {info['cores']} cores shared with other jobs (load {info['load_1min']} when "
            f"this was written), torch {args.threads} thread per process; several training and evaluation processes "
            f"overlapped, so wall times are indicative only.\n\n" + "\n".join(tables) +
            f"\nRegenerate: `python benchmarks/distill.py` (resumes from benchmarks/results/.{name}.partial.json; "
            f"adapters under {args.work}; `--table-only` rewrites this section from it).\n")
    path = RESULTS / ("lora-smollm2.md" if name == "distill-smollm2" else f"{name}.md")
    old = path.read_text() if path.is_file() else ""
    kept = old.split(SECTION)[0].rstrip() if SECTION in old else old.rstrip()
    path.write_text((kept + "\n\n" if kept else "") + text)


if __name__ == "__main__":
    main()
