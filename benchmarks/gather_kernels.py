"""Benchmark: SparseGatherMatMul kernels vs stock-ORT fallback, dense fp32 MatMul and MatMulNBits.

At Mistral-7B MLP shapes (bundled up+gate rows [4096, 28672], down rows [14336, 4096]) and SmolLM2
shapes ([576, 3072], [1536, 576]), N = 1 token, 1 and 2 intra-op threads, ρ_row ∈ {0.25, 0.5, 0.75}
of the rows selected (in DIP score order, i.e. unsorted), for fp32, fp16, BQ4 (block 32, symmetric)
and VQ3 (int8 codebooks, default groups):

- native:        SparseGatherMatMul with the native library registered
- native4:       the same at accuracy_level 4 (BQ4 only: int8 coefficients, integer dot products)
- fallback:      the same model on stock ORT (the model-local function: Gather + decode + MatMul)
- dense:         ONNX MatMul over the whole fp32 matrix (constant initializer)
- matmulnbits0/4: com.microsoft MatMulNBits, int4 block 32, prepacked constant, accuracy_level 0 / 4

SmolLM2 matrices fit in this machine's L3, so their plain rows time cache-resident compute; the
"cold" rows run L layers of distinct weights side by side (≥ 96 MB per implementation) and report the
time per layer, which is what a decode step over the whole model sees (weights from DRAM).

Weights are random (kernel time does not depend on values; correctness is tests/test_ops_harness.py).
Sparse paths get the weights as bound graph inputs (zero copy, as the host runtime feeds them).
A last table times TopKColumnMask (native vs fallback) at the hidden and intermediate widths.
Each time is the median of repeated `run_with_iobinding` calls, the cases of a shape run round-robin so
that load changes on this shared machine hit them alike (at Mistral shapes the fallback runs on its own); "bytes" counts the weight bytes the
implementation must read (selected rows only for sparse, all for dense) and GB/s = bytes / time.

    python benchmarks/gather_kernels.py --quick            # < 2 min: ρ_row = 0.5, no fallback at Mistral shapes
    python benchmarks/gather_kernels.py --json out.json    # full

Writes benchmarks/results/kernels.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from dipdeploy.ops.formats import OpWeights
from dipdeploy.ops.native import require_library, session_options
from dipdeploy.ops.nodes import make_sgmm_model
from dipdeploy.quant.block import BlockQuantTensor
from dipdeploy.quant.config import Block4QuantConfig, VQ3QuantConfig
from dipdeploy.quant.vq import VQTensor, group_shape

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = {  # name: (rows R = input features, cols O = outputs) of the row matrix
    "mistral-7b up+gate": (4096, 28672),
    "mistral-7b down": (14336, 4096),
    "smollm2 up+gate": (576, 3072),
    "smollm2 down": (1536, 576),
}
FORMATS = ("fp32", "fp16", "bq4", "vq3")
IMPLS = ("native", "fallback", "dense", "matmulnbits")
BQ4_BLOCK = 32


@dataclass
class Row:
    shape: str
    format: str
    rho: float
    threads: int
    impl: str
    median_us: float
    bytes: int
    gbps: float
    runs: int
    cpu_us: float | None = None  # median CPU time of the calling thread (1-thread rows only)


def random_weights(fmt: str, rows: int, cols: int, rng: np.random.Generator) -> OpWeights:
    """Random weights in ``fmt`` (valid codes, positive scales), built without quantising."""
    if fmt in ("fp32", "fp16"):
        return OpWeights.from_matrix(rng.standard_normal((rows, cols), dtype=np.float32).astype(fmt.replace("fp", "float")))
    if fmt == "bq4":
        cfg = Block4QuantConfig(block_size=BQ4_BLOCK)
        q = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
        s = (rng.random((rows, cols // BQ4_BLOCK), dtype=np.float32) * 0.01 + 1e-3).astype(np.float16)
        return OpWeights.from_packed(BlockQuantTensor(cfg, rows, cols, q, s))
    cfg = VQ3QuantConfig()
    gr, gc = group_shape(rows, cols, cfg)
    ngr, ngc = -(-rows // gr), -(-cols // gc)
    codes = rng.integers(0, 256, (rows, -(-6 * (cols // 2) // 8)), dtype=np.uint8)
    cb = rng.integers(-128, 128, (ngr, ngc, 64, 2), dtype=np.int8)
    cbs = np.full((ngr, ngc), 1e-3, dtype=np.float16)
    return OpWeights.from_packed(VQTensor(cfg, rows, cols, gr, gc, codes, cb, cbs))


def stack_layers(models: list, shared: set[str]):
    """One model running ``models`` side by side (a model per "layer"): every name not in ``shared`` gets
    the suffix ``.l``. Used for cold-cache timing: L layers of distinct weights exceed the LLC."""
    import copy

    first = models[0]
    graph = helper.make_graph([], "layers", [], [])
    seen_inputs = set()
    for l, m in enumerate(models):
        rn = lambda n: n if (not n or n in shared) else f"{n}.{l}"  # noqa: E731
        for node in m.graph.node:
            c = copy.deepcopy(node)
            c.name = f"{node.name}.{l}"
            c.input[:] = [rn(i) for i in node.input]
            c.output[:] = [rn(o) for o in node.output]
            graph.node.append(c)
        for t in m.graph.initializer:
            c = copy.deepcopy(t)
            c.name = rn(t.name)
            graph.initializer.append(c)
        for vi in m.graph.input:
            if rn(vi.name) not in seen_inputs:
                seen_inputs.add(rn(vi.name))
                c = copy.deepcopy(vi)
                c.name = rn(vi.name)
                graph.input.append(c)
        for vi in m.graph.output:
            c = copy.deepcopy(vi)
            c.name = rn(vi.name)
            graph.output.append(c)
    out = helper.make_model(graph, opset_imports=list(first.opset_import), ir_version=first.ir_version)
    out.functions.extend(first.functions)
    return out


def session(model_bytes: bytes, threads: int, native: bool) -> ort.InferenceSession:
    """No spinning: the cases run round-robin, and a 2-thread session's pool spinning after its run would
    take the core from the next case (seen: load average 8 on 2 cores, 1-thread ratios moved by 1.7×)."""
    so = session_options(threads, native)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


class Bound:
    """A session with every input and output bound once (zero copy), ready for timed runs."""

    def __init__(self, sess: ort.InferenceSession, feeds: dict) -> None:
        self.sess, self.io = sess, sess.io_binding()
        self.values = [ort.OrtValue.ortvalue_from_numpy(a) for a in feeds.values()]
        for name, value in zip(feeds, self.values):
            self.io.bind_ortvalue_input(name, value)
        for o in sess.get_outputs():
            self.io.bind_output(o.name)
        sess.run_with_iobinding(self.io)  # warm-up (allocations, first-touch)

    def run_us(self) -> tuple[float, float]:
        """(wall µs, CPU µs of this thread) of one run. With one intra-op thread ORT computes on the
        calling thread, so the CPU time is the run's cost without the time other jobs held the core."""
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        self.sess.run_with_iobinding(self.io)
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        return (t1 - t0) / 1e3, (c1 - c0) / 1e3


def interleaved(cases: dict, budget_s: float, max_runs: int) -> dict:
    """(median wall µs, run count, median thread-CPU µs) per case, running the cases round-robin (one
    run each per round) so a change in machine load hits every case alike; at least 3 runs each."""
    times = {key: [] for key in cases}
    start = time.perf_counter()
    while True:
        for key, bound in cases.items():
            if len(times[key]) < max_runs:
                times[key].append(bound.run_us())
        fewest = min(len(t) for t in times.values())
        if fewest >= max_runs or (fewest >= 3 and time.perf_counter() - start > budget_s):
            break
    return {key: (float(np.median([w for w, _ in t])), len(t), float(np.median([c for _, c in t])))
            for key, t in times.items()}


def dense_model(w: np.ndarray, as_proto: bool = False):
    rows, cols = w.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "dense",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, rows])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, cols])],
        initializer=[numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    return model if as_proto else model.SerializeToString()


def matmulnbits_model(rows: int, cols: int, level: int, rng: np.random.Generator, as_proto: bool = False):
    """MatMulNBits (K = rows, N = cols), int4 block 32, random codes; returns (model, weight bytes)."""
    nblk = rows // BQ4_BLOCK
    b = rng.integers(0, 256, (cols, nblk, BQ4_BLOCK // 2), dtype=np.uint8)
    scales = (rng.random(cols * nblk, dtype=np.float32) * 0.01 + 1e-3).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["X", "B", "scales"], ["Y"], domain="com.microsoft", K=rows, N=cols,
                            bits=4, block_size=BQ4_BLOCK, accuracy_level=level)
    graph = helper.make_graph(
        [node], "nbits", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, rows])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, cols])],
        initializer=[numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")],
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                   helper.make_opsetid("com.microsoft", 1)])
    return (model if as_proto else model.SerializeToString()), b.nbytes + scales.nbytes


COLD_BYTES = 96e6  # per implementation: about 3x this machine's L3, so every run reads from DRAM


def bench_cold(name: str, threads_list, formats, budget_s: float) -> list[Row]:
    """ρ_row = 0.5, with L layers of distinct weights (L·bytes ≥ COLD_BYTES) run side by side; time per layer.

    SmolLM2 matrices fit in the LLC, so the warm rows time cache-resident compute; these time what a
    whole-model decode step sees, where each layer's weights come from DRAM.
    """
    rows, cols = SHAPES[name]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, rows)).astype(np.float32)
    cases, nbytes, layers = {}, {}, {}

    def layers_for(size: float) -> int:
        return int(min(256, max(1, np.ceil(COLD_BYTES / size))))

    L = layers_for(rows * cols * 4)
    dense = stack_layers([dense_model(rng.standard_normal((rows, cols), dtype=np.float32), True) for _ in range(L)],
                         {"X"}).SerializeToString()
    for th in threads_list:
        key = ("fp32", 1.0, th, "dense")
        cases[key], nbytes[key], layers[key] = Bound(session(dense, th, False), {"X": x}), rows * cols * 4, L
    del dense
    for level in (0, 4):
        size = matmulnbits_model(rows, cols, level, rng)[1]
        L = layers_for(size)
        model = stack_layers([matmulnbits_model(rows, cols, level, rng, True)[0] for _ in range(L)], {"X"})
        model = model.SerializeToString()
        for th in threads_list:
            key = ("int4", 1.0, th, f"matmulnbits{level}")
            cases[key], nbytes[key], layers[key] = Bound(session(model, th, False), {"X": x}), size, L
    k = rows // 2
    idx = rng.permutation(rows)[:k][None].astype(np.int64)
    for fmt in formats:
        probe = random_weights(fmt, rows, cols, rng)
        L = layers_for(rows * probe.row_nbytes())
        ws = [probe] + [random_weights(fmt, rows, cols, rng) for _ in range(L - 1)]
        feeds = {"X": x, "indices": idx}
        for layer, w in enumerate(ws):
            feeds.update({f"W{i}.{layer}": a for i, a in enumerate(w.arrays)})
        for impl, level in (("native", 0), ("native4", 4)) if fmt == "bq4" else (("native", 0),):
            model = stack_layers([make_sgmm_model(w, rows, weights_as_inputs=True, accuracy_level=level) for w in ws],
                                 {"X", "indices"}).SerializeToString()
            for th in threads_list:
                key = (fmt, 0.5, th, impl)
                cases[key], nbytes[key], layers[key] = Bound(session(model, th, True), feeds), k * probe.row_nbytes(), L
    results = interleaved(cases, budget_s * len(cases) / 4, 100)
    return [make_row(f"{name} cold", key, (us / layers[key], runs, cpu / layers[key]), nbytes[key])
            for key, (us, runs, cpu) in results.items()]


SMALL_SHAPE = 4 << 20  # weights per matrix up to which the fallback joins the round-robin


def bench_shape(name: str, rhos, threads_list, formats, impls, budget_s: float) -> list[Row]:
    """One shape: native, dense and MatMulNBits (and, for small shapes, the fallback) timed round-robin.

    At Mistral shapes the fallback runs afterwards on its own: its intermediate tensors take GBs per
    session, too much to keep every session alive at once, and at 10-1000x the native time the cache
    state between its runs does not matter.
    """
    rows, cols = SHAPES[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, rows)).astype(np.float32)
    cases, nbytes, fallback = {}, {}, []
    if "dense" in impls:
        dense = dense_model(rng.standard_normal((rows, cols), dtype=np.float32))
        for th in threads_list:
            cases["fp32", 1.0, th, "dense"] = Bound(session(dense, th, False), {"X": x})
            nbytes["fp32", 1.0, th, "dense"] = rows * cols * 4
        del dense
    for level in (0, 4) if "matmulnbits" in impls else ():
        model, size = matmulnbits_model(rows, cols, level, rng)
        for th in threads_list:
            cases["int4", 1.0, th, f"matmulnbits{level}"] = Bound(session(model, th, False), {"X": x})
            nbytes["int4", 1.0, th, f"matmulnbits{level}"] = size
    for fmt in formats:
        w = random_weights(fmt, rows, cols, rng)
        model = make_sgmm_model(w, rows, weights_as_inputs=True).SerializeToString()
        model4 = make_sgmm_model(w, rows, weights_as_inputs=True, accuracy_level=4).SerializeToString()
        weights = {f"W{i}": a for i, a in enumerate(w.arrays)}
        for rho in rhos:
            k = int(round(rho * rows))
            feeds = {"X": x, "indices": rng.permutation(rows)[:k][None].astype(np.int64), **weights}
            for th in threads_list:
                for impl in ("native", "fallback", "native4"):
                    nbytes[fmt, rho, th, impl] = k * w.row_nbytes()
                if "native" in impls:
                    cases[fmt, rho, th, "native"] = Bound(session(model, th, True), feeds)
                if "native" in impls and fmt == "bq4":
                    cases[fmt, rho, th, "native4"] = Bound(session(model4, th, True), feeds)
                if "fallback" in impls and rows * cols <= SMALL_SHAPE:
                    cases[fmt, rho, th, "fallback"] = Bound(session(model, th, False), feeds)
                elif "fallback" in impls:
                    fallback.append(((fmt, rho, th, "fallback"), model, th, feeds))
    results = interleaved(cases, budget_s * max(1, len(cases)) / 4, 200)
    del cases
    for key, model, th, feeds in fallback:
        results[key] = interleaved({key: Bound(session(model, th, False), feeds)}, budget_s / 2, 20)[key]
    return [make_row(name, key, results[key], nbytes[key]) for key in results]


def make_row(shape: str, key: tuple, result: tuple[float, int, float], nbytes: float) -> Row:
    (fmt, rho, th, impl), (us, runs, cpu) = key, result
    cpu_us = round(cpu, 1) if th == 1 else None
    print(f"{shape:24s} {fmt:5s} rho={rho:<5} t={th} {impl:13s} {us:10.1f} us {nbytes / us / 1e3:6.2f} GB/s"
          f"  cpu {cpu:10.1f} us", flush=True)
    return Row(shape, fmt, rho, th, impl, round(us, 1), int(nbytes), round(nbytes / us / 1e3, 2), runs, cpu_us)


TOPK_DIMS = (576, 1536, 4096, 14336)


def bench_topk(threads_list, budget_s: float) -> list[Row]:
    """TopKColumnMask (DIP-CA, γ = 0.2, K as an input, per-row residency), k = D/2: native vs fallback."""
    from dipdeploy.ops.nodes import make_topk_model

    rng = np.random.default_rng(0)
    out = []
    for d in TOPK_DIMS:
        model = make_topk_model(d, cache=True, gamma=0.2, fixed_top_n=4).SerializeToString()
        feeds = {"X": rng.standard_normal((1, d)).astype(np.float32), "K": np.array([d // 2], dtype=np.int64),
                 "C": rng.random((1, d)) < 0.5}
        nbytes = d * 5  # X (float32) + C (bool): what the op reads
        cases = {(th, impl): Bound(session(model, th, impl == "native"), feeds)
                 for th in threads_list for impl in ("native", "fallback")}
        for (th, impl), (us, runs, cpu) in interleaved(cases, budget_s * len(cases), 500).items():
            out.append(Row(f"topk d={d}", "dipca", 0.5, th, impl, round(us, 1), nbytes, round(nbytes / us / 1e3, 3), runs,
                           round(cpu, 1) if th == 1 else None))
            print(f"topk d={d:<6} t={th} {impl:9s} {us:9.1f} us", flush=True)
    return out


def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    lib = ctypes.CDLL(str(require_library()))
    lib.dd_ops_isa.restype = ctypes.c_char_p
    return {"cpu": cpu, "cores": os.cpu_count(), "onnxruntime": ort.__version__, "native_isa": lib.dd_ops_isa().decode(),
            "load_before": os.getloadavg()}


def goals(rows: list[Row]) -> list[str]:
    """The issue's goals on the measured rows: by 1-thread CPU time (robust on a shared machine) and by
    the best wall time over thread counts."""
    cpu = {(r.shape, r.format, r.rho, r.impl): r.cpu_us for r in rows if r.threads == 1 and r.cpu_us}
    wall = {}
    for r in rows:
        key = (r.shape, r.format, r.rho, r.impl)
        wall[key] = min(wall.get(key, float("inf")), r.median_us)
    lines = []
    for shape in dict.fromkeys(r.shape for r in rows):
        # BQ4 against MatMulNBits at the same accuracy level: level 0 keeps float32 activations on
        # both sides, level 4 quantises them (MatMulNBits) or the coefficients (ours) to int8.
        checks = [("fp32", "native", [("fp32", "dense")], "dense fp32", 0.6),
                  ("bq4", "native", [("int4", "matmulnbits0")], "MatMulNBits level 0", 1.0),
                  ("bq4", "native4", [("int4", "matmulnbits4")], "MatMulNBits level 4", 1.0),
                  ("bq4", "native4", [("int4", "matmulnbits4")], "MatMulNBits level 4 (stretch)", 0.6),
                  ("bq4", "native", [("int4", "matmulnbits4")], "MatMulNBits level 4", 1.0),
                  ("vq3", "native", [("fp32", "dense")], "dense fp32", 1.0)]
        for fmt, impl, bases, base_name, target in checks:
            key = (shape, fmt, 0.5, impl)
            base_keys = [(shape, bf, 1.0, bi) for bf, bi in bases]
            if key not in cpu or not all(b in cpu for b in base_keys):
                continue
            r_cpu = cpu[key] / min(cpu[b] for b in base_keys)
            r_wall = wall[key] / min(wall[b] for b in base_keys)
            verdict = "met" if r_cpu <= target else "NOT met"
            name = f"{impl} {fmt}" + (" (level 4)" if impl == "native4" else "")
            lines.append(f"| {shape} | {name} ρ=0.5 / {base_name} | {r_cpu:.2f}× | {r_wall:.2f}× | ≤ {target}× "
                         f"| {verdict} |")
    return lines


def write_markdown(rows: list[Row], info: dict, path: Path, quick: bool) -> None:
    topk = [r for r in rows if r.shape.startswith("topk")]
    rows = [r for r in rows if not r.shape.startswith("topk")]
    dense = {(r.shape, r.threads): r.median_us for r in rows if r.impl == "dense"}
    rel = lambda r: f"{r.median_us / dense[(r.shape, r.threads)]:.2f}" if (r.shape, r.threads) in dense else "–"  # noqa: E731
    lines = [
        "# SparseGatherMatMul kernels (benchmarks/gather_kernels.py)",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores; "
        f"onnxruntime {info['onnxruntime']}; native kernel set: {info['native_isa']}. "
        f"Load average before/after: {info['load_before'][0]:.2f} / {info['load_after'][0]:.2f}. "
        f"N = 1 token, intra-op threads as listed. Mode: {'--quick' if quick else 'full'}.",
        "Times are medians of repeated run_with_iobinding calls; bytes = weight bytes the implementation must read; "
        "GB/s = bytes / time. ρ_row = fraction of rows selected (dense and MatMulNBits read all rows: ρ shown as 1).",
        "",
        "## Goals",
        "",
        "Ratios of 1-thread CPU time (verdict; the calling thread's CPU time, which leaves out the time other "
        "jobs held the core) and of the best wall time over thread counts (disturbed by the machine's load).",
        "",
        "| shape | comparison | CPU ratio (1 thread) | wall ratio (best) | goal | verdict |",
        "|---|---|---|---|---|---|",
        *goals(rows),
        "",
        "## All measurements",
        "",
        "| shape | format | ρ_row | threads | impl | median µs (wall) | CPU µs | MB read | GB/s (wall) | × dense fp32 | runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu_us = f"{r.cpu_us:.1f}" if r.cpu_us else "–"
        lines.append(f"| {r.shape} | {r.format} | {r.rho} | {r.threads} | {r.impl} | {r.median_us:.1f} | {cpu_us} | "
                     f"{r.bytes / 1e6:.1f} | {r.gbps:.2f} | {rel(r)} | {r.runs} |")
    lines += [
        "",
        "## TopKColumnMask (DIP-CA, γ = 0.2, fixed_top_n = 4, k = D/2, N = 1)",
        "",
        "| D | threads | impl | median µs (wall) | CPU µs | runs |",
        "|---|---|---|---|---|---|",
        *(f"| {r.shape.split('=')[1]} | {r.threads} | {r.impl} | {r.median_us:.1f} | {r.cpu_us or '–'} | {r.runs} |"
          for r in topk),
    ]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="ρ_row = 0.5 only, fallback only at SmolLM2 shapes (< 2 min)")
    ap.add_argument("--json", type=Path, help="also write the rows as a JSON list")
    ap.add_argument("--shapes", nargs="*", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--formats", nargs="*", choices=FORMATS, default=list(FORMATS))
    ap.add_argument("--impls", nargs="*", choices=IMPLS, default=list(IMPLS))
    ap.add_argument("--out", type=Path, default=RESULTS / "kernels.md")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-cache (many layers) SmolLM2 rows")
    args = ap.parse_args()
    info = machine()
    rhos = (0.5,) if args.quick else (0.25, 0.5, 0.75)
    rows: list[Row] = []
    for shape in args.shapes:
        impls = [i for i in args.impls if not (i == "fallback" and args.quick and shape.startswith("mistral"))]
        rows += bench_shape(shape, rhos, args.threads, args.formats, impls, budget_s=0.3 if args.quick else 1.0)
    for shape in (s for s in args.shapes if s.startswith("smollm2") and not args.no_cold):
        rows += bench_cold(shape, args.threads, args.formats, budget_s=0.3 if args.quick else 1.0)
    rows += bench_topk(args.threads, budget_s=0.2 if args.quick else 0.5)
    info["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(rows, info, args.out, args.quick)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
