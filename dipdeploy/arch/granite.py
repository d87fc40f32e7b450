"""Granite (3.x dense): Llama's block with four multipliers from the config: the embedding
(embedding_multiplier), each sub-layer's output before its residual add (residual_multiplier), the
attention scores instead of Dh^-½ (attention_multiplier), and the logits divided by logits_scaling."""

from dipdeploy.arch.record import Arch

RECORD = Arch(name="GraniteForCausalLM", model_type="granite", genai_type="granite", embedding_scale="config",
              multipliers=True)
