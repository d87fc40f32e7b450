"""OLMo 2: a SwiGLU block that normalises sub-layer outputs only (no norm before attention or MLP) and
applies q/k RMSNorms over the whole projection (weight [H·Dh]), not per head."""

from dipdeploy.arch.record import Arch, AttnModules, NormModules

RECORD = Arch(name="Olmo2ForCausalLM", model_type="olmo2",
              attn=AttnModules(q_norm="q_norm", k_norm="k_norm"),
              norms=NormModules(attn_in=None, mlp_in=None, attn_out="post_attention_layernorm",
                                mlp_out="post_feedforward_layernorm"),
              export_refusal="OLMo2's q/k norms span the whole projection; the export builds per-head q/k norms "
                             "only (evaluate it in torch with `dipdeploy eval`)")
