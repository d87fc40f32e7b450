"""LoRA recovery (floor 4): train adapters with the DIP masks active, then merge them before export.

Objectives (``LoraConfig.objective``): ``lm``, next-token cross-entropy; ``distill``, KL to the dense base
model (``distill.py``) on text that is not WikiText (``data.py``), so that the gain measured on WikiText
is recovery from pruning, not adaptation to the evaluation corpus.

    finetune(lm, plan, LoraConfig(...), out_dir)   → a peft adapter + the plan it was trained for
    apply_lora(lm, adapter_dir, merge=True)         → the base with W + (α/r)·B·A (what export uses)

``LoraConfig`` imports without torch (the CLI reads its defaults for ``--help``); the torch parts load on
first use.
"""

from importlib import import_module

from dipdeploy.finetune.config import LoraConfig

_LAZY = {"adapter_plan": "adapter", "apply_lora": "adapter", "read_metadata": "adapter",
         "FinetuneResult": "train", "finetune": "train"}

__all__ = ["LoraConfig", "FinetuneResult", "finetune", "apply_lora", "adapter_plan", "read_metadata"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"dipdeploy.finetune.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'dipdeploy.finetune' has no attribute {name!r}")
