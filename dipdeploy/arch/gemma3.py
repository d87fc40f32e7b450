"""Gemma 3 (text): a GeGLU MLP (tanh-approximated GELU), the embedding scaled by √d, RMSNorms that
scale by (1 + w), sandwich norms (a norm on each sub-layer's output before its residual add), per-head
q/k norms, an explicit head_dim, the attention scaled by query_pre_attn_scalar^-½, and two kinds of
layer (``config.layer_types``): sliding-window layers with their own RoPE base and full layers."""

from dipdeploy.arch.record import Arch, AttnModules, NormModules

RECORD = Arch(name="Gemma3ForCausalLM", model_type="gemma3_text", genai_type="gemma3_text", activation="gelu_tanh",
              head_dim_rule="config", norm_offset=1.0, embedding_scale="sqrt_hidden", softcapping=True,
              rope="per_layer_type", sliding_window="layer_types", tied_head_default=True,
              attn=AttnModules(q_norm="q_norm", k_norm="k_norm"),
              norms=NormModules(attn_in="input_layernorm", attn_out="post_attention_layernorm",
                                mlp_in="pre_feedforward_layernorm", mlp_out="post_feedforward_layernorm"),
              tokenizer_note="SentencePiece-derived; prompts start with <bos>, which Gemma needs")
