"""Pareto plot of evaluation rows: PPL (or HumanEval pass@1) against MLP density ρ, one line per method."""

from __future__ import annotations

from pathlib import Path


#: The rows' metric → its axis label and scale.
METRICS = {"ppl": ("WikiText-2 perplexity", "log"), "pass_at_1": ("HumanEval pass@1 (%, greedy)", "linear")}


def plot_pareto(rows: list[dict], out: Path, title: str = "", force: bool = False, metric: str = "ppl") -> Path:
    """``metric`` against density, one line per method ;
    written atomically, never over a file without ``force``."""
    import matplotlib

    from dipdeploy.paths import check_output

    out = check_output(Path(out), force, flag="--plot")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    label, scale = METRICS[metric]
    for method in dict.fromkeys(r["method"] for r in rows):
        pts = sorted((r["density"], r[metric]) for r in rows if r["method"] == method)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
    ax.set_xlabel("MLP density ρ (fraction of MLP weight bytes read per token)")
    ax.set_ylabel(label)
    ax.set_yscale(scale)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)
    return out
