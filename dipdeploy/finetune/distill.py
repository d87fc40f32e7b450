"""The distillation objective: the student (base + LoRA, the plan's masks active) learns the dense base
model's next-token distribution, KL(dense ‖ student) at temperature 1.

Why not next-token cross-entropy: trained on WikiText with the LM loss, the adapter mostly learns WikiText
(the dense model given the same training gains more than the pruned one recovers;
benchmarks/results/lora-smollm2.md). The dense model is the target DIP approximates, so matching its
output distribution repairs the pruning error only, on any text; on text the dense model itself models
well, the teacher carries the information a one-hot label throws away.

The teacher is the student's own base weights run dense with the adapter switched off (peft
``disable_adapter``, the SparseMLP wrappers lifted by :func:`dense_paths`): no second copy of the model in
memory, and by construction exactly the base model the adapter will later be merged into.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dipdeploy.finetune.adapter import dense_paths


@torch.no_grad()
def teacher_logits(peft_model, hf: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits of the dense base model: no adapter, no masks (``hf`` is the model inside ``peft_model``)."""
    with peft_model.disable_adapter(), dense_paths(hf):
        return peft_model(input_ids=input_ids).logits


def kl_to_teacher(student: torch.Tensor, teacher: torch.Tensor, num_items: int | torch.Tensor | None = None) -> torch.Tensor:
    """Σ KL(teacher ‖ student) over the positions that predict a next token (all but the last), divided by
    ``num_items`` (the Trainer's count of predicted tokens, which makes gradient accumulation and
    data-parallel processes average per token, as its LM loss does) or by their number."""
    s = F.log_softmax(student[:, :-1].float(), dim=-1)
    t = F.log_softmax(teacher[:, :-1].float(), dim=-1)
    total = (t.exp() * (t - s)).sum()
    return total / (num_items if num_items is not None else s.shape[0] * s.shape[1])


class DistillLoss:
    """The Trainer's ``compute_loss_func``: it receives the student's outputs and the labels, which are the
    input windows themselves (:class:`dipdeploy.finetune.train.WindowDataset`), so the teacher reads the
    same tokens."""

    def __init__(self, peft_model, hf: torch.nn.Module):
        self.peft_model = peft_model
        self.hf = hf

    def __call__(self, outputs, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        teacher = teacher_logits(self.peft_model, self.hf, labels)
        return kl_to_teacher(outputs.logits, teacher, num_items_in_batch)
