"""Gemma (1): a GeGLU MLP (tanh-approximated GELU), the embedding scaled by √d, RMSNorms that scale by
(1 + w), an explicit head_dim (256 in the released sizes) and a tied head; otherwise Llama's block."""

from dipdeploy.arch.record import Arch

RECORD = Arch(name="GemmaForCausalLM", model_type="gemma", genai_type="gemma", activation="gelu_tanh",
              head_dim_rule="config", norm_offset=1.0, embedding_scale="sqrt_hidden", tied_head_default=True,
              tokenizer_note="SentencePiece-derived; prompts start with <bos>, which Gemma needs")
