"""LoRA recovery (floor 3): train adapters with the DIP masks active, then merge them before export.

    finetune(lm, plan, LoraConfig(...), out_dir)   → a peft adapter + the plan it was trained for
    apply_lora(lm, adapter_dir, merge=True)         → the base with W + (α/r)·B·A (what export uses)
"""

from dipdeploy.finetune.adapter import adapter_plan, apply_lora, read_metadata
from dipdeploy.finetune.config import LoraConfig
from dipdeploy.finetune.train import FinetuneResult, finetune

__all__ = ["LoraConfig", "FinetuneResult", "finetune", "apply_lora", "adapter_plan", "read_metadata"]
