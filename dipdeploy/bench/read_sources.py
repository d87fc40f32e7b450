"""What the reads suite reads: a scratch file of rows on the disk, a bundle's own misses, or DRAM.

* The scratch file (``rows-<bytes>.bin`` in ``--dir``) is written once with random bytes (a file of holes
  would be read without the disk) and synced, then reused; it is cut into groups of ``GROUP_ROWS`` rows of
  the row's size, and each call reads the selected rows of one group, as the runtime reads one MLP
  group's misses per call.
* A bundle's misses: the runtime's trace of a decode (``dipdeploy run --io direct --cold --trace``; a
  ρ = 1 bundle runs ``--policy static``, dense-static) gives, per decode token, layer and group, the rows
  the cache missed; each is one call on the bundle's ``mlp.bin``, at the file rows the bundle keeps them
  in. The trace is made once per bundle, budget and token count in ``--dir`` and reused.
* DRAM: ``row_reads.cc`` (package data), built once with ``g++ -O2 -mavx2`` into ``--dir``: one core's AVX2
  loads of the selected rows of a resident buffer, the hardware's ceiling below any reader's copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: rows per call on the scratch file: an MLP group of a ≈1 B model
GROUP_ROWS = 8192
_CHUNK = 8 << 20
PROBE_SOURCE = Path(__file__).with_name("row_reads.cc")
#: the prompt of the decode whose misses a bundle's rows replay
PROMPT = "The history of the city begins in the early"


@dataclass(frozen=True)
class Batch:
    """One call: the arrays of one group (file offsets, row bytes) and the file rows wanted (ascending)."""

    offsets: tuple[int, ...]
    row_bytes: tuple[int, ...]
    rows: np.ndarray


def scratch_file(folder: Path, size: int, notice) -> Path:
    """The scratch file of ``size`` bytes in ``folder``, written (random bytes, synced) where missing."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rows-{size}.bin"
    if path.is_file() and path.stat().st_size == size:
        return path
    notice(f"writing {path} ({size / 1e6:.0f} MB, once)")
    tmp = path.with_name(f".{path.name}.tmp")
    chunk = np.random.default_rng(0).integers(0, 256, min(size, _CHUNK), dtype=np.uint8).tobytes()
    with open(tmp, "wb") as f:
        left = size
        while left:
            left -= f.write(chunk[:min(left, len(chunk))])
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return path


def scratch_batches(size: int, row_bytes: int, density: float, seed: int = 0) -> list[Batch]:
    """Each group of the scratch file as one call, each row kept with probability ``density`` (at least one)."""
    rows = size // row_bytes
    group = min(GROUP_ROWS, rows)
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, rows - group + 1, group):
        keep = np.flatnonzero(rng.random(group) < density)
        out.append(Batch((start * row_bytes,), (row_bytes,), keep if len(keep) else np.array([0])))
    return out


def trace_path(folder: Path, bundle: Path, budget: str, tokens: int) -> Path:
    tag = hashlib.sha256(str(bundle.resolve()).encode()).hexdigest()[:8]
    return folder / "traces" / f"{bundle.name}-{tag}-{budget.replace('%', 'pct')}-n{tokens}.npz"


def make_trace(bundle: Path, out: Path, tokens: int, budget: str, policy: str | None) -> None:
    """A decode's trace through ``dipdeploy run`` in a process of its own (the engine's ``--trace``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-c", "from dipdeploy.cli import app; app()", "run", str(bundle.resolve()), "-p", PROMPT, "-n", str(tokens),
            "--io", "direct", "--cold", "--dram-budget", budget, "--trace", str(out.resolve()), "--force",
            *(["--policy", policy] if policy else [])]
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"the decode for {bundle}'s trace failed ({last})")


def trace_batches(bundle: Path, trace: Path, tokens: int) -> tuple[list[Batch], int]:
    """The calls of the trace's last ``tokens`` - 1 tokens (the decode steps of a run of ``-n tokens``):
    per token, layer and group with misses, the arrays of ``mlp.bin`` and the file rows missed; and the
    number of decode tokens."""
    from dipdeploy.bundle.manifest import parse_manifest, row_positions

    z = np.load(trace)
    head = json.loads(str(z["header"]))
    manifest = parse_manifest(bundle)
    total = len(z["sel_in.0"])
    first = total - (tokens - 1)
    if tokens < 2 or first < 1:
        raise ValueError(f"{trace} holds {total} tokens, fewer than --tokens {tokens}; delete it or give its -n")
    arrays, positions = {}, {}
    for layer in range(head["num_layers"]):
        for group in ("up_gate", "down"):
            names = [n for n, t in manifest.tensors.items()
                     if n.startswith(f"model.layers.{layer}.mlp.{group}.") and t["file"] == "mlp.bin"]
            ts = [manifest.tensors[n] for n in names]
            arrays[layer, group] = (tuple(t["offset"] for t in ts),
                                    tuple(int(np.prod(t["shape"][1:])) * np.dtype(t["dtype"]).itemsize for t in ts))
            positions[layer, group] = row_positions(bundle, manifest, layer, group, ts[0]["shape"][0]) if ts else None
    out = []
    for t in range(first, total):
        for layer in range(head["num_layers"]):
            for group, key in (("up_gate", "in"), ("down", "glu")):
                sel, hits = z[f"sel_{key}.{layer}"][t], z[f"hits_{key}.{layer}"][t].astype(bool)
                rows = np.unique(sel[~hits]).astype(np.int64)
                offsets, row_bytes = arrays[layer, group]
                if not len(rows) or not offsets:
                    continue
                pos = positions[layer, group]
                out.append(Batch(offsets, row_bytes, rows if pos is None else np.sort(pos[rows])))
    return out, total - first


def probe_binary(folder: Path) -> Path:
    """The DRAM probe, built once per source into ``folder``; refused in one line where it cannot be."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise ValueError(f"--io dram runs an AVX2 probe, x86-64 only (this is {platform.machine()}); leave dram out")
    compiler = shutil.which("g++")
    if compiler is None:
        raise ValueError("--io dram builds its probe with g++, which is not on PATH; install g++ or leave dram out")
    source = PROBE_SOURCE.read_bytes()
    exe = folder / f"row_reads-{hashlib.sha256(source).hexdigest()[:12]}"
    if not exe.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_name(f".{exe.name}.tmp")
        done = subprocess.run([compiler, "-O2", "-mavx2", "-o", str(tmp), str(PROBE_SOURCE)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building the DRAM probe failed: {done.stderr.strip()[:300]}")
        tmp.replace(exe)
    return exe


def dram_pass(exe: Path, size: int, row_bytes: int, density: float, prefetch: int, order: str,
              passes: int = 3) -> tuple[float, int]:
    """(seconds of the fastest of ``passes``, rows read) of the probe over a ``size``-byte buffer."""
    mode = "all" if density >= 1.0 else order
    done = subprocess.run([str(exe), str(size), str(row_bytes), repr(density), str(prefetch), mode, str(passes)],
                          capture_output=True, text=True, check=True)
    seconds, rows, _ = done.stdout.split()
    return float(seconds), int(rows)
