"""Bounded fuzz run: mutated tiny bundles through ``inspect``, ``inspect --verify`` and ``run``.

    python scripts/fuzz_bundles.py [--cases 300] [--seed 0] [--timeout 20] [--json OUT]

A bundle is a file users download and run, so a hostile one must never crash, hang, read outside its
directory or pass as another model. This exports one tiny VQ3 bundle (tiny-llama, the format with the
most tensors), then for each case copies it, applies one mutation (a manifest field set to a hostile
value, a path pointing outside, a symlink, a truncated or bit-flipped file, a removed file) and runs the
three commands in a worker process (in-process CLI calls, so a case costs milliseconds; a worker that
dies by a signal or outlives ``--timeout`` is recorded and replaced).

Each run is classified:
- ``clean``: exit code 1 or 2 with no traceback, or exit 0;
- ``traceback``: an exception escaped the CLI;
- ``crash``: the worker died by a signal; ``hang``: it outlived the timeout;
- ``outside``: a file outside the bundle was opened (a Python audit hook on ``open``, with a canary file
  beside the bundle that hostile manifests point at);
- ``accepted``: exit 0 on a *structural* mutation (paths, ranges, shapes, plan, files, and bit flips in
  the small files, whose sha256 every open checks) by a command, which must refuse those on every open.
  Bit flips inside the tensor data files (``mlp.bin``, ``dense.bin``) are caught only by ``--verify``
  (their full hash is what a streaming runtime avoids at start), so exit 0 there is counted separately
  as ``content_accepted`` and is a failure only for ``inspect --verify``.

Exit status 1 if any traceback, crash, hang, outside read or accepted structural mutation occurred.
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {"inspect": ["inspect", "{b}"], "verify": ["inspect", "{b}", "--verify"],
            "run": ["run", "{b}", "-p", "hello", "-n", "3", "--dram-budget", "50%"]}
HOSTILE = ["../canary.bin", "{canary}", "/etc/passwd", "", ".", "..", "sub/mlp.bin", "mlp.bin/..", "mlp.bin\x00x",
           -1, -4096, 2**63 - 1, 2**31, 0, 1.5, None, [], {}, "x" * 300, True]


def _tensor_fields(m: dict) -> list[tuple]:
    out = []
    for name, t in m["tensors"].items():
        out += [("tensors", name, key) for key in ("file", "offset", "length", "dtype", "shape")]
    return out


def mutations(manifest: dict, rng: random.Random) -> list[tuple[str, dict]]:
    """A list of (kind, spec) mutations; kind is "structural" or "content"."""
    out: list[tuple[str, dict]] = []
    for path in _tensor_fields(manifest):
        for value in rng.sample(HOSTILE, 3):
            out.append(("structural", {"set": path, "value": value}))
    for name in manifest["files"]:
        out.append(("structural", {"set": ("files", name, "size"), "value": rng.choice([0, -1, 10**12])}))
        out.append(("structural", {"rename_files_key": name, "value": rng.choice(["../canary.bin", "{canary}"])}))
    for role in manifest["graphs"]:
        out.append(("structural", {"set": ("graphs", role), "value": rng.choice(["{canary}", "../canary.bin",
                                                                                "/etc/passwd", 5, None])}))
    out.append(("structural", {"plan_layers": -1}))
    out.append(("structural", {"plan_layers": +1}))
    out.append(("structural", {"set": ("version",), "value": 99}))
    out.append(("structural", {"set": ("format",), "value": "other"}))
    for name in ("mlp.bin", "dense.bin"):
        out.append(("structural", {"symlink": name}))
        out.append(("structural", {"truncate": name}))
        out.append(("structural", {"remove": name}))
        for _ in range(6):
            out.append(("content", {"flip": name, "seed": rng.randrange(1 << 30)}))
    for name in ("model.onnx", "layer.0.mlp_up.onnx", "tokenizer.json", "genai_config.json"):
        for _ in range(2):  # small files: their sha256 is checked on every open
            out.append(("structural", {"flip": name, "seed": rng.randrange(1 << 30)}))
    out.append(("structural", {"remove": "manifest.json"}))
    out.append(("structural", {"garble_manifest": True}))
    return out


def apply(bundle: Path, canary: Path, kind: str, spec: dict) -> None:
    mpath = bundle / "manifest.json"
    m = json.loads(mpath.read_text())

    def resolve(v):
        return str(canary) if v == "{canary}" else v

    if "set" in spec:
        node = m
        *parents, last = spec["set"]
        for p in parents:
            node = node[p]
        node[last] = resolve(spec["value"])
    elif "rename_files_key" in spec:
        m["files"][resolve(spec["value"])] = m["files"].pop(spec["rename_files_key"])
    elif "plan_layers" in spec:
        layers = m["plan"]["layers"]
        m["plan"]["layers"] = layers[:-1] if spec["plan_layers"] < 0 else layers + [copy.deepcopy(layers[-1])]
    elif "symlink" in spec:
        target = bundle / spec["symlink"]
        shutil.copy(target, canary)
        target.unlink()
        target.symlink_to(canary)
    elif "truncate" in spec:
        target = bundle / spec["truncate"]
        with open(target, "r+b") as f:
            f.truncate(max(0, target.stat().st_size // 2))
    elif "remove" in spec:
        (bundle / spec["remove"]).unlink()
    elif "flip" in spec:
        target = bundle / spec["flip"]
        r = random.Random(spec["seed"])
        with open(target, "r+b") as f:
            for _ in range(8):
                f.seek(r.randrange(target.stat().st_size))
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ (1 << r.randrange(8))]))
    if "garble_manifest" in spec:
        mpath.write_text(mpath.read_text()[: len(mpath.read_text()) // 2])
    elif mpath.exists() and "remove" not in spec:
        mpath.write_text(json.dumps(m))


def _worker(jobs, results, canary: str, bundle_root: str) -> None:
    """Runs CLI calls in this process; reports (case, command, outcome, detail)."""
    import logging

    from typer.testing import CliRunner

    from dipdeploy.cli import app

    logging.disable(logging.CRITICAL)
    state = {"outside": None, "bundle": None}
    root = os.path.realpath(bundle_root)

    def audit(event, args):
        if event == "open" and state["bundle"] is not None and args and isinstance(args[0], (str, bytes, os.PathLike)):
            p = os.fsdecode(args[0])
            if not p:
                return
            real = os.path.realpath(p)
            inside_work = real.startswith(root + os.sep)
            in_bundle = real == state["bundle"] or real.startswith(state["bundle"] + os.sep)
            if real in (canary, "/etc/passwd") or (inside_work and not in_bundle):
                state["outside"] = real

    sys.addaudithook(audit)
    runner = CliRunner()
    while True:
        job = jobs.get()
        if job is None:
            return
        case, cmd, argv, bundle = job
        state["bundle"], state["outside"] = os.path.realpath(bundle), None
        res = runner.invoke(app, argv)
        state["bundle"] = None
        tb = res.exception is not None and not isinstance(res.exception, SystemExit)
        outcome = ("outside" if state["outside"] else "traceback" if tb else f"rc{res.exit_code}")
        detail = (state["outside"] or (repr(res.exception)[:200] if tb else res.output.strip().splitlines()[-1:]))
        results.put((case, cmd, outcome, detail))


class Pool:
    """One worker process, restarted after a crash or a hang."""

    def __init__(self, canary: Path, root: Path):
        self.ctx = mp.get_context("fork")
        self.canary, self.root = str(canary), str(root)
        self._start()

    def _start(self):
        self.jobs, self.results = self.ctx.Queue(), self.ctx.Queue()
        self.proc = self.ctx.Process(target=_worker, args=(self.jobs, self.results, self.canary, self.root),
                                     daemon=True)
        self.proc.start()

    def call(self, job, timeout: float):
        import queue

        self.jobs.put(job)
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.results.get(timeout=0.2)
            except queue.Empty:
                pass
            if not self.proc.is_alive():
                code = self.proc.exitcode
                self._start()
                return (job[0], job[1], "crash", f"worker exit code {code}")
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.join()
                self._start()
                return (job[0], job[1], "hang", f"over {timeout} s")

    def close(self):
        self.jobs.put(None)
        self.proc.join(timeout=5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds one command may take")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="dd-fuzz-"))
    try:
        base = work / "base"
        export_model(ExportConfig(model="tiny-llama", method="dip", rho_in=0.6, quant="vq3", validate_tokens=0), base)
        canary = work / "canary.bin"
        canary.write_bytes(b"CANARY" * 4096)
        cases = mutations(json.loads((base / "manifest.json").read_text()), rng)
        rng.shuffle(cases)
        cases = (cases * (a.cases // max(1, len(cases)) + 1))[: a.cases]
        pool = Pool(canary, work)
        rows, counts, t0 = [], {}, time.perf_counter()
        for i, (kind, spec) in enumerate(cases):
            b = work / f"case{i}"
            shutil.copytree(base, b, symlinks=True)
            if not canary.exists():
                canary.write_bytes(b"CANARY" * 4096)
            apply(b, canary, kind, spec)
            for cmd, argv_t in COMMANDS.items():
                argv = [x.format(b=b) for x in argv_t]
                _, _, outcome, detail = pool.call((i, cmd, argv, str(b)), a.timeout)
                if outcome == "rc0":
                    outcome = ("accepted" if kind == "structural" or cmd == "verify" else "content_accepted")
                elif outcome in ("rc1", "rc2"):
                    outcome = "clean"
                counts[outcome] = counts.get(outcome, 0) + 1
                rows.append({"case": i, "kind": kind, "mutation": {k: str(v) for k, v in spec.items()},
                             "command": cmd, "outcome": outcome, "detail": str(detail)})
            shutil.rmtree(b, ignore_errors=True)
            if (i + 1) % 50 == 0:
                print(f"fuzz: {i + 1}/{len(cases)} cases, {time.perf_counter() - t0:.0f} s, {counts}", flush=True)
        pool.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bad = {k: v for k, v in counts.items() if k in ("traceback", "crash", "hang", "outside", "accepted")}
    summary = {"cases": len(cases), "runs": len(rows), "seconds": round(time.perf_counter() - t0, 1),
               "counts": counts, "failures": bad}
    print(f"fuzz: {len(cases)} cases x {len(COMMANDS)} commands = {len(rows)} runs in {summary['seconds']} s: {counts}")
    for r in rows:
        if r["outcome"] in bad:
            print(f"  case {r['case']} {r['command']}: {r['outcome']} {r['mutation']} {r['detail']}")
    if a.json:
        a.json.write_text(json.dumps({**summary, "rows": rows}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
