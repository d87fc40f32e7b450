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

With ``hidden_weight`` the dense model's hidden state after every decoder layer is a second target
(:func:`hidden_match`): the logits' KL says only how wrong the last layer's output is, while every layer's
pruning error is visible in its own hidden state, so each layer's adapter gets a signal of its own.

With ``mlp_weight`` each layer's MLP output is matched to the dense MLP run on the *student's* own MLP
input (:func:`mlp_match`): a local target, what that layer's masks alone cost, free of the error the
earlier layers pass on. Neither extra term paid on SmolLM2 (the hidden states:
benchmarks/results/lora-smollm2.md; the MLP outputs, whose local error a rank-16 adapter barely moved:
benchmarks/results/distill-recipes-smollm2.md, docs/method.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dipdeploy.finetune.adapter import dense_paths
from dipdeploy.sparsity.methods import decoder_layers


@torch.no_grad()
def teacher_logits(peft_model, hf: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits of the dense base model: no adapter, no masks (``hf`` is the model inside ``peft_model``)."""
    return teacher_outputs(peft_model, hf, input_ids).logits


@torch.no_grad()
def teacher_outputs(peft_model, hf: torch.nn.Module, input_ids: torch.Tensor, hidden_states: bool = False):
    """The dense base model's outputs (logits, and with ``hidden_states`` every layer's hidden state)."""
    with peft_model.disable_adapter(), dense_paths(hf):
        return peft_model(input_ids=input_ids, output_hidden_states=hidden_states)


def hidden_match(student: tuple[torch.Tensor, ...], teacher: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Mean over decoder layers of ‖h_student − h_teacher‖² / ‖h_teacher‖², each layer's hidden state
    over the whole batch (HF ``hidden_states``: the embeddings first, which the adapter cannot change, so
    they are left out). Relative, so a family whose residual stream grows large (Gemma scales its
    embeddings by √d) weighs its layers as evenly as one whose stream stays small."""
    terms = [((s.float() - t.float()).pow(2).sum() / t.float().pow(2).sum().clamp_min(1e-12))
             for s, t in zip(student[1:], teacher[1:], strict=True)]
    return torch.stack(terms).mean()


class MlpTaps:
    """Each layer's (sparse MLP, its input, its output) in the student's last forward, by forward hooks. The
    hooks sit on the current SparseMLP wrappers, which the teacher's pass replaces (:func:`dense_paths`
    unwraps and wraps again), so :meth:`attach` runs before every student forward."""

    def __init__(self):
        self.seen: list[tuple[torch.nn.Module, torch.Tensor, torch.Tensor]] = []
        self._handles: list = []

    def _hook(self, module, args, output):
        self.seen.append((module, args[0], output))

    def attach(self, hf: torch.nn.Module) -> None:
        self.detach()
        self._handles = [layer.mlp.register_forward_hook(self._hook) for layer in decoder_layers(hf)]

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self.seen = [], []


def mlp_match(peft_model, seen: list[tuple[torch.nn.Module, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Mean over layers of ‖y − y_dense‖² / ‖y_dense‖², y the student's sparse MLP output (masks and
    adapter) and y_dense the base MLP's on the same input, dense and without the adapter (the SparseMLP's ``base``
    under peft ``disable_adapter``), over the whole batch; relative per layer as :func:`hidden_match`."""
    with torch.no_grad(), peft_model.disable_adapter():  # one toggle of every LoRA layer, not one per MLP
        targets = [mlp.base(x.detach()).float() for mlp, x, _ in seen]
    terms = [(y.float() - t).pow(2).sum() / t.pow(2).sum().clamp_min(1e-12) for (_, _, y), t in zip(seen, targets)]
    return torch.stack(terms).mean()


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
    same tokens. With ``hidden_weight`` the student's outputs must carry their hidden states (the trainer
    asks for them, :mod:`dipdeploy.finetune.train`); with ``mlp_weight`` the trainer attaches ``taps`` before
    each student forward. Each extra term, a mean over this batch, is scaled by its share of ``num_items``
    as the KL's sum is divided by it, so gradient accumulation weighs them alike."""

    def __init__(self, peft_model, hf: torch.nn.Module, hidden_weight: float = 0.0, mlp_weight: float = 0.0):
        self.peft_model = peft_model
        self.hf = hf
        self.hidden_weight = hidden_weight
        self.mlp_weight = mlp_weight
        self.taps = MlpTaps() if mlp_weight else None

    def __call__(self, outputs, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        local = mlp_match(self.peft_model, self.taps.seen) if self.taps else None  # before the teacher rewraps
        teacher = teacher_outputs(self.peft_model, self.hf, labels, hidden_states=bool(self.hidden_weight))
        loss = kl_to_teacher(outputs.logits, teacher.logits, num_items_in_batch)
        share = labels.shape[0] * (labels.shape[1] - 1) / num_items_in_batch if num_items_in_batch else 1.0
        if self.hidden_weight:
            loss = loss + self.hidden_weight * share * hidden_match(outputs.hidden_states, teacher.hidden_states)
        if local is not None:
            loss = loss + self.mlp_weight * share * local
        return loss
