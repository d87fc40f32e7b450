"""Recovery of DIP by distillation from the dense model, against equally trained dense controls
(SmolLM2-135M; another registry model with ``--model``).

Rows (WikiText-2 test PPL, every adapter merged as `export --lora` merges it):

- ``dense``, training ``none``: the untrained dense model. It is also the dense control of distillation
  itself: distilled from itself, the dense student's KL and its gradient are exactly 0 at the start, so
  the adapter never moves (training would reproduce this row).
- ``dense``, training ``lm``: the dense model given the same adapter training (same text, same steps,
  same optimiser) with the next-token objective: what training on that text does to a model with no
  pruning error to repair.
- ``dip``, training ``none``: DIP with the ``--allocation`` plan (``uniform``: one K for every layer;
  ``greedy``: per-layer densities from end-to-end sensitivity; split and allocation calibrated on WikiText-2
  validation).
- ``dip``, training ``distill``: DIP plus the LoRA adapter distilled (KL(dense ‖ student), masks active)
  at the density ``adapter_rho``; at other densities the same adapter is applied under that density's plan.
  ``--hidden-weight W`` adds the dense model's hidden state after every layer as a second target at weight
  W (``hidden_weight`` column; its adapters need a ``--work`` of their own, the recipe differs);
  ``--mlp-weight W`` each layer's dense MLP output on the student's own MLP input (``mlp_weight``, likewise);
  ``--targets …,norms`` trains the RMSNorm weights too, at ``--norm-lr-scale`` × the rate (``norm_lr_scale``).
- ``dip``, training ``lm`` (``--dip-lm``): DIP plus the same training with the next-token objective, to
  tell the objective's share from the training text's.

The training text (``--data``; dipdeploy/finetune/data.py) is Python's pydoc topics or, with ``--data
dense-samples``, text the dense model samples itself (a fresh window per training window); never WikiText.
`gap_closed` = (PPL_DIP − PPL) / (PPL_DIP − PPL_dense), against the untrained DIP row of the same plan;
`x_dense_lm` = PPL / PPL of the dense + LM row.

Adapters and plans go to ``--work`` (not in git) and rows to a partial file, so an interrupted run resumes.
A training run writes a checkpoint every ``--save-steps`` and resumes from the newest one when started
again with the same recipe; ``--train-minutes`` ends it early (the adapter is written from the steps done,
and its row says how many), so a run that would overrun its slot is not lost.
``--train NAME`` only trains one adapter (``distill@RHO``, ``dense-lm``, ``dip-lm@RHO``) and exits: run a few
of those side by side (and the table run with ``--no-train`` meanwhile), then the table run finds them.

    python benchmarks/distill.py --quick    # 1 × 512 test tokens, 4 steps: a pipeline check
    python benchmarks/distill.py            # 4 × 2048 test tokens, 10 steps × 4 × 256 tokens
    python benchmarks/distill.py --allocation greedy --steps 70 --batch 2 --train-seqlen 512 --warmup 8 \
        --save-steps 10 --train distill@0.5 --train-minutes 57   # the results file's run (then the table
                                                                 # runs, same recipe, without --train)

On a GPU (the sampling and training run there; ``results/distill-smollm2-h200.md``: trained on an H200, the
adapters then evaluated here with the same recipe flags, ``--no-train`` and ``--name``):

    python benchmarks/distill.py --allocation greedy --data dense-samples --steps 800 --batch 16 \
        --train-seqlen 512 --warmup 20 --sample-windows 4096 --rank 16 --targets up,gate,down,attn \
        --train-minutes 4 --work W --train distill@0.5
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
from dipdeploy.finetune.data import sampled_windows, samples_the_model
from dipdeploy.loading import load_model
from dipdeploy.paths import write_atomic
from dipdeploy.sparsity.plan import SparsityConfig, SparsityPlan

RESULTS = Path(__file__).resolve().parent / "results"
COLS = ["method", "density", "allocation", "training", "data", "hidden_weight", "mlp_weight", "rank", "targets",
        "norm_lr_scale", "sample_windows", "adapter_rho", "ppl", "x_dense",
        "x_dense_lm", "gap_closed", "train_tokens", "steps", "batch", "train_seqlen", "lr", "wall_s", "train_load_mean",
        "first_loss", "last_loss", "eval_s", "eval_load"]
SECTION = "## Recovery by distillation from the dense model"
#: Where the hand-written reading of the runs starts (and the first 10-step run, whose partial file was not
#: kept, as it was measured): the generated section ends with it, kept when the tables are rewritten.
READING = "### Reading"
LOAD_NAME = "bench-load.json"  # beside an adapter: the mean 1-minute load while it trained


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--densities", default="0.4,0.5,0.6,0.75")
    ap.add_argument("--adapter-densities", default="0.5", help="ρ at which a distilled adapter is trained")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--allocation", default="uniform", choices=("uniform", "greedy"),
                    help="the DIP plans' per-layer allocation (greedy: calibrated once, a few minutes per ρ)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=4, help="training windows per step")
    ap.add_argument("--train-seqlen", type=int, default=256, help="tokens per training window")
    ap.add_argument("--warmup", type=int, default=2, help="linear warm-up steps before the cosine decay")
    ap.add_argument("--save-steps", type=int, default=20, help="steps between training checkpoints")
    ap.add_argument("--train-minutes", type=float,
                    help="stop training after this many minutes (the adapter keeps the steps done)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--data", default="pydoc-topics", help="training text: pydoc-topics | dense-samples (the dense "
                    "model's own samples; use a --work of its own: adapter names do not say their text)")
    ap.add_argument("--sample-windows", type=int,
                    help="dense-samples: draw this many windows and train on them in turn (default: one per window "
                    "trained)")
    ap.add_argument("--rank", type=int, default=LoraConfig.rank, help="LoRA rank")
    ap.add_argument("--targets", default=",".join(LoraConfig.targets),
                    help="what the adapter trains: up,gate,down[,attn] (LoRA)[,norms] (the RMSNorm weights)")
    ap.add_argument("--hidden-weight", type=float, default=0.0,
                    help="distill: weight of the per-layer hidden-state term against the KL (0: logits only)")
    ap.add_argument("--mlp-weight", type=float, default=0.0,
                    help="distill: weight of the per-layer MLP-output term against the KL (0: off)")
    ap.add_argument("--norm-lr-scale", type=float, default=LoraConfig.norm_lr_scale,
                    help="with --targets …,norms: the norms' learning rate as a multiple of --lr (default %(default)g)")
    ap.add_argument("--dip-lm", action="store_true", help="also DIP + the LM objective on the same text")
    ap.add_argument("--train", help="only train this adapter (distill@RHO, dense-lm, dip-lm) and exit")
    ap.add_argument("--no-dense", action="store_true", help="leave the two dense rows to another process")
    ap.add_argument("--table-only", action="store_true", help="rewrite the results section from the partial file")
    ap.add_argument("--trainings", default="none,lm,distill", help="which rows' trainings this process fills")
    ap.add_argument("--no-train", action="store_true",
                    help="skip the rows whose adapter is not trained yet (another process is training it)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; 1 is far faster than 2 on a shared, oversubscribed 2-core machine")
    ap.add_argument("--name", help="the table's name (benchmarks/results/NAME.md and its partial file; default: "
                    "lora-smollm2.md's section for SmolLM2, distill-FAMILY.md for another model)")
    ap.add_argument("--work", default="/tmp/dipdeploy-distill-bench", help="where adapters and plans go (not in git)")
    return ap.parse_args()


def lora_config(args, objective: str) -> LoraConfig:
    """The one training recipe every adapter of the table shares; only the objective differs."""
    return LoraConfig(objective=objective, data=args.data, rank=args.rank, targets=args.targets,
                      sample_windows=args.sample_windows,
                      hidden_weight=args.hidden_weight if objective == "distill" else 0.0,
                      mlp_weight=args.mlp_weight if objective == "distill" else 0.0,
                      norm_lr_scale=args.norm_lr_scale, steps=4 if args.quick else args.steps,
                      seqlen=args.train_seqlen, batch_size=args.batch, lr=args.lr,
                      warmup_steps=1 if args.quick else args.warmup, logging_steps=1 if args.quick else 5,
                      save_steps=2 if args.quick else args.save_steps, bf16=True)


class Bench:
    def __init__(self, args):
        self.args = args
        self.root = Path(args.work) / ("quick" if args.quick else "full")
        # the dense-LM control trains under the ρ = 1 plan, the same whatever --allocation says
        self.work = self.root if args.allocation == "uniform" else self.root / args.allocation
        self.work.mkdir(parents=True, exist_ok=True)
        windows, seqlen = (1, 512) if args.quick else (args.windows, args.seqlen)
        self.ev = Evaluator(EvalConfig(model=args.model, seqlen=seqlen, max_windows=windows, progress=False))
        self.base_lm = self.ev.lm

    def plan(self, rho: float) -> Path:
        """The DIP plan at ρ (``--allocation``; ρ = 1 always uniform), calibrated once on the base model and
        shared by every process."""
        alloc = "uniform" if rho == 1.0 else self.args.allocation
        path = (self.root if alloc == "uniform" else self.work) / f"plan-dip-{rho}.json"
        if not path.is_file():
            t = time.time()
            self.ev.plan_for(SparsityConfig(method="dip", density=rho, allocation=alloc)).save(path, force=True)
            print(f"calibrated {alloc} plan ρ={rho}: {time.time() - t:.0f} s", flush=True)
        return path

    def adapter(self, name: str) -> Path:
        """Train adapter ``name`` unless it is there (resuming its checkpoints); return its directory."""
        objective, method, rho = parse_name(name)
        out = (self.root if method == "dense" else self.work) / name
        cfg = lora_config(self.args, objective)
        if (out / "adapter_config.json").is_file():
            got = LoraConfig.from_dict(json.loads((out / "dipdeploy-lora.json").read_text())["lora"])
            if got != cfg:
                raise SystemExit(f"{out} was trained with another recipe ({got}); remove it or use another --work")
            return out
        plan = SparsityPlan.load(self.plan(1.0 if method == "dense" else rho))
        loads: list[float] = []
        if samples_the_model(cfg):  # minutes before the first logged step
            print(f"{name}: sampling {sampled_windows(cfg)} windows of {cfg.seqlen} tokens from the dense "
                  "model first", flush=True)
        res = finetune(load_model(self.args.model), plan, cfg, out, resume=True, progress=False,
                       callbacks=_callbacks(name, cfg.steps, self.args.train_minutes, loads))
        (out / LOAD_NAME).write_text(json.dumps({"train_load_mean": round(sum(loads) / len(loads), 1) if loads else None}))
        print(f"trained {name}: {res.steps} steps, loss {res.first_loss:.4f} → {res.last_loss:.4f}, {res.wall_s} s",
              flush=True)
        return out

    def row(self, method: str, rho: float, training: str, adapter: Path | None) -> dict:
        t = time.time()
        ev = self.ev
        if adapter is not None:
            plan = SparsityPlan.load(self.plan(rho)) if method == "dip" else None
            ev.lm = apply_lora(load_model(self.args.model), adapter, merge=True, plan=plan, allow_other_plan=True)
            ev.lm.model.to(ev.device)
        ev.cfg.plan = str(self.plan(rho)) if method == "dip" else None
        try:
            row = ev.row(method, rho)
        finally:
            ev.lm, ev.cfg.plan = self.base_lm, None
        train = {"train_tokens": 0, "steps": 0, "wall_s": 0.0}
        if adapter is not None:
            meta = json.loads((adapter / "dipdeploy-lora.json").read_text())
            train = {k: meta["train"][k] for k in ("train_tokens", "steps", "wall_s", "first_loss", "last_loss")}
            train.update(batch=meta["lora"]["batch_size"], train_seqlen=meta["lora"]["seqlen"], lr=meta["lora"]["lr"],
                         planned_steps=meta["lora"]["steps"])
            row["adapter_rho"] = parse_name(adapter.name)[2]
            row["data"] = meta["lora"]["data"]
            row["hidden_weight"] = meta["lora"].get("hidden_weight", 0.0)
            row["rank"], row["targets"] = meta["lora"]["rank"], ",".join(meta["lora"]["targets"])
            row["mlp_weight"] = meta["lora"].get("mlp_weight", 0.0)
            row["norm_lr_scale"] = meta["lora"].get("norm_lr_scale", 1.0) if "norms" in meta["lora"]["targets"] else None
            row["sample_windows"] = meta["lora"].get("sample_windows")
            if (adapter / LOAD_NAME).is_file():
                train.update(json.loads((adapter / LOAD_NAME).read_text()))
        row["eval_load"] = round(os.getloadavg()[0], 1)
        return {**row, "training": training, "eval_wall_s": round(time.time() - t, 1), **train}


def _callbacks(name: str, steps: int, minutes: float | None, loads: list[float]) -> tuple:
    """TrainerCallbacks: each logged loss with its step, the elapsed time, the time left at this pace and
    the 1-minute load (a long run's only sign of life); each checkpoint written; and, with ``minutes``, a
    stop after that long, so the adapter is written from the steps done rather than lost with the slot."""
    from transformers import TrainerCallback

    class PrintLog(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.t0, self.step0 = time.time(), state.global_step

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                loads.append(os.getloadavg()[0])
                done = state.global_step - self.step0
                spent = time.time() - self.t0
                left = spent / done * (steps - state.global_step) if done else float("nan")
                print(f"{name} step {state.global_step}/{steps}: loss {logs['loss']:.4f}, {spent:.0f} s, "
                      f"~{left:.0f} s left, load {os.getloadavg()[0]:.1f}", flush=True)

        def on_save(self, args, state, control, **kwargs):
            print(f"{name} checkpoint at step {state.global_step}", flush=True)

    class Deadline(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.until = time.time() + 60 * minutes

        def on_step_end(self, args, state, control, **kwargs):
            if time.time() >= self.until:
                print(f"{name}: --train-minutes {minutes:g} reached at step {state.global_step} of {steps}; "
                      f"writing the adapter from the steps done", flush=True)
                control.should_training_stop = True

    return (PrintLog(),) + ((Deadline(),) if minutes else ())


def key(row: dict) -> tuple:
    """A row's identity in the partial file: the rows of adapters trained on different text coexist."""
    return (row["method"], row["target_density"], row["allocation"], row["training"], data_of(row), hidden_of(row),
            *recipe_of(row))


#: the adapter recipe of every row from before the rank, targets, sample_windows, mlp_weight and norm_lr_scale
#: columns (the norms, where trained before their column, trained at the LoRA's own rate)
OLD_RECIPE = {"rank": 16, "targets": "up,gate,down", "sample_windows": None, "mlp_weight": 0.0, "norm_lr_scale": 1.0}


def recipe_of(row: dict) -> tuple:
    """(rank, targets, sample_windows, mlp_weight, norm_lr_scale) of a trained row's adapter (norm_lr_scale
    None where no norm was trained), all "-" for an untrained row."""
    if row["training"] == "none":
        return ("-",) * len(OLD_RECIPE)
    recipe = {k: row.get(k, v) for k, v in OLD_RECIPE.items()}
    if "norms" not in recipe["targets"].split(","):
        recipe["norm_lr_scale"] = None
    return tuple(recipe.values())


def data_of(row: dict) -> str:
    """The training text of a row ("-" untrained; rows from before the column were all pydoc topics)."""
    return "-" if row["training"] == "none" else row.get("data") or "pydoc-topics"


def hidden_of(row: dict) -> float:
    """The weight of the hidden-state term a row's adapter was distilled with (0: logits only, and every row
    from before the column)."""
    return float(row.get("hidden_weight") or 0.0) if row["training"] == "distill" else 0.0


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
    name = args.name or "distill-" + args.model.split("-")[0] + ("-quick" if args.quick else "")
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
        alloc = "-" if method == "dense" else args.allocation
        data = data_of({"training": training, "data": args.data})
        hidden = hidden_of({"training": training, "hidden_weight": args.hidden_weight})
        recipe = recipe_of({"training": training, "rank": args.rank, "targets": args.targets,
                            "sample_windows": args.sample_windows,
                            "mlp_weight": args.mlp_weight if training == "distill" else 0.0,
                            "norm_lr_scale": args.norm_lr_scale})
        if (training not in args.trainings.split(",")
                or (method, rho, alloc, training, data, hidden, *recipe) in {key(r) for r in merged()}):
            return
        where = bench.root if method == "dense" else bench.work
        if adapter_name and args.no_train and not (where / adapter_name / "adapter_config.json").is_file():
            print(f"skipped {method} ρ={rho} {training}: adapter {adapter_name} not trained yet", flush=True)
            return
        row = bench.row(method, rho, training, bench.adapter(adapter_name) if adapter_name else None)
        mine.append(row)
        rows = [r for r in all_rows() if (r["windows"], r["seqlen"]) != test] + merged()  # other sizes kept
        write_atomic(partial, json.dumps(rows, indent=1), force=True)  # the partial file grows row by row
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
    dip = {(r["target_density"], r["allocation"]): r["ppl"] for r in rows
           if r["method"] == "dip" and r["training"] == "none"}
    for r in rows:
        r["x_dense"] = r["ppl"] / dense if dense else None
        r["x_dense_lm"] = r["ppl"] / dense_lm if dense_lm else None
        base = dip.get((r["target_density"], r["allocation"]))
        r["gap_closed"] = ((base - r["ppl"]) / (base - dense) if r["method"] == "dip" and r["training"] != "none"
                           and base and dense and base != dense else None)


def goal(rows: list[dict], rho: float) -> str:
    """The issue's goal: DIP at ρ = 0.5 with recovery within 1.10× the equally trained dense model. For
    distillation that model is the untrained dense row (distilled from itself it does not move); where the
    dense + LM row of the same table exists, the ratio to it is given too (the stricter reading when it is
    lower)."""
    dense = next((r["ppl"] for r in rows if r["method"] == "dense" and r["training"] == "none"), None)
    dense_lm = next((r["ppl"] for r in rows if r["method"] == "dense" and r["training"] == "lm"), None)
    recs = [r for r in rows if r["method"] == "dip" and r["target_density"] == rho and r["training"] == "distill"]
    head = f"Goal (DIP ρ={rho} + distillation ≤ 1.10× the equally trained dense model, i.e. the dense row)"
    if not recs or dense is None:
        return f"{head}: not measured yet."
    lines = []
    for rec in recs:
        ratio = rec["ppl"] / dense
        extra = f"; {rec['ppl'] / dense_lm:.3f}× the dense + LM row" if dense_lm else ""
        if rec.get("planned_steps", rec["steps"]) > rec["steps"]:
            extra += f" (training stopped by --train-minutes at step {rec['steps']} of {rec['planned_steps']})"
        hidden = f", hidden states ×{hidden_of(rec):g}" if hidden_of(rec) else ""
        rank, targets, _, mlp, norm_lr = recipe_of(rec)
        if mlp:
            hidden += f", MLP outputs ×{mlp:g}"
        if norm_lr is not None:
            hidden += f", the norms at {norm_lr:g} × lr"
        if (rank, targets) != (OLD_RECIPE["rank"], OLD_RECIPE["targets"]):
            hidden += f", rank {rank} on {targets}"
        lines.append(f"{head}, {rec['allocation']} plan, {data_of(rec)}{hidden}, {rec['steps']} steps: "
                     f"{rec['ppl']:.3f} = {ratio:.3f}× dense {dense:.3f} (limit {1.10 * dense:.3f}){extra}: **{'met' if ratio <= 1.10 else 'NOT met'}**.")
    return "\n".join(lines)


def write_table(rows: list[dict], name: str, info: dict, args) -> None:
    """The section of the results file: one table per evaluation size found in the rows."""
    if not rows:
        return
    order = ["none", "lm", "distill"]
    tables = []
    cfg = lora_config(args, "distill")
    for windows, seqlen in sorted({(r["windows"], r["seqlen"]) for r in rows}, reverse=True):
        part = [r for r in rows if (r["windows"], r["seqlen"]) == (windows, seqlen)]
        derive(part)
        for r in part:
            r["data"], r["hidden_weight"] = data_of(r), hidden_of(r) if r["training"] == "distill" else None
            r["rank"], r["targets"], r["sample_windows"], r["mlp_weight"], r["norm_lr_scale"] = recipe_of(r)
        part.sort(key=lambda r: (r["method"] != "dense", r["target_density"], r["allocation"],
                                 order.index(r["training"]), r["data"], r["hidden_weight"] or 0.0, str(recipe_of(r))))
        tables.append(f"### {windows} × {seqlen} tokens of WikiText-2 test ({part[0]['tokens']} predicted tokens)\n\n"
                      f"{md_table(part, COLS)}\n\n{goal(part, 0.5)}\n")
    text = (f"{SECTION}\n\n"
            f"Model {rows[0]['model']}; evaluation: the project's evaluator on WikiText-2 test, fewer windows than "
            f"the 16 × 2048 protocol to fit this machine (the size heads each table), fp32, prefill and decode both "
            f"sparsified, every adapter merged into the fp32 weights (as `export --lora`). DIP: the plan's `allocation` "
            f"(uniform: one K for every layer; greedy: per-layer densities from end-to-end sensitivity), split and "
            f"allocation calibrated on WikiText-2 validation (4 × 512 tokens). Training: LoRA of the row's `rank` "
            f"(α = 2 · rank) on its `targets` (attn: every attention projection), AdamW, {cfg.scheduler} schedule "
            f"after linear "
            f"warm-up, `steps` × `batch` × `train_seqlen` tokens at `lr` (per row; `steps` is the steps done), "
            f"bf16 autocast forward, on the row's `data` (dipdeploy/finetune/data.py, never WikiText): "
            f"`pydoc-topics`, Python's bundled pydoc topics (220 windows of 512 tokens, so more steps are more "
            f"epochs), or `dense-samples`, text the dense model samples itself at temperature 1, a fresh window "
            f"for every window trained on, or `sample_windows` of them trained on in turn. `distill`: "
            f"KL(dense ‖ student) at temperature 1, the teacher "
            f"the same base weights run dense with the adapter off, plus, where `hidden_weight` > 0, that weight times "
            f"the mean over layers of the relative squared error of the hidden state after each layer, and where "
            f"`mlp_weight` > 0, that weight times the mean over layers of the relative squared error of the MLP's "
            f"output against the dense MLP's on the same input; `lm`: "
            f"next-token cross-entropy. One distilled "
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
    reading = "\n" + old[old.index(READING, old.index(SECTION)):] if READING in old.partition(SECTION)[2] else ""
    write_atomic(path, (kept + "\n\n" if kept else "") + text + reading, force=True)  # this section is regenerated


if __name__ == "__main__":
    main()
