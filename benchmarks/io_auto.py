"""What ``dipdeploy run``'s ``--io`` default costs: ``auto`` (what it picks) beside ``mmap`` and ``direct``,
without a memory limit and under the limit the README promises (the plan + its stated fixed overhead).

A DRAM budget is kept only if the reads bypass the page cache: ``mmap`` leaves every page it touched in
the page cache, which a cgroup memory limit counts, so once the MLP file does not fit beside the plan
the kernel evicts its pages and faults them in again, one block at a time (dipdeploy/runtime/flash.py,
``choose_io``). Each configuration runs ``dipdeploy run BUNDLE --dram-budget B --io IO --cold`` in a fresh
cgroup v1 memory group (page cache counted; ``--cold`` drops the MLP file first so its pages are charged
to the group that reads them), unlimited or limited to the plan (the run's own ``resident`` total, probed
once) + ``--overhead``; the repeats interleave the configurations, the table gives medians.

    python benchmarks/io_auto.py                         # the ≈1 B model's DIP-CA bundle at 50 %
    python benchmarks/io_auto.py --model smollm2-135m --quick --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from _common import lscpu, machine, md_table, memory_group, positive_int, publish

import flash

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
IOS = ("auto", "mmap", "direct")
#: the child runs the CLI and prints its process's bytes read from the block device when it exits
CHILD = ("import sys\nfrom dipdeploy.cli import app\nfrom peers import read_bytes\ntry:\n    app()\nfinally:\n"
         "    print('READ_BYTES', read_bytes(), file=sys.stderr)\n")


def run_once(bundle: Path, io: str, budget: str, tokens: int, limit: int | None, out: Path) -> dict:
    argv = [sys.executable, "-c", CHILD, "run", str(bundle), "-p", flash.PROMPT, "-n", str(tokens), "--dram-budget",
            budget, "--io", io, "--cold", "--json", str(out), "--force"]
    with memory_group(f"io-auto-{io}", limit) as (group, enter):
        p = subprocess.run(argv, preexec_fn=enter, capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "benchmarks")))})
        peak = int((group / "memory.max_usage_in_bytes").read_text())
    if p.returncode:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"exit {p.returncode}: {last}", "peak_group_mb": peak / 1e6}
    read = [int(line.split()[1]) for line in p.stderr.splitlines() if line.startswith("READ_BYTES ")]
    d = json.loads(out.read_text())
    return {"chose": d["io"], "tok_s": d["decode_tok_s"], "plan_mb": d["resident"]["total"] / 1e6,
            "device_mb_run": read[-1] / 1e6 if read else None, "peak_group_mb": peak / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=flash.LLAMA_1B, help=f"{flash.LLAMA_1B} (random weights, default) or "
                    "smollm2-135m: its DIP-CA bundle from benchmarks/flash.py (exported if missing)")
    ap.add_argument("--budget", default="50%", help="--dram-budget of every run")
    ap.add_argument("--tokens", type=positive_int, default=16, help="tokens generated per run")
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--overhead", type=float, default=200.0, help="MB above the plan the limited runs get (the "
                    "README's stated fixed overhead)")
    ap.add_argument("--quick", action="store_true", help="one repeat of 8 tokens")
    ap.add_argument("--json", help="write the rows as JSON")
    ap.add_argument("--name", default="io-auto", help="results/NAME.md (default: io-auto)")
    args = ap.parse_args()
    repeats, tokens = (1, 8) if args.quick else (args.repeats, args.tokens)
    bundle = flash.ensure_bundles(args.model)["dip-ca", "natural"]
    runs: dict[tuple[str, bool], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        probe = run_once(bundle, "direct", args.budget, 2, None, Path(tmp) / "probe.json")
        if "error" in probe:
            raise SystemExit(f"error: the probe run failed: {probe['error']}")
        limit = int((probe["plan_mb"] + args.overhead) * 1e6)
        for rep in range(repeats):
            for io in IOS:
                for limited in (False, True):
                    r = run_once(bundle, io, args.budget, tokens, limit if limited else None, Path(tmp) / "run.json")
                    print(f"repeat {rep + 1}/{repeats} --io {io} {'limited' if limited else 'unlimited'}: {r}",
                          file=sys.stderr, flush=True)
                    runs.setdefault((io, limited), []).append(r)
    rows = []
    for (io, limited), rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        row = {"io": io, "chose": ok[0]["chose"] if ok else "", "limit_mb": round(limit / 1e6, 1) if limited else "",
               "tok_s": float(np.median([r["tok_s"] for r in ok])) if ok else "",
               "tok_s_runs": " / ".join(f"{r['tok_s']:.2f}" if "error" not in r else "failed" for r in rs),
               "device_mb_run": float(np.median([r["device_mb_run"] for r in ok if r["device_mb_run"] is not None]))
               if ok else "",
               "peak_group_mb": float(np.median([r["peak_group_mb"] for r in rs])),
               "plan_mb": float(np.median([r["plan_mb"] for r in ok])) if ok else ""}
        row["errors"] = "; ".join(r["error"] for r in rs if "error" in r)
        rows.append(row)
    cols = ["io", "chose", "limit_mb", "tok_s", "tok_s_runs", "device_mb_run", "peak_group_mb", "plan_mb"]
    text = "\n".join([
        "# `--io auto` against mmap and direct, with and without a memory limit (benchmarks/io_auto.py)", "",
        f"`python benchmarks/io_auto.py {' '.join(sys.argv[1:])}` · {machine()} · lscpu: {lscpu()}", "",
        f"- bundle `{bundle.name}` (DIP-CA, BQ4, LFU), `dipdeploy run --dram-budget {args.budget} --cold`, {tokens} "
        f"greedy tokens after \"{flash.PROMPT}\", 1 ORT thread, the default path; {repeats} interleaved repeat(s), "
        f"medians",
        f"- `limit_mb`: a cgroup v1 memory group (page cache counted) limited to the plan of `--io direct` "
        f"({probe['plan_mb']:.1f} MB, the run's `resident` total, its read buffer included) + {args.overhead:g} MB; "
        f"empty: no limit; `plan_mb`: each row's own plan (`mmap` holds no read buffer). `chose`: what `--io` ran (`auto` "
        f"resolves once the plan is known). `device_mb_run`: the process's bytes from the block device over the "
        f"whole run (/proc/self/io `read_bytes`: opening, prompt and decode). `peak_group_mb`: the group's peak "
        f"charge, page cache included",
        f"- load (1 min) at the end: {os.getloadavg()[0]:.2f}", "",
        md_table(rows, cols), "",
        *[f"- `--io {r['io']}`{' limited' if r['limit_mb'] else ''}: {r['errors']}" for r in rows if r["errors"]], ""])
    publish(RESULTS, args.name, args.quick, text, rows, args.json)


if __name__ == "__main__":
    main()
