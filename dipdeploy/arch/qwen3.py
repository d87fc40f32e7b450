"""Qwen3 (dense): Llama's block with an explicit head_dim (128 for every size, ≠ d / heads) and an
RMSNorm over each head of q and k before RoPE (``q_norm``/``k_norm``, weight [Dh]); sliding-window
layers where the config's layer_types say so, as Qwen2."""

from dipdeploy.arch.record import Arch, AttnModules

RECORD = Arch(name="Qwen3ForCausalLM", model_type="qwen3", genai_type="qwen3", head_dim_rule="config", sliding_window="layer_types",
              attn=AttnModules(q_norm="q_norm", k_norm="k_norm"),
              tokenizer_note="byte-level BPE; chat models end turns with <|im_end|>")
