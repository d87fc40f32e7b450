"""ORT sessions over a bundle's per-layer graphs, bound once to the engine's buffers.

``open_session`` can override the DIP-CA γ of a graph's ``TopKColumnMask`` nodes and the accuracy
level of its MatMulNBits/SparseGatherMatMul nodes: both attributes are baked at export, but both are
run-time choices (a DIP bundle becomes DIP-CA with γ < 1; level 4 trades int8 rounding for speed),
so the graph is loaded without its weights, the attributes rewritten, and the session built from
bytes.

Every graph is handed to ORT as the bytes ``BundleDir.read_bytes`` checked (its sha256 where the
manifest lists one), never by path, and so are its weights: each tensor the graph keeps in another file
(``dense.bin``, ``mlp.bin``) is given with ``SessionOptions.add_initializer`` as a read-only numpy view of
that file mapped from its checked descriptor (``BundleDir.map``, one map per file shared by every session).
The mapping holds the inode that was checked, so a name swapped while ORT builds the session cannot change
what it reads. ``add_initializer`` uses the view in place, where ``add_external_initializers`` and
``add_external_initializers_from_files_in_memory`` copy every weight
(benchmarks/results/external-data-reads.md). ORT is still given the held folder (``BundleDir.folder``):
it checks there that each name exists and reads none of them. After the build the session's pages are
dropped from the maps (``MADV_DONTNEED``): what ORT prepacked into its own buffers is not read from
them again, and what a run reads comes back from the page cache (docs/decisions/0008-bundle-reads.md).

``Bound`` keeps one IOBinding per session. Every fixed-shape tensor of the decode loop (hidden
states, indices, slots, residency, slab arrays, RoPE rows, logits) is a numpy buffer bound once at
start; per token only the attention mask and the KV cache (whose lengths grow) are re-bound, by address
into a ``Buffer`` whose address was read once (``Bound.input_at``): numpy's ``ctypes.data`` and a view per
bind cost more than ORT's bind itself (docs/decisions/0001-native-cache-step.md).
ORT reads and writes the buffers in place, so a token costs ORT's run and a handful of binds, not a Python
wrapper per tensor (what per-call binding cost: benchmarks/results/notes.md).
Torch-free (floor 5).
"""

from __future__ import annotations

import functools
import math
import mmap
from pathlib import Path

import numpy as np

from dipdeploy.bundle.bundledir import BundleDir


@functools.cache
def _cpu():
    """ORT's CPU device, for binding raw buffers."""
    from onnxruntime.capi import _pybind_state as C

    return C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)


@functools.cache
def _register_shared_arena() -> None:
    """ORT's environment (one per process) gets one CPU arena, registered once."""
    import onnxruntime as ort

    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, 1, -1, -1))  # no cap, extend by what is asked


def shared_arena(options):
    """``options`` with the sessions' CPU memory drawn from one arena for the whole process.

    Each ORT session otherwise keeps its own arena at its peak: with 3 graphs per layer that is one
    retained peak per graph, most of the stock-ORT fallback path's memory (its functions dequantise
    the slab rows into fp32 intermediates per MLP graph), and still some with the native ops
    (benchmarks/results/notes.md, memory.md). Sessions of one engine run one after another, so one
    arena holds the largest single run."""
    _register_shared_arena()
    options.add_session_config_entry("session.use_env_allocators", "1")
    return options


#: tensors every attention graph of a layer type reads whole (``dipdeploy.export.blocks.rope_tables``)
SHARED_LAYOUTS = ("rope_table",)


class SharedInitializers:
    """The bundle's tensors that many graphs hold (the RoPE tables), read once and given to every
    session with ``SessionOptions.add_initializer``. Each session would otherwise map its own view of
    them from ``dense.bin``, and every mapping's pages count in RSS again, once per layer's cos and sin
    (benchmarks/results/notes.md)."""

    def __init__(self, bundle: Path | BundleDir, manifest):
        from onnxruntime import OrtValue

        from dipdeploy.bundle.manifest import open_tensor

        self.arrays = {name: np.ascontiguousarray(open_tensor(bundle, manifest, name))
                       for name, t in manifest.tensors.items() if str(t.get("layout", "")).startswith(SHARED_LAYOUTS)}
        self.values = {name: OrtValue.ortvalue_from_numpy(a) for name, a in self.arrays.items()}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def apply(self, options):
        """``options`` with these initializers (a name the graph does not have is ignored by ORT)."""
        for name, value in self.values.items():
            options.add_initializer(name, value)
        return options


def graph_bytes(files: BundleDir, name: str) -> bytes:
    """The graph ``name``'s bytes as checked (``BundleDir.read_bytes``), its external data held to the
    manifest's files (``graph_data_problems``, on these very bytes)."""
    from dipdeploy.bundle.manifest import graph_data_problems

    with files.refusing():
        data = files.read_bytes(name)
    problems = graph_data_problems(name, data, files.files)
    if problems:
        raise files.error(problems[0])
    return data


#: onnx.proto's TensorProto.DataType numbers of the types a bundle's weight files hold, as numpy dtypes
ONNX_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
               9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def mapped_weights(folder: BundleDir, entries: list[dict], given=()) -> dict:
    """name → OrtValue over a read-only view of the mapped file, for every tensor of ``entries`` (a graph's
    ``graphdata.external_data``) bar the names in ``given`` (initializers the options already hold). A
    tensor whose type, shape or length disagree with the bytes it names is refused in one line."""
    from onnxruntime import OrtValue

    values = {}
    for e in entries:
        if e["name"] in given:
            continue
        dtype = ONNX_DTYPES.get(e["data_type"])
        dims = tuple(e["dims"])
        if dtype is None or any(d < 0 for d in dims):
            raise folder.error(f"{e['name']}: type {e['data_type']} or shape {list(dims)} is not one a bundle's "
                               "weights have")
        count, offset = math.prod(dims), int(e["offset"])
        nbytes = count * np.dtype(dtype).itemsize
        with folder.refusing():
            buf = folder.map(e["location"])
        if (e["length"] is not None and int(e["length"]) != nbytes) or offset + nbytes > len(buf):
            raise folder.error(f"{e['name']}: {nbytes} bytes at {offset} of {e['location']} do not match the "
                               f"graph's length {e['length']} or the file's {len(buf)} bytes")
        view = np.frombuffer(buf, dtype, count, offset).reshape(dims)
        values[e["name"]] = OrtValue.ortvalue_from_numpy(view)
    return values


def open_session(files: BundleDir | Path, options, gamma: float | None = None, accuracy_level: int | None = None,
                 name: str | None = None, given=()):
    """An ORT CPU session for the graph ``name`` of the bundle ``files`` (a path: its folder and name);
    with ``gamma`` every TopKColumnMask gets that γ, with ``accuracy_level`` every MatMulNBits and
    SparseGatherMatMul that level (``with_accuracy_level``); ``given``: names ``options`` already has an
    initializer for (``SharedInitializers``). See the module docstring for what is read how."""
    import onnxruntime as ort

    from dipdeploy.bundle.graphdata import external_data
    from dipdeploy.bundle.manifest import held

    if name is None:
        files, name = Path(files).parent, Path(files).name
    with held(files) as folder:
        if not folder.files:
            from dipdeploy.bundle.manifest import parse_manifest

            folder.files = parse_manifest(folder).files
        data = graph_bytes(folder, name)
        if gamma is not None or accuracy_level is not None:
            import onnx

            from dipdeploy.ops.nodes import set_gamma, with_accuracy_level

            model = onnx.load_from_string(data)
            if gamma is not None:
                set_gamma(model.graph.node, gamma)
            if accuracy_level is not None:
                model = with_accuracy_level(model, accuracy_level)
            data = model.SerializeToString()
        entries = external_data(data)
        weights = mapped_weights(folder, entries, given)
        for weight, value in weights.items():
            options.add_initializer(weight, value)
        locations = sorted({e["location"] for e in entries})
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", folder.folder)
        try:
            session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        except Exception:
            _refuse_changed(folder, name, locations)  # ORT's own check of a name that no longer is a plain file
            raise
        session.dipdeploy_weights = weights  # ORT reads the views in place: they live as long as the session
        _drop_pages(folder, locations)
        return session


def _drop_pages(folder: BundleDir, locations: list[str]) -> None:
    """Drop the maps' resident pages: the build read every weight ORT prepacks into its own buffers, and
    those pages would otherwise stay counted in this process's memory; a run's reads fault back in from the
    page cache."""
    if hasattr(mmap, "MADV_DONTNEED"):
        for location in locations:
            folder.map(location).madvise(mmap.MADV_DONTNEED)


def _refuse_changed(folder: BundleDir, graph: str, locations: list[str]) -> None:
    changed = folder.unchanged(locations)
    if changed:
        raise folder.error(f"{changed[0]}: not the file that was checked when onnxruntime looked it up for {graph} "
                           "(replaced, or a link put in its place)")


class Buffer:
    """A C-contiguous numpy array whose leading elements are bound, with a shape that changes per token
    (a KV view, the mask), by address: the address is read once here, and each bind checks that the
    shape fits inside the array, so no bind can reach past it."""

    def __init__(self, array: np.ndarray):
        if not array.flags.c_contiguous:
            raise ValueError("a Buffer must be C-contiguous")
        self.array, self.dtype, self.size = array, array.dtype, array.size
        self.address = array.ctypes.data

    def fits(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if math.prod(shape) > self.size:
            raise ValueError(f"shape {shape} exceeds a buffer of {self.size} elements")
        return shape


class Bound:
    """A session and its IOBinding over numpy buffers (see the module docstring)."""

    def __init__(self, session):
        from onnxruntime import OrtValue

        self._value = OrtValue.ortvalue_from_numpy
        self._device = _cpu()
        self.session = session
        self.io = session.io_binding()._iobinding  # the C binding: no Python wrapper per call
        self._keep: dict[str, object] = {}

    def input(self, name: str, array: np.ndarray) -> None:
        """Bind ``array`` as input ``name`` (zero copy; it must stay alive and contiguous)."""
        v = self._value(np.ascontiguousarray(array))
        self._keep["in:" + name] = (array, v)
        self.io.bind_ortvalue_input(name, v._ortvalue)

    def input_at(self, name: str, buffer: Buffer, shape: tuple[int, ...]) -> None:
        """Bind the first elements of ``buffer``, as ``shape``, as input ``name`` (rebound every token: no
        OrtValue or view per call)."""
        self._keep["in:" + name] = buffer
        self.io.bind_input(name, self._device, buffer.dtype, buffer.fits(shape), buffer.address)

    def output_at(self, name: str, buffer: Buffer, shape: tuple[int, ...]) -> None:
        """``output`` in the same way as ``input_at``."""
        self._keep["out:" + name] = buffer
        self.io.bind_output(name, self._device, buffer.dtype, buffer.fits(shape), buffer.address)

    def output(self, name: str, array: np.ndarray) -> None:
        """ORT writes output ``name`` into ``array`` (whose shape must be the output's)."""
        v = self._value(array)
        self._keep["out:" + name] = (array, v)
        self.io.bind_ortvalue_output(name, v._ortvalue)

    def run(self) -> None:
        self.session._sess.run_with_iobinding(self.io, None)
