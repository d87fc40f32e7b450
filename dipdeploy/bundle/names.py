"""The names a bundle's writer (``dipdeploy.export``) and its readers (``dipdeploy.runtime``) agree on:
its files, graphs, the graphs' symbolic dims and the tensors found by name. Torch-free, no imports."""

from __future__ import annotations

MANIFEST = "manifest.json"
MLP_FILE = "mlp.bin"  # the MLP rows in the Flash layout: the one file a runtime streams from
EMBEDDING = "model.embed_tokens"  # the token table: ``.weight`` fp32, or ``.qweight`` + ``.scales`` int4
# First dim of the per-layer MLP graphs' per-row weight inputs (the host binds a slab of that many rows);
# shared tables (VQ3 codebooks) keep fixed shapes. The runtime reads this dim to know what it streams.
SLAB_DIM = "slab_rows"
# The graphs' symbolic dims, onnxruntime-genai's names; the runtime sizes its buffers by them.
BATCH, SEQ, TOTAL = "batch_size", "sequence_length", "total_sequence_length"
# The per-layer graphs beside the layers' own (dipdeploy/export/layers.py), in the order export lists them.
EDGE_GRAPHS = ("embed.onnx", "positions.onnx", "head.onnx")
# The joined decoder's forms (dipdeploy/export/joined.py): the per-layer graphs spliced into one, the host's
# cache step as ops; ``graphs.decoder`` lists those a bundle has, in this order.
JOINED = {"step": "decoder.step.onnx", "overlap": "decoder.overlap.onnx", "prefetch": "decoder.prefetch.onnx"}
#: the joined decoder's input naming the first position whose logits it outputs (default: the last only)
JOINED_LOGITS_FROM = "logits_from"
ATTENTION_LAYOUTS = ("standard", "gqa")  # export_config.attention: the attention op and KV layout of the graphs
MLP_GROUPS = ("up_gate", "down")  # a layer's row groups, in the order every stage lists them
# Files the readers open by their fixed names (the runtime's decoder settings, the tokenizer).
GENAI_CONFIG = "genai_config.json"  # onnxruntime-genai's settings, which the runtime reads too
TOKENIZER = "tokenizer.json"
READ_BY_NAME = (GENAI_CONFIG, TOKENIZER)
ROW_POSITION = "model.layers.{layer}.mlp.{group}.position"  # int64 [R]: the file row of each logical row


def layer_graph_names(num_layers: int) -> list[str]:
    """The per-layer graphs of a bundle with ``num_layers`` layers, in the order export lists them."""
    return [f"layer.{i}.{part}.onnx" for i in range(num_layers) for part in ("attn", "mlp_up", "mlp_down")] + [
        *EDGE_GRAPHS]


def joined_input(layer: int, name: str) -> str:
    """The joined decoder's input for layer ``layer``'s per-layer graph input ``name`` (a slab array
    ``up_gate.qweight``, a residency ``cache_in``, a group's ``up_gate.handle``)."""
    return f"layer.{layer}.{name}"
