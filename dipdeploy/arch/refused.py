"""Architectures DIP does not prune, each with the reason said to the user.

DIP selects input columns of a gated MLP's up and gate matrices and columns of its down matrix
(docs/method.md); a plain two-matrix MLP has no GLU to rank, and a mixture of experts routes each
token to a few expert MLPs, which the Flash layout and the per-layer caches do not model.
"""

NOT_GLU = ("GPT2LMHeadModel", "GPTNeoXForCausalLM", "GPTJForCausalLM", "GPTBigCodeForCausalLM", "OPTForCausalLM",
           "BloomForCausalLM", "FalconForCausalLM", "PhiForCausalLM", "Starcoder2ForCausalLM")
MIXTURES = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "OlmoeForCausalLM",
            "PhimoeForCausalLM", "GraniteMoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")


def not_glu(name: str) -> str:
    return (f"{name} has no gated MLP (GLU): DIP prunes the inputs of a gated MLP's up/gate matrices and the "
            f"GLU units of its down matrix (docs/method.md); a two-matrix MLP has no GLU to rank: not supported")


def mixture(name: str) -> str:
    return f"{name} is a mixture of experts: not supported (DIP's Flash layout and caches model one dense MLP per layer)"
