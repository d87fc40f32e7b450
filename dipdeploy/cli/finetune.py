"""`dipdeploy finetune`: LoRA recovery with DIP/DIP-CA active (parses, calls `finetune`, presents).

Unset options fall through to :class:`dipdeploy.finetune.LoraConfig` and
:class:`dipdeploy.sparsity.plan.SparsityConfig`, where every default is defined once.
Scale-out: ``accelerate launch "$(which dipdeploy)" finetune ...`` (see dipdeploy/finetune/train.py): every
process checks and trains, only process 0 prints and writes the adapter. The launcher places each process
on its device, so ``--device`` (one process: calibration and training, ``dipdeploy.torchdevice``) is
refused under it rather than fighting it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dipdeploy import defaults
from dipdeploy.cli._app import app
from dipdeploy.cli.core import DATA, DEVICE, MODEL, console, fail
from dipdeploy.finetune.config import DATA as SOURCES
from dipdeploy.finetune.config import DEFAULT_DATA, OBJECTIVES, LoraConfig
from dipdeploy.terminal import shown

_L = LoraConfig


def _given(**kw) -> dict:
    return {k: v for k, v in kw.items() if v is not None}


@app.command("finetune")
def finetune_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="adapter directory to write (peft adapter + plan.json)"),
    model: str = MODEL,
    method: Optional[str] = typer.Option(None, help="dip | dip-ca (default: SparsityConfig; ignored with --plan)"),
    density: Optional[float] = typer.Option(None, help="target MLP density ρ (ignored with --plan)"),
    plan: Optional[Path] = typer.Option(None, help="train under this plan (default: calibrate one on validation)"),
    rho_in: Optional[float] = typer.Option(None, "--rho-in", help="input share ρ_in; default: calibrated"),
    gamma: Optional[float] = typer.Option(None, help="DIP-CA re-weighting of non-resident rows"),
    rank: Optional[int] = typer.Option(None, help=f"LoRA rank (default {_L.rank})"),
    alpha: Optional[float] = typer.Option(None, help="LoRA α (default 2·rank)"),
    targets: Optional[str] = typer.Option(None, help="comma list of up, gate, down, attn (LoRA), norms (the RMSNorm "
                                          f"weights, trained whole beside them; default {','.join(_L.targets)})"),
    steps: Optional[int] = typer.Option(None, help=f"optimizer steps (default {_L.steps})"),
    tokens: Optional[int] = typer.Option(None, help="training tokens (overrides --steps)"),
    lr: Optional[float] = typer.Option(None, help=f"peak learning rate (default {_L.lr:g})"),
    norm_lr_scale: Optional[float] = typer.Option(
        None, "--norm-lr-scale", help="with --targets …,norms: the norms' learning rate as a multiple of --lr "
                                      f"(default {_L.norm_lr_scale:g})"),
    seqlen: Optional[int] = typer.Option(None, help=f"training window length (default {_L.seqlen})"),
    batch_size: Optional[int] = typer.Option(None, help=f"windows per step per process (default {_L.batch_size})"),
    save_steps: Optional[int] = typer.Option(None, help=f"checkpoint every N steps (default {_L.save_steps})"),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="bf16 autocast forward (GPU or AVX512-BF16 CPU)"),
    objective: Optional[str] = typer.Option(
        None, help=f"{' | '.join(OBJECTIVES)}: next-token cross-entropy, or KL to the dense base model "
                   f"(default {_L.objective})"),
    hidden_weight: Optional[float] = typer.Option(
        None, "--hidden-weight", help="distill: also match the dense model's hidden state after every layer, at "
                                      f"this weight against the KL (default {_L.hidden_weight:g}: logits only)"),
    mlp_weight: Optional[float] = typer.Option(
        None, "--mlp-weight", help="distill: also match each layer's dense MLP output on the student's own MLP "
                                   f"input, at this weight against the KL (default {_L.mlp_weight:g}: off)"),
    data: Optional[str] = typer.Option(
        None, help=f"{' | '.join(SOURCES)} (never the test split; default: "
                   f"{', '.join(f'{v} for {k}' for k, v in DEFAULT_DATA.items())}); or --text-file"),
    sample_windows: Optional[int] = typer.Option(
        None, "--sample-windows", help="dense-samples: draw this many windows and train on them in turn (default: "
                                       "one fresh window per window trained; sampling costs a forward per token)"),
    text_file: Optional[Path] = typer.Option(None, help="train on this UTF-8 text instead"),
    data_dir: Optional[Path] = DATA,
    threads: Optional[int] = typer.Option(None, help="torch CPU threads (1 is fastest on a busy machine)"),
    device: Optional[str] = DEVICE,
    resume: bool = typer.Option(False, "--resume", help="continue from the newest checkpoint in OUT.checkpoints"),
    force: bool = typer.Option(False, "--force", help="overwrite OUT and discard old checkpoints"),
) -> None:
    """Train LoRA adapters with the DIP masks active (next-token loss, or distillation from the dense model);
    save a peft adapter plus the plan it was trained for."""
    import torch

    from dipdeploy.cli.core import check_inputs
    from dipdeploy.finetune.launch import ProcessInfo
    from dipdeploy.paths import check_output
    from dipdeploy.progress import Progress
    from dipdeploy.sparsity.plan import SparsityConfig, SparsityPlan
    from dipdeploy.torchdevice import DEFAULT_DEVICE, resolve_device

    proc = ProcessInfo.from_env()
    say = console.print if proc.is_main else (lambda *a, **k: None)
    try:
        check_output(out, force, directory=True, flag="--out")
        check_inputs(data_dir=data_dir, files={"--plan": plan, "--text-file": text_file})
        cfg = LoraConfig(**_given(rank=rank, alpha=alpha, targets=targets, steps=steps, tokens=tokens, lr=lr,
                                  norm_lr_scale=norm_lr_scale, seqlen=seqlen, batch_size=batch_size,
                                  save_steps=save_steps, bf16=bf16, objective=objective,
                                  hidden_weight=hidden_weight, mlp_weight=mlp_weight, data=data,
                                  sample_windows=sample_windows, text_file=str(text_file) if text_file else None))
        if threads is not None and threads < 1:
            raise ValueError(f"--threads {threads}: give at least 1")
        if proc.world_size > 1 and device is not None:
            raise ValueError(f"--device {device} under a launcher ({proc.world_size} processes): accelerate places "
                             f"each process on its device (accelerate config, CUDA_VISIBLE_DEVICES); drop "
                             f"--device")
        # one process: calibration and training on this device; under a launcher, None: the launcher's
        where = resolve_device(device or DEFAULT_DEVICE) if proc.world_size == 1 else None
        p = SparsityPlan.load(plan) if plan is not None else None
        sp = None
        if p is None:
            sp = SparsityConfig(**_given(method=method, density=density, rho_in=rho_in, gamma=gamma))
            if sp.method not in ("dip", "dip-ca"):
                raise ValueError(f"--method {sp.method}: finetune trains under dip or dip-ca")
        from dipdeploy.finetune.data import sampled_windows, samples_the_model, training_text

        training_text(cfg, data_dir)  # refuses WikiText test (and, for distill, validation) text before any work
        check_inputs(model=model)
        from dipdeploy.data import calibration_windows
        from dipdeploy.finetune import finetune
        from dipdeploy.loading import load_model
        from dipdeploy.sparsity.calibrate import calibrate_on

        if threads is not None:
            torch.set_num_threads(threads)
        progress = Progress(quiet=not proc.is_main)
        with progress.stage(f"load {model}"):
            lm = load_model(model)
        if p is None:
            with progress.stage(f"calibrate {sp.method} ρ={sp.density:g}, window passes") as stage:
                calib = calibration_windows(lm.tokenizer, defaults.CALIB_WINDOWS, defaults.CALIB_SEQLEN, data_dir)
                p = calibrate_on(lm, sp, calib, where or "cpu", progress=stage)
        norms = f", the norms at {cfg.norm_lr_scale:g} × lr" if "norms" in cfg.targets else ""
        say(f"training LoRA (rank {cfg.rank}, {','.join(cfg.targets)}{norms}, objective {cfg.objective}"
            f"{f' + hidden states ×{cfg.hidden_weight:g}' if cfg.hidden_weight else ''}"
            f"{f' + MLP outputs ×{cfg.mlp_weight:g}' if cfg.mlp_weight else ''}, text "
            f"{shown(cfg.text_file or cfg.data)}) on {shown(lm.name)} under {shown(p.method)} "
            f"ρ={p.density:.4f}: {cfg.total_steps(proc.world_size)} steps × {cfg.tokens_per_step} tokens"
            + (f" × {proc.world_size} processes" if proc.world_size > 1 else ""))
        if samples_the_model(cfg):  # minutes before the first step: say so
            say(f"sampling {sampled_windows(cfg)} windows of {cfg.seqlen} tokens "
                f"from the dense model first (--data dense-samples)")
        with progress.stage("train LoRA, steps", total=cfg.total_steps(proc.world_size)) as stage:
            res = finetune(lm, p, cfg, out, data_dir=data_dir, resume=resume, force=force, progress=False,
                           callbacks=(_step_counter(stage),), device=where)
    except (ValueError, OSError, KeyError) as err:
        proc.await_main_refusal()  # every process refuses alike; process 0 says why, once
        fail(err)
    say(f"adapter → {shown(res.out_dir)}: {res.steps} steps, {res.train_tokens} tokens, "
                  f"loss {res.first_loss:.4f} → {res.last_loss:.4f}, {res.wall_s} s")


def _step_counter(stage):
    """A TrainerCallback that advances ``stage`` per optimizer step (the Trainer's own tqdm bar is off:
    it would interleave with ours, dipdeploy/progress.py)."""
    from transformers import TrainerCallback

    class StepCounter(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stage.advance()

    return StepCounter()
