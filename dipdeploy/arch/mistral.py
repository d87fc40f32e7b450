"""Mistral: Llama's block with an optional sliding window on every layer (``config.sliding_window``)."""

from dipdeploy.arch.record import Arch

RECORD = Arch(name="MistralForCausalLM", model_type="mistral", genai_type="mistral", sliding_window="all")
