"""Qwen2 / Qwen2.5: Llama's block with a bias on q, k and v."""

from dipdeploy.arch.record import Arch

RECORD = Arch(name="Qwen2ForCausalLM", model_type="qwen2", genai_type="qwen2", qkv_bias=True,
              tokenizer_note="byte-level BPE; chat models end turns with <|im_end|>")
