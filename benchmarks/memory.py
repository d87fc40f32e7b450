"""The host runtime's memory against its budget: planned residency vs peak RSS, two checkouts side by side.

Each row is one fresh process (``dipdeploy.runtime.Engine`` imported from the checkout given) that
opens the bundle under a DRAM budget, generates greedy tokens and reports its planned residency
(``Engine.residency``) and ``/proc/self/status``: VmHWM (peak RSS), VmRSS, RssAnon, RssFile, also
right after the imports (the interpreter, numpy, onnxruntime: part of the fixed overhead). Rows:
budgets 25/50/75/100 % of the MLP rows (native op library and the stock-ORT fallback), the 50 % row
with the other ``--io`` (its Flash read time per token beside), and one long run of ``--long`` tokens
at 50 %. ``--cgroup MB`` runs each checkout's long 50 % row (and a short fallback one) again inside a
cgroup v1 memory group limited to its planned residency + MB (the limit counts the page cache too);
the group is removed afterwards. ``--before`` is the reference checkout (default /work/main).

    python benchmarks/memory.py --bundle build/mem-bundle --quick --json rows.json
    python benchmarks/memory.py --bundle build/mem-bundle --cgroup 150
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from _common import machine, md_table, write_rows_json

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The capital of France is"
CGROUP_V1 = Path("/sys/fs/cgroup/memory")

CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from dipdeploy.runtime.stats import memory_now
imports = memory_now()
from dipdeploy.runtime import Engine
bundle, budget, native, io, tokens = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4], int(sys.argv[5])
eng = Engine(bundle, dram_budget=budget, native=native, io=io)
opened = memory_now()
g = eng.generate(sys.argv[6], tokens, stop_at_eos=False)
end = memory_now()
print(json.dumps({"planned": eng.residency.total, "kv": eng.residency.kv, "dense": eng.residency.dense,
                  "imports": imports, "opened": opened, "end": end, "new_tokens": len(g.tokens),
                  "decode_tok_s": g.stats.decode_tok_s,
                  "flash_io_ms": 1e3 * g.stats.seconds["flash_io"] / (len(g.tokens) + len(eng.encode(sys.argv[6])))}))
"""


def measure(checkout: Path, bundle: Path, budget: str, native: bool, io: str, tokens: int,
            cgroup: Path | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    pre = None
    if cgroup is not None:
        def pre():  # enter the group before the interpreter allocates anything
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    p = subprocess.run([sys.executable, "-c", CHILD, str(bundle), budget, "1" if native else "0", io, str(tokens),
                        PROMPT], cwd=checkout, env=env, capture_output=True, text=True, preexec_fn=pre)
    if p.returncode != 0:
        return {"rc": p.returncode, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    mb = 1e6
    return {"rc": 0, "planned_mb": r["planned"] / mb, "kv_mb": r["kv"] / mb, "dense_mb": r["dense"] / mb,
            "imports_mb": r["imports"]["VmRSS"] / mb, "peak_rss_mb": r["end"]["VmHWM"] / mb,
            "rss_end_mb": r["end"]["VmRSS"] / mb, "anon_mb": r["end"]["RssAnon"] / mb,
            "file_mb": r["end"]["RssFile"] / mb, "ratio": r["end"]["VmHWM"] / r["planned"],
            "over_plan_mb": (r["end"]["VmHWM"] - r["planned"]) / mb, "tok_s": r["decode_tok_s"],
            "flash_io_ms_per_token": r["flash_io_ms"]}


def in_cgroup(checkout: Path, bundle: Path, planned_mb: float, overhead_mb: float, native: bool, io: str,
              tokens: int) -> dict:
    group = CGROUP_V1 / f"dipdeploy-mem-{os.getpid()}"
    group.mkdir()
    try:
        limit = int((planned_mb + overhead_mb) * 1e6)
        (group / "memory.limit_in_bytes").write_text(str(limit))
        row = measure(checkout, bundle, "50%", native, io, tokens, cgroup=group)
        row["limit_mb"] = limit / 1e6
        row["cgroup_max_usage_mb"] = int((group / "memory.max_usage_in_bytes").read_text()) / 1e6
        row["oom_kills"] = int((group / "memory.failcnt").read_text())
        return row
    finally:
        group.rmdir()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--before", type=Path, default=Path("/work/main"))
    ap.add_argument("--after", type=Path, default=ROOT)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--long", type=int, default=1000)
    ap.add_argument("--io", default="mmap", choices=["mmap", "pread"])
    ap.add_argument("--cgroup", type=float, default=None, help="overhead MB above the plan for the cgroup runs")
    ap.add_argument("--quick", action="store_true", help="50%% only, 16 tokens, long run of 200")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    budgets = ["50%"] if a.quick else ["25%", "50%", "75%", "100%"]
    tokens, long = (16, 200) if a.quick else (a.tokens, a.long)
    bundle = a.bundle.resolve()
    rows = []
    for native in (True, False):
        for budget in budgets:
            for name, checkout in (("before", a.before), ("after", a.after)):
                r = measure(checkout, bundle, budget, native, a.io, tokens)
                rows.append({"checkout": name, "native": native, "budget": budget, "io": a.io, "tokens": tokens, **r})
                print(rows[-1], file=sys.stderr, flush=True)
    other = "pread" if a.io == "mmap" else "mmap"
    for name, checkout in (("before", a.before), ("after", a.after)):
        r = measure(checkout, bundle, "50%", True, other, tokens)
        rows.append({"checkout": name, "native": True, "budget": "50%", "io": other, "tokens": tokens, **r})
        print(rows[-1], file=sys.stderr, flush=True)
    for name, checkout in (("before", a.before), ("after", a.after)):
        r = measure(checkout, bundle, "50%", True, a.io, long)
        rows.append({"checkout": name, "native": True, "budget": "50%", "io": a.io, "tokens": long, **r})
        print(rows[-1], file=sys.stderr, flush=True)
    if a.cgroup is not None:
        for name, checkout in (("before", a.before), ("after", a.after)):
            plan = next(r for r in rows if r["checkout"] == name and r["budget"] == "50%" and r.get("rc") == 0)
            for native, n in ((True, long), (False, tokens)):
                r = in_cgroup(checkout, bundle, plan["planned_mb"], a.cgroup, native, a.io, n)
                rows.append({"checkout": name, "native": native, "budget": "50%", "io": a.io, "tokens": n,
                             "cgroup": True, **r})
                print(rows[-1], file=sys.stderr, flush=True)
    print(json.dumps(machine()))
    print(md_table(rows, ["checkout", "native", "budget", "io", "tokens", "cgroup", "limit_mb", "planned_mb",
                          "peak_rss_mb", "ratio", "over_plan_mb", "anon_mb", "file_mb", "imports_mb",
                          "cgroup_max_usage_mb", "oom_kills", "rc", "tok_s", "flash_io_ms_per_token"]))
    write_rows_json(rows, a.json)


if __name__ == "__main__":
    main()
