"""Real reads from storage: SmolLM2 DIP-CA BQ4 and dense-static with ``--io mmap | pread | direct``, cold,
each run in its own cgroup v1 memory group so the OS page cache cannot keep the MLP file.

Every configuration runs in a child process moved into a fresh memory group under this process's own
(``/sys/fs/cgroup/memory/<own group>/dipdeploy-flash-<pid>``, removed afterwards). The child builds the
engine, warms it up (a few tokens), touches every page of its slabs (so the row caches are counted
full), drops the MLP file from the page cache, and only then limits its group to its anonymous and
mapped pages (``memory.stat`` ``rss`` + ``mapped_file``) plus ``--slack``: v1 counts the page
cache in the group, so the kernel has to drop the MLP file's pages and every row the row cache does
not hold comes from the disk again, in every io mode (without the limit ``mmap`` and ``pread`` re-read
evicted rows from the page cache). The "unlimited" rows skip the limit. Each run starts cold (the
file dropped from the page cache, ``Engine(cold=True)``).

Columns: decode tok/s; per decode token: the rows' bytes the caches asked for (``wanted_mb``), the bytes
the process read from the block device (``device_mb``, ``/proc/self/io`` ``read_bytes``: measured,
every mode; for ``direct`` it matches the store's own block count) and the store's requests; hit rate;
peak RSS (VmHWM); the limit. ``waste`` = device / wanted.

    python benchmarks/flash.py            # 2 methods × 3 io × budgets 25/50/75 % + unlimited, 64 tokens,
                                          # and DIP-CA direct at 1/4/16/32 reads in flight (~10 min at 32 tokens)
    python benchmarks/flash.py --quick    # DIP-CA and dense-static, 50 % + unlimited, 16 tokens; 1 and 16 in flight
    python benchmarks/flash.py --io direct --row-order natural,calibrated --no-thread-sweep
                                          # the layout axis: natural and calibrated bundles side by side
                                          # (`export --row-order`), results in flash-row-order.md

``--model llama-1b`` is the ≈1 B section instead: a random-weight Llama-shaped checkpoint
(benchmarks/llama-1b.json, written by scripts/random_checkpoint.py with SmolLM2's tokenizer), exported
streamed at a uniform ``--rho-in`` (as the SmolLM2 bundles), ``--io direct`` only, and beside it the peers
of benchmarks/peers.py (onnxruntime-genai int4, llama.cpp Q4_0 with mmap), each run in its own group
under the limit the DIP-CA run at the same budget had, plus unlimited. Its section is written into
results/flash.md after the SmolLM2 one (each run keeps the other's section). Its ``--slack`` is 64 MiB:
with 4 MiB the 1 B dense-static child is OOM-killed while decoding (its per-layer row buffers, freed
between tokens, are not in the warmed-up charge):

    python benchmarks/flash.py --model llama-1b --tokens 16 --slack 67108864 --genai-python venv-genai/bin/python \
        --llama-python venv-llama/bin/python --llama-convert llama.cpp/convert_hf_to_gguf.py
    # 50 % only, ours at accuracy levels 0 and 4 (the peers' int8 activations), with and without the
    # read-ahead, 3 interleaved repeats, into results/flash-1b-levels.md (the same peer options as above)
    python benchmarks/flash.py --model llama-1b --tokens 16 --slack 67108864 --path default --budgets 50% \
        --accuracy-level 0,4 --variants 'no read-ahead' --repeats 3 --name flash-1b-levels …
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import lscpu, machine, md_table, memory_group, positive_int, write_rows_json

from peers import LLAMA_PEERS, PEERS, build_genai, build_gguf, child_argv, peer_row, peer_spec, read_bytes

from dipdeploy.bench.child import last_line
from dipdeploy.cache.split import CACHE_SPLIT
from dipdeploy.paths import write_atomic
from dipdeploy.runtime.blockio import IO_ENGINE, IO_GAP, IO_RING_DEPTH, IO_THREADS

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The history of the city begins in the early"
PATHS = {"per-layer": False, "default": None}  # --path → EngineConfig.fused
BUNDLES = {  # method → (folder under build/, export options); dip-ca is `dipdeploy export --method dip-ca
    #           --quant bq4 --rho-in 0.55 --out build/flash-bundle`
    "dip-ca": ("flash-bundle", dict(method="dip-ca", rho_in=0.55)),
    "dense-static": ("flash-bundle-dense", dict(method="dip", density=1.0, rho_in=1.0)),
}
POLICY = {"dip-ca": "lfu", "dense-static": "static"}
LLAMA_1B = "llama-1b"  # --model: the checkpoint build/llama-1b-random, from this config and tokenizer
LLAMA_1B_CONFIG = ROOT / "benchmarks" / "llama-1b.json"
LLAMA_1B_TOKENIZER = "smollm2-135m"  # 49152 tokens, a pre-tokenizer llama.cpp's converter knows
SECTION_1B = "## ≈1 B random Llama beside onnxruntime-genai and llama.cpp"
THREADS = (1, 4, 16, 32)  # the reads-in-flight sweep
ROW_ORDERS = ("natural", "calibrated")  # `export --row-order`: the layout axis (docs/method.md "Flash layout")
VARIANTS = (  # at 50 %, --io direct, limited: the other methods on the same bundles, and the cache split
    ("dip lfu", "dip-ca", dict(gamma=1.0, policy="lfu")),
    ("dip belady", "dip-ca", dict(gamma=1.0, policy="belady")),
    ("γ 0.3", "dip-ca", dict(gamma=0.3)),
    ("γ 0.7", "dip-ca", dict(gamma=0.7)),
    ("split even", "dip-ca", dict(cache_split="even")),
    ("split even", "dense-static", dict(cache_split="even")),
    ("no read-ahead", "dip-ca", dict(prefetch=False)),  # the default is auto: timed both ways on the first tokens
    ("no read-ahead", "dense-static", dict(prefetch=False)),
    ("read-ahead", "dip-ca", dict(prefetch=True)),
    ("read-ahead", "dense-static", dict(prefetch=True)),
    ("threads", "dip-ca", dict(io_engine="threads")),  # the pread pool where the default reader is the ring
    ("threads", "dense-static", dict(io_engine="threads")),
)
#: variants that are DIP-CA itself, read another way (the fastest of them also goes against the peers)
DIP_CA_READERS = ("no read-ahead", "read-ahead", "threads")
BUDGETS = ("25%", "50%", "75%")
COLS = ["method", "variant", "accuracy_level", "path", "row_order", "io", "reader", "read_ahead", "budget", "tok_s", "wanted_mb", "device_mb", "waste", "requests", "hit_rate", "peak_rss_mb",
        "peak_group_mb", "limit_mb", "load_1min"]


def storage(path: Path) -> str:
    """The block device and filesystem holding ``path`` (from /proc/mounts and /sys/block)."""
    path = path.resolve()
    best = ("?", "?", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, mnt, fs = line.split()[:3]
        if str(path).startswith(mnt.rstrip("/") + "/") and len(mnt) > len(best[2]):
            best = (dev, fs, mnt)
    dev, fs, _ = best
    name = Path(dev).name
    rot = Path(f"/sys/block/{name}/queue/rotational")
    flag = rot.read_text().strip() if rot.is_file() else "?"
    return f"{dev} ({fs}; {rot} = {flag})"


def ensure_checkpoint() -> Path:
    out = ROOT / "build" / f"{LLAMA_1B}-random"
    if not (out / "config.json").is_file():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "random_checkpoint.py"), "--out", str(out), "--config",
                        str(LLAMA_1B_CONFIG), "--tokenizer", LLAMA_1B_TOKENIZER], check=True)
    return out


def ensure_bundles(model: str, orders: tuple[str, ...] = ("natural",)) -> dict[tuple[str, str], Path]:
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    # the 1 B checkpoint is exported streamed at the bundles' rho_in, without validation (it needs the whole model)
    source, extra = (str(ensure_checkpoint()), dict(stream=True, validate_tokens=0)) if model == LLAMA_1B \
        else (model, dict(validate_tokens=4))
    out = {}
    for method, (folder, kw) in BUNDLES.items():
        folder = folder.replace("flash-", f"flash-{LLAMA_1B}-", 1) if model == LLAMA_1B else folder
        for order in orders:
            path = ROOT / "build" / (folder if order == "natural" else f"{folder}-{order}")
            if not (path / "manifest.json").is_file():
                print(f"exporting {path} …", flush=True)
                export_model(ExportConfig(model=source, quant="bq4", row_order=order, **extra, **kw), path,
                             force=True)
            out[method, order] = path
    return out


def belady_table_bytes(eng, steps: int) -> int:
    """What Belady's offline optimum holds beyond the warmed-up charge, per group: the recorded future
    selections (``Engine.generate``'s first pass, int64 [steps, K]) and the next-use table built from them
    (``dipdeploy.cache.policies``: int32 [steps, rows], which the native cache step reads in place). Both
    are made when the sequence starts and sized by its length (SmolLM2 at 64 tokens: about 37 MB, which the
    4 MiB slack does not hold). They are the oracle's bookkeeping, not a device's, so the limit grants them."""
    return sum(steps * (8 * slab.k + 4 * slab.rows) for pair in eng.slabs for slab in pair)


def child(spec: dict) -> dict:
    """One configuration, inside the memory group ``spec['group']`` (see the module docstring)."""
    import numpy as np

    from dipdeploy.runtime import Engine
    from dipdeploy.runtime.stats import memory_now

    group = Path(spec["group"])
    eng = Engine(spec["bundle"], dram_budget=spec["budget"], policy=spec["policy"], io=spec["io"], cold=True,
                 native=True, context=256, io_threads=spec["io_threads"], io_engine=spec.get("io_engine", IO_ENGINE),
                 cache_split=spec.get("cache_split", CACHE_SPLIT), io_gap=spec.get("io_gap", IO_GAP),
                 gamma=spec.get("gamma"), fused=spec.get("fused", False), accuracy_level=spec.get("accuracy_level"),
                 overlap_reads=spec.get("overlap_reads", True),
                 prefetch=spec.get("prefetch"),
                 prefill=spec.get("prefill", "batch"))
    eng.generate(PROMPT, 4, stop_at_eos=False)  # warm up the sessions and the caches
    for pair in eng.slabs:
        for s in pair:
            for slab in s.slabs:
                flat = slab.reshape(-1).view(np.uint8)
                flat[::4096] |= 0  # a write per page: the slab counted in RSS, values unchanged
    eng.flash.drop_page_cache()
    limit = None
    if spec["limited"]:
        # The group's anonymous and mapped pages (VmRSS would also count shared library pages charged to
        # other groups); the page cache of files read once at load (graphs, dense weights) is left out, or
        # the kernel would evict it to make room for MLP pages and the limit would leak.
        stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
        limit = int(stat["rss"]) + int(stat["mapped_file"]) + spec["slack"]
        if spec["policy"] == "belady":
            limit += belady_table_bytes(eng, len(eng.encode(PROMPT)) + spec["tokens"])
        (group / "memory.limit_in_bytes").write_text(str(limit))
    (group / "memory.max_usage_in_bytes").write_text("0")
    start = []  # read_bytes when the first token is out: the decode steps begin

    def on_text(piece: str) -> None:
        if not start:
            start.append(read_bytes())

    s = eng.generate(PROMPT, spec["tokens"], stop_at_eos=False, on_text=on_text).stats
    device = read_bytes() - start[0]
    row = {"tok_s": s.decode_tok_s, "wanted_mb": s.flash_mb_per_token, "device_mb": device / (s.new_tokens - 1) / 1e6,
           "store_device_mb": s.flash_device_mb_per_token, "requests": s.flash_requests_per_token,
           "hit_rate": s.hit_rate, "ahead_rows": s.read_ahead_rows_per_token, "ahead_used": s.read_ahead_used_per_token,
           "peak_rss_mb": memory_now().get("VmHWM", 0) / 1e6,
           "peak_group_mb": int((group / "memory.max_usage_in_bytes").read_text()) / 1e6,
           "limit_mb": limit / 1e6 if limit else None, "flash_io_s": s.seconds["flash_io"], "note": eng.flash.note,
           "reader": s.io_engine, "path": "fused" if s.fused else "per-layer",
           "read_ahead": (s.read_ahead or "").split(" (")[0]}  # "on", "off", "auto: on" …
    eng.close()
    return row


def run_in_group(spec: dict, timeout: float, cmd: list[str] | None = None) -> dict:
    """This script's ``--child SPEC``, or ``cmd`` + SPEC (a peer's child, dipdeploy/bench/peer_child.py), in a
    fresh memory group under this process's."""
    with memory_group("dipdeploy-flash") as (group, enter):
        if cmd is None:
            argv = [sys.executable, __file__, "--child", json.dumps({**spec, "group": str(group)})]
        else:
            argv = [*cmd, json.dumps({**spec, "group": {"path": str(group), "version": 1}})]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, preexec_fn=enter,
                              cwd=ROOT / "benchmarks")
        if done.returncode != 0:
            oom = int((group / "memory.failcnt").read_text())
            why = "killed at the memory limit" if done.returncode == -9 and oom else f"exit {done.returncode}"
            tail = last_line(done.stderr) if done.stderr.strip() else ""
            return {"error": f"{why} (memory.failcnt {oom})" + (f": {tail}" if tail else "")}
        return json.loads(done.stdout.strip().splitlines()[-1])


def _level(level: int | None) -> dict:
    """A configuration's ``accuracy_level`` key: none for the bundles' own level."""
    return {} if level is None else {"accuracy_level": level}


def configs(quick: bool, ios: tuple[str, ...] = ("mmap", "pread", "direct"),
            orders: tuple[str, ...] = ("natural",), budgets: tuple[str, ...] = BUDGETS,
            levels: tuple[int | None, ...] = (None,)) -> list[dict]:
    budgets = ("50%",) if quick else budgets
    out = []
    for level in levels:
        for method in BUNDLES:
            for io in ios:
                for b in budgets:
                    for order in orders:
                        out.append(dict(method=method, row_order=order, io=io, budget=b, limited=True,
                                        io_threads=None, io_engine=IO_ENGINE, **_level(level)))
                for order in orders:
                    out.append(dict(method=method, row_order=order, io=io, budget=budgets[len(budgets) // 2],
                                    limited=False, io_threads=None, io_engine=IO_ENGINE, **_level(level)))
    return out


def variant_configs(quick: bool, ios: tuple[str, ...] = ("direct",), labels: tuple[str, ...] | None = None,
                    levels: tuple[int | None, ...] = (None,)) -> list[dict]:
    """:data:`VARIANTS` (those named in ``labels``; None: all) at 50 %, ``--io direct``, limited, at each
    accuracy level (none with --quick)."""
    if quick or "direct" not in ios:
        return []
    return [{**dict(method=method, variant=label, row_order="natural", io="direct", budget="50%", limited=True,
                    io_threads=None, io_engine=IO_ENGINE, **_level(level)), **over}
            for level in levels for label, method, over in VARIANTS if labels is None or label in labels]


def thread_configs(quick: bool, ios: tuple[str, ...] = ("direct",)) -> list[dict]:
    """DIP-CA, --io direct at 50 %, limited, natural row order: how much the reads in flight pay, by each
    reader (``--io-engine``), the two engines' runs interleaved."""
    if "direct" not in ios:
        return []
    return [dict(method="dip-ca", row_order="natural", io="direct", budget="50%", limited=True, io_threads=t,
                 io_engine=engine, sweep=True)
            for t in ((IO_THREADS,) if quick else THREADS) for engine in ("threads", "io_uring")]


def _plot_variants(axes, rows: list[dict]) -> None:
    """The :data:`VARIANTS` rows as single points at their budget, beside the default configurations' lines."""
    for i, r in enumerate(r for r in rows if r.get("variant") and r.get("tok_s")):
        x = float(r["budget"].rstrip("%")) + 0.8 * (i - 3)  # spread the points of one budget apart
        for ax, key in zip(axes, ("tok_s", "device_mb")):
            ax.scatter([x], [r[key]], marker="xP*dv^<>"[i % 8], label=f"{r['method']} {r['variant']}")


def plot(rows: list[dict], path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len({r["budget"] for r in rows if r.get("limit_mb")}) == 1:  # levels and variants at one budget: bars
        return _bars(rows, path, f"{model}, {{budget}} budget, cgroup-limited")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    orders = sorted({r["row_order"] for r in rows})
    for method, style in (("dip-ca", "-o"), ("dense-static", "--s")):
        for io in ("mmap", "pread", "direct"):
            for order in orders:
                pts = [r for r in rows if r["method"] == method and r["io"] == io and r["row_order"] == order
                       and r.get("limit_mb") and "tok_s" in r and not r.get("variant")]
                if not pts:
                    continue
                x = [float(r["budget"].rstrip("%")) for r in pts]
                label = f"{method} {io}" + (f" {order}" if len(orders) > 1 else "")
                axes[0].plot(x, [r["tok_s"] for r in pts], style, label=label)
                axes[1].plot(x, [r["device_mb"] for r in pts], style, label=label)
    _plot_variants(axes, rows)
    axes[0].set(xlabel="row-cache budget (% of MLP bytes), cgroup-limited", ylabel="decode tok/s")
    axes[1].set(xlabel="row-cache budget (% of MLP bytes), cgroup-limited", ylabel="MB read from the device / token")
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_configs(cfgs: list[dict], paths: dict[tuple[str, str], Path], tokens: int, args) -> list[dict]:
    rows = []
    for c in cfgs:
        t = time.time()
        spec = {"policy": POLICY[c["method"]], "fused": PATHS[args.path], **c,
                "bundle": str(paths[c["method"], c["row_order"]]), "tokens": tokens, "slack": args.slack}
        res = run_in_group(spec, args.timeout)
        row = {**c, "budget": c["budget"] if c["limited"] else f"{c['budget']}, unlimited", **res,
               "load_1min": round(os.getloadavg()[0], 2)}
        if "wanted_mb" in row and row["wanted_mb"]:
            row["waste"] = row["device_mb"] / row["wanted_mb"]
        rows.append(row)
        print(f"{c['method']:12s} {c.get('variant', '-'):18s} {c['row_order']:10s} {c['io']:6s} {row['budget']:16s} "
              + (res.get("error") or f"{res['tok_s']:.1f} tok/s, wanted {res['wanted_mb']:.2f} MB, device "
                 f"{res['device_mb']:.2f} MB, {res['requests']:.0f} req/token") + f" ({time.time() - t:.0f} s)",
              flush=True)
    return rows


def ensure_peer(method: str, args, checkpoint: Path) -> tuple[list[str], Path] | str:
    """A peer's model, built once under build/ by its own tools, and the command its child runs; or the
    reason it is left out (its interpreter option not given)."""
    if method == PEERS[0]:
        if not args.genai_python:
            return "left out (no --genai-python)"
        model = ROOT / "build" / f"genai-{LLAMA_1B}-int4"
        if not (model / "genai_config.json").is_file():
            build_genai(args.genai_python, checkpoint, model)
        return child_argv(args.genai_python), model
    gguf = ROOT / "build" / f"{LLAMA_1B}-q4_0.gguf"
    if not args.llama_python or not (gguf.is_file() or args.llama_convert):
        return "left out (no --llama-python, or neither the GGUF nor --llama-convert)"
    if not gguf.is_file():
        build_gguf(args.llama_python, Path(args.llama_convert), checkpoint, gguf)
    return child_argv(args.llama_python), gguf


def levels_in(rows: list[dict]) -> list[int | None]:
    """The accuracy levels our rows ran at, the bundles' own (None) first."""
    return sorted({r.get("accuracy_level") for r in rows if r["method"] in BUNDLES}, key=lambda v: -1 if v is None else v)


def goals(rows: list[dict]) -> list[str]:
    """The issue's two ratios at the 50 % budget, limited, from this run's rows (docs/design.md §12), per
    accuracy level of our rows: the default configurations, then the fastest sparse variant against the
    fastest dense-static one; the peers' rows are the same at every level."""
    at50 = [r for r in rows if r["budget"] == "50%" and r.get("tok_s")]
    peers = [max(r["tok_s"] for r in at50 if r["method"] == m) for m in PEERS if any(r["method"] == m for r in at50)]
    levels = levels_in(rows)
    out = []
    for level in levels:
        ours = [r for r in at50 if r["method"] in BUNDLES and r.get("accuracy_level") == level]
        tag = "" if levels == [None] else f", accuracy level {'of the bundles' if level is None else level}"
        at = {r["method"]: r["tok_s"] for r in ours if not r.get("variant")}
        dip, dense = at.get("dip-ca"), at.get("dense-static")
        if dip and dense:
            out.append(f"- DIP-CA / dense-static at 50 %{tag}: {dip / dense:.2f}× (goal ≥ 1.5×: "
                       f"{'met' if dip / dense >= 1.5 else 'not met'})")
        best = {m: max((r for r in ours if r["method"] == m), key=lambda r: r["tok_s"], default=None)
                for m in BUNDLES}
        if best["dip-ca"] and best["dense-static"] and any(r.get("variant") for r in ours):
            a, b = best["dip-ca"], best["dense-static"]
            out.append(f"- the fastest sparse row ({a.get('variant') or 'dip-ca'}) / the fastest dense-static row "
                       f"({b.get('variant') or 'default'}) at 50 %{tag}: {a['tok_s'] / b['tok_s']:.2f}×")
        if dip and peers:
            out.append(f"- DIP-CA / the faster peer at the same limit{tag}: {dip / max(peers):.2f}× (goal ≥ 2×: "
                       f"{'met' if dip / max(peers) >= 2 else 'not met'})")
        fast = best["dip-ca"]
        if fast and fast.get("variant") in DIP_CA_READERS and peers:
            out.append(f"- DIP-CA with {fast['variant']} / the faster peer at the same limit{tag}: "
                       f"{fast['tok_s'] / max(peers):.2f}×")
    missing = [m for m in PEERS if not any(r["method"] == m for r in at50)]
    if missing:
        out.append(f"- no decode figure at 50 % for: {', '.join(missing)} (see the notes)")
    return out


def plot_1b(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len({r["budget"] for r in rows if r.get("limit_mb")}) == 1:
        return _bars(rows, path, "random-weight ≈1 B Llama, {budget} budget, cgroup-limited (peers under DIP-CA's limit)")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    levels = levels_in(rows)
    for method, style in (("dip-ca", "-o"), ("dense-static", "--s"), (PEERS[0], ":^"), (PEERS[1], "-.v"),
                          (PEERS[2], "-.x")):
        for level in levels if method in BUNDLES else (None,):
            pts = [r for r in rows if r["method"] == method and r.get("accuracy_level") == level and r.get("limit_mb")
                   and r.get("tok_s") and not r.get("variant")]
            if not pts:  # a peer that did not fit under any limit: the table says why
                continue
            x = [float(r["budget"].rstrip("%")) for r in pts]
            label = method + ("" if level is None else f", level {level}")
            style_l = style[-1] if len(pts) == 1 else style  # one budget: a marker, no line
            axes[0].plot(x, [r["tok_s"] for r in pts], style_l, label=label, fillstyle="none" if level == 4 else "full")
            axes[1].plot(x, [r["device_mb"] for r in pts], style_l, label=label, fillstyle="none" if level == 4 else "full")
    _plot_variants(axes, rows)
    for ax, label in zip(axes, ("decode tok/s", "MB read from the device / token")):
        ax.set(xlabel="row-cache budget (% of MLP bytes); the peers under DIP-CA's limit", ylabel=label)
        ax.set_ylim(bottom=0)
    axes[0].set_title("random-weight ≈1 B Llama, cgroup-limited", fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _bars(rows: list[dict], path: Path, title: str) -> None:
    """One limited budget: a bar per configuration that decoded under it, tok/s and device MB per token
    (``title``'s ``{budget}`` names the budget)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in rows if r.get("limit_mb") and r.get("tok_s")]
    if not pts:  # nothing decoded under the limit: the table's notes say why
        return
    labels = [_label(r) for r in pts]
    colors = ["tab:blue" if r["method"] == "dip-ca" else "tab:orange" if r["method"] == "dense-static" else "tab:gray"
              for r in pts]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(pts) + 1.5), sharey=True)
    for ax, key, unit in zip(axes, ("tok_s", "device_mb"), ("decode tok/s", "MB read from the device / token")):
        ax.barh(labels, [r[key] for r in pts], color=colors)
        ax.set(xlabel=unit)
    axes[0].invert_yaxis()  # the table's order from the top (the axes share y: once inverts both)
    axes[0].set_title(title.format(budget=pts[0]["budget"]), fontsize=9, loc="left")
    axes[0].tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _label(row: dict) -> str:
    """A row's configuration in an error line or a bar's label: its method, variant and accuracy level."""
    level = row.get("accuracy_level")
    return " ".join(v for v in (row["method"], row.get("variant"), None if level is None else f"level {level}") if v)


def median_rows(repeats: list[list[dict]]) -> list[dict]:
    """One row per configuration from the repeats' rows (the same configurations in the same order): the
    median of each figure over the runs that decoded, ``tok_s_runs`` each run's tok/s in the order run, and
    each run's ``read_ahead`` where ``--prefetch auto`` chose differently."""
    out = []
    for runs in zip(*repeats):
        ok = [r for r in runs if r.get("tok_s")]
        row = dict(runs[-1] if not ok else ok[0], repeats=len(ok))
        for key in {k for r in ok for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}:
            vals = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
            # a value every run shares (a setting such as the accuracy level) stays as it is: the median of
            # an even number of ints is a float
            row[key] = (vals[0] if len(set(vals)) == 1 else statistics.median(vals)) if vals else None
        row["tok_s_runs"] = " / ".join(f"{r['tok_s']:.2f}" for r in ok)
        if len({r.get("read_ahead") for r in ok}) > 1:  # --prefetch auto chose differently in some runs
            row["read_ahead"] = " / ".join(r.get("read_ahead") or "" for r in ok)
        if ok:
            row.pop("error", None)
            failed = [" ".join(r["error"].split()) for r in runs if not r.get("tok_s") and r.get("error")]
            if failed:  # the median is of the others: say so beside the table
                row["failed_runs"] = f"{len(failed)} of {len(runs)} runs failed ({'; '.join(failed)})"
        out.append(row)
    return out


def problem_lines(rows: list[dict], keys: tuple[str, ...] = ("budget",)) -> list[str]:
    """The lines beside a table: each distinct note once, then each configuration that decoded in no run (its
    error) or in only some (``failed_runs``, from :func:`median_rows`), named by :func:`_label` and ``keys``."""
    def name(r: dict) -> str:
        return " ".join([_label(r), *(str(r[k]) for k in keys if r.get(k))])

    return (sorted({f"- {r['note']}" for r in rows if r.get("note")})
            + [f"- {name(r)}: {' '.join(r['error'].split())}" for r in rows if r.get("error")]
            + [f"- {name(r)}: {r['failed_runs']}" for r in rows if r.get("failed_runs")])


def _with_runs(cols: list[str]) -> list[str]:
    """``cols`` with each run's tok/s (``tok_s_runs``) after the median's."""
    at = cols.index("tok_s") + 1
    return cols[:at] + ["tok_s_runs"] + cols[at:]


def section_1b(args) -> None:
    """The ≈1 B section (module docstring): ours at --io direct, then each peer under DIP-CA's limits."""
    tokens = 8 if args.quick else args.tokens
    checkpoint = ensure_checkpoint()
    paths = ensure_bundles(LLAMA_1B)
    notes = []
    info, cpu, disk = machine(), lscpu(), storage(paths["dip-ca", "natural"])
    peers = {}
    for method in PEERS:  # each built once under build/
        peer = ensure_peer(method, args, checkpoint)
        if isinstance(peer, str):
            notes.append(f"- {method}: {peer}")
        else:
            peers[method] = peer
    ours = (configs(args.quick, ("direct",), budgets=args.budgets, levels=args.accuracy_level)
            + variant_configs(args.quick, labels=args.variants, levels=args.accuracy_level))
    limits, repeats = {}, []
    for i in range(args.repeats):  # every configuration once per repeat, ours then the peers
        print(f"repeat {i + 1}/{args.repeats}", flush=True)
        rows = run_configs(ours, paths, tokens, args)
        if not limits:  # budget → the largest limit a default DIP-CA run had there in the first repeat
            for r in rows:  # (the level-4 runs need ORT's int8 scratch)
                if r["method"] == "dip-ca" and r.get("limit_mb") and not r.get("variant"):
                    limits[r["budget"]] = max(limits.get(r["budget"], 0), r["limit_mb"])
        unlimited = next(r["budget"] for r in rows if not r["limited"])
        for method, (cmd, model) in peers.items():
            for budget, limit_mb in [*limits.items(), (unlimited, None)]:
                t = time.time()
                spec = peer_spec(method, model, PROMPT, tokens, int(limit_mb * 1e6) if limit_mb else None)
                res = peer_row(run_in_group(spec, args.timeout, cmd), spec)
                rows.append({"method": method, "io": "mmap" if method in LLAMA_PEERS else "read at load",
                             "budget": budget, **res, "load_1min": round(os.getloadavg()[0], 2)})
                print(f"{method:24s} {budget:16s} " + (res.get("error") or f"{res['tok_s']:.2f} tok/s, device "
                      f"{res['device_mb']:.1f} MB/token") + f" ({time.time() - t:.0f} s)", flush=True)
        repeats.append(rows)
    rows = median_rows(repeats)
    ck = json.loads((checkpoint / "config.json").read_text())
    shape = ", ".join(f"{k} {ck[k]}" for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                               "num_attention_heads", "num_key_value_heads", "vocab_size"))
    name = args.name + ("-quick" if args.quick else "")
    text = "\n".join([
        SECTION_1B, "",
        f"`python benchmarks/flash.py {shlex.join(sys.argv[1:])}` · "
        f"{info} · {tokens} greedy tokens after \"{PROMPT}\", cold, 1 thread each; {args.repeats} interleaved "
        "repeat(s): the figures are medians, `tok_s_runs` each run's", "",
        f"**The weights are random** (scripts/random_checkpoint.py, benchmarks/llama-1b.json: {shape}; bf16; "
        f"the tokenizer is {LLAMA_1B_TOKENIZER}'s): the tokens say nothing about a trained model's; bytes, "
        "memory and speed carry over.", "",
        f"- machine (lscpu): {cpu}",
        f"- storage: {disk}",
        "- ours: streamed exports (`dipdeploy export --stream`) with a uniform plan (as the SmolLM2 bundles: "
        "`--rho-in`), BQ4, `--io direct`, native kernels, "
        f"`--path {args.path}` (`path`: fused, the joined decoder; per-layer, the host cache step); dip-ca ρ_in 0.55, LFU; dense-static ρ = 1, "
        "static pinning; `accuracy_level`: MatMulNBits and BQ4 SparseGatherMatMul at 4 (int8 activations) "
        "instead of the bundles' 0 (empty); `ahead_rows` / `ahead_used`: rows read during the attention per "
        "token and those the selection then missed. `limit_mb`: as in the SmolLM2 table above (the group's anonymous + mapped pages after "
        f"warm-up, slabs touched, MLP file dropped) + {args.slack >> 20} MiB (`--slack`; `dip belady`: + its recorded selections and next-use tables)",
        f"- peers (benchmarks/peers.py; their child dipdeploy/bench/peer_child.py, tok_s over the wall time of "
        f"the decode steps after a one-token prompt, greedy), each in its own group: {PEERS[0]} (its builder, "
        f"`-p int4 -e cpu`, its own decode loop), {PEERS[1]} (convert_hf_to_gguf.py → Q4_0, llama-cpp-python, "
        f"use_mmap; its CPU backend repacks the Q4_0 weights into anonymous memory) and "
        f"{PEERS[2]} (the same with `use_extra_bufts` off, llama.cpp's `--no-repack`: the weights are used from "
        "the mapped file's pages, which the kernel can drop). A peer's `limit_mb` is the DIP-CA run's at the same budget (the larger "
        "where DIP-CA ran at two levels), set after "
        "its warm-up with the model files dropped from the page cache; device MB from /proc/self/io", "",
        md_table(rows, ["method", "variant", "accuracy_level", "path", "io", "reader", "read_ahead", "budget", "tok_s", "tok_s_runs", "device_mb", "requests",
                        "ahead_rows", "ahead_used", "hit_rate",
                        "peak_rss_mb", "peak_group_mb", "limit_mb", "load_1min"]), "",
        "Against the goals (this run, 50 %, limited):", "", *goals(rows), "", *notes, *problem_lines(rows), ""])
    path = RESULTS / f"{name}.md"
    kept = path.read_text().split(SECTION_1B)[0].rstrip() + "\n\n" if path.is_file() else ""
    write_atomic(path, kept + text, force=True)
    write_rows_json(rows, args.json)
    plot_1b(rows, RESULTS / f"{name}-{LLAMA_1B}.png")
    print(text)


def _budgets(value: str) -> tuple[str, ...]:
    out = tuple(value.split(","))
    if not all(b.endswith("%") and b[:-1].isdigit() and 0 < int(b[:-1]) < 100 for b in out):
        raise argparse.ArgumentTypeError(f"{value!r}: give shares of the MLP bytes below 100 %, e.g. 25%,50%")
    return out


def _levels(value: str) -> tuple[int | None, ...]:
    out = tuple(None if v == "bundle" else int(v) if v in ("0", "4") else -1 for v in value.split(","))
    if -1 in out:
        raise argparse.ArgumentTypeError(f"{value!r}: give 0, 4 or bundle, comma-separated")
    return out


def _variants(value: str) -> tuple[str, ...]:
    if value == "none":
        return ()
    known = {v[0] for v in VARIANTS}
    out = tuple(value.split(","))
    if not set(out) <= known:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {sorted(set(out) - known)}: give some of "
                                         f"{sorted(known)}, or none")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50 %% + unlimited, 16 tokens")
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--model", default="smollm2-135m", help=f"a registry model, or {LLAMA_1B} (the 1 B section)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--genai-python", help=f"{LLAMA_1B}: a Python with onnxruntime-genai (and its builder's torch)")
    ap.add_argument("--llama-python", help=f"{LLAMA_1B}: a Python with llama-cpp-python and gguf")
    ap.add_argument("--llama-convert", help=f"{LLAMA_1B}: llama.cpp's convert_hf_to_gguf.py")
    ap.add_argument("--slack", type=int, default=4 << 20, help="bytes above the group's warmed-up charge in the limit")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    ap.add_argument("--io", default="mmap,pread,direct", help="io modes, comma-separated")
    ap.add_argument("--row-order", default="natural", help="bundles' row orders, comma-separated (natural,calibrated: "
                    "side by side; results in flash-row-order.md)")
    ap.add_argument("--no-thread-sweep", action="store_true", help="skip the reads-in-flight sweep")
    ap.add_argument("--path", choices=tuple(PATHS), default="default",
                    help="our engine's path: per-layer (the host cache step, fused=False) or default (the joined "
                         "decoder wherever it can run, as `dipdeploy run` chooses; Belady and --io pread stay per-layer; the default)")
    ap.add_argument("--budgets", type=_budgets, default=BUDGETS,
                    help="limited budgets, comma-separated, e.g. 50%% (the unlimited row runs at the middle one); "
                    "default: 25%%,50%%,75%%")
    ap.add_argument("--accuracy-level", type=_levels, default=(None,),
                    help="our runs' MatMulNBits / BQ4 accuracy levels, comma-separated: 0, 4 (int8 activations) or "
                    "bundle (its own, 0); default: bundle")
    ap.add_argument("--variants", type=_variants, default=None,
                    help=f"the 50 %% variants to run, comma-separated labels ({', '.join(dict.fromkeys(v[0] for v in VARIANTS))}) "
                    "or none; default: all")
    ap.add_argument("--repeats", type=positive_int, default=1, help="runs of every configuration, interleaved; "
                    "the table gives the medians")
    ap.add_argument("--name", default="flash", help="results/NAME.md and its plot (default: flash, where the "
                    "SmolLM2 and the 1 B sections each keep the other)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.model == LLAMA_1B:
        section_1b(args)
        return
    tokens = 16 if args.quick else args.tokens
    ios, orders = tuple(args.io.split(",")), tuple(args.row_order.split(","))
    paths = ensure_bundles(args.model, orders)
    info, cpu, disk = machine(), lscpu(), storage(paths["dip-ca", orders[0]])
    sweep_cfgs = [] if args.no_thread_sweep else thread_configs(args.quick, ios)
    if sweep_cfgs and "natural" not in orders:
        paths.update(ensure_bundles(args.model, ("natural",)))
    cfgs = (configs(args.quick, ios, orders, args.budgets, args.accuracy_level)
            + variant_configs(args.quick or orders != ("natural",), ios, args.variants, args.accuracy_level) + sweep_cfgs)
    repeats = []
    for i in range(args.repeats):  # every configuration once per repeat
        if args.repeats > 1:
            print(f"repeat {i + 1}/{args.repeats}", flush=True)
        repeats.append(run_configs(cfgs, paths, tokens, args))
    rows = median_rows(repeats)
    name = args.name + ("-row-order" if orders != ("natural",) else "") + ("-quick" if args.quick else "")
    sweep = [r for r in rows if r.get("sweep")]
    main_rows = [r for r in rows if not r.get("sweep")]
    text = "\n".join([
        "# Real reads from storage (benchmarks/flash.py)", "",
        f"`python benchmarks/flash.py {shlex.join(sys.argv[1:])}` · {info} · {tokens} greedy tokens after "
        f"\"{PROMPT}\", cold, native kernels, 1 ORT thread"
        + (f"; {args.repeats} interleaved repeats: the figures are medians, `tok_s_runs` each run's"
           if args.repeats > 1 else ""), "",
        f"- machine (lscpu): {cpu}",
        f"- storage: {disk}",
        f"- cgroup v1 memory limit (`limit_mb`): the child group's anonymous + mapped pages after warm-up, its slabs "
        f"touched and the MLP file dropped from the page cache, + {args.slack >> 20} MiB (`dip belady`: + its recorded selections and next-use tables, "
        "`belady_table_bytes`); empty = unlimited (the page cache may keep the file). `peak_group_mb`: the group's peak "
        "charge (anonymous + page cache) while decoding",
        "- dip-ca: LFU, the bundle's γ; dense-static: a ρ = 1 bundle, its most used rows pinned. `variant`: the "
        f"same bundles at 50 % with another policy or γ (`dip`: γ = 1, plain DIP), or the other cache split; the "
        f"rows without one use `--cache-split {CACHE_SPLIT}` (reads: the cache bytes to the groups whose misses cost "
        "most reading per byte, the down rows first; even: the same share of every group's rows)",
        f"- path (`--path {args.path}`): " + ("the per-layer graphs with the host cache step (`fused=False`)"
                                             if args.path == "per-layer" else "the engine's default (`path` per row)")
        + ", the prompt batched; benchmarks/fused.py compares the joined decoder, the default below 100 %, with the "
        "per-layer path on the same bundles", "",
        "Per decode token: `wanted_mb` the rows the caches missed; `device_mb` bytes read from the block device "
        "(/proc/self/io read_bytes from the first generated token on); `requests` the store's reads; `waste` = "
        "device / wanted.", "",
        md_table(main_rows, _with_runs(COLS) if args.repeats > 1 else COLS), "",
        *([f"Reads in flight (`--io-threads`; the main table's: each reader's default, {IO_RING_DEPTH} for the ring, "
           f"{IO_THREADS} threads) by reader (`--io-engine`: threads, a pool of pread threads; io_uring, one syscall "
           f"per batch; the main table's `{IO_ENGINE}` takes the ring where the kernel grants one): DIP-CA, `--io direct`, "
           "50 %, limited, in the order run. `flash_io_s`: seconds inside the reads over the whole call.", "",
           md_table(sweep, ["io_engine", "io_threads", "tok_s", "flash_io_s", "device_mb", "requests", "load_1min"]),
           ""]
          if sweep_cfgs else []),
        *problem_lines(rows, ("io", "budget")), ""])
    path = RESULTS / f"{name}.md"
    section = path.read_text().partition(SECTION_1B) if path.is_file() else ("", "", "")
    write_atomic(path, text + ("\n" + section[1] + section[2] if section[1] else ""), force=True)  # the 1 B one kept
    write_rows_json(rows, args.json)
    plot(main_rows, RESULTS / f"{name}.png", args.model)
    print(text)


if __name__ == "__main__":
    main()
