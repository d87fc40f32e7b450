"""The KV cache: allocated once for the whole context, written in place, nothing allocated per token.

Two layouts, one per attention variant of the per-layer graphs (``ExportConfig.attention``):

* ``gqa`` (com.microsoft::GroupQueryAttention): one [1, Hkv, context, Dh] buffer per layer and K/V,
  bound both as ``past_key_values.i.*`` and as ``present.i.*``. ORT's kernel then shares past and
  present (past_present_share_buffer: the present length is the past buffer's, and ``seqlens_k``,
  Σ attention_mask − 1, says how many positions are valid), writing the new position in place.
* ``standard`` (opset ops): the graph's ``Concat(past, new)`` must write a buffer other than its
  input, so each K/V of a layer is a contiguous [1, Hkv, n, Dh] view of a flat buffer of
  Hkv·context·Dh floats, and the present of layer i is bound into a spare flat buffer; after the
  run the spare becomes layer i's and layer i's old buffer the spare. L + 1 buffers per K and V,
  rotated: the cache costs (L + 1)/L of the tokens it holds, no copies beyond the graph's Concat.

``nbytes`` is what the residency plan counts (``dipdeploy.runtime.budget``). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dipdeploy.bundle.names import ATTENTION_LAYOUTS  # one list: export writes it, verify checks it
from dipdeploy.runtime.sessions import Buffer


@dataclass(frozen=True)
class KvShape:
    """Per layer: ``heads`` KV heads of ``head_dim``; ``layers`` layers; ``context`` positions."""

    layers: int
    heads: int
    head_dim: int
    context: int

    @property
    def layer_floats(self) -> int:
        return self.heads * self.context * self.head_dim


class KvCache:
    """The preallocated KV storage of one sequence (see the module docstring); ``bind`` before each
    layer's attention run, ``commit`` after it."""

    def __init__(self, shape: KvShape, attention: str):
        if attention not in ATTENTION_LAYOUTS:
            raise ValueError(f"attention {attention!r} unknown; choose one of {', '.join(ATTENTION_LAYOUTS)}")
        self.shape, self.attention = shape, attention
        count = shape.layers if attention == "gqa" else shape.layers + 1
        # [buffer, K|V, floats]: one allocation for the whole cache
        self.storage = np.zeros((count, 2, shape.layer_floats), np.float32)
        # every view ``bind`` makes starts at its buffer's first float: bound by address (sessions.Buffer)
        self._buffers = [[Buffer(self.storage[b, w]) for w in (0, 1)] for b in range(count)]
        self._names = [[(f"past_key_values.{i}.{kind}", f"present.{i}.{kind}") for kind in ("key", "value")]
                       for i in range(shape.layers)]
        self._owner = list(range(shape.layers))  # layer -> its buffer index
        self._spare = shape.layers if attention == "standard" else None
        self.length = 0

    @property
    def nbytes(self) -> int:
        return self.storage.nbytes

    def reset(self) -> None:
        self.length = 0

    def _view(self, buffer: int, which: int, n: int) -> np.ndarray:
        s = self.shape
        flat = self.storage[buffer, which]
        if self.attention == "gqa":
            return flat.reshape(1, s.heads, s.context, s.head_dim)
        return flat[: s.heads * n * s.head_dim].reshape(1, s.heads, n, s.head_dim)

    def bind(self, session, layer: int, new: int = 1) -> None:
        """Bind layer ``layer``'s past (``length`` positions) and present (``new`` more: one per decoded
        token, the prompt's length for a batched prefill) to ``session``."""
        s, own = self.shape, self._owner[layer]
        if self.attention == "gqa":
            out, past = own, (1, s.heads, s.context, s.head_dim)
            present = past
        else:
            out, past = self._spare, (1, s.heads, self.length, s.head_dim)
            present = (1, s.heads, self.length + new, s.head_dim)
        for which, (past_name, present_name) in enumerate(self._names[layer]):
            session.input_at(past_name, self._buffers[own][which], past)
            session.output_at(present_name, self._buffers[out][which], present)

    def bind_session(self, session, new: int = 1) -> None:
        """Bind every layer's past and present to ``session``, one graph for the whole decoder
        (``dipdeploy.runtime.backends.whole``). GQA: as ``bind``. Standard: layer i's present goes into the buffer
        holding layer i − 1's past (layer 0's into the spare), which that layer's Concat has read before
        layer i runs; ``commit_session`` then shifts the ownership by one layer."""
        s = self.shape
        for layer in range(s.layers):
            own = self._owner[layer]
            if self.attention == "gqa":
                out, past = own, (1, s.heads, s.context, s.head_dim)
                present = past
            else:
                out = self._owner[layer - 1] if layer else self._spare
                past, present = (1, s.heads, self.length, s.head_dim), (1, s.heads, self.length + new, s.head_dim)
            for which, (past_name, present_name) in enumerate(self._names[layer]):
                session.input_at(past_name, self._buffers[own][which], past)
                session.output_at(present_name, self._buffers[out][which], present)

    def commit_session(self) -> None:
        """After a ``bind_session`` run: each layer's present is now its cache."""
        if self.attention == "standard":
            self._owner, self._spare = [self._spare, *self._owner[:-1]], self._owner[-1]

    def commit(self, layer: int) -> None:
        """After layer ``layer`` ran: its present is now its cache (the standard layout swaps buffers)."""
        if self.attention == "standard":
            self._owner[layer], self._spare = self._spare, self._owner[layer]

    def advance(self, new: int = 1) -> None:
        """After every layer ran for ``new`` tokens: that many more valid positions."""
        self.length += new

    def layer(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer ``layer``'s valid K and V, [1, Hkv, length, Dh] (views, not copies)."""
        own = self._owner[layer]
        if self.attention == "gqa":
            return tuple(self._view(own, w, 0)[:, :, : self.length] for w in (0, 1))
        return tuple(self._view(own, w, self.length) for w in (0, 1))

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions. GQA: the length alone (later positions are overwritten);
        standard: each layer's [Hkv, n, Dh] is repacked through the spare buffer."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot keep {n} positions of a KV cache holding {self.length}")
        if self.attention == "standard":
            for i in range(self.shape.layers):
                for w in (0, 1):
                    self._view(self._spare, w, n)[...] = self._view(self._owner[i], w, self.length)[:, :, :n]
                self._owner[i], self._spare = self._spare, self._owner[i]
        self.length = n
