"""Pareto plot of evaluation rows: PPL against MLP density ρ, one line per method."""

from __future__ import annotations

from pathlib import Path


def plot_pareto(rows: list[dict], out: Path, title: str = "", force: bool = False) -> Path:
    """PPL against density, one line per method; written atomically, never over a file without ``force``."""
    import matplotlib

    from dipdeploy.paths import check_output

    out = check_output(Path(out), force, flag="--plot")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for method in dict.fromkeys(r["method"] for r in rows):
        pts = sorted((r["density"], r["ppl"]) for r in rows if r["method"] == method)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
    ax.set_xlabel("MLP density ρ (fraction of MLP weight bytes read per token)")
    ax.set_ylabel("WikiText-2 perplexity")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)
    return out
