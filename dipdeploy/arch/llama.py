"""Llama (1, 2, 3.x; SmolLM2): the reference block. RMSNorm → GQA attention with RoPE → residual →
RMSNorm → SwiGLU → residual. Llama 3.x's ``rope_type: llama3`` frequency scaling is read from
``rope_parameters`` by the model's own rotary module, which the export samples (rope="config")."""

from dipdeploy.arch.record import Arch

RECORD = Arch(name="LlamaForCausalLM", model_type="llama", genai_type="llama")
