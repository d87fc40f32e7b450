"""OLMo 2: a SwiGLU block that normalises sub-layer outputs only (no norm before attention or MLP) and
applies q/k RMSNorms over the whole projection (weight [H·Dh]), not per head."""

from dipdeploy.arch.record import Arch, AttnModules, NormModules

# genai_type: the bundle's graph is a plain decoder-only one, which onnxruntime-genai runs under "llama".
RECORD = Arch(name="Olmo2ForCausalLM", model_type="olmo2", genai_type="llama", qk_norm_span="projection",
              attn=AttnModules(q_norm="q_norm", k_norm="k_norm"),
              norms=NormModules(attn_in=None, mlp_in=None, attn_out="post_attention_layernorm",
                                mlp_out="post_feedforward_layernorm"))
