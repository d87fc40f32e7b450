"""A streamed GGUF's tensors (``dipdeploy.checkpoint.GGUFCheckpoint``) are read a block of rows at a time
with plain file reads: the values are gguf's whole-tensor dequantisation bit for bit, the transient memory
is about the output alone (not the output plus every row group's result), and neither the file's pages
nor its parsed metadata stay with the process."""

import gc
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

import dipdeploy.checkpoint as checkpoint
from dipdeploy.checkpoint import GGUFTensor, _dequantized


def _write(path: Path, tensors: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType]]) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (a, kind) in tensors.items():
        if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(name, a.astype(np.float32 if kind == gguf.GGMLQuantizationType.F32 else np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _stored(path: Path) -> dict[str, tuple[GGUFTensor, np.ndarray]]:
    """Each tensor's place, and gguf's own dequantisation of the whole tensor (the reference)."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: (GGUFTensor(t.name, t.tensor_type, t.data.dtype, tuple(t.data.shape), int(t.data_offset)),
                     np.array(gguf.dequantize(t.data, t.tensor_type))) for t in reader.tensors}


def test_gguf_rows_read_in_blocks_are_the_whole_tensor_dequantised(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    Q8, F16, F32 = (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32)
    path = _write(tmp_path / "t.gguf", {
        "big.weight": (rng.standard_normal((1001, 256), dtype=np.float32), Q8),  # rows not a multiple of a block
        "half.weight": (rng.standard_normal((37, 64), dtype=np.float32), F16),
        "full.weight": (rng.standard_normal((23, 48), dtype=np.float32), F32),
        "norm.weight": (rng.standard_normal(48, dtype=np.float32), F32)})
    monkeypatch.setattr(checkpoint, "GGUF_BLOCK_BYTES", 7 * 256 * 4)  # 7 rows of big.weight a block
    with open(path, "rb", buffering=0) as f:
        for name, (t, ref) in _stored(path).items():
            got = _dequantized(f, t)
            assert got.dtype == np.float32 and got.shape == ref.shape, name
            assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), name


def test_gguf_tensor_read_holds_about_its_output_alone(tmp_path, monkeypatch):
    """gguf's whole-tensor dequantisation holds every row group's result beside the output (twice the
    output at least); a block read holds the output and one block."""
    rows, cols = 4096, 256
    path = _write(tmp_path / "t.gguf", {"big.weight": (
        np.random.default_rng(1).standard_normal((rows, cols), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)})
    t, _ = _stored(path)["big.weight"]
    out_bytes = rows * cols * 4
    monkeypatch.setattr(checkpoint, "GGUF_BLOCK_BYTES", out_bytes // 64)
    gc.collect()
    with open(path, "rb", buffering=0) as f:
        tracemalloc.start()
        try:
            _dequantized(f, t)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 1.25 * out_bytes, (peak, out_bytes)


def test_streamed_gguf_keeps_neither_the_mapping_nor_the_metadata(tmp_path, monkeypatch):
    """Every tensor as transformers' processor gives it (the q/k un-permutation included) from rows read
    a few at a time; afterwards no page of the file is mapped into the process."""
    from tiny_gguf import write_llama_gguf
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    from dipdeploy.checkpoint import GGUFCheckpoint
    from dipdeploy.loading import load_model

    path = write_llama_gguf(load_model("tiny-llama"), tmp_path / "tiny.gguf")
    monkeypatch.setattr(checkpoint, "GGUF_BLOCK_BYTES", 3 * 64 * 4)  # 3 rows of a hidden-wide matrix a block
    lm = load_model(str(path), stream=True)
    ck = lm.checkpoint
    assert isinstance(ck, GGUFCheckpoint) and not hasattr(ck, "reader")
    processor = TENSOR_PROCESSORS["llama"](config=ck.parsed["config"])
    stored = _stored(path)
    for name, t in ck.by_hf.items():
        ref = processor.process(weights=stored[t.name][1], name=t.name, tensor_key_mapping=ck.mapping,
                                parsed_parameters=ck.parsed).weights
        got = ck._read(name)
        assert got.dtype == torch.float32 and torch.equal(got, torch.from_numpy(np.ascontiguousarray(ref))), name
    del stored
    gc.collect()
    assert str(path) not in Path("/proc/self/maps").read_text()


def test_truncated_gguf_is_one_error_naming_the_tensor(tmp_path):
    path = _write(tmp_path / "t.gguf", {"big.weight": (
        np.ones((64, 256), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)})
    t, _ = _stored(path)["big.weight"]
    data = path.read_bytes()
    path.write_bytes(data[:t.offset + t.row_bytes * 10])
    with open(path, "rb", buffering=0) as f, pytest.raises(OSError, match="big.weight.*truncated"):
        _dequantized(f, t)
