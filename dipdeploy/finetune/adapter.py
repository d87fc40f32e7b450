"""The LoRA adapter as a file interface: which modules it targets, what it was trained for, and
:func:`apply_lora`, which `eval --lora` and `export --lora` call.

An adapter directory is a standard peft adapter (``adapter_config.json``, ``adapter_model.safetensors``;
``peft.PeftModel.from_pretrained`` loads it onto the plain base model) plus two files of ours:

- ``plan.json`` — the :class:`SparsityPlan` whose masks were active while it trained. The adapter
  learnt to repair *that* plan's error, so applying it under another plan is refused unless asked for.
- ``dipdeploy-lora.json`` — type, version, the base model's name, shape and a weight fingerprint, the
  :class:`LoraConfig` and the training figures, so a mismatched base is a clear error, not silent noise.

Module paths: the adapter is always saved from the *unwrapped* model (``layers.i.mlp.up_proj``), never
through the ``SparseMLP`` wrapper (``layers.i.mlp.base.up_proj``), so its keys fit the plain HF model.
:func:`dense_paths` is the context that unwraps and re-wraps around a save or a load.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from dipdeploy.arch import Arch, arch_of_model
from dipdeploy.finetune.config import PROJECTIONS, LoraConfig
from dipdeploy.sparsity.methods import SparseMLP, decoder_layers, sparse_mlps, sparsify_, unsparsify_
from dipdeploy.sparsity.plan import SparsityPlan

ADAPTER_VERSION = 1
META_NAME = "dipdeploy-lora.json"
PLAN_NAME = "plan.json"
_FINGERPRINT_RTOL = 1e-4

def target_modules(arch: Arch, targets: tuple[str, ...]) -> list[str]:
    """peft ``target_modules`` for the roles in ``targets``, by the family record's module names. With
    Phi-3's fused ``gate_up_proj``, up and gate share one matrix, so asking for either adapts both (said
    here rather than silently)."""
    return sorted({name for t in targets if t in PROJECTIONS for name in arch.lora_modules(t)})


def norm_modules(model: torch.nn.Module) -> list[str]:
    """peft ``modules_to_save`` for ``targets`` with ``norms``: every decoder layer's norms of the family
    record (before and, for Gemma's sandwich, after each sub-layer) and the final norm, by full path
    under the causal LM, because peft matches these names as suffixes of module paths (the bare name
    ``norm`` would also match ``input_layernorm``). Gemma 3's q/k norms are not among them: they shape
    the attention, not the MLP input DIP scores."""
    n = arch_of_model(model).norms
    per_layer = [name for name in (n.attn_in, n.mlp_in, n.attn_out, n.mlp_out) if name]
    layers = range(len(decoder_layers(model)))  # model.model.layers
    return [f"model.layers.{i}.{name}" for i in layers for name in per_layer] + [f"model.{n.final}"]


def keep_base_norms(peft_model: torch.nn.Module) -> None:
    """Make a later ``unload()`` give back the base model's own norms: peft's unload keeps a
    ``modules_to_save`` module's trained copy, while ``finetune`` must leave the model as it came."""
    from peft.utils import ModulesToSaveWrapper

    for module in peft_model.modules():
        if isinstance(module, ModulesToSaveWrapper):
            module.set_adapter([])


def _raw_weight(module: torch.nn.Module) -> torch.Tensor:
    return getattr(module, "base_layer", module).weight


def fingerprint(model: torch.nn.Module) -> dict:
    """A few numbers that identify the base weights (mean |w| of the first and last down projection):
    cheap, dtype-robust, and different for a different checkpoint of the same shape."""
    layers = decoder_layers(model)
    out = {}
    for i in (0, len(layers) - 1):
        mlp = layers[i].mlp
        mlp = mlp.base if isinstance(mlp, SparseMLP) else mlp
        down = getattr(mlp, arch_of_model(model).mlp.down)
        out[f"layers.{i}.down_proj.mean_abs"] = float(_raw_weight(down).detach().float().abs().mean())
    return out


def model_shape(model: torch.nn.Module) -> dict:
    c = model.config
    return {"architecture": (getattr(c, "architectures", None) or [type(model).__name__])[0],
            "num_hidden_layers": c.num_hidden_layers, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "vocab_size": c.vocab_size}


@contextmanager
def dense_paths(model: torch.nn.Module):
    """Unwrap the SparseMLPs for the duration of the block (a save or a load), then wrap them again
    with the same plan, so adapter keys never contain the wrapper's ``.base``."""
    mlps = sparse_mlps(model)
    plan = mlps[0].plan if mlps else None
    unsparsify_(model)
    try:
        yield model
    finally:
        if plan is not None:
            sparsify_(model, plan)


def write_metadata(out: Path, lm, plan: SparsityPlan, cfg: LoraConfig, train: dict, base_fp: dict) -> None:
    meta = {"type": "DipLoraAdapter", "version": ADAPTER_VERSION, "model": lm.name, "mlp_layout": lm.mlp_layout,
            "shape": model_shape(lm.model), "fingerprint": base_fp, "plan_file": PLAN_NAME,
            "lora": cfg.to_dict(), "train": train}
    (out / META_NAME).write_text(json.dumps(meta, indent=1))
    plan.save(out / PLAN_NAME, force=True)


def read_metadata(adapter_dir: str | Path) -> dict:
    d = Path(adapter_dir)
    path = d / META_NAME
    if not (d / "adapter_config.json").is_file() or not path.is_file():
        raise FileNotFoundError(
            f"{d} is not a dipdeploy LoRA adapter (needs adapter_config.json and {META_NAME}); "
            f"train one with `dipdeploy finetune --out {d}`"
        )
    meta = json.loads(path.read_text())
    if meta.get("type") != "DipLoraAdapter" or meta.get("version") != ADAPTER_VERSION:
        raise ValueError(
            f"{path}: type {meta.get('type')!r} version {meta.get('version')!r} is not supported "
            f"(this dipdeploy reads DipLoraAdapter version {ADAPTER_VERSION}); retrain with `dipdeploy finetune`"
        )
    return meta


def adapter_plan(adapter_dir: str | Path) -> SparsityPlan:
    """The plan the adapter was trained under (what `eval --lora` should use when given no --plan)."""
    read_metadata(adapter_dir)
    return SparsityPlan.load(Path(adapter_dir) / PLAN_NAME)


def check_base(meta: dict, lm, where: str) -> None:
    """Raise ValueError when ``lm`` is not the model the adapter was trained on."""
    shape = model_shape(lm.model)
    if meta["shape"] != shape or meta.get("mlp_layout") != lm.mlp_layout:
        diff = {k: (meta["shape"].get(k), v) for k, v in shape.items() if meta["shape"].get(k) != v}
        raise ValueError(
            f"LoRA adapter {where} was trained on {meta['model']!r} but the model is {lm.name!r}; "
            f"shapes differ (adapter, model): {diff or {'mlp_layout': (meta.get('mlp_layout'), lm.mlp_layout)}}"
        )
    fp = fingerprint(lm.model)
    for k, want in meta["fingerprint"].items():
        got = fp.get(k)
        if got is None or abs(got - want) > _FINGERPRINT_RTOL * max(abs(want), 1e-12):
            raise ValueError(
                f"LoRA adapter {where} was trained on {meta['model']!r}, whose weights differ from "
                f"{lm.name!r} ({k}: {want:.6g} vs {got}); same shape, different checkpoint. Load the base it was "
                f"trained on (apply LoRA before quantising), or retrain with `dipdeploy finetune --model {lm.name}`"
            )


def check_plan(trained: SparsityPlan, plan: SparsityPlan, where: str) -> None:
    """Raise ValueError when ``plan`` selects differently from the plan the adapter was trained under."""
    mine = (plan.method, [(lp.k_in, lp.k_glu) for lp in plan.layers], plan.score)
    theirs = (trained.method, [(lp.k_in, lp.k_glu) for lp in trained.layers], trained.score)
    if mine != theirs:
        raise ValueError(
            f"LoRA adapter {where} was trained under {trained.method} at density {trained.density:.4f} "
            f"(score {trained.score}), but the plan is {plan.method} at density {plan.density:.4f} "
            f"(score {plan.score}) with different per-layer K; use the adapter's own plan "
            f"({Path(where) / PLAN_NAME}), retrain with this plan (`dipdeploy finetune --plan`), "
            f"or pass allow_other_plan=True to apply it anyway"
        )


def apply_lora(lm, adapter_dir: str | Path, merge: bool, plan: SparsityPlan | None = None,
               allow_other_plan: bool = False):
    """Load the peft adapter in ``adapter_dir`` onto ``lm`` and return a new LoadedModel.

    ``merge=True``: ``W ← W + (α/r)·B·A`` (peft ``merge_and_unload``), a plain HF model again; this is
    what export does before quantisation, so inference pays nothing. ``merge=False``: the HF model with
    live LoRA layers (the adapter-applied reference). Either way ``lm.model`` stays an HF causal LM that
    ``sparsify_`` and the evaluator accept. Apply LoRA before quantising: the fingerprint check refuses
    weights that differ from the base the adapter was trained on.

    ``plan``: the plan it will run under; refused if it differs from the training plan, unless
    ``allow_other_plan``. Raises ValueError (mismatch) or FileNotFoundError (not an adapter).
    """
    from peft import PeftModel

    where = str(adapter_dir)
    meta = read_metadata(adapter_dir)
    check_base(meta, lm, where)
    if plan is not None and not allow_other_plan:
        check_plan(adapter_plan(adapter_dir), plan, where)
    with dense_paths(lm.model) as model:
        try:
            peft_model = PeftModel.from_pretrained(model, where, is_trainable=False)
        except RuntimeError as err:  # size mismatches surface here
            raise ValueError(f"LoRA adapter {where} does not fit {lm.name!r}: {err}") from err
        new = peft_model.merge_and_unload() if merge else peft_model.get_base_model()
    new.eval()
    return replace(lm, model=new)
