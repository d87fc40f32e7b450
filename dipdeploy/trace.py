"""The trace file: which weight rows each token selected, per layer — the interface between whatever ran
the model (the torch reference's ``dipdeploy trace``, the host runtime's ``--trace``) and the simulator.

Floor 1: numpy only. One definition, one reader, one writer (docs/design.md: "files are the interfaces").

Format (version 1)
------------------
A single ``.npz`` archive (``np.savez_compressed``, written atomically: temp file + rename) with:

``header``
    a 0-d unicode array holding a JSON object::

        {"format": "dipdeploy-trace", "version": 1,
         "source": "torch" | "runtime" | "synthetic",
         "model": "<registry name or path>",
         "hidden_size": d, "intermediate_size": F, "num_layers": L, "num_tokens": T,
         "method": "dense" | "dip" | "dip-ca" | ...,   # what produced the selections
         "density": ρ,                                 # MLP density, docs/method.md: ρ = (2·K_in/d + K_glu/F)/3
         "k_in": [K_in per layer], "k_glu": [K_glu per layer],
         "gamma": γ or null,                           # DIP-CA re-weighting used while tracing (null: none)
         "score": "abs" | "wina" | ...,                # what the magnitudes below measure
         "policy": "<cache policy while tracing>" or null,
         "has": {"x_abs": bool, "glu_abs": bool, "hits": bool},
         "meta": {...}}                                # free-form: dataset, seqlen, command line

``sel_in.<l>``  int32 [T, K_in(l)]
    input features i of layer l selected at each token = rows of the bundled [W_uᵀ | W_gᵀ]
    (2F weights each). Recommended order: largest score first (what ``topk_indices`` returns); the
    model-shape projection uses this order as the rank of each selected row.
``sel_glu.<l>`` int32 [T, K_glu(l)]
    GLU units j selected = rows of W_dᵀ (d weights each). For a dense trace K = d resp. F (all rows).
``x_abs.<l>``   float16 [T, d]     optional: |x| at the MLP input (the DIP / DIP-CA input score)
``glu_abs.<l>`` float16 [T, F]     optional: |GLU~(x)|, computed under the trace's *own* input mask
``hits_in.<l>``, ``hits_glu.<l>`` bool [T, K]   optional: which selected rows were resident (runtime)

The magnitudes are what the simulator needs to recompute DIP-CA masks under a different cache state, γ
or policy (``dipca_scores(x_abs, resident, γ)`` + ``topk_indices``, token by token). ``glu_abs`` was
recorded under the trace's own input mask, so re-masking the GLU group under another input mask is an
approximation (said again wherever the simulator uses it).

A reader that meets an unknown ``format``/``version`` or a missing field refuses the file and says
which command regenerates it.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dipdeploy.limits import MAX_LAYERS, MAX_TOKENS, MAX_WIDTH
from dipdeploy.paths import check_output

TRACE_FORMAT = "dipdeploy-trace"
TRACE_VERSION = 1
HEADER_MAX = 16 << 20  # bytes of the JSON header (a few kB per trace: K per layer and a free-form meta)
TRACE_SOURCES = ("torch", "runtime", "synthetic")
TRACE_METHODS = ("dense", "dip", "dip-ca", "glu", "gate", "up", "cats", "teal")  # as in dipdeploy.sparsity
REGENERATE_HINT = (
    "regenerate it with `dipdeploy trace --model M --method X --density RHO --out T` "
    "(torch reference) or the runtime's `--trace T` option"
)

_HEADER_KEYS = (
    "format", "version", "source", "model", "hidden_size", "intermediate_size", "num_layers",
    "num_tokens", "method", "density", "k_in", "k_glu", "gamma", "score", "policy", "has", "meta",
)


def mlp_density(k_in: int, k_glu: int, d: int, F: int) -> float:
    """ρ = (2·K_in/d + K_glu/F) / 3: the fraction of MLP weight bytes one token reads (docs/method.md)."""
    return (2.0 * k_in / d + k_glu / F) / 3.0


class TraceError(ValueError):
    """A trace file or object that cannot be used; the message names the problem and the fix."""


def _check_layers(name: str, arrays: list[np.ndarray] | None, L: int, T: int | None, width: int | None,
                  rows: int | None) -> None:
    if arrays is None:
        return
    if len(arrays) != L:
        raise TraceError(f"trace field {name}: {len(arrays)} layers, expected num_layers = {L}")
    for layer, a in enumerate(arrays):
        if a.ndim != 2:
            raise TraceError(f"trace field {name}[{layer}]: expected 2-D [T, K], got shape {a.shape}")
        if T is not None and a.shape[0] != T:
            raise TraceError(f"trace field {name}[{layer}]: {a.shape[0]} tokens, layer 0 of sel_in has {T}")
        if width is not None and a.shape[1] != width:
            raise TraceError(f"trace field {name}[{layer}]: width {a.shape[1]}, expected {width}")
        if rows is not None and a.size and (int(a.min()) < 0 or int(a.max()) >= rows):
            raise TraceError(
                f"trace field {name}[{layer}]: row indices must lie in [0, {rows}), "
                f"got [{int(a.min())}, {int(a.max())}]")


def available_memory() -> int | None:
    """The memory this machine can give a new allocation, in bytes: ``MemAvailable`` where Linux says
    it, else the physical memory (None where the platform says neither)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _check_members(z, path: Path, max_bytes: int | None) -> None:
    """Refuse an archive whose arrays would not fit before reading any: each member's declared size
    (the zip's) must hold the shape its .npy header declares, and the declared sizes together must fit
    in ``max_bytes``. A compressed member inflates to its declared size, so a small file of zeros can
    declare gigabytes; this reads only the headers."""
    from numpy.lib import format as npy

    total = 0
    for info in z.zip.infolist():
        total += info.file_size
        if info.filename == "header.npy" and info.file_size > HEADER_MAX:  # parsed as JSON whole
            raise TraceError(f"{path}: its header is {info.file_size} bytes, over the cap of {HEADER_MAX}; "
                             f"{REGENERATE_HINT}")
        try:
            with z.zip.open(info) as f:
                version = npy.read_magic(f)
                read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                shape, _, dtype = read(f)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            raise TraceError(f"{path}: member {info.filename} is not a readable array ({exc}); "
                             f"{REGENERATE_HINT}") from None
        need = math.prod(shape) * dtype.itemsize
        if need > info.file_size:
            raise TraceError(f"{path}: member {info.filename} declares shape {shape} ({need} bytes) in "
                             f"{info.file_size} bytes; {REGENERATE_HINT}")
    if max_bytes is not None and total > max_bytes:
        raise TraceError(f"{path}: its arrays inflate to {total / 2**30:.2f} GiB, over the cap of the "
                         f"{max_bytes / 2**30:.2f} GiB of memory this process may use; record fewer tokens or "
                         "simulate where there is more memory")


@dataclass
class Trace:
    """Per-token, per-layer selected rows of one run (see the module docstring for the file format)."""

    source: str
    model: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    method: str
    density: float
    sel_in: list[np.ndarray]
    sel_glu: list[np.ndarray]
    gamma: float | None = None
    score: str = "abs"
    policy: str | None = None
    x_abs: list[np.ndarray] | None = None
    glu_abs: list[np.ndarray] | None = None
    hits_in: list[np.ndarray] | None = None
    hits_glu: list[np.ndarray] | None = None
    meta: dict = field(default_factory=dict)
    version: int = TRACE_VERSION

    def __post_init__(self) -> None:
        if self.version != TRACE_VERSION:
            raise TraceError(f"trace version {self.version} is not supported (this reader knows "
                             f"{TRACE_VERSION}); {REGENERATE_HINT}")
        if self.source not in TRACE_SOURCES:
            raise TraceError(f"trace source {self.source!r} unknown; allowed: {', '.join(TRACE_SOURCES)}")
        if self.method not in TRACE_METHODS:
            raise TraceError(f"trace method {self.method!r} unknown; allowed: {', '.join(TRACE_METHODS)}")
        for name, high in (("hidden_size", MAX_WIDTH), ("intermediate_size", MAX_WIDTH), ("num_layers", MAX_LAYERS)):
            if int(getattr(self, name)) < 1:
                raise TraceError(f"trace field {name} must be >= 1, got {getattr(self, name)}")
            if int(getattr(self, name)) > high:
                raise TraceError(f"trace field {name} {getattr(self, name)} is over the cap of {high}")
        if not 0.0 < self.density <= 1.0:
            raise TraceError(f"trace density must lie in (0, 1], got {self.density}")
        if self.gamma is not None and not 0.0 <= self.gamma <= 1.0:
            raise TraceError(f"trace gamma must lie in [0, 1] or be None, got {self.gamma}")
        self.sel_in = [np.asarray(a, dtype=np.int32) for a in self.sel_in]
        self.sel_glu = [np.asarray(a, dtype=np.int32) for a in self.sel_glu]
        d, F, L = self.hidden_size, self.intermediate_size, self.num_layers
        if not self.sel_in or len(self.sel_in) != L:
            raise TraceError(f"trace field sel_in: {len(self.sel_in)} layers, expected num_layers = {L}")
        T = self.sel_in[0].shape[0] if self.sel_in[0].ndim == 2 else None
        if not T:
            raise TraceError("trace holds no tokens (sel_in[0] must be [T, K] with T >= 1)")
        _check_layers("sel_in", self.sel_in, L, T, None, d)
        _check_layers("sel_glu", self.sel_glu, L, T, None, F)
        for name, width, dtype in (("x_abs", d, np.float16), ("glu_abs", F, np.float16)):
            arrays = getattr(self, name)
            if arrays is not None:
                arrays = [np.asarray(a, dtype=dtype) for a in arrays]
                setattr(self, name, arrays)
            _check_layers(name, arrays, L, T, width, None)
        for name, sel in (("hits_in", self.sel_in), ("hits_glu", self.sel_glu)):
            arrays = getattr(self, name)
            if arrays is not None:
                arrays = [np.asarray(a, dtype=bool) for a in arrays]
                setattr(self, name, arrays)
                for layer, (h, s) in enumerate(zip(arrays, sel)):
                    if h.shape != s.shape:
                        raise TraceError(f"trace field {name}[{layer}]: shape {h.shape} != selection {s.shape}")

    # ----- derived ------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return int(self.sel_in[0].shape[0])

    @property
    def k_in(self) -> list[int]:
        return [int(a.shape[1]) for a in self.sel_in]

    @property
    def k_glu(self) -> list[int]:
        return [int(a.shape[1]) for a in self.sel_glu]

    @property
    def has_magnitudes(self) -> bool:
        return self.x_abs is not None and self.glu_abs is not None

    def measured_density(self) -> float:
        """ρ averaged over layers, from the recorded K (may differ from ``density`` by rounding)."""
        d, F = self.hidden_size, self.intermediate_size
        return float(np.mean([mlp_density(ki, kg, d, F) for ki, kg in zip(self.k_in, self.k_glu)]))

    def row_counts(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per layer, how often each up|gate row [d] and each down row [F] was selected (the calibration
        counts a ``static`` cache pins its rows by)."""
        return [(np.bincount(si.reshape(-1), minlength=self.hidden_size),
                 np.bincount(sg.reshape(-1), minlength=self.intermediate_size))
                for si, sg in zip(self.sel_in, self.sel_glu)]

    def head(self, n: int) -> Trace:
        """The first ``n`` tokens (for quick runs)."""
        if n < 1:
            raise TraceError(f"head: n must be >= 1, got {n}")

        def cut(arrays):
            return None if arrays is None else [a[:n] for a in arrays]

        return Trace(
            source=self.source, model=self.model, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_layers=self.num_layers, method=self.method,
            density=self.density, sel_in=cut(self.sel_in), sel_glu=cut(self.sel_glu), gamma=self.gamma,
            score=self.score, policy=self.policy, x_abs=cut(self.x_abs), glu_abs=cut(self.glu_abs),
            hits_in=cut(self.hits_in), hits_glu=cut(self.hits_glu), meta=dict(self.meta),
        )

    # ----- file I/O ---------------------------------------------------------------------------------
    def header(self) -> dict:
        return {
            "format": TRACE_FORMAT, "version": self.version, "source": self.source, "model": self.model,
            "hidden_size": int(self.hidden_size), "intermediate_size": int(self.intermediate_size),
            "num_layers": int(self.num_layers), "num_tokens": self.num_tokens, "method": self.method,
            "density": float(self.density), "k_in": self.k_in, "k_glu": self.k_glu,
            "gamma": None if self.gamma is None else float(self.gamma), "score": self.score,
            "policy": self.policy,
            "has": {"x_abs": self.x_abs is not None, "glu_abs": self.glu_abs is not None,
                    "hits": self.hits_in is not None and self.hits_glu is not None},
            "meta": self.meta,
        }

    def save(self, path: str | os.PathLike, force: bool = False) -> Path:
        """Write the trace atomically (temp file in the same folder, then rename)."""
        path = check_output(Path(path), force)
        arrays: dict[str, np.ndarray] = {"header": np.array(json.dumps(self.header()))}
        for name in ("sel_in", "sel_glu", "x_abs", "glu_abs", "hits_in", "hits_glu"):
            layers = getattr(self, name)
            if layers is not None:
                for layer, a in enumerate(layers):
                    arrays[f"{name}.{layer}"] = a
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez_compressed(f, **arrays)
            os.chmod(tmp, 0o644)  # mkstemp makes it private; a trace is an ordinary output file
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, max_bytes: int | None = None) -> Trace:
        """Read a trace; refuse unknown formats/versions and missing fields with a clear message.
        ``max_bytes``: the most its arrays may inflate to (default: the memory available now; a caller that
        knows a tighter limit, a cgroup's, passes it), checked from the archive's declared sizes before
        any array is read (:func:`_check_members`)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"trace {path} not found; {REGENERATE_HINT}")
        try:
            z = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise TraceError(f"{path} is not a dipdeploy trace (.npz): {exc}; {REGENERATE_HINT}") from exc
        with z:
            if "header" not in z.files:
                raise TraceError(f"{path} has no 'header' entry, so it is not a dipdeploy trace; {REGENERATE_HINT}")
            _check_members(z, path, available_memory() if max_bytes is None else max_bytes)
            try:
                head = json.loads(str(z["header"]))
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}: header is not JSON ({exc}); {REGENERATE_HINT}") from exc
            if not isinstance(head, dict):
                raise TraceError(f"{path}: header is not a JSON object; {REGENERATE_HINT}")
            if head.get("format") != TRACE_FORMAT:
                raise TraceError(f"{path}: format {head.get('format')!r} is not {TRACE_FORMAT!r}; {REGENERATE_HINT}")
            if head.get("version") != TRACE_VERSION:
                raise TraceError(f"{path}: trace version {head.get('version')!r} is not supported (this "
                                 f"reader knows {TRACE_VERSION}); {REGENERATE_HINT}")
            missing = [k for k in _HEADER_KEYS if k not in head]
            if missing:
                raise TraceError(f"{path}: header lacks {', '.join(missing)}; {REGENERATE_HINT}")
            for key, high in (("num_layers", MAX_LAYERS), ("hidden_size", MAX_WIDTH),
                              ("intermediate_size", MAX_WIDTH), ("num_tokens", MAX_TOKENS)):
                value = head[key]
                if type(value) is not int or not 1 <= value <= high:
                    raise TraceError(f"{path}: header {key} {value!r} is not a whole number in [1, {high}] (the "
                                     f"cap); {REGENERATE_HINT}")
            L = head["num_layers"]

            def layers(name: str, required: bool) -> list[np.ndarray] | None:
                keys = [f"{name}.{layer}" for layer in range(L)]
                present = [k in z.files for k in keys]
                if not any(present) and not required:
                    return None
                if not all(present):
                    absent = [k for k, p in zip(keys, present) if not p]
                    raise TraceError(f"{path}: missing arrays {', '.join(absent[:4])}"
                                     f"{' …' if len(absent) > 4 else ''}; {REGENERATE_HINT}")
                return [z[k] for k in keys]

            return cls(
                source=head["source"], model=head["model"], hidden_size=int(head["hidden_size"]),
                intermediate_size=int(head["intermediate_size"]), num_layers=L, method=head["method"],
                density=float(head["density"]), sel_in=layers("sel_in", True), sel_glu=layers("sel_glu", True),
                gamma=head["gamma"], score=head["score"], policy=head["policy"],
                x_abs=layers("x_abs", False), glu_abs=layers("glu_abs", False),
                hits_in=layers("hits_in", False), hits_glu=layers("hits_glu", False),
                meta=head["meta"], version=int(head["version"]),
            )


@dataclass
class TraceRecorder:
    """Accumulates selections layer by layer while a model runs, then builds the ``Trace``.

    Call ``record(layer, sel_in, sel_glu, ...)`` with ``n`` tokens at a time ([n, K] arrays; a prefill
    may record many tokens at once, decoding one); every layer must end up with the same token count.
    """

    source: str
    model: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    method: str
    density: float
    gamma: float | None = None
    score: str = "abs"
    policy: str | None = None
    meta: dict = field(default_factory=dict)
    _parts: dict = field(init=False, default_factory=dict)

    def record(self, layer: int, sel_in: np.ndarray, sel_glu: np.ndarray, x_abs: np.ndarray | None = None,
               glu_abs: np.ndarray | None = None, hits_in: np.ndarray | None = None,
               hits_glu: np.ndarray | None = None) -> None:
        if not 0 <= layer < self.num_layers:
            raise TraceError(f"record: layer {layer} outside [0, {self.num_layers})")
        for name, value, dtype in (("sel_in", sel_in, np.int32), ("sel_glu", sel_glu, np.int32),
                                   ("x_abs", x_abs, np.float16), ("glu_abs", glu_abs, np.float16),
                                   ("hits_in", hits_in, bool), ("hits_glu", hits_glu, bool)):
            if value is not None:
                a = np.asarray(value, dtype=dtype)
                self._parts.setdefault(name, [[] for _ in range(self.num_layers)])[layer].append(
                    a.reshape(-1, a.shape[-1]))

    def finish(self) -> Trace:
        def joined(name: str) -> list[np.ndarray] | None:
            parts = self._parts.get(name)
            if parts is None:
                return None
            empty = [layer for layer, p in enumerate(parts) if not p]
            if empty:
                raise TraceError(f"record: field {name} has no tokens for layers {empty[:8]}")
            return [np.concatenate(p, axis=0) for p in parts]

        if "sel_in" not in self._parts:
            raise TraceError("record: nothing was recorded")
        return Trace(
            source=self.source, model=self.model, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_layers=self.num_layers, method=self.method,
            density=self.density, sel_in=joined("sel_in"), sel_glu=joined("sel_glu"), gamma=self.gamma,
            score=self.score, policy=self.policy, x_abs=joined("x_abs"), glu_abs=joined("glu_abs"),
            hits_in=joined("hits_in"), hits_glu=joined("hits_glu"), meta=dict(self.meta),
        )
