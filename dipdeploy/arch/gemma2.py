"""Gemma 2: Gemma's block (GeGLU with tanh GELU, the embedding scaled by √d, (1 + w) RMSNorms, an explicit
head_dim, a tied head) plus sandwich norms, the attention scaled by query_pre_attn_scalar^-½, sliding-window
and global layers alternating (``config.layer_types``, one RoPE base for both), and tanh soft-capping of
the attention scores (``attn_logit_softcapping``) and of the final logits (``final_logit_softcapping``)."""

from dipdeploy.arch.record import Arch, NormModules

RECORD = Arch(name="Gemma2ForCausalLM", model_type="gemma2", genai_type="gemma2", activation="gelu_tanh",
              head_dim_rule="config", norm_offset=1.0, embedding_scale="sqrt_hidden", softcapping=True,
              sliding_window="layer_types", tied_head_default=True,
              norms=NormModules(attn_in="input_layernorm", attn_out="post_attention_layernorm",
                                mlp_in="pre_feedforward_layernorm", mlp_out="post_feedforward_layernorm"),
              tokenizer_note="SentencePiece-derived; prompts start with <bos>, which Gemma needs")
