"""SmolLM3: Llama's block where every fourth layer uses no RoPE (``config.no_rope_layers[i] == 0``, NoPE),
and sliding-window layers only when ``use_sliding_window`` is on."""

from dipdeploy.arch.record import Arch

# genai_type: the bundle's graph is a plain decoder-only one (NoPE is inside it), which onnxruntime-genai
# runs under its generic "llama" type.
RECORD = Arch(name="SmolLM3ForCausalLM", model_type="smollm3", genai_type="llama", nope_layers=True,
              sliding_window="config")
