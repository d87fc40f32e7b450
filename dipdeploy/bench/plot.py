"""``dipdeploy bench plot``: tokens/s against the cgroup memory limit, one line per configuration, from the
JSON of one or more ``bench decode`` runs (a run per limit can be joined: the rows keep their limit).

Why this view: the runtime's promise is a model run under a memory limit below its size, so the figure a
user compares is how each engine's speed falls as the limit tightens, beside its own speed with no limit
(drawn at the right, past the tightest-to-loosest limits). A repetition that did not finish at a limit
leaves no point there; a configuration that finished nowhere under a limit still shows its unlimited point.
Error bars are the rows' standard deviations over their repetitions.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from dipdeploy.bench.grid import NO_LIMIT, parse_limit
from dipdeploy.jsonout import read
from dipdeploy.paths import check_output, write_figure

#: files one plot reads (each a ``bench decode --output X.json``)
MAX_FILES = 32


def load_rows(paths: list[Path]) -> list[dict]:
    """The rows of every ``bench decode`` JSON in ``paths``; a file that is not one is refused naming it."""
    if not paths:
        raise ValueError("give the JSON of a `dipdeploy bench decode --output ROWS.json` run")
    if len(paths) > MAX_FILES:
        raise ValueError(f"{len(paths)} files, over the cap of {MAX_FILES}; join fewer runs in one plot")
    rows = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: not readable as JSON ({err}); give the file of `bench decode --output "
                             f"ROWS.json`") from None
        data = read(data, "bench.decode", path)  # a file written before the schema keys reads too
        if not isinstance(data.get("rows"), list) or any(
                not isinstance(r, dict) or "tok_s" not in r or "test" not in r for r in data["rows"]):
            raise ValueError(f"{path} holds no decode rows (a `bench decode --output ROWS.json` file has a "
                             f"'rows' list with 'test' and 'tok_s')")
        rows += data["rows"]
    return rows


def series(rows: list[dict], test: str) -> dict[str, list[tuple[int | None, float, float]]]:
    """Configuration label (model, method, ρ, threads) → (limit in bytes or None, tok/s, std) of the rows of
    ``test`` that measured something, each configuration's points ordered by limit with no limit last."""
    out: dict[str, list] = defaultdict(list)
    for r in rows:
        if r["test"] != test or not r.get("repetitions") or r.get("tok_s") is None:
            continue
        density = r.get("density")
        # no budget in the label: a run per limit gives each limit the budget that fits under it, and a
        # configuration's line joins them
        label = " ".join(str(x) for x in (r["model"], r["method"], "" if density in (None, "") else f"ρ {density:g}",
                                          f"t{r['threads']}") if x)
        out[label].append((parse_limit(r.get("limit") or NO_LIMIT), float(r["tok_s"]), float(r.get("tok_s_std") or 0)))
    return {k: sorted(v, key=lambda p: (p[0] is None, p[0] or 0)) for k, v in out.items()}


def plot(rows: list[dict], out: str | os.PathLike, test: str, title: str = "", force: bool = False) -> Path:
    """The PNG of :func:`series` for ``test`` (e.g. tg32), written atomically; refused when no row has it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = series(rows, test)
    if not curves:
        tests = sorted({r["test"] for r in rows})
        raise ValueError(f"no row measured {test}; the rows hold {', '.join(tests) or 'no test'}: give --test one "
                         f"of them")
    out = check_output(Path(out), force, flag="--output")
    limits = sorted({p[0] for pts in curves.values() for p in pts if p[0] is not None})
    position = {lim: i for i, lim in enumerate(limits)}
    unlimited = len(limits)
    fig, ax = plt.subplots(figsize=(10.5, 4.6))
    for name, pts in curves.items():
        xs = [unlimited if lim is None else position[lim] for lim, _, _ in pts]
        ax.errorbar(xs, [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", ms=4, capsize=3, label=name,
                    linestyle="--" if " dense " in f" {name} " else "-")
    ax.set_xticks(range(unlimited + 1), [f"{lim / 1e6:.0f} MB" for lim in limits] + ["no limit"])
    ax.set_yscale("log")  # the limited rows lie decades below the unlimited ones
    ax.set_xlabel("cgroup memory limit (page cache counted)")
    ax.set_ylabel(f"{test} tokens/s")
    ax.set_title(title or f"{test} tokens/s against the memory limit", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: the lines stay visible
    fig.tight_layout()
    return write_figure(fig, out)
