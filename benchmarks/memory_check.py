"""How close the runtime's memory check (``dipdeploy.runtime.cgroup.estimate``) comes to what a run holds.

For each bundle and DRAM budget a child process opens the ``Engine`` and generates, with the check
itself switched off; it reports the estimate the engine computed (its parts), its peak resident memory
(``VmHWM``) and peak address space (``VmPeak``). Then the smallest cgroup v1 memory limit it completes
under (the bundle's files dropped from the page cache first, so its reads are charged to the group) and
the smallest ``RLIMIT_AS`` (``ulimit -v``) it completes under are found by bisection. The check is right
when the estimate lies at or above the smallest limit that fits (an accepted run fits), by a small
margin (a refused run would not have fitted), for both limits.

    python benchmarks/memory_check.py BUNDLE [BUNDLE ...] [--budget 50% --budget 100%] [--io direct --io mmap]
        [--no-bisect]

The smallest limits are bisected for the first bundle only (a large bundle's runs near their limit
thrash the page cache for minutes each); the others are held to their VmHWM and VmPeak.

Needs root (a cgroup v1 memory group). Writes benchmarks/results/memory-check.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import lscpu, machine, md_table, memory_group  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MB = 1 << 20
STEP = 2 * MB  # bisection resolution
CHILD_TIMEOUT = 180  # seconds: a run thrashing just above its limit counts as not fitting


def _child(spec: dict) -> None:
    import dipdeploy.runtime.engine as engine_mod
    from dipdeploy.runtime import cgroup, rlimit
    from dipdeploy.runtime.stats import memory_now

    seen = {}

    def spy(m, budget, kv, limit):
        seen["estimate"] = cgroup.estimate(m, budget, kv).as_dict()

    def spy_as(m, budget, kv, threads=1, limit=None, maps=None):  # the engine's own arguments: its threads, its maps
        seen["as_estimate"] = rlimit.address_space_estimate(m, budget, kv, threads, maps).as_dict()

    engine_mod.check_budget = spy
    engine_mod.check_address_space = spy_as
    e = engine_mod.Engine(spec["bundle"], dram_budget=spec["budget"], context=spec["context"], io=spec["io"])
    e.generate(list(range(1, spec["prompt"] + 1)), spec["tokens"])
    status = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmPeak", "VmSize", "VmHWM", "Threads"):
            status[k] = int(v.split()[0]) * (1024 if k != "Threads" else 1)
    print(json.dumps({**seen, **status, "backend": type(e.backend).__name__, "io": e.cfg.io,
                      "rss_end": memory_now()["VmRSS"]}))


def _run(spec: dict, cgroup_limit: int | None = None, as_limit: int | None = None) -> dict | None:
    """The child's reply, or None when it did not complete; with the cgroup's peak."""
    from dipdeploy.bench.child import drop_page_cache

    drop_page_cache(Path(spec["bundle"]))
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    with memory_group("memcheck", cgroup_limit) as (group, enter):
        def pre():
            enter()
            if as_limit is not None:
                resource.setrlimit(resource.RLIMIT_AS, (as_limit, as_limit))
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pre, timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:  # thrashing at the limit: it does not fit
            return None
        peak = int((group / "memory.max_usage_in_bytes").read_text())
    if done.returncode != 0:
        return None
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "cgroup_peak": peak}


def _smallest(fits, lo: int, hi: int) -> int:
    """The smallest limit in (lo, hi] that ``fits`` (hi must fit), to :data:`STEP`."""
    while hi - lo > STEP:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def measure(bundle: Path, budget: str, context: int, prompt: int, tokens: int, bisect: bool, io: str = "auto") -> dict:
    spec = {"bundle": str(bundle), "budget": budget, "context": context, "prompt": prompt, "tokens": tokens, "io": io}
    free = _run(spec)
    if free is None:
        raise RuntimeError(f"{bundle} at {budget} does not run without a limit")
    est, as_est = free["estimate"], free["as_estimate"]
    cg = as_fit = None
    if bisect:
        hi = max(2 * free["cgroup_peak"], est["total"] + 64 * MB)
        cg = _smallest(lambda lim: _run(spec, cgroup_limit=lim) is not None, 0, hi)
        as_fit = _smallest(lambda lim: _run(spec, as_limit=lim) is not None, free["VmSize"] // 2, 2 * free["VmPeak"])
    return {"bundle": bundle.name, "budget": budget, "backend": free["backend"], "io": free["io"],
            "threads": free["Threads"], "AS maps MB": as_est["files"] / MB,
            "planned MB": est["budget"] / MB, "process MB": est["process"] / MB, "graphs MB": est["graphs"] / MB,
            "modelled MB": est["runtime"] / MB, "estimate MB": est["total"] / MB,
            "VmHWM MB": free["VmHWM"] / MB, "cgroup peak MB": free["cgroup_peak"] / MB,
            "estimate - VmHWM MB": (est["total"] - free["VmHWM"]) / MB,
            "smallest cgroup limit MB": cg and cg / MB, "estimate - smallest MB": cg and (est["total"] - cg) / MB,
            "VmPeak MB": free["VmPeak"] / MB, "AS estimate MB": as_est["total"] / MB,
            "AS estimate - VmPeak MB": (as_est["total"] - free["VmPeak"]) / MB,
            "smallest ulimit -v MB": as_fit and as_fit / MB,
            "AS estimate - smallest MB": as_fit and (as_est["total"] - as_fit) / MB}


COLS = ["bundle", "budget", "backend", "io", "planned MB", "process MB", "graphs MB", "modelled MB", "estimate MB",
        "VmHWM MB", "estimate - VmHWM MB", "cgroup peak MB", "smallest cgroup limit MB", "estimate - smallest MB"]
AS_COLS = ["bundle", "budget", "backend", "io", "threads", "VmPeak MB", "AS maps MB", "AS estimate MB",
           "AS estimate - VmPeak MB", "smallest ulimit -v MB", "AS estimate - smallest MB"]


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        _child(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", nargs="+", type=Path)
    ap.add_argument("--budget", action="append", help="DRAM budgets (default: 50%% and 100%%)")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--io", action="append", choices=["auto", "mmap", "direct", "pread"],
                    help="the engine's --io, one row each (default: auto)")
    ap.add_argument("--no-bisect", dest="bisect", action="store_false",
                    help="one unlimited run per row: the estimate against VmHWM and VmPeak only")
    ap.add_argument("--out", type=Path, default=RESULTS / "memory-check.md")
    args = ap.parse_args()
    rows = [measure(b, budget, args.context, args.prompt, args.tokens, args.bisect and i == 0, io)
            for i, b in enumerate(args.bundles) for budget in args.budget or ["50%", "100%"]
            for io in args.io or ["auto"]]
    m = machine()
    root = Path(__file__).resolve().parents[1]
    rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "dipdeploy"],
                           capture_output=True, text=True).stdout.strip()
    revision = (rev.stdout.strip() or "unknown") + (" with changes to dipdeploy/" if dirty else "")
    text = (f"# The runtime's memory check against what a run holds\n\n"
            f"Written by `benchmarks/memory_check.py` at revision {revision} on {m['cpu']} ({m['cores']} cores; "
            f"lscpu: {lscpu()}), Python {m['python']}, load {m['load_1min']}; context {args.context}, a {args.prompt}-token prompt, "
            f"{args.tokens} new tokens, native kernels where built, the engine's default backend. The smallest "
            f"limits are bisected to {STEP // MB} MB, each run a fresh process, the bundle dropped from the page "
            f"cache first (cgroup v1 charges its reads to the group). The cgroup peak counts the page cache of "
            f"`mlp.bin`'s reads, which the kernel reclaims under a limit, and not the library pages other groups "
            f"faulted in first: the smallest limit a run completes under is the figure the check must cover, "
            f"VmHWM its bound where every page is the run's own (below 100 % it counts the shared staging pages once "
            f"per slab that maps them, `RssShmem`). Only the first bundle is bisected. The address-space estimate "
            f"counts each map of a weight file the run makes (`AS maps`: `dense.bin`; `mlp.bin` for `model.onnx`'s "
            f"session and again under `--io mmap`).\n\n"
            f"## Resident memory: the check's estimate against the smallest cgroup limit a run completes under\n\n"
            f"{md_table(rows, COLS)}\n\n"
            f"## Address space: the RLIMIT_AS estimate against the smallest `ulimit -v` a run completes under\n\n"
            f"{md_table(rows, AS_COLS)}\n")
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(args.out)
    print(text)


if __name__ == "__main__":
    main()
