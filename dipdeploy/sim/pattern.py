"""Access patterns at the simulated model's widths, and the model-shape projection (ours).

An ``AccessPattern`` is what the replay consumes: for each *simulated* layer the selected rows of both
groups ([T, K]) and, when the trace has them, the magnitudes that DIP / DIP-CA re-masking scores.

Projection onto a larger (or smaller) model's shape — the access pattern is **extrapolated**, not
measured — works like this:

* Layers by relative depth: target layer l reads source layer round(l · (L_s − 1) / (L_t − 1)).
  Target layers that read the same source layer have identical statistics, so each source layer is
  simulated once and weighted by how many target layers it stands for.
* Rows by rank: each source row of a group (R_s rows) becomes a block of ≈ R_t / R_s target rows, so
  the per-layer popularity quantiles carry over unchanged. A token's K_s selected source rows, taken in
  rank order (largest score first, as recorded), expand into their blocks until K_t ≈ K_s · R_t / R_s
  target rows are filled (ties inside the last block → lower target index, like ``topk_indices``);
  magnitudes are copied to every row of the block. Block members are scattered over the target rows
  by a fixed-seed permutation, so adjacency (which decides Flash request coalescing) is random rather
  than artificially contiguous. Rows of one block are always co-selected: the larger model is assumed
  to have no more independent "kinds" of rows than the traced one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dipdeploy.registry import ModelShape
from dipdeploy.trace import Trace


@dataclass
class GroupMap:
    """Source → target rows of one group: ``members[s]`` = target rows of source row s (−1 padded,
    ascending), ``source_of[j]`` = source row of target row j."""

    members: np.ndarray
    source_of: np.ndarray
    sizes: np.ndarray

    @classmethod
    def build(cls, rows_src: int, rows_dst: int, rng: np.random.Generator) -> GroupMap:
        pre = (np.arange(rows_dst, dtype=np.int64) * rows_src) // rows_dst  # block of each position
        perm = rng.permutation(rows_dst)
        source_of = np.empty(rows_dst, dtype=np.int64)
        source_of[perm] = pre
        sizes = np.bincount(source_of, minlength=rows_src)
        width = max(1, int(sizes.max()))
        members = np.full((rows_src, width), -1, dtype=np.int64)
        order = np.argsort(source_of * rows_dst + np.arange(rows_dst), kind="stable")  # by source, then index
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        slot = np.arange(rows_dst) - starts[source_of[order]]
        members[source_of[order], slot] = order
        return cls(members=members, source_of=source_of, sizes=sizes)

    def k_target(self, sel: np.ndarray, rows_src: int, rows_dst: int) -> int:
        desired = max(1, round(sel.shape[1] * rows_dst / rows_src))
        return int(min(desired, self.sizes[sel].sum(axis=1).min()))

    def expand(self, sel: np.ndarray, k: int) -> np.ndarray:
        """[T, K_s] ranked source rows → [T, k] target rows (first k members in rank order)."""
        cand = self.members[sel].reshape(sel.shape[0], -1)  # [T, K_s * width]
        valid = cand >= 0
        pos = np.cumsum(valid, axis=1) - 1
        keep = valid & (pos < k)
        out = np.empty((sel.shape[0], k), dtype=np.int64)
        t_idx = np.broadcast_to(np.arange(sel.shape[0])[:, None], cand.shape)
        out[t_idx[keep], pos[keep]] = cand[keep]
        return out


@dataclass
class AccessPattern:
    """Row accesses at the target widths: ``sel_in[i]`` / ``sel_glu[i]`` for simulated layer i, which
    stands for ``weights[i]`` target layers."""

    rows_in: int
    rows_glu: int
    num_layers: int
    sel_in: list[np.ndarray]
    sel_glu: list[np.ndarray]
    weights: np.ndarray
    source_layers: list[int]
    trace: Trace | None = None
    map_in: GroupMap | None = None
    map_glu: GroupMap | None = None
    extrapolation: str | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.sel_in[0].shape[0]) if self.sel_in else 1

    @property
    def has_magnitudes(self) -> bool:
        return self.trace is not None and self.trace.has_magnitudes

    def magnitudes(self, group: str, i: int) -> np.ndarray:
        """[T, R] float16 magnitudes of simulated layer i at target width (a gather when projected)."""
        if not self.has_magnitudes:
            raise ValueError("this trace has no magnitudes (x_abs, glu_abs); DIP/DIP-CA re-masking needs "
                             "them: re-trace with magnitudes kept, or use --method traced")
        src = (self.trace.x_abs if group == "in" else self.trace.glu_abs)[self.source_layers[i]]
        gmap = self.map_in if group == "in" else self.map_glu
        return src if gmap is None else src[:, gmap.source_of]

    def density(self) -> float:
        k_in = np.array([s.shape[1] for s in self.sel_in], dtype=float)
        k_glu = np.array([s.shape[1] for s in self.sel_glu], dtype=float)
        per = (2 * k_in / self.rows_in + k_glu / self.rows_glu) / 3
        return float((per * self.weights).sum() / self.weights.sum())


def _project_group(sels: list[np.ndarray], source_layers: list[int], gmap: GroupMap, rows_src: int,
                   rows_dst: int) -> list[np.ndarray]:
    """Expand each layer's selections; layers with the same source K get the same target K (the
    smallest any of them can fill), so the replay can batch them."""
    src = [sels[s].astype(np.int64) for s in source_layers]
    k_of: dict[int, int] = {}
    for sel in src:
        k = gmap.k_target(sel, rows_src, rows_dst)
        k_of[sel.shape[1]] = min(k, k_of.get(sel.shape[1], k))
    return [gmap.expand(sel, k_of[sel.shape[1]]) for sel in src]


def build_pattern(trace: Trace, shape: ModelShape, seed: int = 0) -> AccessPattern:
    """The trace's accesses at ``shape``'s widths: identity when the shapes match, else projected."""
    d_s, F_s, L_s = trace.hidden_size, trace.intermediate_size, trace.num_layers
    d_t, F_t, L_t = shape.hidden_size, shape.intermediate_size, shape.num_hidden_layers
    if (d_s, F_s, L_s) == (d_t, F_t, L_t):
        return AccessPattern(rows_in=d_t, rows_glu=F_t, num_layers=L_t, sel_in=list(trace.sel_in),
                             sel_glu=list(trace.sel_glu), weights=np.ones(L_t), source_layers=list(range(L_t)),
                             trace=trace)
    src_of_layer = [0 if L_t == 1 else round(lt * (L_s - 1) / (L_t - 1)) for lt in range(L_t)]
    source_layers = sorted(set(src_of_layer))
    weights = np.array([src_of_layer.count(s) for s in source_layers], dtype=float)
    rng = np.random.default_rng(seed)
    map_in = GroupMap.build(d_s, d_t, rng)
    map_glu = GroupMap.build(F_s, F_t, rng)
    sel_in = _project_group(trace.sel_in, source_layers, map_in, d_s, d_t)
    sel_glu = _project_group(trace.sel_glu, source_layers, map_glu, F_s, F_t)
    note = (f"extrapolated: trace of {trace.model} (d={d_s}, F={F_s}, L={L_s}) projected onto d={d_t}, F={F_t}, "
            f"L={L_t}; layers by relative depth, rows by rank (each source row → a block of "
            f"{d_t / d_s:.2f} input / {F_t / F_s:.2f} GLU rows, co-selected, scattered by a seed-{seed} permutation)")
    return AccessPattern(rows_in=d_t, rows_glu=F_t, num_layers=L_t, sel_in=sel_in, sel_glu=sel_glu, weights=weights,
                         source_layers=source_layers, trace=trace, map_in=map_in, map_glu=map_glu,
                         extrapolation=note)
