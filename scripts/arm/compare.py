"""Runs a bundle's ``model.onnx`` on a fixed input and compares runs across architectures (scripts/arm/check.sh).

    compare.py expose --bundle DIR
    compare.py run --bundle DIR --out RUN.npz [--native LIB] [--threads 1]
    compare.py compare [--tolerance 1e-3] REF.npz RUN.npz ...

``expose`` (x86 side, it may import onnx) writes ``model.selections.onnx`` into the bundle: ``model.onnx``
with every TopKColumnMask's selection and scored input X as graph outputs, named in
``selections.json``; ``run`` uses it when present and keeps them per fed position.

``run`` is what both sides execute, the x86 venv and the aarch64 Python under qemu-user. It imports only
numpy, onnxruntime, tokenizers and the torch-free ``dipdeploy.bundle.manifest`` / ``dipdeploy.ops.native``
(the aarch64 site-packages holds nothing else; it fails if torch, transformers or onnx got imported).
It encodes a fixed prompt with the bundle's tokenizer, takes its first ``--positions`` ids, runs them in one
prefill (teacher-forced logits at every position), then ``--greedy`` greedy steps on the KV cache, as
``dipdeploy/export/generate.py`` does (plain ORT + numpy; EOS does not stop it: a fixed length is compared).
``--native LIB`` registers that library through ``$DIPDEPLOY_OPS_LIB`` and ``session_options(native=True)``;
the run checks that LIB's ELF machine is the running Python's, so the aarch64 side cannot load the x86
build by accident. Without ``--native``, ORT inlines the stock fallback functions the model carries.

``--engine`` also runs the host runtime (``dipdeploy.runtime.Engine``, what ``dipdeploy run`` uses: the
bundle's per-layer graphs, DRAM slabs at ``--dram-budget`` over the mmap'ed ``mlp.bin``) on the same ids with
greedy sampling, keeping the logits of each generated token; it needs a bundle with per-layer graphs.

``compare`` takes the first file as the reference and checks every run against it by the project's
agreement rule (``dipdeploy.agreement.compare_runs``, docs/numerics.md): the prompt ids must be equal; the
two compute the same function until their selections part, which must be a near-tie of the reference's
|X|; until then the greedy tokens are equal (or part at a near-tie of the reference's logits) and the
logits agree within ``--tolerance``. The engine (where a run has it, its selections from
``Engine.teacher_forced`` on its own tokens) against the reference likewise. Prints a table; exits 1 on
any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import struct
import sys
import time
from pathlib import Path

import numpy as np

PROMPT = "The quick brown fox jumps over the lazy dog. The capital of France is"
HEAVY = ("torch", "transformers", "onnx", "onnxscript")
ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64"}


def elf_machine(path: Path) -> str:
    head = path.read_bytes()[:20]
    if head[:4] != b"\x7fELF" or head[5] != 1:
        raise ValueError(f"{path} is not a little-endian ELF file")
    (machine,) = struct.unpack_from("<H", head, 18)
    return ELF_MACHINES.get(machine, hex(machine))


def cpu_features() -> str:
    """The SIMD features the kernels may pick: AT_HWCAP/AT_HWCAP2 on aarch64 (what qemu's -cpu model
    advertises), the /proc/cpuinfo flags on x86-64."""
    if platform.machine() == "aarch64":
        import ctypes

        getauxval = ctypes.CDLL(None).getauxval
        getauxval.restype = ctypes.c_ulong
        hw, hw2 = getauxval(16), getauxval(26)  # AT_HWCAP, AT_HWCAP2
        bits = [("asimd", hw, 1), ("asimddp", hw, 20), ("sve", hw, 22), ("sve2", hw2, 1), ("i8mm", hw2, 13),
                ("bf16", hw2, 14)]
        return " ".join(name for name, word, bit in bits if word >> bit & 1)
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return ""
    return " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_vnni") if f in flags)


def run_engine(bundle: Path, ids: list[int], greedy: int, native: bool, threads: int, budget: str):
    """Greedy tokens and the logits before each of them from the host runtime."""
    from dipdeploy.runtime import Engine, EngineConfig

    engine = Engine(bundle, EngineConfig(dram_budget=budget, native=native, threads=threads,
                                          fused=False))  # teacher_forced: the host step's selections
    try:
        g = engine.generate(ids, greedy, keep_logits=True, stop_at_eos=False)
        _, sel = engine.teacher_forced(ids, g.tokens)  # the same engine: bit-equal to generate's run
    finally:
        engine.close()
    return np.asarray(g.tokens, np.int64), np.stack(g.logits).astype(np.float32), _stack(sel, "engine_sel")


SELECTIONS = "selections.json"
SELECTION_GRAPH = "model.selections.onnx"


def _stack(sel: list[dict], prefix: str) -> dict:
    """Per-position selections {(layer, group[, "x"]): array} as npz arrays [positions, ...]."""
    return {f"{prefix}:" + ":".join(map(str, key)): np.stack([np.asarray(s[key]) for s in sel]) for key in sel[0]} \
        if sel else {}


def _unstack(z, prefix: str) -> list[dict]:
    keys = [k for k in z.files if k.startswith(prefix + ":")]
    if not keys:
        return []
    parts = {k: tuple(int(p) if p.isdigit() else p for p in k.split(":")[1:]) for k in keys}
    return [{parts[k]: z[k][p] for k in keys} for p in range(len(z[keys[0]]))]


def expose(bundle: Path) -> None:
    import onnx

    from dipdeploy.bundle.manifest import read_manifest
    from dipdeploy.ops.nodes import with_selection_outputs

    src = bundle / read_manifest(bundle).graphs["model"]
    proto, names = with_selection_outputs(onnx.load(str(src), load_external_data=False), scored=True)
    onnx.save(proto, str(bundle / SELECTION_GRAPH))
    (bundle / SELECTIONS).write_text(json.dumps({name: list(key) for key, name in names.items()}))


def run(bundle: Path, out: Path, native: Path | None, threads: int, positions: int, greedy: int,
        cpu: str, engine: bool, budget: str) -> None:
    if native is not None:
        native = native.resolve()
        if not native.is_file():
            raise SystemExit(f"--native {native}: no such file (run `make ops`)")
        lib_arch, py_arch = elf_machine(native), platform.machine()
        if lib_arch != py_arch:
            raise SystemExit(f"--native {native} is built for {lib_arch}, this Python runs on {py_arch}")
        os.environ["DIPDEPLOY_OPS_LIB"] = str(native)  # what dipdeploy.ops.native.library_path() reads first
    else:
        os.environ.pop("DIPDEPLOY_OPS_LIB", None)

    import onnxruntime as ort
    from tokenizers import Tokenizer

    from dipdeploy.bundle.manifest import read_manifest
    from dipdeploy.export.generate import KVDecoder
    from dipdeploy.ops.native import library_path, session_options

    t0 = time.perf_counter()
    manifest = read_manifest(bundle)
    dec = json.loads((bundle / "genai_config.json").read_text())["model"]["decoder"]
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    ids = tok.encode(PROMPT, add_special_tokens=False).ids
    if len(ids) < positions:
        raise SystemExit(f"the prompt gives {len(ids)} tokens, fewer than --positions {positions}")
    ids = np.asarray([ids[:positions]], dtype=np.int64)

    loaded = str(library_path()) if native is not None else ""
    if native is not None and Path(loaded).resolve() != native:
        raise SystemExit(f"dipdeploy.ops.native would load {loaded}, not {native}")
    so = session_options(threads=threads, native=native is not None)
    exposed = (bundle / SELECTIONS).is_file()
    graph = SELECTION_GRAPH if exposed else manifest.graphs["model"]
    outputs = {tuple(key): name for name, key in json.loads((bundle / SELECTIONS).read_text()).items()} if exposed else {}
    sess = ort.InferenceSession(str(bundle / graph), so, providers=["CPUExecutionProvider"])
    t_session = time.perf_counter() - t0

    kv = KVDecoder(sess, dec["num_key_value_heads"], dec["head_size"])
    x, logits, tokens, sel = ids, [], [], []
    t1 = time.perf_counter()
    for step in range(greedy + 1):  # step 0: the teacher-forced prefill; then one greedy token per step
        logits.append(kv.feed(x))
        sel += kv.selections(outputs)
        if step < greedy:
            tokens.append(int(logits[-1][-1].argmax()))
            x = [tokens[-1]]
    t_run = time.perf_counter() - t1
    extra, t_engine = {}, 0.0
    if engine:
        t2 = time.perf_counter()
        extra["engine_tokens"], extra["engine_logits"], engine_sel = run_engine(
            bundle, ids[0].tolist(), greedy, native is not None, threads, budget)
        extra.update(engine_sel)
        t_engine = time.perf_counter() - t2

    heavy = [m for m in HEAVY if m in sys.modules]
    if heavy:
        raise SystemExit(f"the runtime path imported {heavy}: it must stay torch- and onnx-free")
    logits = np.concatenate(logits, axis=0).astype(np.float32)  # [positions + greedy, vocab]
    top2 = np.sort(logits[positions - 1:positions - 1 + greedy], axis=1)[:, -2:]
    meta = {"arch": platform.machine(), "cpu": cpu, "features": cpu_features(), "native": native is not None,
            "library": loaded,
            "onnxruntime": ort.__version__, "numpy": np.__version__, "python": platform.python_version(),
            "threads": threads, "text": tok.decode(tokens), "seconds_session": round(t_session, 3),
            "seconds_run": round(t_run, 3), "min_greedy_margin": float((top2[:, 1] - top2[:, 0]).min()),
            "engine": engine, "engine_budget": budget if engine else None, "seconds_engine": round(t_engine, 3)}
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, prompt_ids=ids[0], logits=logits, tokens=np.asarray(tokens, np.int64), meta=json.dumps(meta),
             **extra, **_stack(sel, "sel"))
    print(f"{meta['arch']:8s} {cpu:15s} native={'yes' if meta['native'] else 'no ':3s} ORT {meta['onnxruntime']}: "
          f"tokens {tokens} {meta['text']!r}  (session {t_session:.2f} s, {greedy + 1} runs {t_run:.2f} s)"
          + (f"; engine tokens {extra['engine_tokens'].tolist()} ({t_engine:.2f} s)" if engine else ""))


def load(path: Path) -> dict:
    with np.load(path) as z:
        return {"path": path, "meta": json.loads(str(z["meta"])), "prompt_ids": z["prompt_ids"],
                "logits": z["logits"], "tokens": z["tokens"],
                "engine_tokens": z["engine_tokens"] if "engine_tokens" in z else None,
                "engine_logits": z["engine_logits"] if "engine_logits" in z else None,
                "sel": _unstack(z, "sel"), "engine_sel": _unstack(z, "engine_sel")}


def compare(paths: list[Path], tolerance: float) -> int:
    from dipdeploy.agreement import Tolerance, compare_runs

    runs = [load(p) for p in paths]
    ref = runs[0]
    rm = ref["meta"]
    print(f"reference: {rm['arch']} native={'yes' if rm['native'] else 'no'} (ORT {rm['onnxruntime']}); "
          f"{len(ref['prompt_ids'])} teacher-forced positions + {len(ref['tokens'])} greedy tokens; "
          f"tolerance max |Δlogit| ≤ {tolerance:g} (max |logit| {np.abs(ref['logits']).max():.3f})")
    header = ("arch", "cpu", "SIMD", "native", "ORT", "tokens agree", "max |Δlogit|", "min top-2 gap",
              "engine tokens agree", "engine max |Δ|", "ok")
    n, g = len(ref["prompt_ids"]), len(ref["tokens"])
    rows, failed = [], False

    def steps_of(logits: np.ndarray) -> list:  # step 0: the prefill (a row per prompt position), then a row per token
        return [logits[:n]] + list(logits[n:n + g])

    def tokens_cell(res) -> str:
        t = res.tokens
        if t.first_difference is None:
            return "yes" if res.selection_parting is None else f"yes (to position {res.selection_parting})"
        return f"near-tie at {t.first_difference}" if t.ok else f"NO (from {t.first_difference})"

    tol = Tolerance(tolerance, tolerance)
    ref_steps = steps_of(ref["logits"])
    for r in runs:
        m = r["meta"]
        same_ids = np.array_equal(r["prompt_ids"], ref["prompt_ids"])
        res = compare_runs(ref_steps, ref["tokens"], ref["sel"], steps_of(r["logits"]), r["tokens"], r["sel"], n, tol)
        ok = same_ids and res.ok
        e_tok = e_diff = "-"
        if r["engine_tokens"] is not None:
            e_res = compare_runs(ref_steps, ref["tokens"], ref["sel"], list(r["engine_logits"]), r["engine_tokens"],
                                 r["engine_sel"], n, tol)
            ok = ok and e_res.ok
            e_tok, e_diff = tokens_cell(e_res), f"{e_res.logits.max_abs_diff:.3g}"
            if not e_res.ok:
                print(f"{m['arch']} engine: {e_res.describe()}")
        if not res.ok:
            print(f"{m['arch']} {'native' if m['native'] else 'stock'}: {res.describe()}")
        failed |= not ok
        rows.append((m["arch"], m["cpu"], m["features"], "yes" if m["native"] else "no", m["onnxruntime"],
                     tokens_cell(res) if same_ids else "NO (prompt ids differ)",
                     f"{res.logits.max_abs_diff:.3g}", f"{m['min_greedy_margin']:.3g}", e_tok, e_diff,
                     "ok" if ok else "MISMATCH"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print(line(row))
    print(f"greedy tokens: {ref['tokens'].tolist()} {rm['text']!r}")
    if failed:
        print("ARM CHECK FAILED: a run differs from the reference beyond the tolerance (table above)")
        return 1
    print("ARM CHECK OK: every run matches the reference")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the fixed input through a bundle, write an npz")
    r.add_argument("--bundle", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--native", type=Path, default=None, help="the native op library to register (default: stock ORT)")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--cpu", default="host", help="a label for the table: the CPU (model) it ran on")
    r.add_argument("--engine", action="store_true", help="also generate with dipdeploy.runtime.Engine")
    r.add_argument("--dram-budget", default="50%", help="the engine's DRAM budget (default 50%%)")
    r.add_argument("--positions", type=int, default=16)
    r.add_argument("--greedy", type=int, default=8)
    c = sub.add_parser("compare", help="compare npz runs against the first one")
    c.add_argument("--tolerance", type=float, default=1e-3)
    c.add_argument("runs", type=Path, nargs="+")
    e = sub.add_parser("expose", help="write model.selections.onnx (selections as outputs) into a bundle")
    e.add_argument("--bundle", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "expose":
        expose(a.bundle)
        return 0
    if a.cmd == "run":
        run(a.bundle, a.out, a.native, a.threads, a.positions, a.greedy, a.cpu, a.engine, a.dram_budget)
        return 0
    return compare(a.runs, a.tolerance)


if __name__ == "__main__":
    sys.exit(main())
