"""Bounded fuzz run: mutated tiny bundles through ``inspect``, ``inspect --verify`` and ``run``.

    python scripts/fuzz_bundles.py [--cases 300] [--seed 0] [--timeout 20] [--strace-share 0.25] [--json OUT]

A bundle is a file users download and run, so a hostile one must never crash, hang, read outside its
directory or pass as another model. This exports one tiny VQ3 bundle (tiny-llama, the format with the
most tensors) and a second one of the same shapes (tiny-llama3: other weights, other tokens), then for
each case copies the first, applies one mutation of one class (scripts/fuzz_mutations.py: the manifest,
the data files, a graph, the tokenizer, the configs with their sha256 recomputed, hard links, FIFOs, a
link swapped in during ``run``, ``export --force`` racing ``run``; the classes share the cases evenly,
the swaps and races get a few) and runs the three commands in a worker process (dipdeploy/devtools/fuzzwatch.py:
in-process CLI calls, so a case costs milliseconds; a worker that dies by a signal or outlives
``--timeout`` is recorded and replaced). A share of the cases runs in a second worker under ``strace``.

Each run is classified:
- ``clean``: exit code 1 or 2 with no traceback, or exit 0 where that is right;
- ``traceback``: an exception escaped the CLI;
- ``crash``: the worker died by a signal; ``hang``: it outlived the timeout;
- ``outside``: a file outside the bundle was opened (the canary beside it, which mutations point at,
  ``/etc/passwd``, another folder): seen by an audit hook, by scanning the worker's ``/proc`` fds and
  maps, or in the strace log (fuzzwatch's docstring);
- ``accepted``: exit 0 by a command the mutation's spec says must refuse it (``refuse``);
- ``mixed``: ``run`` exited 0 with tokens that neither whole bundle gives alone (a swap or a race);
- ``content_accepted``: exit 0 where no check can tell (a data file's bits for ``inspect`` and ``run``,
  an edit the hashed file vouches for); not a failure.

Exit status 1 if any traceback, crash, hang, outside read, accepted or mixed run occurred.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from fuzz_mutations import MAKERS, SHARED, apply, swap_in
from dipdeploy.devtools.fuzzwatch import STRACE, Judge, Worker, strace_outside

PROMPT = "The capital of France is"  # where the two tiny models' greedy tokens part within 12
COMMANDS = {"inspect": ["inspect", "{b}"], "verify": ["inspect", "{b}", "--verify"],
            "run": ["run", "{b}", "-p", PROMPT, "-n", "12", "--dram-budget", "50%", "-q", "--json", "{j}", "--force"]}
FAILURES = ("traceback", "crash", "hang", "outside", "accepted", "mixed")
RACE_RUNS = 40  # the most runs one race case makes while its export builds


def plan(manifest: dict, rng: random.Random, cases: int) -> list[dict]:
    """``cases`` specs: the shared classes in equal shares, a few swaps and races, in a seeded order."""
    swaps = cases // 30 if cases >= 30 else 0
    races = max(1, cases // 100) if cases >= 50 else 0
    classes = [SHARED[i % len(SHARED)] for i in range(cases - swaps - races)] + ["swap"] * swaps + ["race"] * races
    rng.shuffle(classes)
    return [MAKERS[c](manifest, rng) for c in classes]


def classify(spec: dict, cmd: str, outcome: str, tokens, expect: list | None) -> str:
    if outcome in ("rc1", "rc2"):
        return "clean"
    if outcome != "rc0":
        return outcome if outcome in FAILURES else "crash"
    if cmd in spec["refuse"]:
        return "accepted"
    if cmd == "run" and expect is not None:
        return "clean" if tokens in expect else "mixed"
    return "clean" if spec["cls"] in ("swap", "race") else "content_accepted"


class Fuzz:
    def __init__(self, a, work: Path, out: Path, bundles: dict, configs: dict):
        self.a, self.work, self.out, self.bundles, self.configs = a, work, out, bundles, configs
        self.canary = work / "canary.bin"
        self.plain = Worker(work, self.canary)
        traced = a.strace_share > 0 and os.access(STRACE, os.X_OK)
        self.traced = Worker(work, self.canary, log=out / "strace.log") if traced else None
        self.rows, self.jobs, self.tokens = [], {}, {}

    def fresh_canary(self) -> None:
        self.canary.unlink(missing_ok=True)
        self.canary.write_bytes(b"CANARY" * 4096)

    def call(self, worker: Worker, case: int, spec: dict, cmd: str, bundle: Path, expect=None, during=None,
             record: bool = True):
        job_id = len(self.jobs)
        json_out = self.out / "run.json"
        json_out.unlink(missing_ok=True)
        job = {"id": job_id, "argv": [x.format(b=bundle, j=json_out) for x in COMMANDS[cmd]], "bundle": str(bundle),
               "race": spec["cls"] == "race", "json": str(json_out) if cmd == "run" else None}
        self.jobs[job_id] = job
        ino = self.canary.stat().st_ino if self.canary.exists() else None
        outcome, detail, tokens, seen = worker.call(job, self.a.timeout, ino, during)
        if seen and outcome not in ("crash", "hang"):
            outcome, detail = "outside", f"{seen} (/proc scan)"
        if record:
            self.rows.append({"case": case, "job": job_id, "class": spec["cls"], "strace": worker is self.traced,
                              "mutation": {k: str(v) for k, v in spec.items()}, "command": cmd,
                              "outcome": classify(spec, cmd, outcome, tokens, expect), "detail": str(detail),
                              "tokens": tokens})
        return tokens

    def case(self, i: int, spec: dict, traced: bool) -> None:
        worker = self.traced if traced else self.plain
        b = self.work / f"case{i}"
        first = spec.get("race", "A")
        shutil.copytree(self.bundles[first], b, symlinks=True)
        self.fresh_canary()
        if spec["cls"] == "race":
            return self.race(i, spec, worker, b, first)
        apply(b, self.canary, spec, self.bundles["B"])
        if spec["cls"] == "swap":
            def swapper():
                time.sleep(spec["delay"])
                swap_in(b, self.canary, spec["swap"], self.bundles["B"])
            t = threading.Thread(target=swapper)
            self.call(worker, i, spec, "run", b, expect=[self.tokens["A"]], during=t)
            t.join()
            for cmd in ("inspect", "verify"):
                self.call(worker, i, spec, cmd, b)
        else:
            for cmd in COMMANDS:
                self.call(worker, i, spec, cmd, b)
        shutil.rmtree(b, ignore_errors=True)

    def race(self, i: int, spec: dict, worker: Worker, b: Path, first: str) -> None:
        """``export --force`` of the other model into ``b`` in a thread; ``run`` again and again meanwhile
        (either bundle's tokens, or a clean refusal), then all three commands on what it left."""
        from dipdeploy.export.bundle import export_model

        second = "B" if first == "A" else "A"
        failed = []

        def export():
            try:
                export_model(self.configs[second], b, force=True)
            except Exception as exc:  # reported as the case's detail; the runs are judged all the same
                failed.append(repr(exc)[:200])

        t = threading.Thread(target=export)
        t.start()
        for _ in range(RACE_RUNS):
            if not t.is_alive():
                break
            self.call(worker, i, spec, "run", b, expect=[self.tokens["A"], self.tokens["B"]])
        t.join()
        for cmd in COMMANDS:
            self.call(worker, i, spec, cmd, b, expect=[self.tokens[second]] if not failed else None)
        if failed:
            self.rows[-1]["detail"] += f"; the export failed: {failed[0]}"
        shutil.rmtree(b, ignore_errors=True)

    def reference(self) -> None:
        """Each whole bundle's tokens alone, from the same worker and command as the cases."""
        for name, bundle in self.bundles.items():
            spec = {"cls": "reference", "refuse": []}
            self.tokens[name] = self.call(self.plain, -1, spec, "run", bundle, record=False)
            if not isinstance(self.tokens[name], list):
                raise SystemExit(f"fuzz: the unmutated bundle {name} did not run; fix that first")

    def close(self) -> None:
        for w in (self.plain, self.traced):
            if w is not None:
                w.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds one command may take")
    ap.add_argument("--strace-share", type=float, default=0.25, help="share of the cases run under strace (0: none)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    rng, pick = random.Random(a.seed), random.Random(a.seed + 1)
    work, out = Path(tempfile.mkdtemp(prefix="dd-fuzz-")), Path(tempfile.mkdtemp(prefix="dd-fuzz-out-"))
    configs = {name: ExportConfig(model=model, method="dip", rho_in=0.6, quant="vq3", validate_tokens=0)
               for name, model in (("A", "tiny-llama"), ("B", "tiny-llama3"))}
    t0 = time.perf_counter()
    try:
        bundles = {"A": work / "base", "B": work / "other"}
        for name, cfg in configs.items():
            export_model(cfg, bundles[name])
        fuzz = Fuzz(a, work, out, bundles, configs)
        fuzz.reference()
        if fuzz.tokens["A"] == fuzz.tokens["B"]:
            print("fuzz: note: both bundles give the same tokens, so a mixed run cannot be told from a whole one")
        specs = plan(json.loads((bundles["A"] / "manifest.json").read_text()), rng, a.cases)
        traced_cases = 0
        try:
            for i, spec in enumerate(specs):
                traced = fuzz.traced is not None and pick.random() < a.strace_share
                traced_cases += traced
                fuzz.case(i, spec, traced)
                if (i + 1) % 50 == 0:
                    print(f"fuzz: {i + 1}/{len(specs)} cases, {time.perf_counter() - t0:.0f} s", flush=True)
        finally:
            fuzz.close()
        if fuzz.traced is not None:
            for job, path in strace_outside(fuzz.traced.logs, Judge(str(work), str(fuzz.canary)), fuzz.jobs).items():
                for r in fuzz.rows:
                    if r["job"] == job and r["outcome"] not in ("crash", "hang"):
                        r["outcome"], r["detail"] = "outside", f"{path} (strace)"
        rows = fuzz.rows
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    counts, by_class = {}, {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        c = by_class.setdefault(r["class"], {})
        c[r["outcome"]] = c.get(r["outcome"], 0) + 1
    bad = {k: v for k, v in counts.items() if k in FAILURES}
    summary = {"cases": len(specs), "runs": len(rows), "seconds": round(time.perf_counter() - t0, 1),
               "strace_cases": traced_cases, "tokens": fuzz.tokens, "counts": counts, "by_class": by_class,
               "failures": bad}
    print(f"fuzz: {len(specs)} cases ({traced_cases} under strace), {len(rows)} runs in {summary['seconds']} s: {counts}")
    outcomes = ["clean", "content_accepted", *FAILURES]
    print(f"  {'class':<10}{'cases':>6}{'runs':>6}" + "".join(f"{o:>{max(7, len(o) + 1)}}" for o in outcomes))
    for cls in [*SHARED, "swap", "race"]:
        c = by_class.get(cls, {})
        n = len({r["case"] for r in rows if r["class"] == cls})
        print(f"  {cls:<10}{n:>6}{sum(c.values()):>6}" + "".join(f"{c.get(o, 0):>{max(7, len(o) + 1)}}"
                                                               for o in outcomes))
    for r in rows:
        if r["outcome"] in bad:
            print(f"  case {r['case']} {r['command']}: {r['outcome']} {r['mutation']} {r['detail']}")
    if a.json:
        a.json.write_text(json.dumps({**summary, "rows": rows}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
