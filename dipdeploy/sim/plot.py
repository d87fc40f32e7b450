"""Throughput-vs-DRAM curves as a PNG (matplotlib, Agg backend: no display needed; log tokens/s axis)."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from dipdeploy.paths import check_output, write_figure
from dipdeploy.sim.simulate import SimResult


def label(r: SimResult) -> str:
    g = f" γ={r.gamma:g}" if r.gamma is not None else ""
    return f"{r.method} / {r.policy}{g}"


def plot_curves(rows: list[SimResult], out: str | os.PathLike, title: str = "", overlap: bool = False,
                force: bool = False) -> Path:
    """One line per (method, policy, γ); x = DRAM budget (GB), y = tokens/s. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = check_output(Path(out), force, flag="--plot")
    curves = defaultdict(list)
    for r in rows:
        curves[label(r)].append(r)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, rs in curves.items():
        rs = sorted(rs, key=lambda r: r.dram_bytes)
        ax.plot([r.dram_bytes / 1e9 for r in rs], [r.tok_s_overlap if overlap else r.tok_s for r in rs],
                marker="o", ms=3, label=name, linestyle="--" if rs[0].method == "dense" else "-")
    ax.set_yscale("log")  # the Flash-bound region spans decades below the all-in-DRAM end
    ax.set_xlabel("DRAM budget (GB)")
    ax.set_ylabel("tokens/s" + (" (Flash overlapped)" if overlap else ""))
    extrapolated = any(r.extrapolated for r in rows)
    ax.set_title(title + (" — extrapolated access pattern" if extrapolated else ""), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return write_figure(fig, out)
