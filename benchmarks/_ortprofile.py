"""Reading onnxruntime's profiler files (``SessionOptions.enable_profiling``): one definition for the
benchmarks that split a decode token into kernels and ORT's per-run framework (host.py, kernel_gap.py,
ceiling.py), and the switch that turns the profiler on for an engine's sessions.

A profile holds, per session run, a ``model_run`` event (the whole ``Run`` call inside ORT), a
``SequentialExecutor::Execute`` event (the node loop) and one ``*_kernel_time`` event per node, each
with the node's op type in ``args.op_name``. The profiler adds several µs to every node event (its own
bookkeeping), so profiled kernel times of small nodes are mostly the profiler's: compare two profiles
with each other, never a profiled figure with an unprofiled one (benchmarks/results/kernel_gap.md).
"""

from __future__ import annotations

import itertools
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

#: ORT's transpose optimizer names the Transpose nodes it inserts ``Transpose_token_<n>``, numbered per graph
_INSERTED = re.compile(r"^Transpose_token_\d+$")


@dataclass
class Kernel:
    op: str
    node: str
    us: float


@dataclass
class Run:
    """One session run: ``run_us`` (ORT's ``model_run``), ``execute_us`` (its node loop), its kernels."""

    run_us: float
    execute_us: float
    kernels: list[Kernel] = field(default_factory=list)

    @property
    def kernel_us(self) -> float:
        return sum(k.us for k in self.kernels)


def node_key(name: str) -> str:
    """A node's name with the layer index removed (``/model/layers.*/attn/Split``), so a layer's node in a
    per-layer graph and in ``model.onnx`` (the same names: dipdeploy/export/blocks.py) sum together;
    the optimizer's inserted Transposes become one key."""
    name = name.removesuffix("_kernel_time")
    return "Transpose_token_* (inserted by ORT's transpose optimizer)" if _INSERTED.match(name) else \
        re.sub(r"layers\.\d+", "layers.*", name)


@contextmanager
def profiled_sessions(folder: str | Path):
    """While inside, every session ``dipdeploy.ops.native.session_options`` makes is profiled by ORT into
    ``folder``, one file per session (an ``Engine`` built inside is profiled throughout)."""
    import dipdeploy.ops.native as native

    plain, number = native.session_options, itertools.count()

    def profiled(threads: int = 1, use_native: bool = True):
        so = plain(threads, use_native)
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(folder) / f"ort{next(number)}")
        return so

    native.session_options = profiled
    try:
        yield
    finally:
        native.session_options = plain


def session_runs(profile: Path, skip: int = 1) -> list[Run]:
    """The runs of one session's profile in time order, the first ``skip`` left out (a prefill run, the
    first decode run's one-off allocations)."""
    events = json.loads(Path(profile).read_text())
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[skip:]
    execs = [e for e in events if e.get("name") == "SequentialExecutor::Execute"]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    out = []
    for r in runs:
        lo, hi = r["ts"], r["ts"] + r["dur"]
        out.append(Run(float(r["dur"]), float(sum(e["dur"] for e in execs if lo <= e["ts"] <= hi)),
                       [Kernel(e["args"].get("op_name", "?"), node_key(e["name"]), float(e["dur"]))
                        for e in nodes if lo <= e["ts"] <= hi]))
    return out
