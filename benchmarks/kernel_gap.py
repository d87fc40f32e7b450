"""Where a decode token of the per-layer graphs goes, against the same bundle's ``model.onnx`` run the
way onnxruntime-genai runs it, side by side in one run (SmolLM2-135M DIP-CA BQ4, 100 % budget: every
row in DRAM after the prompt, nothing read from Flash; native kernels; 1 ORT thread).

Profiled (ORT's profiler, ``SessionOptions.enable_profiling``; the prefill run and the first decode run
left out on both sides; one profile per side and repeat, alternating, and of each side the quietest,
the one with the least kernel time per token: load inflates a profile as it does wall time):

* ``ours``: every session of ``dipdeploy run``'s engine (``positions``, per layer ``attn``, ``mlp_up``,
  ``mlp_down``, ``head``) during a decode;
* ``genai``: ``model.onnx`` inside onnxruntime-genai's own loop (scripts/genai_decode.py ``--profile``:
  the bundle's genai_config.json, its custom-op library, ORT's default optimisation level, 1 intra-op
  thread), so the session options are genai's own.

Per op type and per node (layer index removed): kernel µs and calls per token; per kind of run: ORT's
``model_run``, its ``SequentialExecutor::Execute`` and the kernels inside, so the per-run framework
(``model_run`` − kernels) shows beside the kernels. The profiler adds several µs to every node and run,
alike on both sides (benchmarks/_ortprofile.py): its figures compare the two profiles, not wall time.

Unprofiled wall time (ms per decode token, median over the tokens of every repeat, the items
interleaved in each repeat so load hits them alike):

* ``token``: ``Engine.step``; ``in_runs``: its 92 session runs (``Bound.run``); ``host``: the rest
  (cache step, binding, Python);
* ``runs_alone``: the same 92 runs with the per-token binding (positions, KV views) and no cache step
  between them: the graphs without the host loop;
* ``model.onnx``: one run of ``model.onnx`` per token in onnxruntime with genai's session options and
  I/O binding, the presents fed back as the next pasts (no copies): the graph without genai's loop;
* ``genai``: onnxruntime-genai's whole token (scripts/genai_decode.py, unprofiled);
* ``run_floor``: 92 × one IOBinding run of a one-node graph (ORT's fixed cost per run).

``--instructions`` counts, under valgrind's callgrind (not timed: load cannot change a count), the
instructions per decode token of ``model.onnx`` (as above), of ``runs_alone`` and of the whole
``token``, by shared object (onnxruntime, the op library, libc, Python, numpy): the difference of a
10- and a 2-token decode over 8. Each count is a process under valgrind (minutes).

``--baseline CHECKOUT`` adds a before/after of ``Engine.step`` (wall and the process's CPU time per
decode token, which the machine's other jobs inflate less), each repeat one fresh process with
CHECKOUT's ``dipdeploy`` and one with this checkout's, alternating, on the same bundle.

    python benchmarks/kernel_gap.py                    # 3 repeats, 64 tokens (~2 min on 2 cores)
    python benchmarks/kernel_gap.py --quick --json o.json   # 1 repeat, 24 tokens
    python benchmarks/kernel_gap.py --baseline /work/main   # and main's engine against this one
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import lscpu, md_table, write_rows_json
from _ortprofile import Run, profiled_sessions, session_runs
from host import GENAI_PYTHON, PROMPT, ROOT, bundle, genai_row

from dipdeploy.paths import write_atomic

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("positions", "attn", "mlp_up", "mlp_down", "head")
SKIP = 2  # the prefill run and the first decode run (its one-off allocations)



def runs_alone(eng) -> None:
    """One decode token's session runs with their KV binding and nothing between them: no cache step,
    the slots left as they are."""
    eng.per_token.step(eng.kv.length + 1)
    for i in range(eng.num_layers):
        eng.kv.bind(eng.attn[i], i)
        eng.attn[i].run()
        eng.kv.commit(i)
        eng.up[i].run()
        eng.down[i].run()
    eng.head.run()
    eng.kv.advance()

def engine(path: Path, context: int, profile_dir: str | None = None):
    """A warm 100 %-budget engine over ``path``; with ``profile_dir``, every session profiled into it."""
    from dipdeploy.runtime import Engine

    with profiled_sessions(profile_dir) if profile_dir else contextlib.nullcontext():
        return Engine(path, dram_budget="100%", native=True, context=context, single_session=False,
                      fused=False, io="mmap")  # the per-layer path


def sessions_by_kind(eng) -> dict[str, list]:
    return {"positions": [eng.positions], "attn": eng.attn, "mlp_up": eng.up, "mlp_down": eng.down,
            "head": [eng.head]}


def profile_ours(path: Path, tokens: int) -> dict[str, list[Run]]:
    with tempfile.TemporaryDirectory() as tmp:
        eng = engine(path, tokens + 32, tmp)
        eng.generate(PROMPT, tokens, stop_at_eos=False)
        runs = {kind: [r for b in group for r in session_runs(Path(b.session.end_profiling()), SKIP)]
                for kind, group in sessions_by_kind(eng).items()}
        eng.close()
    return runs


def profile_genai(path: Path, tokens: int, python: str) -> list[Run]:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([python, str(ROOT / "scripts" / "genai_decode.py"), str(path), "--prompt", PROMPT,
                        "-n", str(tokens), "--threads", "1", "--profile", str(Path(tmp) / "genai")],
                       capture_output=True, text=True, check=True)
        files = glob.glob(str(Path(tmp) / "genai*.json"))
        if len(files) != 1:
            raise RuntimeError(f"scripts/genai_decode.py --profile wrote {len(files)} profiles, expected 1")
        return session_runs(Path(files[0]), SKIP)


def op_rows(ours: dict[str, list[Run]], genai: list[Run]) -> list[dict]:
    """Kernel µs and calls per token by op type, both sides (tokens: the head's runs, genai's runs)."""
    def tally(runs: list[Run], tokens: int):
        us, calls = collections.Counter(), collections.Counter()
        for r in runs:
            for k in r.kernels:
                us[k.op] += k.us
                calls[k.op] += 1
        return {op: v / tokens for op, v in us.items()}, {op: v / tokens for op, v in calls.items()}

    (ou, oc), (gu, gc) = tally([r for v in ours.values() for r in v], len(ours["head"])), tally(genai, len(genai))
    rows = [{"op": op, "ours_calls": oc.get(op, 0.0), "genai_calls": gc.get(op, 0.0), "ours_us": ou.get(op, 0.0),
             "genai_us": gu.get(op, 0.0), "diff_us": ou.get(op, 0.0) - gu.get(op, 0.0)} for op in set(ou) | set(gu)]
    rows.sort(key=lambda r: -max(r["ours_us"], r["genai_us"]))
    return rows + [{"op": "all", **{key: sum(r[key] for r in rows) for key in rows[0] if key != "op"}}]


def node_rows(ours: dict[str, list[Run]], genai: list[Run], top: int) -> list[dict]:
    """The ``top`` nodes (summed over layers) by the largest difference in kernel µs per token."""
    def tally(runs: list[Run], tokens: int):
        us, calls = collections.Counter(), collections.Counter()
        for r in runs:
            for k in r.kernels:
                us[k.node] += k.us / tokens
                calls[k.node] += 1 / tokens
        return us, calls

    (ou, oc), (gu, gc) = tally([r for v in ours.values() for r in v], len(ours["head"])), tally(genai, len(genai))
    rows = [{"node": n, "ours_calls": oc.get(n, 0.0), "genai_calls": gc.get(n, 0.0), "ours_us": ou.get(n, 0.0),
             "genai_us": gu.get(n, 0.0), "diff_us": ou.get(n, 0.0) - gu.get(n, 0.0)} for n in set(ou) | set(gu)]
    return sorted(rows, key=lambda r: -abs(r["diff_us"]))[:top]


def run_rows(ours: dict[str, list[Run]], genai: list[Run]) -> list[dict]:
    """Per kind of run: runs per token and, per run, ORT's run, its executor, the kernels, what is left."""
    tokens = len(ours["head"])
    rows = []
    for kind, runs in [*ours.items(), ("model.onnx (genai)", genai)]:
        n = len(runs)
        per_token = n / (tokens if kind in ours else len(genai))
        run_us, exe_us, ker_us = (sum(getattr(r, a) for r in runs) / n for a in ("run_us", "execute_us", "kernel_us"))
        rows.append({"run": kind, "runs_per_token": per_token, "nodes_per_run": sum(len(r.kernels) for r in runs) / n,
                     "model_run_us": run_us, "execute_us": exe_us, "kernels_us": ker_us,
                     "framework_us": run_us - ker_us, "outside_executor_us": run_us - exe_us,
                     "run_ms_per_token": run_us * per_token / 1e3, "kernel_ms_per_token": ker_us * per_token / 1e3,
                     "framework_ms_per_token": (run_us - ker_us) * per_token / 1e3})
    ours_rows = rows[:-1]
    rows.insert(len(ours_rows), {"run": "per-layer graphs, all", "runs_per_token": sum(r["runs_per_token"] for r in ours_rows),
                                 **{k: sum(r[k] for r in ours_rows) for k in ("run_ms_per_token", "kernel_ms_per_token",
                                                                              "framework_ms_per_token")}})
    return rows


class Monolith:
    """``model.onnx`` decoded in onnxruntime with onnxruntime-genai's session options (1 intra-op and 1
    inter-op thread, ORT's default optimisation level, the bundle's op library) and I/O binding: each
    token's presents, allocated by ORT, are bound as the next token's pasts without a copy."""

    def __init__(self, path: Path):
        import onnxruntime as ort

        from dipdeploy.ops.native import session_options

        self.session = ort.InferenceSession(str(path / "model.onnx"), session_options(1, True),
                                            providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.layers = sum(1 for n in self.outputs if n.startswith("present.") and n.endswith(".key"))

    def decode(self, prompt: list[int], tokens: int) -> list[float]:
        """Greedy-decode ``tokens`` after ``prompt``; the wall seconds of each decode run."""
        from onnxruntime import OrtValue

        shape = next(i.shape for i in self.session.get_inputs() if i.name == "past_key_values.0.key")
        heads, dim = shape[1], shape[3]
        past = {f"past_key_values.{i}.{k}": OrtValue.ortvalue_from_numpy(np.zeros((1, heads, 0, dim), np.float32))
                for i in range(self.layers) for k in ("key", "value")}
        ids, pos, times = list(prompt), 0, []
        for step in range(tokens):
            io = self.session.io_binding()
            n = len(ids)
            for name, value in (("input_ids", np.array([ids], np.int64)), ("attention_mask", np.ones((1, pos + n), np.int64)),
                                ("position_ids", np.arange(pos, pos + n, dtype=np.int64)[None])):
                io.bind_cpu_input(name, value)
            for name, value in past.items():
                io.bind_ortvalue_input(name, value)
            for name in self.outputs:
                io.bind_output(name)
            t0 = time.perf_counter()
            self.session.run_with_iobinding(io)
            if step:
                times.append(time.perf_counter() - t0)
            out = dict(zip(self.outputs, io.get_outputs()))
            past = {name: out[name.replace("past_key_values", "present")] for name in past}
            pos += n
            ids = [int(np.argmax(out["logits"].numpy()[0, -1]))]
        return times


def run_floor(runs: int, repeats: int = 2000) -> float:
    """ms of ``runs`` IOBinding runs of a one-node graph (Identity of 576 floats) with the engine's options."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from dipdeploy.ops.native import session_options
    from dipdeploy.runtime.sessions import Bound, shared_arena

    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 576]) for n in ("x", "y")]
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "floor", vi[:1], vi[1:]),
                              opset_imports=[helper.make_opsetid("", 17)])
    b = Bound(ort.InferenceSession(model.SerializeToString(), shared_arena(session_options(1, True)),
                                   providers=["CPUExecutionProvider"]))
    b.input("x", np.zeros((1, 576), np.float32))
    b.output("y", np.zeros((1, 576), np.float32))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        b.run()
        times.append(time.perf_counter() - t0)
    return 1e3 * runs * statistics.median(times)


def walls(path: Path, tokens: int, repeats: int, genai_python: str | None) -> tuple[dict[str, float], list[float]]:
    """The unprofiled items of the module docstring, ms per decode token (medians), and the loads seen."""
    from dipdeploy.runtime.sessions import Bound
    from dipdeploy.runtime.stats import Timer

    eng = engine(path, tokens + 32)
    mono = Monolith(path)
    prompt = eng.encode(PROMPT)
    in_runs: list[float] = []
    plain = Bound.run

    def timed(bound) -> None:
        t0 = time.perf_counter()
        plain(bound)
        in_runs.append(time.perf_counter() - t0)

    samples: dict[str, list[float]] = collections.defaultdict(list)
    loads = []
    runs = 3 * eng.num_layers + 2
    for _ in range(repeats):
        Bound.run = timed
        try:
            g = eng.generate(prompt, 2, stop_at_eos=False)
            timer, tok = Timer(), g.tokens[-1]
            for _ in range(tokens - 1):
                in_runs.clear()
                t0 = time.perf_counter()
                tok = int(np.argmax(eng.step(tok, timer)))
                samples["token"].append(time.perf_counter() - t0)
                samples["in_runs"].append(sum(in_runs))
        finally:
            Bound.run = plain
        eng.generate(prompt, 2, stop_at_eos=False)
        for _ in range(tokens - 1):
            t0 = time.perf_counter()
            runs_alone(eng)
            samples["runs_alone"].append(time.perf_counter() - t0)
        samples["model.onnx"] += mono.decode(prompt, tokens)
        if genai_python:
            samples["genai"].append(genai_row(path, tokens, genai_python)["ms_per_token"] / 1e3)
        loads.append(os.getloadavg()[0])
    eng.close()
    out = {key: 1e3 * statistics.median(v) for key, v in samples.items()}
    out["host"] = 1e3 * statistics.median(t - r for t, r in zip(samples["token"], samples["in_runs"]))
    out["run_floor"] = run_floor(runs)
    out["runs_per_token"] = runs
    return out, loads


COUNTED = ("model.onnx", "runs_alone", "token")


def counted_workload(path: Path, what: str, tokens: int) -> None:
    """The decode ``--instructions`` counts: ``tokens`` decode runs of ``what`` after the prompt."""
    from dipdeploy.runtime.stats import Timer

    if what == "model.onnx":
        from tokenizers import Tokenizer

        Monolith(path).decode(Tokenizer.from_file(str(path / "tokenizer.json")).encode(PROMPT).ids, tokens + 1)
        return
    eng = engine(path, tokens + 32)
    g = eng.generate(eng.encode(PROMPT), 2, stop_at_eos=False)
    timer, tok = Timer(), g.tokens[-1]
    for _ in range(tokens):
        if what == "token":
            tok = int(np.argmax(eng.step(tok, timer)))
            continue
        runs_alone(eng)


def callgrind_objects(out: Path) -> collections.Counter:
    """Instructions by shared object in a callgrind file written with uncompressed names (the cost line
    after a ``calls=`` line is the call's inclusive cost, counted at the callee, so it is skipped)."""
    by = collections.Counter()
    obj, skip = "?", False
    for line in out.read_text(errors="replace").splitlines():
        if skip:
            skip = False
        elif line.startswith("ob="):
            obj = Path(line[3:]).name.split(".cpython")[0].split(".so")[0] or "?"
        elif line.startswith("calls="):
            skip = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                by[obj] += int(parts[1])
    return by


def instruction_rows(path: Path) -> list[dict]:
    """M instructions per decode token of each ``COUNTED`` workload, by shared object (module docstring)."""
    short, long = 2, 10
    per_token = {}
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        for what in COUNTED:
            counts = []
            for n in (short, long):
                out = Path(tmp) / f"cg.{n}"
                subprocess.run(["valgrind", "--tool=callgrind", "--dump-instr=no", "--compress-strings=no",
                                "--compress-pos=no", f"--callgrind-out-file={out}", sys.executable, __file__,
                                "--count", what, "--tokens", str(n), "--bundle", str(path)],
                               capture_output=True, text=True, check=True, env=env)
                counts.append(callgrind_objects(out))
            per_token[what] = {k: (counts[1][k] - counts[0][k]) / (long - short) / 1e6 for k in counts[0] | counts[1]}
    objects = sorted({k for v in per_token.values() for k in v}, key=lambda k: -per_token["token"].get(k, 0))
    rows = [{"object": k, **{what: per_token[what].get(k, 0.0) for what in COUNTED}} for k in objects
            if max(abs(per_token[what].get(k, 0.0)) for what in COUNTED) >= 0.05]
    return rows + [{"object": "all", **{what: sum(per_token[what].values()) for what in COUNTED}}]


def step_ms(path: Path, tokens: int) -> dict[str, float]:
    """``Engine.step``'s median wall ms and mean CPU ms per decode token, in this process."""
    from dipdeploy.runtime.stats import Timer

    eng = engine(path, tokens + 32)
    prompt = eng.encode(PROMPT)
    g = eng.generate(prompt, 2, stop_at_eos=False)
    timer, tok, wall = Timer(), g.tokens[-1], []
    c0 = time.process_time()
    for _ in range(tokens - 1):
        t0 = time.perf_counter()
        tok = int(np.argmax(eng.step(tok, timer)))
        wall.append(time.perf_counter() - t0)
    cpu = time.process_time() - c0
    eng.close()
    return {"ms_per_token": 1e3 * statistics.median(wall), "cpu_ms_per_token": 1e3 * cpu / (tokens - 1)}


def before_after(path: Path, tokens: int, repeats: int, baseline: Path) -> list[dict]:
    """``step_ms`` with ``baseline``'s dipdeploy and with this checkout's, alternating fresh processes."""
    samples: dict[str, list[dict]] = collections.defaultdict(list)
    for _ in range(repeats):
        for name, root in (("before", baseline), ("after", ROOT)):
            out = subprocess.run([sys.executable, __file__, "--step-only", "--bundle", str(path), "--tokens", str(tokens)],
                                 capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(root)})
            samples[name].append(json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{"))))
    rows = [{"engine": f"{name} ({root})", **{key: statistics.median(r[key] for r in samples[name])
                                              for key in ("ms_per_token", "cpu_ms_per_token")}}
            for name, root in (("before", baseline), ("after", ROOT))]
    for key in ("ms_per_token", "cpu_ms_per_token"):
        rows[1][f"after_over_before_{key.split('_')[0]}"] = rows[1][key] / rows[0][key]
    return rows


WALL_ITEMS = [("token", "Engine.step, the whole decode token"),
              ("in_runs", "its session runs (Bound.run)"),
              ("host", "the rest: cache step, binding, Python"),
              ("runs_alone", "the same runs, binding but no cache step between them"),
              ("model.onnx", "model.onnx, one ORT run per token, genai's session options"),
              ("genai", "onnxruntime-genai's whole token"),
              ("run_floor", "ORT's fixed cost of as many one-node runs")]


def refuse(message: str) -> None:
    """Bad input: one line naming the problem and the fix, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 repeat, 24 tokens")
    ap.add_argument("--json", help="write every table's rows as one JSON object")
    ap.add_argument("--bundle", type=Path, help="a SmolLM2 DIP-CA BQ4 bundle (default: exported once under build/)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--genai-python", default=GENAI_PYTHON, help="a Python with onnxruntime-genai")
    ap.add_argument("--baseline", type=Path, help="a checkout whose engine to time against this one's")
    ap.add_argument("--instructions", action="store_true", help="count instructions per token under valgrind")
    ap.add_argument("--step-only", action="store_true", help=argparse.SUPPRESS)  # one side of --baseline
    ap.add_argument("--count", choices=COUNTED, help=argparse.SUPPRESS)  # one workload of --instructions
    args = ap.parse_args()
    tokens, repeats = (24, 1) if args.quick else (args.tokens, args.repeats)
    if args.step_only:
        print(json.dumps(step_ms(bundle(args.bundle), tokens)))
        return
    if args.count:
        counted_workload(bundle(args.bundle), args.count, args.tokens)
        return
    if args.instructions and shutil.which("valgrind") is None:
        refuse("--instructions needs valgrind (apt-get install valgrind), or leave it out")
    if args.baseline is not None and not (args.baseline / "dipdeploy" / "runtime" / "engine.py").is_file():
        refuse(f"--baseline {args.baseline} is not a dipdeploy checkout (no dipdeploy/runtime/engine.py); give one")
    if not (args.genai_python and Path(args.genai_python).is_file()):
        refuse(f"no Python with onnxruntime-genai at {args.genai_python!r}; give --genai-python PATH")
    path = bundle(args.bundle)
    load0 = os.getloadavg()[0]
    ours, genai = [], []
    for _ in range(repeats):
        ours.append(profile_ours(path, tokens))
        genai.append(profile_genai(path, tokens, args.genai_python))
    ours = min(ours, key=lambda p: sum(r.kernel_us for v in p.values() for r in v) / len(p["head"]))
    genai = min(genai, key=lambda p: sum(r.kernel_us for r in p) / len(p))
    wall, loads = walls(path, tokens, repeats, args.genai_python)
    tables = {"ops": op_rows(ours, genai), "runs": run_rows(ours, genai), "nodes": node_rows(ours, genai, 12),
              "wall": [{"item": k, "what": what, "ms_per_token": wall.get(k),
                        "x_genai": wall[k] / wall["genai"] if k in wall else None} for k, what in WALL_ITEMS]}
    if args.instructions:
        tables["instructions"] = instruction_rows(path)
    if args.baseline is not None:
        tables["before_after"] = before_after(path, tokens, repeats, args.baseline.resolve())
    write_rows_json(tables, args.json)
    write_table(tables, tokens, repeats, [load0, *loads], args.quick)


def write_table(tables: dict, tokens: int, repeats: int, loads: list[float], quick: bool) -> None:
    name = "kernel_gap" + ("-quick" if quick else "")
    text = (f"# {name}: the per-layer graphs' time against model.onnx in onnxruntime-genai\n\n"
            f"SmolLM2-135M DIP-CA BQ4 (the demo's bundle), 100 % budget, native kernels, 1 ORT thread, "
            f"{tokens} greedy tokens after one prompt; profiles leave out the prefill and the first decode run, "
            f"the quietest of {repeats} per side; "
            f"wall times: median over the tokens of {repeats} interleaved repeat(s). What each item is: "
            f"benchmarks/kernel_gap.py's docstring.\n\n"
            f"Machine: {lscpu()}; shared with other jobs, 1-minute load {', '.join(f'{x:.2f}' for x in loads)} "
            f"(before, then after each repeat).\n\n"
            f"## Unprofiled wall time per decode token\n\n"
            f"{md_table(tables['wall'], ['item', 'what', 'ms_per_token', 'x_genai'])}\n\n"
            f"## Profiled: per kind of run (µs per run, ms per token)\n\n"
            f"{md_table(tables['runs'], ['run', 'runs_per_token', 'nodes_per_run', 'model_run_us', 'execute_us', 'kernels_us', 'framework_us', 'outside_executor_us', 'run_ms_per_token', 'kernel_ms_per_token', 'framework_ms_per_token'])}\n\n"
            f"## Profiled: kernels per op type (µs and calls per token)\n\n"
            f"{md_table(tables['ops'], ['op', 'ours_calls', 'genai_calls', 'ours_us', 'genai_us', 'diff_us'])}\n\n"
            f"## Profiled: the nodes that differ most (summed over layers, µs and calls per token)\n\n"
            f"{md_table(tables['nodes'], ['node', 'ours_calls', 'genai_calls', 'ours_us', 'genai_us', 'diff_us'])}\n\n"
            + (f"## Instructions per decode token (M, callgrind, by shared object)\n\n"
               f"{md_table(tables['instructions'], ['object', *COUNTED])}\n\n" if "instructions" in tables else "")
            + (f"## Before/after: Engine.step per decode token\n\n"
               f"{md_table(tables['before_after'], ['engine', 'ms_per_token', 'cpu_ms_per_token', 'after_over_before_ms', 'after_over_before_cpu'])}\n\n"
               if "before_after" in tables else "") +
            "Regenerate: `python benchmarks/kernel_gap.py` (dipdeploy/runtime/DESIGN.md reads this file).\n")
    write_atomic(RESULTS / f"{name}.md", text, force=True)
    print(text)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f} s)")
