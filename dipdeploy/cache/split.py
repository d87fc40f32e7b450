"""How a cache budget is shared among the MLP groups: the one rule of the runtime's plan and the simulator's.

``reads`` (the default): the bytes ``even`` would give, spent where a cached byte saves the most reading
(:func:`split_by_reads`).
``even`` (the paper's §5): the same fraction of every group's rows.
The runtime's plan, the simulator's and the torch DIP-CA reference (``SparsityPlan.cache_split``) all
apply one of these, so ``eval`` measures the perplexity of the split ``run`` uses.

Floor 2: no dependencies.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

CACHE_SPLITS = ("even", "reads")
#: ``reads`` is the default: at the same cache bytes it gives SmolLM2 the lower perplexity and the 1 B model
#: fewer bytes read per token than ``even`` (benchmarks/results/accuracy-smollm2.md, cache-split.md).
CACHE_SPLIT = "reads"


class Group(Protocol):
    rows: int
    row_bytes: int
    k: int  # rows selected per token


def split_by_reads(groups: Sequence[Sequence[Group]], cache_bytes: float,
                   miss_cost: Callable[[float], float]) -> list[list[int]]:
    """Capacities [layer][group] spending at most ``cache_bytes`` where a cached byte saves the most reading.

    A cached row of group g saves, per token, about K/rows of a miss (its chance of being selected), and a
    miss costs ``miss_cost(row_bytes)`` (a request plus whole blocks: ``dipdeploy.flash.miss_cost``,
    the simulator's device model), so a cached byte is worth (K / rows) · miss_cost / row_bytes. Groups are
    filled in that order, groups of equal worth (every layer's down group of a uniform plan) to the same
    fraction. Small rows are the expensive ones: a row smaller than a block (SmolLM2's BQ4 down rows) costs
    a whole block and a request, so a byte of it is worth several of a larger up|gate row's, and its
    groups are cached first.
    """
    worth = {(i, j): (g.k / g.rows) * miss_cost(g.row_bytes) / g.row_bytes if g.rows and g.row_bytes else 0.0
             for i, layer in enumerate(groups) for j, g in enumerate(layer)}
    cap = [[0 for _ in layer] for layer in groups]
    left = cache_bytes
    for w in sorted({round(v, 12) for v in worth.values()}, reverse=True):
        tier = [(i, j) for (i, j), v in worth.items() if round(v, 12) == w]
        size = sum(groups[i][j].rows * groups[i][j].row_bytes for i, j in tier)
        frac = min(1.0, left / size) if size else 0.0
        for i, j in tier:
            g = groups[i][j]
            cap[i][j] = int(frac * g.rows)
            left -= cap[i][j] * g.row_bytes
        if left <= 0:
            break
    return cap


def spend(split: str, even: Sequence[Sequence[int]], groups: Sequence[Sequence[Group]],
          miss_cost: Callable[[float], float]) -> list[list[int]]:
    """The capacities [layer][group] of ``split``, given the ``even`` split's: ``reads`` spends the bytes
    ``even`` gives the caches by :func:`split_by_reads` instead."""
    if split not in CACHE_SPLITS:
        raise ValueError(f"cache split {split!r} unknown; choose one of {', '.join(CACHE_SPLITS)}")
    if split == "even":
        return [list(layer) for layer in even]
    return split_by_reads(groups, sum(c * g.row_bytes for cl, gl in zip(even, groups) for c, g in zip(cl, gl)),
                          miss_cost)
