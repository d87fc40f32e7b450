"""``finetune(lm, plan, cfg, out_dir)``: LoRA recovery with the DIP/DIP-CA masks active.

Built on the Hugging Face ``Trainer`` (not a hand-written loop): it brings progress, periodic
checkpoints (adapter, optimizer, scheduler, RNG, data position), exact resume after an interruption,
and — unchanged — data-parallel training on several GPUs or machines:

    accelerate launch --num_processes 8 "$(which dipdeploy)" finetune --model mistral-7b --method dip \
        --density 0.5 --bf16 --out mistral-dip50-lora

(each process trains on its shard of the windows; process 0 writes checkpoints and the adapter, the
same adapter as one process writes; ``train.processes`` in its metadata says how many trained it). On a
CPU-only machine the same launch with ``--multi_gpu`` and ``CUDA_VISIBLE_DEVICES=`` runs DDP over gloo;
``tests/test_finetune_multiprocess.py`` runs two such processes.

The Trainer needed two small overrides, not a different loop, because of the ``SparseMLP`` wrapper:

- ``_save`` / ``_load_from_checkpoint`` run inside :func:`dense_paths`, so checkpoints and the final
  adapter carry the plain module paths (``mlp.up_proj``), which the unwrapped base model accepts;
- ``compute_loss`` resets the DIP-CA caches first, so every batch of windows starts cold, exactly as
  the evaluator runs it (plain DIP keeps no state; the reset is free).

With ``score = wina`` or ``wina-in`` the column norms are taken from the base weights while training (the SparseMLP
computes them when it wraps); a merged model recomputes them from ``W + s·B·A`` (and export folds those), so the merged
and adapter-applied models can select slightly differently. The default ``abs`` score has no such gap.

The masks: peft wraps the nn.Linear projections *inside* the SparseMLP, so a projection computes
``(W + s·B·A)(m_in ⊙ x)`` — the adapter acts on the full weight before column selection, as merging
it later does (docs/method.md). ``m_in``/``m_glu`` come from ``topk`` and enter as boolean multiplies, so
gradients flow through the kept entries only and the masks are constants. The training text is WikiText-2
*validation*, Python's pydoc topics or a user file, never the test split the evaluator reports
(dipdeploy/finetune/data.py).

The objective (``LoraConfig.objective``): ``lm`` is the Trainer's own next-token cross-entropy; ``distill``
passes :class:`dipdeploy.finetune.distill.DistillLoss` as the Trainer's ``compute_loss_func`` (KL to the
dense base model, computed on the fly from the same weights with the adapter off), so checkpoints,
resume and data parallelism stay the Trainer's.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dipdeploy.finetune.adapter import (dense_paths, fingerprint, keep_base_norms, norm_modules, target_modules,
                                       write_metadata)
from dipdeploy.finetune.config import LoraConfig
from dipdeploy.finetune.data import training_windows
from dipdeploy.finetune.distill import DistillLoss
from dipdeploy.finetune.launch import ProcessInfo
from dipdeploy.paths import atomic_dir, check_output
from dipdeploy.sparsity.methods import reset_caches, sparsify_, unsparsify_
from dipdeploy.sparsity.plan import SparsityPlan
from dipdeploy.torchdevice import device_of


@dataclass
class FinetuneResult:
    out_dir: Path
    steps: int
    train_tokens: int
    wall_s: float
    first_loss: float | None
    last_loss: float | None
    log_history: list = field(default_factory=list)


class WindowDataset(torch.utils.data.Dataset):
    """Fixed-length token windows; labels are the inputs (the model shifts them)."""

    def __init__(self, windows: torch.Tensor):
        self.windows = windows

    def __len__(self) -> int:
        return self.windows.shape[0]

    def __getitem__(self, i: int) -> dict:
        w = self.windows[i]
        return {"input_ids": w, "labels": w.clone()}


def checkpoint_dir(out_dir: str | Path) -> Path:
    """Checkpoints live beside the adapter (``<out>.checkpoints``) until training finishes."""
    out = Path(out_dir)
    return out.with_name(out.name + ".checkpoints")


def _trainer_class():
    from transformers import Trainer

    class SparseTrainer(Trainer):
        """Trainer whose saves/loads see plain module paths and whose DIP-CA caches start cold per batch."""

        hf_model: torch.nn.Module  # the HF causal LM inside the PeftModel (where the SparseMLPs live)
        norm_lr_scale: float = 1.0  # LoraConfig.norm_lr_scale

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            reset_caches(self.hf_model)
            if getattr(self.compute_loss_func, "hidden_weight", 0):  # DistillLoss's hidden term needs the student's
                inputs = {**inputs, "output_hidden_states": True}
            if getattr(self.compute_loss_func, "taps", None):  # ... its MLP term, each layer's input and output
                self.compute_loss_func.taps.attach(self.hf_model)
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

        def create_optimizer(self):
            """The Trainer's optimizer, with the trained norms (peft ``modules_to_save`` copies) in groups of
            their own at ``norm_lr_scale`` × the learning rate, split once, when the Trainer builds it (a later
            call returns the same optimizer); the scheduler then scales each group alike."""
            fresh = self.optimizer is None
            opt = super().create_optimizer()
            norms = {id(p) for n, p in self.model.named_parameters() if ".modules_to_save." in n}
            if fresh and norms and self.norm_lr_scale != 1.0:
                groups = []
                for g in opt.param_groups:
                    rest = {k: v for k, v in g.items() if k != "params"}
                    for mine, lr in ((False, g["lr"]), (True, g["lr"] * self.norm_lr_scale)):
                        params = [p for p in g["params"] if (id(p) in norms) == mine]
                        if params:
                            groups.append({**rest, "params": params, "lr": lr})
                opt.param_groups.clear()
                for g in groups:
                    opt.add_param_group(g)
            return opt

        def _save(self, output_dir=None, state_dict=None):
            with dense_paths(self.hf_model):
                super()._save(output_dir, state_dict=None)  # recomputed from the unwrapped paths

        def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
            with dense_paths(self.hf_model):
                super()._load_from_checkpoint(resume_from_checkpoint, model)

    return SparseTrainer


def _training_args(cfg: LoraConfig, ckpt: Path, progress: bool, device: str | None):
    """``device`` cpu or cuda (``dipdeploy.torchdevice``, one process), or None: the launcher's and the
    Trainer's own choice (a GPU wherever torch sees one; ``accelerate launch`` gives each process its own)."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(ckpt), max_steps=cfg.total_steps(ProcessInfo.from_env().world_size),
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum, learning_rate=cfg.lr, lr_scheduler_type=cfg.scheduler,
        warmup_steps=cfg.warmup_steps, weight_decay=cfg.weight_decay, logging_steps=cfg.logging_steps,
        logging_first_step=True, save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=2,
        seed=cfg.seed, data_seed=cfg.seed, report_to=[], remove_unused_columns=False,
        dataloader_num_workers=0, disable_tqdm=not progress, bf16=cfg.bf16,
        use_cpu=_train_device(device).type == "cpu",
        ddp_find_unused_parameters=False,
    )


def _train_device(device: str | None) -> torch.device:
    """Where the Trainer puts the model (see :func:`_training_args`): the CPU, or this process's GPU
    (``LOCAL_RANK``, which the launchers set). The model moves there before ``dense-samples`` are drawn,
    so the teacher samples on the GPU too."""
    if device == "cpu" or (device is None and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def _prepare_checkpoints(out: Path, resume: bool, force: bool) -> Path:
    ckpt = checkpoint_dir(out)
    if ckpt.exists() and not resume:
        if not force:
            raise FileExistsError(
                f"{ckpt} holds checkpoints of an earlier run; pass --resume to continue it or --force to start over"
            )
        shutil.rmtree(ckpt, ignore_errors=True)  # every process of a launch removes it: a race, not an error
    return ckpt


def finetune(lm, plan: SparsityPlan, cfg: LoraConfig, out_dir: str | Path, *, data_dir: str | Path | None = None,
             resume: bool = False, force: bool = False, progress: bool = True, keep_checkpoints: bool = False,
             callbacks: tuple = (), device: str | None = None) -> FinetuneResult:
    """Train LoRA adapters on ``lm`` with ``plan``'s masks active; write the adapter to ``out_dir``.

    ``resume`` continues from the newest checkpoint in ``<out_dir>.checkpoints`` (same cfg expected).
    ``out_dir`` is written atomically and never clobbered without ``force``. ``lm`` is left as it came
    (LoRA layers removed, MLPs unwrapped); apply the result with :func:`apply_lora`. ``callbacks`` are
    extra ``TrainerCallback`` objects (progress hooks, tests). ``device``: see :func:`_training_args`; the
    adapter is written from the CPU either way (safetensors), the same format.
    """
    import peft

    out = check_output(Path(out_dir), force, directory=True)
    ckpt = _prepare_checkpoints(out, resume, force)
    unsparsify_(lm.model)  # dense: ``dense-samples`` are the teacher's own text
    base_fp = fingerprint(lm.model)  # where the model came from, as apply_lora will check it
    home = device_of(lm.model)
    lm.model.to(_train_device(device))
    model = None
    try:
        data = WindowDataset(training_windows(lm, cfg, data_dir))
        peft_cfg = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.dropout, bias="none",
                                   target_modules=target_modules(lm.arch, cfg.targets), task_type="CAUSAL_LM",
                                   modules_to_save=norm_modules(lm.model) if "norms" in cfg.targets else None)
        torch.manual_seed(cfg.seed)  # LoRA A init
        model = peft.get_peft_model(lm.model, peft_cfg)
        hf = model.get_base_model()
        sparsify_(hf, plan)
        loss_func = DistillLoss(model, hf, cfg.hidden_weight, cfg.mlp_weight) if cfg.objective == "distill" else None
        trainer = _trainer_class()(model=model, args=_training_args(cfg, ckpt, progress, device), train_dataset=data,
                                   callbacks=list(callbacks), compute_loss_func=loss_func)
        trainer.hf_model, trainer.norm_lr_scale = hf, cfg.norm_lr_scale
        if not progress:  # the caller reports (dipdeploy/progress.py): no per-log dicts on stdout either
            from transformers.trainer_callback import PrinterCallback

            trainer.remove_callback(PrinterCallback)
        t0 = time.time()
        has_ckpt = resume and any(ckpt.glob("checkpoint-*"))
        trainer.train(resume_from_checkpoint=True if has_ckpt else None)
        wall = time.time() - t0
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        steps = trainer.state.global_step
        processes = trainer.args.world_size
        result = FinetuneResult(out, steps, steps * cfg.tokens_per_step * processes, round(wall, 1),
                                losses[0] if losses else None, losses[-1] if losses else None,
                                list(trainer.state.log_history))
        if trainer.args.should_save:
            train = {"steps": steps, "train_tokens": result.train_tokens, "processes": processes,
                     "wall_s": result.wall_s,
                     "first_loss": result.first_loss, "last_loss": result.last_loss,
                     "windows": len(data), "resumed": bool(has_ckpt),
                     "objective": cfg.objective, "text": cfg.text_file or cfg.data}
            with atomic_dir(out) as tmp, dense_paths(hf):
                model.save_pretrained(tmp)
                write_metadata(tmp, lm, plan, cfg, train, base_fp)
            if not keep_checkpoints:
                shutil.rmtree(ckpt, ignore_errors=True)
    finally:  # the model goes home however training ended, the sampling of its windows included
        if model is None:
            lm.model.to(home)
        else:
            unsparsify_(model.get_base_model())
            keep_base_norms(model)
            lm.model = model.unload().to(home)
    return result
