"""Phi-3: Llama's block with q/k/v fused into ``qkv_proj`` and gate/up into ``gate_up_proj``
(``gate, up = gate_up_proj(x).chunk(2, dim=-1)``)."""

from dipdeploy.arch.record import Arch, AttnModules, MlpModules

RECORD = Arch(name="Phi3ForCausalLM", model_type="phi3", genai_type="phi3",
              mlp=MlpModules(gate_up="gate_up_proj"), attn=AttnModules(qkv="qkv_proj"))
