"""The host runtime's memory against its budget: planned residency vs peak RSS, per prefill mode and prompt length.

Each row is one fresh process (``dipdeploy.runtime.Engine`` imported from the checkout given) that opens
the bundle under a DRAM budget, feeds a prompt (``--prefill batch``, chunked by ``--prefill-chunk``, or
``token``), generates greedy tokens and reports its planned residency (``Engine.residency``) and
``/proc/self/status``: VmHWM (peak RSS), VmRSS, RssAnon, RssFile, RssShmem (the shared staging, counted
once per slab that maps it, so VmHWM overstates by that), also right after the imports (the interpreter,
numpy, onnxruntime: part of the fixed overhead), and at the end PSS (each page once). The prompt is the first N tokens of
WikiText-2 test (``DIPDEPLOY_DATA``), tokenised here by the bundle's tokenizer and passed to the child
as a file, so the WikiText loader is not in the measured process.

Rows: budgets 25/50/100 % (native kernels, ``--io mmap``) for each prefill mode and prompt length
(``--prompts 300,1000``), the 50 % rows again with ``--io direct``, a chunk sweep (``--chunks``: prefill
tokens/s against peak RSS, what the default chunk was chosen by), one unchunked batch (the chunk as
long as the prompt), and a decode of ``--long`` tokens after the shortest prompt (300 + 700: 1,000
tokens in the KV cache of the default 1,024-token context). ``--cgroup`` runs the long row again inside
a cgroup v1 memory group limited to its planned residency + ``--overhead`` MB (the limit counts the page
cache); the group is removed afterwards. ``--before PATH`` adds the 50 % batch rows of another checkout.
``--parts`` runs some of the row groups (grid, sweep, long, before, paths), ``--modes`` some prefill modes.
``paths``: at 100 % (where ``Engine`` runs ``model.onnx`` in one session by itself, ``dipdeploy.runtime.backends.whole``)
each prompt and the long row on both paths, forced (``single_session`` True / False), with ``--cgroup`` the
long rows in a cgroup too; the other rows let the engine choose (``path`` auto: below 100 % the joined
decoder wherever it can run). ``fused``: at 50 %, mmap and direct, the long row on the per-layer graphs
with the host cache step (``fused=False``) and on the joined decoder (``dipdeploy.runtime.backends.joined``, its
prompt in chunks through the same graph), with ``--cgroup`` in a cgroup too.

    python benchmarks/memory.py --bundle build/pf-bundle --quick --json rows.json
    python benchmarks/memory.py --bundle build/pf-bundle --before /work/main --cgroup
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import lscpu, machine, md_table, write_rows_json

ROOT = Path(__file__).resolve().parent.parent
CGROUP_V1 = Path("/sys/fs/cgroup/memory")

CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from dipdeploy.runtime.stats import memory_now
imports = memory_now()
from dipdeploy.runtime import Engine
bundle, budget, io, prefill, chunk, tokens, ids_file, path = sys.argv[1:9]
options = {"prefill_chunk": int(chunk)} if int(chunk) else {}
if path == "fused":  # the per-layer graphs joined, the cache step in the graph (dipdeploy.runtime.backends.joined)
    options["fused"] = True
elif path != "auto":  # an older checkout has no single_session: only the auto rows run there
    options["single_session"] = path == "single"
    if path == "per-layer":  # the host cache step (below 100 % the default joins the graphs where it can)
        options["fused"] = False
eng = Engine(bundle, dram_budget=budget, native=True, io=io, prefill=prefill, **options)
opened = memory_now()
ids = json.load(open(ids_file))
g = eng.generate(ids, int(tokens), stop_at_eos=False)
end = memory_now()
print(json.dumps({"single_session": getattr(eng, "single_session", False), "planned": eng.residency.total, "prefill_planned": eng.residency.prefill, "kv": eng.residency.kv,
                  "imports": imports, "opened": opened, "end": end, "new_tokens": len(g.tokens),
                  "prefill_tok_s": g.stats.prefill_tok_s, "decode_tok_s": g.stats.decode_tok_s}))
"""


def measure(checkout: Path, bundle: Path, ids_file: Path, budget: str, io: str, prefill: str, chunk: int,
            tokens: int, overhead_mb: float, cgroup: Path | None = None, path: str = "auto") -> dict:
    """One fresh process; ``chunk`` 0 keeps the checkout's default (an older checkout has no chunk)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    pre = None
    if cgroup is not None:
        def pre():  # enter the group before the interpreter allocates anything
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    p = subprocess.run([sys.executable, "-c", CHILD, str(bundle), budget, io, prefill, str(chunk), str(tokens),
                        str(ids_file), path], cwd=checkout, env=env, capture_output=True, text=True, preexec_fn=pre)
    if p.returncode != 0:
        return {"rc": p.returncode, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    mb = 1e6
    peak = r["end"]["VmHWM"] / mb
    planned = r["planned"] / mb
    return {"rc": 0, "single_session": r["single_session"], "planned_mb": planned, "prefill_planned_mb": r["prefill_planned"] / mb, "kv_mb": r["kv"] / mb,
            "imports_mb": r["imports"]["VmRSS"] / mb, "opened_mb": r["opened"]["VmHWM"] / mb, "peak_rss_mb": peak,
            "anon_mb": r["end"]["RssAnon"] / mb, "file_mb": r["end"]["RssFile"] / mb,
            "shmem_mb": r["end"].get("RssShmem", 0) / mb, "pss_mb": r["end"].get("Pss", 0) / mb,
            "over_plan_mb": peak - planned, "within": "yes" if peak <= planned + overhead_mb else "no",
            "prefill_tok_s": r["prefill_tok_s"], "decode_tok_s": r["decode_tok_s"]}


def in_cgroup(row: dict, planned_mb: float, overhead_mb: float, **kw) -> dict:
    group = CGROUP_V1 / f"dipdeploy-mem-{os.getpid()}"
    group.mkdir()
    try:
        limit = int((planned_mb + overhead_mb) * 1e6)
        (group / "memory.limit_in_bytes").write_text(str(limit))
        r = measure(**kw, overhead_mb=overhead_mb, cgroup=group)
        r["limit_mb"] = limit / 1e6
        r["cgroup_max_usage_mb"] = int((group / "memory.max_usage_in_bytes").read_text()) / 1e6
        r["limit_hits"] = int((group / "memory.failcnt").read_text())
        return {**row, "cgroup": True, **r}
    finally:
        group.rmdir()


def prompt_files(bundle: Path, lengths: list[int], folder: Path) -> dict[int, Path]:
    """The first N tokens of WikiText-2 test for each N, one JSON file each."""
    from tokenizers import Tokenizer

    from dipdeploy.data import wikitext_text

    ids = Tokenizer.from_file(str(bundle / "tokenizer.json")).encode(wikitext_text("test")[: 60 * max(lengths)]).ids
    if len(ids) < max(lengths):
        raise SystemExit(f"only {len(ids)} prompt tokens; give shorter --prompts")
    out = {}
    for n in lengths:
        out[n] = folder / f"prompt-{n}.json"
        out[n].write_text(json.dumps(ids[:n]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--before", type=Path, default=None, help="another checkout: its 50 %% batch rows beside")
    ap.add_argument("--prompts", default="300,1000", help="prompt lengths (tokens)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens generated after each prompt")
    ap.add_argument("--long", type=int, default=700, help="tokens generated after the shortest prompt in the long row")
    ap.add_argument("--chunks", default="64,128,256,512", help="--prefill-chunk sweep at the longest prompt, 50 %%")
    ap.add_argument("--overhead", type=float, default=200.0, help="the fixed overhead (MB) the rows are held to")
    ap.add_argument("--cgroup", action="store_true", help="run the long row again in a cgroup of plan + overhead")
    ap.add_argument("--quick", action="store_true", help="50 %% only, one prompt of 300, no sweep, long run of 200")
    ap.add_argument("--parts", default="grid,sweep,long,before,paths", help="row groups to run")
    ap.add_argument("--modes", default="batch,token", help="prefill modes of the grid")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    lengths = [300] if a.quick else [int(n) for n in a.prompts.split(",")]
    budgets = ["50%"] if a.quick else ["25%", "50%", "100%"]
    long = 200 if a.quick else a.long
    bundle, longest, parts = a.bundle.resolve(), max(lengths), a.parts.split(",")
    rows = []

    def row(checkout=ROOT, budget="50%", io="mmap", prefill="batch", chunk=0, n=longest, tokens=a.tokens, path="auto",
            **extra):
        base = {"checkout": "before" if checkout != ROOT else "this", "path": path, "budget": budget, "io": io,
                "prefill": prefill, "chunk": chunk or ("default" if prefill == "batch" else ""), "prompt": n, "tokens": tokens}
        kw = dict(checkout=checkout, bundle=bundle, ids_file=files[n], budget=budget, io=io, prefill=prefill,
                  chunk=chunk, tokens=tokens, path=path)
        r = {**base, **measure(**kw, overhead_mb=a.overhead), **extra}
        rows.append(r)
        print(r, file=sys.stderr, flush=True)
        return r, kw

    with tempfile.TemporaryDirectory() as tmp:
        files = prompt_files(bundle, sorted({*lengths, 1}), Path(tmp))
        for n in lengths if "grid" in parts else []:
            for prefill in a.modes.split(","):
                for budget in budgets:
                    row(budget=budget, prefill=prefill, n=n)
            row(io="direct", n=n)
        if not a.quick and "sweep" in parts:
            for chunk in (int(c) for c in a.chunks.split(",")):
                row(chunk=chunk)
            row(chunk=longest, note="unchunked")
        if a.before is not None and "before" in parts:
            for n in lengths:
                row(checkout=a.before.resolve(), n=n)
        longs = []
        if "long" in parts:
            longs.append(row(n=min(lengths), tokens=long))
        if "paths" in parts:
            for n in lengths:
                for path in ("per-layer", "single"):
                    row(budget="100%", n=n, path=path)
            longs += [row(budget="100%", n=min(lengths), tokens=long, path=path) for path in ("per-layer", "single")]
        if "fused" in parts:
            longs += [row(budget="50%", io=io, n=min(lengths), tokens=long, path=path)
                      for io in ("mmap", "direct") for path in ("per-layer", "fused")]
        for long_row, kw in longs if a.cgroup else []:
            if long_row.get("rc") != 0:
                continue
            keys = ("checkout", "path", "budget", "io", "prefill", "chunk", "prompt", "tokens")
            r = in_cgroup({k: long_row[k] for k in keys}, long_row["planned_mb"], a.overhead, **kw)
            rows.append(r)
            print(r, file=sys.stderr, flush=True)
    print(json.dumps({**machine(), "lscpu": lscpu()}))
    print(md_table(rows, ["checkout", "path", "single_session", "prefill", "chunk", "prompt", "tokens", "budget", "io", "cgroup", "limit_mb",
                          "planned_mb", "prefill_planned_mb", "opened_mb", "peak_rss_mb", "over_plan_mb", "within",
                          "anon_mb", "file_mb", "shmem_mb", "pss_mb", "cgroup_max_usage_mb", "limit_hits", "rc", "prefill_tok_s",
                          "decode_tok_s"]))
    write_rows_json([{**r, "machine": machine()} for r in rows], a.json)


if __name__ == "__main__":
    main()
