"""Streamed checkpoints: a model's weights read from disk one module at a time, for models larger than memory.

``loading.load_model(..., stream=True)`` builds the model on ``meta`` and hands it one of these: a safetensors
checkpoint (:class:`StreamedCheckpoint`) or a GGUF file (:class:`GGUFCheckpoint`). Export and calibration
materialise a decoder layer, use it and release it, so only that layer's weights are resident.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
from pathlib import Path

import torch


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def return_freed_heap() -> None:
    """Give the heap pages freed so far back to the OS (glibc's ``malloc_trim``; a no-op elsewhere).

    A streamed pass frees a decoder layer at a time, but glibc keeps freed heap chunks for reuse, and
    after the first large free it raises its mmap threshold (glibc's dynamic threshold), so a 7B model's
    k/v weights and activations come from the heap from then on. On the 32-layer Mistral-7B calibration
    the process's RSS grew layer after layer, with one layer resident at any time; this call keeps the
    whole export's peak near one layer's (benchmarks/results/scale.md has both runs)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


class StreamedCheckpoint:
    """A safetensors checkpoint read one module at a time, for models larger than memory.

    ``load_model(..., stream=True)`` builds the model on the ``meta`` device (shapes, no storage);
    :meth:`materialise` reads one module's tensors from the checkpoint files (memory-mapped) as fp32
    parameters and :meth:`release` returns them to ``meta``, so an export holds one decoder layer at a
    time: peak memory ≈ one fp32 layer plus the embedding, not the whole model (a 7B model in fp32
    is several times a laptop's memory). Tensor names are the checkpoint's, which are the HF module paths. A LoRA adapter
    put in :attr:`lora` (``dipdeploy.export.prepare.stream_lora``) is merged into each weight as it is
    read, so ``export --stream --lora`` never holds more than the layer it merges.
    """

    def __init__(self, directory: Path):
        from safetensors import safe_open

        index = directory / "model.safetensors.index.json"
        if index.is_file():
            files = json.loads(index.read_text())["weight_map"]
        elif (directory / "model.safetensors").is_file():
            with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
                files = {k: "model.safetensors" for k in f.keys()}
        else:
            raise FileNotFoundError(
                f"{directory}: no model.safetensors(.index.json); streaming reads safetensors checkpoints "
                f"(convert others with save_pretrained, or export without --stream)")
        self.directory = directory
        self.files = files
        #: weight name → (A [r, in], B [out, r], scaling): a LoRA adapter merged as each weight is read
        self.lora: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}

    def has(self, name: str) -> bool:
        return name in self.files

    def _tensor(self, name: str) -> torch.Tensor:
        """One tensor as stored (any dtype), read from its shard alone."""
        from safetensors import safe_open

        with safe_open(str(self.directory / self.files[name]), framework="pt") as f:
            return f.get_tensor(name)

    def _read(self, name: str) -> torch.Tensor:
        if not self.has(name):
            raise KeyError(f"{self.directory}: tensor {name!r} is not in the checkpoint")
        value = self._tensor(name).to(torch.float32)
        if name in self.lora:  # W + (B·A)·scaling, as peft's merge_and_unload computes it in fp32
            a, b, scaling = self.lora[name]
            value += (b @ a) * scaling
        return value

    @staticmethod
    def _replace(module: torch.nn.Module, path: str, value: torch.Tensor) -> None:
        owner, _, leaf = path.rpartition(".")
        sub = module.get_submodule(owner) if owner else module
        setattr(sub, leaf, torch.nn.Parameter(value, requires_grad=False))

    def materialise(self, module: torch.nn.Module, prefix: str) -> None:
        """Give every parameter of ``module`` (named ``prefix`` + its path) its checkpoint values."""
        for path, param in list(module.named_parameters()):
            if param.device.type == "meta":
                self._replace(module, path, self._read(prefix + path))

    @classmethod
    def release(cls, *modules: torch.nn.Module) -> None:
        """Return the ``modules``' parameters to ``meta`` (their memory is freed), then the freed heap to
        the OS, once for all of them (:func:`return_freed_heap`)."""
        for module in modules:
            for path, param in list(module.named_parameters()):
                cls._replace(module, path, torch.empty_like(param, device="meta"))
        return_freed_heap()


class GGUFCheckpoint(StreamedCheckpoint):
    """A GGUF file read lazily, tensor by tensor: the file is memory-mapped (``gguf.GGUFReader``) and a
    tensor is dequantised only when its module is materialised, so a streamed export of a GGUF needs
    no fp32 copy of the model on disk (4 bytes per weight) nor in memory.

    Names and values are transformers' own GGUF loading (``modeling_gguf_pytorch_utils``): its name map
    (``get_gguf_hf_weights_map``, GGUF ``blk.N.*`` → HF paths) and its per-architecture tensor processor
    (Llama's q/k head permutation undone, Gemma's norm offset), applied to one tensor at a time, so each
    tensor is the one the eager load (and the cached fp32 copy) holds (``tests/test_loading.py``)."""

    def __init__(self, gguf: Path, model: torch.nn.Module):
        from gguf import GGUFReader
        from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                               get_gguf_hf_weights_map, read_field)

        self.directory = gguf
        self.lora = {}
        self.reader = GGUFReader(str(gguf))
        # The processors read HF-named config keys (num_attention_heads, …), which the model's config holds
        # with the values transformers parsed from this file's metadata: no second parse.
        self.parsed = {"config": model.config.to_dict()}
        architecture = read_field(self.reader, "general.architecture")[0]
        self.processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=self.parsed["config"])
        self.mapping = get_gguf_hf_weights_map(model, self.processor)
        self.by_hf = {self.mapping[t.name]: t for t in self.reader.tensors if t.name in self.mapping}
        self.files = {name: gguf.name for name in self.by_hf}

    def _tensor(self, name: str) -> torch.Tensor:
        import numpy as np
        from gguf import dequantize

        t = self.by_hf[name]
        weights = dequantize(t.data, t.tensor_type)
        result = self.processor.process(weights=weights, name=t.name, tensor_key_mapping=self.mapping,
                                        parsed_parameters=self.parsed)
        return torch.from_numpy(np.copy(result.weights))
