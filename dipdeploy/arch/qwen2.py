"""Qwen2 / Qwen2.5: Llama's block with a bias on q, k and v; sliding-window layers where the config's
layer_types say so (use_sliding_window, off in the released checkpoints)."""

from dipdeploy.arch.record import Arch

RECORD = Arch(name="Qwen2ForCausalLM", model_type="qwen2", genai_type="qwen2", qkv_bias=True, sliding_window="layer_types",
              tokenizer_note="byte-level BPE; chat models end turns with <|im_end|>")
