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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
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


class WeightError(ValueError):
    """A checkpoint tensor the model its config.json describes cannot use: another shape (a table of
    another vocabulary, another width), or values that are not finite."""


def check_weight(where, name: str, value: torch.Tensor, shape=None) -> None:
    """Refuse (one line naming the tensor) a ``value`` of another shape than ``shape`` (the config's, from
    the model built on ``meta``) or holding NaN or Inf, before it reaches the quantiser or the bundle: a
    short table would be padded by nothing and read past by token ids, a NaN row would be written as is
    (fp32) and show only as wrong tokens."""
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise WeightError(f"{where}: tensor {name} has shape {list(value.shape)} but config.json's model needs "
                          f"{list(shape)}; the weights do not belong to this config.json: fix or download the "
                          f"checkpoint again")
    finite = torch.isfinite(value)
    if not bool(finite.all()):
        bad = int(finite.numel() - finite.sum())
        raise WeightError(f"{where}: tensor {name} holds {bad} NaN or Inf value{'s' if bad > 1 else ''}; fix the "
                          f"checkpoint (or the LoRA adapter merged into it) and export again")


def check_weights(model: torch.nn.Module, where) -> None:
    """:func:`check_weight` on every parameter of a model loaded whole (its shapes transformers checked)."""
    for name, param in model.named_parameters():
        if param.device.type != "meta":
            check_weight(where, name, param.detach())


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

    def shape_error(self, model: torch.nn.Module) -> WeightError | None:
        """The first parameter of ``model`` (built on ``meta`` from config.json) whose stored tensor has
        another shape, as :func:`check_weight` words it, read from the files' headers alone."""
        from safetensors import safe_open

        for name, param in model.named_parameters():
            if name not in self.files:
                continue
            with safe_open(str(self.directory / self.files[name]), framework="pt") as f:
                shape = f.get_slice(name).get_shape()
            if tuple(shape) != tuple(param.shape):
                try:
                    check_weight(self.directory, name, torch.empty(shape, device="meta"), param.shape)
                except WeightError as err:
                    return err
        return None

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
        """Give every parameter of ``module`` (named ``prefix`` + its path) its checkpoint values, each
        checked against the parameter's shape (the config's) and for NaN or Inf (:func:`check_weight`)."""
        for path, param in list(module.named_parameters()):
            if param.device.type == "meta":
                value = self._read(prefix + path)
                check_weight(self.directory, prefix + path, value, param.shape)
                self._replace(module, path, value)

    @classmethod
    def release(cls, *modules: torch.nn.Module) -> None:
        """Return the ``modules``' parameters to ``meta`` (their memory is freed), then the freed heap to
        the OS, once for all of them (:func:`return_freed_heap`)."""
        for module in modules:
            for path, param in list(module.named_parameters()):
                cls._replace(module, path, torch.empty_like(param, device="meta"))
        return_freed_heap()


#: Bytes of fp32 output dequantised at a time from a GGUF tensor. gguf's whole-tensor dequantisation keeps
#: every row group's result until it joins them, beside the output and the groups' temporaries, so the
#: model's largest matrices (the embedding, an untied lm_head) would cost several times their fp32 size
#: at once; GGUF blocks never span two rows, so a block of rows dequantises to the same values alone.
GGUF_BLOCK_BYTES = 16 << 20


@dataclass(frozen=True)
class GGUFTensor:
    """Where one tensor lies in a GGUF file and how it is stored: what reading it needs, without the
    reader (whose parsed metadata, the vocabulary and merges among it, is large and no longer needed)."""

    name: str  # the GGUF name (``blk.N.ffn_up.weight``)
    kind: int  # gguf.GGMLQuantizationType
    dtype: np.dtype  # of the stored array: uint8 blocks for quantised types, with the file's byte order
    shape: tuple[int, ...]  # of the stored array: rows first, then bytes (or values) per row
    offset: int  # from the start of the file

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize


class GGUFCheckpoint(StreamedCheckpoint):
    """A GGUF file read lazily, tensor by tensor: a tensor is read and dequantised only when its module is
    materialised, so a streamed export of a GGUF needs no fp32 copy of the model on disk (4 bytes per
    weight) nor in memory.

    The file's metadata is parsed once (``gguf.GGUFReader``) for the tensors' places, then dropped. A
    tensor is read with plain file reads, :data:`GGUF_BLOCK_BYTES` of output at a time, into the fp32
    array it becomes: only that array and one block are held, and no page of the file stays mapped into
    the process (a memory-mapped read would leave every page it touched counted in its resident memory
    for as long as the mapping lives).

    Names and values are transformers' own GGUF loading (``modeling_gguf_pytorch_utils``): its name map
    (``get_gguf_hf_weights_map``, GGUF ``blk.N.*`` → HF paths), gguf's dequantisation and its
    per-architecture tensor processor (Llama's q/k head permutation undone, Gemma's norm offset), applied
    to one tensor at a time, so each tensor is the one the eager load (and the cached fp32 copy) holds
    (``tests/test_loading.py``)."""

    def __init__(self, gguf: Path, model: torch.nn.Module):
        from gguf import GGUFReader
        from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                               get_gguf_hf_weights_map, read_field)

        self.directory = gguf
        self.lora = {}
        reader = GGUFReader(str(gguf))
        # The processors read HF-named config keys (num_attention_heads, …), which the model's config holds
        # with the values transformers parsed from this file's metadata: no second parse.
        self.parsed = {"config": model.config.to_dict()}
        architecture = read_field(reader, "general.architecture")[0]
        self.processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=self.parsed["config"])
        self.mapping = get_gguf_hf_weights_map(model, self.processor)
        self.by_hf = {self.mapping[t.name]: GGUFTensor(t.name, t.tensor_type, t.data.dtype, tuple(t.data.shape),
                                                       int(t.data_offset))
                      for t in reader.tensors if t.name in self.mapping}
        self.files = {name: gguf.name for name in self.by_hf}

    @property
    def types(self) -> dict[str, str]:
        """Each tensor's GGUF type by HF name (``model.layers.0.self_attn.v_proj.weight`` → ``Q6_K``): the
        precision the file stores it with (``quant.dense``)."""
        from gguf import GGMLQuantizationType

        return {name: GGMLQuantizationType(t.kind).name for name, t in self.by_hf.items()}

    def _tensor(self, name: str) -> torch.Tensor:
        t = self.by_hf[name]
        with open(self.directory, "rb", buffering=0) as f:
            weights = _dequantized(f, t)
        result = self.processor.process(weights=weights, name=t.name, tensor_key_mapping=self.mapping,
                                        parsed_parameters=self.parsed)
        out = np.ascontiguousarray(result.weights)
        return torch.from_numpy(out if out.flags.writeable else np.copy(out))


def _dequantized(f, t: GGUFTensor) -> np.ndarray:
    """Tensor ``t`` of the open file ``f`` in fp32, dequantised a block of rows at a time into one array."""
    from gguf import dequantize

    if len(t.shape) < 2:
        return dequantize(_read(f, t, 0, 1), t.kind)
    rows = t.shape[0]
    first = dequantize(_read(f, t, 0, 1), t.kind)
    step = max(1, GGUF_BLOCK_BYTES // max(1, first.nbytes))
    out = np.empty((rows, *first.shape[1:]), dtype=first.dtype)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        out[start:stop] = dequantize(_read(f, t, start, stop), t.kind)
    return out


def _read(f, t: GGUFTensor, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of ``t`` as stored, read from the file into a fresh array (all of a 1-D tensor
    when it has no rows to split)."""
    shape = (stop - start, *t.shape[1:]) if len(t.shape) > 1 else t.shape
    buf = np.empty(shape, dtype=t.dtype)
    view = memoryview(buf.reshape(-1).view(np.uint8))
    f.seek(t.offset + start * t.row_bytes)
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise OSError(f"{f.name}: the file ends inside tensor {t.name!r}; the GGUF is truncated")
        done += n
    return buf
