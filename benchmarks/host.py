"""The host runtime's overhead per decoded token: ORT kernel time, storage wait and everything else.

SmolLM2-135M DIP-CA BQ4 (the bundle ``dipdeploy demo`` exports: ρ = 0.5, ρ_in = 0.55, γ = 0.5, LFU),
native kernels, 1 ORT thread, Flash reads through mmap. Per budget (100 %: all in DRAM after the
prompt; 50 %), side by side in one run and interleaved per repeat so load hits both alike:

* ``numpy``: the per-token cache step in numpy (``EngineConfig(native_cache=False)``, the reference);
* ``native``: the step in the op library (custom_ops/src/cache/);
* ``single`` (100 % only): ``model.onnx`` in one session per token (``dipdeploy.runtime.backends.whole``: every
  row resident, so DIP-CA is plain DIP), the mode ``Engine`` picks by itself at a budget that holds every
  row; ``numpy`` and ``native`` are forced onto the per-layer graphs there (``single_session=False``);
* ``fused`` (both budgets): the per-layer graphs joined into one session per token with the cache step
  inside the graph (``dipdeploy.runtime.backends.joined``: the native step as the CacheStep/CacheSettle nodes, the
  same decisions as ``native``); the prompt is fed token by token there, so its decode starts from the same
  caches as ``native`` only at 100 % after the prompt, and the 50 % hit rates differ by the prompt's
  batched warm-up;
* ``genai``: the same bundle's ``model.onnx`` in onnxruntime-genai's own loop (scripts/genai_decode.py
  with the Python of ``--genai-python``, 1 intra-op thread): the target of the host-overhead goal.

Split of a decode token (ms, median of the repeats):

* ``kernel``: ORT's kernel time, the sum of the ``*_kernel_time`` node events of ORT's profiler over the
  decode runs of every session (a separate profiled engine per budget: the kernels and the cache decisions
  do not depend on where the step runs, tests/test_native_cache.py); the profiler inflates every node, so
  compare it with another profile (benchmarks/kernel_gap.py profiles model.onnx under genai), not with
  genai's unprofiled token;
* ``storage``: time inside the Flash reads of the misses (``flash_io_decode``), memcpy from the page
  cache here (the file is cached), zero at 100 % once the prompt has filled the caches; ``fused``
  copies inside its CacheStep kernels, so there ``host`` is the token less the kernels alone;
* ``cpu_ms_per_token`` / ``ort_cpu_ms`` / ``outside_ort_cpu_share``: the token in CPU time (the process's,
  one ORT thread), which other jobs on a shared machine inflate less than wall time, inside the session
  runs, and the share outside them (host and reads);
* ``loop_cpu_ms``: CPU time of the decode loop alone, ``Engine.step`` with every session run stubbed out
  (the caches then see the same selection every token: all hits, the 100 % case): the host's own cost;
* ``host``: the rest of the token's wall time: Python, the cache step, binding, ORT's per-run framework;
  split into ``ort_run - kernel`` (ORT outside its kernels: the wall time inside the session runs, timed
  around ``Bound.run``, less the kernels) and ``python`` (outside the session runs and the reads).

    python benchmarks/host.py                     # 3 repeats × 2 budgets × 64 tokens (~3 min on 2 cores)
    python benchmarks/host.py --quick --json o.json   # 1 repeat, 100 % only, 24 tokens (<1 min)
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine, md_table, write_rows_json
from _ortprofile import profiled_sessions, session_runs

from dipdeploy.paths import write_atomic

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The history of the city begins in the early"
GENAI_PYTHON = "/work/venv-genai/bin/python"
MODE = {"single": "single", "fused": "fused"}  # the paths that are not the per-layer graphs
COLS = ["budget", "path", "tok_s", "ms_per_token", "kernel_ms", "storage_ms", "host_ms", "host_share", "ort_run_ms",
        "python_ms", "cpu_ms_per_token", "ort_cpu_ms", "outside_ort_cpu_share", "loop_cpu_ms", "hit_rate", "x_genai",
        "x_genai_cpu", "load_1min"]


def bundle(path: Path | None) -> Path:
    """The given bundle, or the demo's SmolLM2 DIP-CA BQ4 bundle exported once under build/."""
    if path is not None:
        return path
    out = ROOT / "build" / "bench-bundles" / "smollm2-135m-dip-ca-bq4"
    if not (out / "manifest.json").is_file():
        from dipdeploy.export.bundle import export_model
        from dipdeploy.export.config import ExportConfig

        print(f"exporting {out.name} …", flush=True)
        export_model(ExportConfig(model="smollm2-135m", method="dip-ca", density=0.5, rho_in=0.55, gamma=0.5,
                                  quant="bq4", validate_tokens=8), out, force=True)
    return out


class RunClock:
    """Wall and CPU time inside every session run (``Bound.run``), in call order: ORT's share of a
    token, kernels and its per-run framework together."""

    def __init__(self):
        from dipdeploy.runtime.sessions import Bound

        self.calls: list[tuple[float, float]] = []
        plain = Bound.run

        def timed(bound) -> None:
            t0, c0 = time.perf_counter(), time.process_time()
            plain(bound)
            self.calls.append((time.perf_counter() - t0, time.process_time() - c0))

        Bound.run = timed


def _engine(path: Path, budget: str, mode: str, native_cache: bool = True, context: int = 256):
    """The engine of a path: ``per-layer`` (forced), ``single`` (model.onnx) or ``fused``."""
    from dipdeploy.runtime import Engine

    return Engine(path, dram_budget=budget, native=True, native_cache=native_cache, context=context, io="mmap",
                  single_session={"per-layer": False, "single": True}.get(mode), fused=mode == "fused")


def engine_row(path: Path, budget: str, native_cache: bool, tokens: int, clock: RunClock, mode: str = "per-layer") -> dict:
    """Decode tokens/s, ORT's run time and the storage wait of one warm engine."""
    eng = _engine(path, budget, mode, native_cache)
    cpu = []
    for n in (4, tokens):  # the first also warms the sessions (first-run allocations)
        c0 = time.process_time()
        clock.calls.clear()
        s = eng.generate(PROMPT, n, stop_at_eos=False).stats
        cpu.append(time.process_time() - c0)
    # one batched run of every graph; the joined graph runs once per prompt token
    prefill_runs = {"single": 1, "fused": s.prompt_tokens}.get(mode, 3 * eng.num_layers + 1)
    eng.close()
    steps = s.new_tokens - 1
    ort = clock.calls[prefill_runs:]
    return {"tok_s": s.decode_tok_s, "ms_per_token": 1e3 * s.decode_s / steps,
            "ort_ms": 1e3 * sum(w for w, _ in ort) / steps,
            "storage_ms": 1e3 * s.seconds["flash_io_decode"] / steps, "hit_rate": s.hit_rate,
            # CPU time, which the machine's other jobs do not inflate: the difference of two runs is decode
            "cpu_ms_per_token": 1e3 * (cpu[1] - cpu[0]) / (tokens - 4),
            "ort_cpu_ms": 1e3 * sum(c for _, c in ort) / steps}


def loop_cpu_ms(path: Path, budget: str, native_cache: bool, steps: int = 200, mode: str = "per-layer") -> float:
    """CPU ms per token of ``Engine.step`` with the session runs stubbed out (see the module docstring)."""
    from dipdeploy.runtime.sessions import Bound
    from dipdeploy.runtime.stats import Timer

    eng = _engine(path, budget, mode, native_cache, context=steps + 8)
    record = (lambda *a: None) if mode == "per-layer" else None  # one session: no per-layer selections
    eng.generate(PROMPT, 4, stop_at_eos=False)  # real selections in the graph buffers
    plain, timer = Bound.run, Timer()
    Bound.run = lambda bound: None
    try:
        eng.reset()
        eng.step(5, timer)
        c0 = time.process_time()
        for i in range(steps):
            eng.step(5 + i % 7, timer, record)
        cpu = time.process_time() - c0
    finally:
        Bound.run = plain
        eng.close()
    return 1e3 * cpu / steps


def kernel_ms(path: Path, budget: str, tokens: int, mode: str = "per-layer") -> float:
    """ORT kernel milliseconds per decode token, from ORT's profiler (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        with profiled_sessions(tmp):
            eng = _engine(path, budget, mode)
        g = eng.generate(PROMPT, tokens, stop_at_eos=False)  # one batched prefill run, then decode runs
        one = {"single": lambda: eng.whole.bound, "fused": lambda: eng.fused.bound}.get(mode)
        groups = [[one()]] if one else (eng.attn, eng.up, eng.down, [eng.positions, eng.head])
        sessions = [b.session for group in groups for b in group]
        skip = g.stats.prompt_tokens if mode == "fused" else 1  # the prefill's runs
        total = sum(r.kernel_us for s in sessions for r in session_runs(Path(s.end_profiling()), skip))
        eng.close()
    return total / 1e3 / (len(g.tokens) - 1)


def genai_row(path: Path, tokens: int, python: str) -> dict:
    """Decode tokens/s of model.onnx in onnxruntime-genai's loop, 1 intra-op thread."""
    out = subprocess.run([python, str(ROOT / "scripts" / "genai_decode.py"), str(path), "--prompt", PROMPT,
                          "-n", str(tokens), "--threads", "1"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"decode (\d+) tokens in ([\d.]+) s = ([\d.]+) tok/s \(CPU ([\d.]+) s\)", out)
    if not m:
        raise RuntimeError(f"scripts/genai_decode.py printed no decode figure:\n{out}")
    n = int(m.group(1))
    return {"tok_s": float(m.group(3)), "ms_per_token": 1e3 * float(m.group(2)) / n,
            "cpu_ms_per_token": 1e3 * float(m.group(4)) / n}


def median_rows(samples: dict[tuple, list[dict]], kernels: dict[str, list[float]], genai: dict | None) -> list[dict]:
    rows = []
    for (budget, path), runs in samples.items():
        row = {"budget": budget, "path": path}
        for key in runs[0]:
            row[key] = statistics.median(r[key] for r in runs)
        if path != "genai":
            row["kernel_ms"] = statistics.median(kernels[(budget, MODE.get(path, "per-layer"))])
            row["ort_run_ms"] = row.pop("ort_ms")
            inside = path == "fused"  # its reads are inside the CacheStep kernels and the session run
            row["python_ms"] = row["ms_per_token"] - row["ort_run_ms"] - (0 if inside else row["storage_ms"])
            row["host_ms"] = row["ms_per_token"] - row["kernel_ms"] - (0 if inside else row["storage_ms"])
            row["host_share"] = row["host_ms"] / row["ms_per_token"]
            row["outside_ort_cpu_share"] = 1 - row["ort_cpu_ms"] / row["cpu_ms_per_token"]
            if genai:
                row["x_genai"] = row["tok_s"] / genai["tok_s"]
                row["x_genai_cpu"] = genai["cpu_ms_per_token"] / row["cpu_ms_per_token"]
        rows.append(row)
    return rows


def goals(rows: list[dict]) -> str:
    out = []
    for r in rows:
        if r["path"] == "single" and r.get("x_genai") is not None:
            ok = min(r["x_genai"], r["x_genai_cpu"]) >= 0.9
            out.append(f"- budget 100%, one session per token: {r['x_genai']:.2f}× onnxruntime-genai's tokens/s, "
                       f"{r['x_genai_cpu']:.2f}× by CPU time per token ({'met' if ok else 'NOT met'}, goal ≥ 0.9×)")
        if r["path"] == "fused":
            ok = max(r["host_share"], r["outside_ort_cpu_share"]) <= 0.10
            out.append(f"- budget {r['budget']}, joined graph (cache step inside): host overhead {r['host_ms']:.2f} ms = "
                       f"{r['host_share']:.0%} of a {r['ms_per_token']:.2f} ms token by wall time; by CPU time "
                       f"{r['outside_ort_cpu_share']:.0%} outside ORT's run ({'met' if ok else 'NOT met'}, goal ≤ 10 %)"
                       + (f"; {r['x_genai']:.2f}× onnxruntime-genai's tokens/s, {r['x_genai_cpu']:.2f}× by CPU"
                          if r.get("x_genai") is not None else ""))
        if r["path"] == "native":
            cpu = (f"; by CPU time {r['outside_ort_cpu_share']:.0%} of the token lies outside ORT's runs" +
                   (f", the decode loop alone {r['loop_cpu_ms']:.2f} ms = {r['loop_cpu_ms'] / r['cpu_ms_per_token']:.0%}"
                    if r.get("loop_cpu_ms") else ""))
            out.append(f"- budget {r['budget']}: host overhead {r['host_ms']:.2f} ms = {r['host_share']:.0%} of a "
                       f"{r['ms_per_token']:.2f} ms token by wall time{cpu} "
                       f"({'met' if max(r['host_share'], r['outside_ort_cpu_share']) <= 0.10 else 'NOT met'}, goal ≤ 10 %)")
            if r["budget"] == "100%" and r.get("x_genai") is not None:
                ok = min(r["x_genai"], r["x_genai_cpu"]) >= 0.9
                out.append(f"- budget 100%, per-layer graphs: the runtime decodes {r['x_genai']:.2f}× onnxruntime-genai's tokens/s on "
                           f"the same bundle's model.onnx, {r['x_genai_cpu']:.2f}× by CPU time per token "
                           f"({'met' if ok else 'NOT met'}, goal ≥ 0.9×)")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 repeat, 100 %% budget only, 24 tokens")
    ap.add_argument("--json", help="write the rows as a JSON list")
    ap.add_argument("--bundle", type=Path, help="a SmolLM2 DIP-CA BQ4 bundle (default: exported once under build/)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--genai-python", default=GENAI_PYTHON, help="a Python with onnxruntime-genai ('' to skip)")
    args = ap.parse_args()
    tokens, repeats = (24, 1) if args.quick else (args.tokens, args.repeats)
    budgets = ("100%",) if args.quick else ("100%", "50%")
    path = bundle(args.bundle)
    info = machine()
    genai_python = args.genai_python if args.genai_python and Path(args.genai_python).is_file() else None
    samples: dict[tuple, list[dict]] = {}
    kernels: dict[tuple[str, bool], list[float]] = {}
    loads = []
    clock = RunClock()
    for rep in range(repeats):
        for budget in budgets:
            for mode in ("per-layer", "fused") + (("single",) if budget == "100%" else ()):
                kernels.setdefault((budget, mode), []).append(kernel_ms(path, budget, tokens, mode))
        for budget in budgets:
            for name in ("numpy", "native", "fused") + (("single",) if budget == "100%" else ()):
                mode = MODE.get(name, "per-layer")
                r = engine_row(path, budget, name != "numpy", tokens, clock, mode)
                if budget == "100%":
                    r["loop_cpu_ms"] = loop_cpu_ms(path, budget, name != "numpy", mode=mode)
                samples.setdefault((budget, name), []).append(r)
                print(f"repeat {rep + 1} {budget:>4} {name:6s}: {r['tok_s']:.1f} tok/s", flush=True)
        if genai_python:
            r = genai_row(path, tokens, genai_python)
            samples.setdefault(("100%", "genai"), []).append(r)
            print(f"repeat {rep + 1} genai      : {r['tok_s']:.1f} tok/s", flush=True)
        loads.append(os.getloadavg()[0])
    genai = next((v for k, v in samples.items() if k[1] == "genai"), None)
    if genai:
        genai = {key: statistics.median(x[key] for x in genai) for key in ("tok_s", "cpu_ms_per_token")}
    rows = median_rows(samples, kernels, genai)
    for r in rows:
        r["load_1min"] = round(statistics.median(loads), 2)
    write_rows_json(rows, args.json)
    write_table(rows, info, tokens, repeats, loads, args.quick)


def write_table(rows: list[dict], info: dict, tokens: int, repeats: int, loads: list[float], quick: bool) -> None:
    name = "host" + ("-quick" if quick else "")
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout if sys.platform == "linux" else ""
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")),
                 info["cpu"])
    text = (f"# {name}: host overhead per decoded token\n\n"
            f"SmolLM2-135M DIP-CA BQ4 (ρ = 0.5, ρ_in = 0.55, γ = 0.5, LFU), {tokens} greedy tokens after one prompt, "
            f"native kernels, 1 ORT thread, mmap reads; median of {repeats} repeat(s), the paths interleaved in each. "
            f"`numpy`: the per-token cache step in numpy (the reference, main's path); `native`: in the op library "
            f"(custom_ops/src/cache/), both on the per-layer graphs; `single`: model.onnx in one session per "
            f"token (dipdeploy/runtime/backends/whole.py, every row resident: plain DIP); `fused`: the per-layer graphs joined "
            f"into one session per token, the cache step inside it (dipdeploy/runtime/backends/joined.py; prompt fed token by "
            f"token; its storage is inside its kernels, so its host_ms is the token less the kernels); `genai`: the same bundle's model.onnx in onnxruntime-genai's own loop, "
            f"1 intra-op thread. `kernel_ms`: ORT's profiled kernel time per token (same for both per-layer paths); "
            f"`storage_ms`: inside the reads of the misses (page cache → slab); `host_ms`: the rest of the token. "
            f"`x_genai`: tok/s over genai's.\n\n"
            f"Machine: {model}, {info['cores']} cores (lscpu), shared with other jobs: 1-minute load "
            f"{', '.join(f'{x:.2f}' for x in loads)} after each repeat.\n\n"
            f"{md_table(rows, COLS)}\n\n## Goals\n\n{goals(rows)}\n\n"
            f"Regenerate: `python benchmarks/host.py` (dipdeploy/runtime/DESIGN.md reads this table).\n")
    write_atomic(RESULTS / f"{name}.md", text, force=True)
    print(text)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f} s)")
