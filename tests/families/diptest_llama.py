"""A family added the way the recipe says (docs/contributing/family.md),
from outside the package: a Llama under a made-up HF class name, with its own record and its own tiny
registry model (``tiny-diptest.toml`` beside this file). ``tests/conftest.py`` registers it before
collection, so every test parametrised over the registry's tiny models runs it without being edited.
"""

from dipdeploy.arch import Arch

RECORD = Arch(name="DipTestLlamaForCausalLM", model_type="diptest_llama", genai_type="llama")


def register_hf() -> None:
    """The HF side of a new class: a config with its own model_type, and the causal-LM class for it
    (what a checkpoint with ``trust_remote_code`` or a new transformers release would provide)."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    class DipTestLlamaConfig(LlamaConfig):
        model_type = "diptest_llama"

    class DipTestLlamaForCausalLM(LlamaForCausalLM):
        config_class = DipTestLlamaConfig

    AutoConfig.register("diptest_llama", DipTestLlamaConfig)
    AutoModelForCausalLM.register(DipTestLlamaConfig, DipTestLlamaForCausalLM)
