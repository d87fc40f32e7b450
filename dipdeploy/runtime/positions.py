"""What every attention graph needs from the step's positions, computed once per token.

``positions.onnx`` (dipdeploy/export/layers.py) turns the attention mask and the position ids into the
values each layer's attention used to rebuild for itself: the RoPE cos/sin rows and the additive causal
mask (standard attention), or ``seqlens_k`` and the total length (GroupQueryAttention). Built by the
same function as ``model.onnx``'s (``blocks.shared_for_layers``), so the per-layer graphs see the values
``model.onnx`` computes; one run per token instead of one mask subgraph per layer
(docs/decisions/0001-native-cache-step.md).

Decode binds every fixed-shape output once, to the positions session and to each attention graph that
takes it; an output that grows with the sequence (the mask bias [1,1,1,1,T]) is a view of one buffer
sized for the context, rebound by pointer each token as the KV views are. Torch-free.
"""

from __future__ import annotations

import numpy as np

from dipdeploy.bundle.names import BATCH, SEQ, TOTAL
from dipdeploy.runtime.sessions import Bound, Buffer

_DTYPES = {"tensor(float)": np.float32, "tensor(int32)": np.int32, "tensor(int64)": np.int64}


def _shape(dims, seq: int, total: int) -> tuple[int, ...]:
    sizes = {BATCH: 1, SEQ: seq, TOTAL: total}
    return tuple(sizes[d] if isinstance(d, str) else int(d) for d in dims)


class PositionValues:
    """``positions.onnx`` bound for decoding, and the attention graphs' inputs it feeds."""

    def __init__(self, positions: Bound, attention: list[Bound], mask: np.ndarray, position_ids: np.ndarray):
        self.bound, self.mask = positions, mask
        outputs = positions.session.get_outputs()
        takes = [{i.name for i in a.session.get_inputs()} for a in attention]
        #: output name → the attention graphs that take it (per layer: the names it takes)
        self.takers = {o.name: [a for a, names in zip(attention, takes) if o.name in names] for o in outputs}
        self.names = [[o.name for o in outputs if o.name in names] for names in takes]
        self._dims = {o.name: (o.shape, _DTYPES[o.type]) for o in outputs}
        self._growing: dict[str, Buffer] = {}
        self._mask = Buffer(mask)  # batch 1: mask[:, :n] is its first n elements
        context = mask.shape[1]
        positions.input("position_ids", position_ids)
        for name, (dims, dtype) in self._dims.items():
            if TOTAL in dims:
                self._growing[name] = Buffer(np.zeros(int(np.prod(_shape(dims, 1, context))), dtype))
                continue
            buf = np.zeros(_shape(dims, 1, 0), dtype)
            positions.output(name, buf)
            for a in self.takers[name]:
                a.input(name, buf)

    def step(self, length: int) -> None:
        """Compute the values of a decode step whose sequence holds ``length`` positions (this one included)."""
        self.bound.input_at("attention_mask", self._mask, (1, length))
        for name, flat in self._growing.items():
            shape = _shape(self._dims[name][0], 1, length)
            self.bound.output_at(name, flat, shape)
            for a in self.takers[name]:
                a.input_at(name, flat, shape)
        self.bound.run()

    def batch(self, bound: Bound, start: int, n: int) -> dict[str, np.ndarray]:
        """The values of ``n`` positions from ``start`` at once (a batched prefill), through ``bound``
        (another binding of the positions session, so decode's stays as it is)."""
        total = start + n
        bound.input("attention_mask", self.mask[:, :total])
        bound.input("position_ids", np.arange(start, total, dtype=np.int64)[None])
        out = {name: np.zeros(_shape(dims, n, total), dtype) for name, (dims, dtype) in self._dims.items()}
        for name, arr in out.items():
            bound.output(name, arr)
        bound.run()
        return out
