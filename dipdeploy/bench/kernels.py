"""The kernels suite: the SparseGatherMatMul kernel against the dense kernel, side by side, one matrix at a time.

Each shape (``-m``: a registry model's MLP matrices, the bundled up+gate rows [d, 2F] and the down rows
[F, d]; or ``--shape RxO``) is timed at N = 1 token over a grid of weight formats (``--quant``), MLP
densities (the share of rows selected, in a random order as DIP's scores give them), ORT threads, the
implementations (``native``: the op library's kernel; ``fallback``: the same model on stock onnxruntime,
the model-local function; ``matmulnbits``: com.microsoft MatMulNBits int4 block 32, a dense int4
baseline) and accuracy levels (``--accuracy-level``: 4 gives BQ4 int8 coefficients and MatMulNBits int8
activations; other formats run at 0 only). The dense fp32 MatMul of the same shape runs beside every
configuration, at each thread count, and each row's ``× dense`` is its time over the dense one's.

The cases of one shape are built at once and timed interleaved: a repetition is ``--calls`` rounds of
one call of every case, so a change in the machine's load falls on all of them alike, and its figure is
the median of its calls; a row is the mean ± standard deviation over the repetitions. With ``--cache
cold`` a case runs L copies of its matrix with distinct weights side by side (L·bytes ≥ ``COLD_BYTES``,
well above a last-level cache) and reports the time per copy: weights from DRAM, as a decode step over a
whole model sees them. A fallback of a large shape runs after the others on its own (its intermediate
tensors take gigabytes per session). Each ``--kernel-set`` other than ``best`` (the one the op library
picks on this CPU) runs in a process of its own with ``DIPDEPLOY_OPS_ISA`` set, since the library picks
its set once, when it is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, ClassVar

import numpy as np

from dipdeploy.bench.grid import MAX_VALUES, check_runs
from dipdeploy.bench.rows import SuiteResult, mean_std
from dipdeploy.limits import check_count

Notice = Callable[[str], None]
FORMATS = ("fp32", "fp16", "bq4", "vq3")
IMPLS = ("native", "fallback", "matmulnbits")
CACHES = ("warm", "cold")
#: ``best``: the set the op library picks on this CPU; the others cap it ($DIPDEPLOY_OPS_ISA)
KERNEL_SETS = ("best", "avx2", "portable")
LEVELS = (0, 4)
#: calls per repetition (``--calls``), and ``--quick``'s
DEFAULT_CALLS, QUICK_CALLS, MAX_CALLS = 50, 10, 10000
DEFAULT_REPETITIONS, QUICK_REPETITIONS = 5, 1
#: a matrix's side and weights: the largest model's MLP fits, a typo does not allocate the machine
MAX_SIDE, MAX_WEIGHTS = 1 << 17, 1 << 28
#: bytes of weights per case under ``--cache cold``: about three times a server's last-level cache
COLD_BYTES = 96e6
MAX_COPIES = 256
#: weights per matrix above which the fallback runs alone, after the interleaved cases
FALLBACK_ALONE = 4 << 20


@dataclass(frozen=True)
class Shape:
    name: str
    rows: int  # R: input features, the rows the kernel selects from
    cols: int  # O: outputs


def parse_shape(text: str) -> Shape:
    """``RxO`` (``576x3072``), each side a multiple of 32 (BQ4's and MatMulNBits' block)."""
    r, sep, o = text.lower().partition("x")
    if not sep or not r.isdigit() or not o.isdigit():
        raise ValueError(f"--shape {text!r} is not RxO (the rows selected from × the outputs), e.g. 576x3072")
    rows, cols = int(r), int(o)
    for side in (rows, cols):
        check_count(side, f"--shape {text}: a side", 32, MAX_SIDE)
        if side % 32:
            raise ValueError(f"--shape {text}: {side} is not a multiple of 32 (BQ4's block); give such sides")
    if rows * cols > MAX_WEIGHTS:
        raise ValueError(f"--shape {text} holds {rows * cols} weights, over the cap of {MAX_WEIGHTS}")
    return Shape(text, rows, cols)


def model_shapes(name: str) -> list[Shape]:
    """A registry model's MLP matrices as the runtime's kernels see them: up+gate [d, 2F], down [F, d]."""
    from dipdeploy.registry import get_model

    s = get_model(name).shape
    d, f = s.hidden_size, s.intermediate_size
    return [Shape(f"{name} up+gate", d, 2 * f), Shape(f"{name} down", f, d)]


@dataclass(frozen=True)
class KernelCase:
    shape: Shape
    format: str  # a weight format, "fp32" for the dense MatMul, "int4" for MatMulNBits
    density: float  # 1 for the dense kernels
    threads: int
    impl: str  # native | fallback | dense | matmulnbits
    level: int
    cache: str

    def label(self) -> str:
        return self.impl + (f" L{self.level}" if self.level else "")


@dataclass
class KernelGrid:
    shapes: list[Shape]
    formats: list[str] = field(default_factory=lambda: ["bq4"])
    densities: list[float] = field(default_factory=lambda: [0.5])
    threads: list[int] = field(default_factory=lambda: [1])
    impls: list[str] = field(default_factory=lambda: ["native"])
    levels: list[int] = field(default_factory=lambda: [0])
    caches: list[str] = field(default_factory=lambda: ["warm"])
    kernel_sets: list[str] = field(default_factory=lambda: ["best"])
    repetitions: int = DEFAULT_REPETITIONS
    calls: int = DEFAULT_CALLS

    def __post_init__(self) -> None:
        if not self.shapes:
            raise ValueError("give shapes: -m MODEL (its MLP matrices) or --shape RxO")
        if len(self.shapes) > MAX_VALUES:
            raise ValueError(f"the grid has {len(self.shapes)} shapes, over the cap of {MAX_VALUES}")
        check_count(self.repetitions, "-r/--repetitions", 1, 100, "repetitions")
        check_count(self.calls, "--calls", 1, MAX_CALLS, "calls")

    def cases(self) -> list[KernelCase]:
        """Per shape and cache: the dense MatMul at each thread count, then every sparse configuration in
        flag order, then MatMulNBits; level 4 only where it means something (a format with int8
        coefficients in the native kernel, MatMulNBits)."""
        from dipdeploy.ops.formats import weight_format

        out = []
        for shape in self.shapes:
            for cache in self.caches:
                out += [KernelCase(shape, "fp32", 1.0, t, "dense", 0, cache) for t in self.threads]
                for fmt in self.formats:
                    for rho in self.densities:
                        for t in self.threads:
                            for impl in (i for i in self.impls if i != "matmulnbits"):
                                for level in self.levels:
                                    if level and (not weight_format(fmt).int8 or impl != "native"):
                                        continue
                                    out.append(KernelCase(shape, fmt, rho, t, impl, level, cache))
                if "matmulnbits" in self.impls:
                    out += [KernelCase(shape, "int4", 1.0, t, "matmulnbits", level, cache)
                            for level in self.levels for t in self.threads]
        cases = list(dict.fromkeys(out))
        check_runs(len(cases) * len(self.kernel_sets), self.repetitions)
        return cases


@dataclass(frozen=True)
class KernelRow:
    shape: str
    rows: int
    cols: int
    format: str
    density: float
    threads: int
    impl: str
    cache: str
    kernel_set: str
    us: float  # wall µs per call (per copy under --cache cold): mean of the repetitions' medians
    us_std: float
    repetitions: int
    calls: int
    cpu_us: float | None = None  # the calling thread's CPU µs (1-thread rows only)
    weight_mb: float = 0.0  # the weight bytes the kernel must read: the selected rows only for a sparse one
    gb_s: float = 0.0
    gflop_s: float = 0.0  # 2 · rows read · O per call
    x_dense: float | None = None  # us over the dense MatMul's at the same shape, threads and cache

    MD_COLUMNS: ClassVar[tuple[str, ...]] = ("shape", "R×O", "format", "ρ", "threads", "impl", "cache", "kernels",
                                             "µs/call", "CPU µs", "MB read", "GB/s", "GFLOP/s", "× dense")
    MD_OPTIONAL: ClassVar[dict[str, str]] = {"CPU µs": "", "cache": "warm"}
    MD_NUMERIC: ClassVar[tuple[str, ...]] = ("µs/call", "CPU µs", "GB/s", "GFLOP/s", "× dense", "ρ", "threads")
    SCHEMA: ClassVar[str] = "bench.kernels"

    def as_dict(self) -> dict:
        return asdict(self)

    def cells(self) -> tuple[str, ...]:
        return (self.shape, f"{self.rows}×{self.cols}", self.format, f"{self.density:g}", str(self.threads),
                self.impl, self.cache, self.kernel_set, f"{self.us:.1f} ± {self.us_std:.1f}",
                "" if self.cpu_us is None else f"{self.cpu_us:.1f}", f"{self.weight_mb:.3g}", f"{self.gb_s:.2f}",
                f"{self.gflop_s:.2f}", "" if self.x_dense is None else f"{self.x_dense:.2f}")


def _build(case: KernelCase, rng: np.random.Generator, x: np.ndarray, idx: dict):
    """(bound session, weight bytes a call reads, rows a call multiplies, copies) of ``case``."""
    from dipdeploy.bench.kernel_models import Bound, dense_model, matmulnbits_model, random_weights, session, stack
    from dipdeploy.ops.nodes import make_sgmm_model

    r, o = case.shape.rows, case.shape.cols

    def copies(nbytes: float) -> int:
        return int(min(MAX_COPIES, max(1, np.ceil(COLD_BYTES / nbytes)))) if case.cache == "cold" else 1

    if case.impl == "dense":
        n = copies(r * o * 4)
        models = [dense_model(rng.standard_normal((r, o), dtype=np.float32)) for _ in range(n)]
        model = models[0] if n == 1 else stack(models, {"X"})
        return Bound(session(model.SerializeToString(), case.threads, False), {"X": x}), r * o * 4, r, n
    if case.impl == "matmulnbits":
        size = matmulnbits_model(r, o, case.level, rng)[1]
        n = copies(size)
        models = [matmulnbits_model(r, o, case.level, rng)[0] for _ in range(n)]
        model = models[0] if n == 1 else stack(models, {"X"})
        return Bound(session(model.SerializeToString(), case.threads, False), {"X": x}), size, r, n
    k = max(1, int(round(case.density * r)))
    key = (r, k)
    if key not in idx:
        idx[key] = rng.permutation(r)[:k][None].astype(np.int64)
    probe = random_weights(case.format, r, o, rng)
    n = copies(k * probe.row_nbytes())
    ws = [probe] + [random_weights(case.format, r, o, rng) for _ in range(n - 1)]
    feeds = {"X": x, "indices": idx[key]}
    models = [make_sgmm_model(w, r, weights_as_inputs=True, accuracy_level=case.level) for w in ws]
    if n == 1:
        feeds.update({f"W{i}": a for i, a in enumerate(probe.arrays)})
        model = models[0]
    else:
        for layer, w in enumerate(ws):
            feeds.update({f"W{i}.{layer}": a for i, a in enumerate(w.arrays)})
        model = stack(models, {"X", "indices"})
    sess = session(model.SerializeToString(), case.threads, case.impl == "native")
    return Bound(sess, feeds), k * probe.row_nbytes(), k, n


def groups(cases: list[KernelCase]) -> list[list[int]]:
    """Indices of the cases timed together: one group per shape and cache, a large fallback alone after it."""
    out: dict[tuple, list[int]] = {}
    for i, c in enumerate(cases):
        alone = c.impl == "fallback" and c.shape.rows * c.shape.cols > FALLBACK_ALONE
        out.setdefault((c.shape, c.cache, i if alone else -1), []).append(i)
    return list(out.values())


def _describe(c: KernelCase) -> str:
    what = "" if c.impl in ("dense", "matmulnbits") else f" ρ {c.density:g}"
    return f"{c.shape.name} {c.format}{what} {c.label()}, {c.threads} thread(s), {c.cache}"


def _rows(cases: list[KernelCase], timed: dict[int, list[tuple[float, float]]], meta: dict, calls: int,
          kernel_set: str) -> list[KernelRow]:
    rows = []
    for i, c in enumerate(cases):
        if i not in timed:
            continue
        nbytes, nrows, copies = meta[i]
        us, std = mean_std([w / copies for w, _ in timed[i]])
        cpu = float(np.mean([u / copies for _, u in timed[i]])) if c.threads == 1 else None
        rows.append(KernelRow(c.shape.name, c.shape.rows, c.shape.cols, c.format, c.density, c.threads,
                              c.label(), c.cache, kernel_set, us, std, len(timed[i]), calls, cpu,
                              nbytes / 1e6, nbytes / us / 1e3, 2 * nrows * c.shape.cols / us / 1e3))
    dense = {(r.shape, r.threads, r.cache): r.us for r in rows if r.impl == "dense"}
    return [KernelRow(**{**r.as_dict(), "x_dense": r.us / dense[r.shape, r.threads, r.cache]})
            if (r.shape, r.threads, r.cache) in dense else r for r in rows]


def run_here(grid: KernelGrid, notice: Notice = lambda line: None) -> SuiteResult:
    """Every case in this process, with the kernel set the library picks here."""
    from dipdeploy.ops.native import kernel_set, require_library

    require_library()
    t0 = time.perf_counter()
    cases = grid.cases()
    kset = kernel_set() or "unknown"
    timed: dict[int, list[tuple[float, float]]] = {}
    meta: dict[int, tuple[float, int, int]] = {}
    interrupted = False
    todo = groups(cases)
    try:
        for g, members in enumerate(todo, 1):
            rng = np.random.default_rng(0)
            first = cases[members[0]]
            x = rng.standard_normal((1, first.shape.rows)).astype(np.float32)
            notice(f"[{g}/{len(todo)}] {first.shape.name} ({first.shape.rows}×{first.shape.cols}, {first.cache}): "
                   f"building {len(members)} session(s)")
            bound, idx = {}, {}
            for i in members:
                bound[i], *m = _build(cases[i], rng, x, idx)
                meta[i] = tuple(m)
            for rep in range(grid.repetitions):
                times = {i: [] for i in members}
                for _ in range(grid.calls):
                    for i in members:
                        times[i].append(bound[i].call_us())
                for i in members:
                    walls, cpus = zip(*times[i])
                    timed.setdefault(i, []).append((float(np.median(walls)), float(np.median(cpus))))
                notice(f"[{g}/{len(todo)}] repetition {rep + 1}/{grid.repetitions}: " + ", ".join(
                    f"{_describe(cases[i])} {timed[i][-1][0] / meta[i][2]:.1f} µs" for i in members))
            del bound
    except KeyboardInterrupt:
        interrupted = True
        notice("interrupted: the rows hold the repetitions measured so far")
    return SuiteResult(_rows(cases, timed, meta, grid.calls, kset), time.perf_counter() - t0, [], interrupted)


def run_kernels(grid: KernelGrid, notice: Notice = lambda line: None) -> SuiteResult:
    """The grid in this process where it asks for the ``best`` set alone, else one child per kernel set."""
    if grid.kernel_sets == ["best"]:
        return run_here(grid, notice)
    t0 = time.perf_counter()
    rows, notes = [], []
    for kset in grid.kernel_sets:
        env = {k: v for k, v in os.environ.items() if k != "DIPDEPLOY_OPS_ISA"}
        if kset != "best":
            env["DIPDEPLOY_OPS_ISA"] = kset
        notice(f"kernel set {kset}: a process of its own")
        spec = {**asdict(grid), "kernel_sets": ["best"]}
        done = subprocess.run([sys.executable, "-m", "dipdeploy.bench.kernels", json.dumps(spec)],
                              stdout=subprocess.PIPE, env=env, text=True)
        if done.returncode != 0:
            notes.append(f"kernel set {kset}: the child exited {done.returncode}")
            if done.returncode == 130:
                return SuiteResult(rows, time.perf_counter() - t0, notes, True)
            continue
        got = [KernelRow(**r) for r in json.loads(done.stdout)]
        if kset != "best" and got and got[0].kernel_set != kset:
            notes.append(f"kernel set {kset}: the library ran {got[0].kernel_set} (this CPU or library has no {kset})")
        rows += got
    return SuiteResult(rows, time.perf_counter() - t0, notes)


def _child(spec: str) -> int:
    raw = json.loads(spec)
    raw["shapes"] = [Shape(**s) for s in raw["shapes"]]
    result = run_here(KernelGrid(**raw), lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps([r.as_dict() for r in result.rows]))
    return 130 if result.interrupted else 0


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1]))
