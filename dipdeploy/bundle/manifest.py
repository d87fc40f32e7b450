"""``manifest.json``: what a bundle holds (the directory: ``dipdeploy/bundle/__init__.py``), and the reader
every command that opens a bundle uses (torch-free: json + hashlib).

A bundle is a sandbox: the reader rejects another ``format`` or an unknown ``version``, and
``read_manifest`` checks the structure (:func:`verify`) before anything is opened, so a hostile or
damaged manifest cannot make a reader open a file outside the bundle, follow a symbolic link, slice
past a file's ends or run another model than the graphs. Every error is a :class:`BundleError` whose
one line names the problem and the fix.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from dipdeploy.bundle.bundledir import REGENERATE, BundleDir, BundleError, FileProblem, name_problem, stream_sha256
from dipdeploy.bundle.graphdata import GraphDataError, external_data
from dipdeploy.bundle.runnable import runnable_problems
from dipdeploy.bundle.names import EDGE_GRAPHS, EMBEDDING, GENAI_CONFIG, MANIFEST, READ_BY_NAME, ROW_POSITION, layer_graph_names
from dipdeploy.flash import BLOCK

BUNDLE_FORMAT = "dipdeploy-bundle"
BUNDLE_VERSION = 3  # 3: the joined decoder (graphs.decoder); 2: positions.onnx, the MLP term unadded
# Caps on what a manifest may hold, checked before it is parsed or walked: json.loads holds the whole
# text many times over in objects and ``verify`` visits every entry, so a hostile manifest of gigabytes or
# millions of entries would exhaust memory or time before any check could refuse it. What export writes
# for the largest registry model is a few hundred kB and about a thousand tensors.
MANIFEST_MAX = 16 << 20  # bytes
MAX_ENTRIES = 100_000  # tensors, and files, a manifest may list
# Item sizes of the dtypes a tensor may have (numpy names; ``open_tensor`` maps them with numpy).
DTYPES = {"float64": 8, "float32": 4, "float16": 2, "int64": 8, "uint64": 8, "int32": 4, "uint32": 4,
          "int16": 2, "uint16": 2, "int8": 1, "uint8": 1, "bool": 1}
GENAI_LIBRARY_KEY = "custom_ops_library"  # the key onnxruntime-genai loads a library from
GENAI_CONFIG_MAX = 1 << 20  # bytes: what export writes is a few kB
GRAPH_SUFFIX = ".onnx"  # every listed file so named is a graph onnxruntime may open: its external data is checked
DATA_SUFFIX = ".bin"  # what a graph's external data may name: the weight files export writes (dense.bin, mlp.bin)
LIBRARY_SUFFIXES = (".so", ".dylib", ".dll")  # the one file a bundle may lack is a shared library (``verify``)
# How much of the bundle ``verify`` hashes: nothing, every file except the tensor data files, everything.
CHECKSUMS = ("none", "small", "all")
_FIELD_TYPES = {"source": dict, "method": str, "plan": (dict, type(None)), "quant": (dict, type(None)),
                "ops": dict, "onnxruntime": dict, "graphs": dict, "tensors": dict, "files": dict,
                "dipca": (dict, type(None)), "sizes": dict, "validation": dict, "export_config": dict,
                "alignment": int, "row_order": (dict, type(None))}


@dataclass
class Manifest:
    """Everything a reader needs to trust and use a bundle. ``tensors``: name → {file, offset, length,
    dtype, shape, layout}; ``files``: name → {size, sha256}; ``graphs``: role → file(s). ``row_order``:
    how ``mlp.bin`` orders each group's rows (docs/method.md, "Flash layout"); None (older bundles) or
    ``order`` "natural" is the logical order, "calibrated" a permutation per group in the tensors
    ``model.layers.{i}.mlp.{group}.position`` (:func:`row_positions`)."""

    source: dict
    method: str
    plan: dict | None
    quant: dict | None
    ops: dict
    onnxruntime: dict
    graphs: dict
    tensors: dict
    files: dict
    dipca: dict | None = None
    sizes: dict = field(default_factory=dict)
    validation: dict = field(default_factory=dict)
    export_config: dict = field(default_factory=dict)
    alignment: int = BLOCK
    row_order: dict | None = None
    format: str = BUNDLE_FORMAT
    version: int = BUNDLE_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        """The manifest, its top-level fields type-checked (so later checks and readers never meet a
        list where a table belongs); any other content raises :class:`BundleError`."""
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise BundleError(f"manifest.json is not valid JSON ({exc}); {REGENERATE}") from None
        if not isinstance(raw, dict):
            raise BundleError(f"manifest.json holds a {type(raw).__name__}, not a table; {REGENERATE}")
        if raw.get("format") != BUNDLE_FORMAT:
            raise BundleError(f"not a dipdeploy bundle manifest (format {raw.get('format')!r}); {REGENERATE}")
        if raw.get("version") != BUNDLE_VERSION:
            raise BundleError(f"bundle version {raw.get('version')!r} is not supported (this dipdeploy reads "
                              f"{BUNDLE_VERSION}); {REGENERATE}")
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise BundleError(f"manifest has unknown fields {sorted(unknown)}; {REGENERATE}")
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
                   and f.name not in raw]
        if missing:
            raise BundleError(f"manifest lacks the fields {missing}; {REGENERATE}")
        for name, kind in _FIELD_TYPES.items():
            if name in raw and (not isinstance(raw[name], kind) or isinstance(raw[name], bool)):
                raise BundleError(f"manifest field {name!r} has the wrong type ({type(raw[name]).__name__}); "
                                  f"{REGENERATE}")
        for name in ("tensors", "files"):
            if len(raw[name]) > MAX_ENTRIES:
                raise BundleError(f"manifest lists {len(raw[name])} {name}, over the cap of {MAX_ENTRIES}; "
                                  f"{REGENERATE}")
        if raw.get("alignment", 1) < 1:
            raise BundleError(f"manifest alignment {raw['alignment']} is not positive; {REGENERATE}")
        return cls(**raw)


def read_manifest(bundle: str | Path | BundleDir, checksums: str = "small",
                  libraries: Collection[str] | None = None) -> Manifest:
    """The manifest of ``bundle`` after :func:`check_structure`: what every command that opens a bundle
    calls first, so no file is opened on the manifest's word before its paths and ranges are checked. A
    bundle missing because an export was killed between its two renames is restored first
    (:func:`restore_interrupted`). ``libraries``: see :func:`verify`. Given a :class:`BundleDir`, every
    file is read through it and its ``files`` are set to the manifest's."""
    restore_interrupted(bundle.path if isinstance(bundle, BundleDir) else Path(bundle))
    with held(bundle) as folder:
        manifest = parse_manifest(folder)
        folder.files = manifest.files
        check_structure(folder, manifest, checksums, libraries)
    return manifest


@contextmanager
def held(bundle: str | Path | BundleDir, files: dict | None = None) -> Iterator[BundleDir]:
    """``bundle`` as a :class:`BundleDir`: the one given, or one opened for the block (with ``files``)."""
    if isinstance(bundle, BundleDir):
        yield bundle
        return
    if not Path(bundle).is_dir():
        raise FileNotFoundError(f"bundle {bundle} not found: give the folder `dipdeploy export` wrote (its "
                                f"manifest.json beside the graphs)")
    with BundleDir(bundle, files) as folder:
        yield folder


def parse_manifest(bundle: str | Path | BundleDir) -> Manifest:
    """The manifest of ``bundle``, parsed but not checked against the files (what :func:`verify` reports on)."""
    with held(bundle) as folder:
        return _parse(folder)


def _parse(folder: BundleDir) -> Manifest:
    path = folder.path / MANIFEST
    try:
        fd = folder.open(MANIFEST)
    except FileProblem as exc:
        if exc.problem == f"{MANIFEST}: missing":
            raise FileNotFoundError(f"{path} not found: {folder.path} is not a dipdeploy bundle; {REGENERATE}") from None
        raise BundleError(f"{path}: {exc.problem.removeprefix(MANIFEST + ': ')}; {REGENERATE}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if st.st_size > MANIFEST_MAX:
            raise BundleError(_too_large(path, st.st_size))
        raw = f.read(MANIFEST_MAX + 1)  # the cap holds even if the file grows after the fstat
    if len(raw) > MANIFEST_MAX:
        raise BundleError(_too_large(path, len(raw)))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BundleError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); {REGENERATE}") from None
    return Manifest.from_json(text)


def _too_large(path: Path, size: int) -> str:
    return (f"{path} is {size} bytes, over the {MANIFEST_MAX >> 20} MiB cap on a manifest (export writes a few "
            f"hundred kB at most); {REGENERATE}")


def check_structure(bundle: str | Path | BundleDir, manifest: Manifest, checksums: str = "small",
                    libraries: Collection[str] | None = None) -> None:
    """Raise :class:`BundleError` (one line: the first problems and the fix) unless :func:`verify` finds
    the bundle intact at the given ``checksums`` level (and its op library among ``libraries``)."""
    problems = verify(bundle, manifest, checksums, libraries)
    bundle = bundle.path if isinstance(bundle, BundleDir) else bundle
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise BundleError(f"bundle {bundle} is damaged: {'; '.join(problems[:5])}{more}; files truncated or "
                          f"altered since export; {REGENERATE}")


def restore_interrupted(bundle: Path) -> bool:
    """Put back the complete old bundle an export moved aside (``.<name>.old-*``) when ``bundle`` is
    missing and no export holds its lock; leftovers are not removed here (the next export does that).
    True when it restored one."""
    from dipdeploy import dirswap

    if bundle.exists() or not any(p.name.startswith(dirswap.old_prefix(bundle)) for p in dirswap.leftovers(bundle)):
        return False
    try:
        with dirswap.hold(bundle, wait=False):
            return bool(dirswap.recover(bundle, lambda p: (p / MANIFEST).is_file(), tidy=False))
    except (dirswap.OutputBusy, OSError):
        return False


def open_tensor(bundle: str | Path | BundleDir, manifest: Manifest, name: str):
    """A read-only ``np.memmap`` of one tensor of the table (what a host runtime reads rows from), mapped
    from a descriptor :meth:`BundleDir.open` checked."""
    import numpy as np

    if name not in manifest.tensors:
        raise KeyError(f"tensor {name!r} is not in the bundle; it has {len(manifest.tensors)} tensors")
    t = manifest.tensors[name]
    if t["length"] == 0:  # np.memmap cannot map zero bytes
        return np.zeros(tuple(t["shape"]), dtype=np.dtype(t["dtype"]))
    with held(bundle, manifest.files) as folder:
        with folder.refusing():
            fd = folder.open(t["file"])
        with os.fdopen(fd, "rb") as f:  # the map keeps its own reference to the file
            return np.memmap(f, dtype=np.dtype(t["dtype"]), mode="r", offset=t["offset"], shape=tuple(t["shape"]))


def row_positions(bundle: str | Path | BundleDir, manifest: Manifest, layer: int, group: str, rows: int):
    """The file row of each logical row of one MLP group (int64 [rows]), or None where ``mlp.bin`` keeps
    the logical order (``row_order`` absent or natural); a calibrated bundle whose position tensor is
    missing or not a permutation of ``range(rows)`` raises :class:`BundleError`."""
    import numpy as np

    if (manifest.row_order or {}).get("order", "natural") == "natural":
        return None
    where = bundle.path if isinstance(bundle, BundleDir) else bundle
    name = ROW_POSITION.format(layer=layer, group=group)
    if name not in manifest.tensors:
        raise BundleError(f"{where}: row_order is {manifest.row_order.get('order')!r} but tensor {name} is "
                          f"missing; {REGENERATE}")
    position = np.array(open_tensor(bundle, manifest, name), dtype=np.int64)
    if position.shape != (rows,) or not (np.sort(position) == np.arange(rows)).all():
        raise BundleError(f"{where}: tensor {name} is not a permutation of the group's {rows} rows; {REGENERATE}")
    return position


def file_record(path: Path) -> dict:
    with open(path, "rb") as f:
        return {"size": os.fstat(f.fileno()).st_size, "sha256": stream_sha256(f)}


def verify(bundle: str | Path | BundleDir, manifest: Manifest | None = None, checksums: str = "all",
           libraries: Collection[str] | None = None) -> list[str]:
    """Problems found (empty = intact). Structure, always: every path the manifest names is a plain file
    name of a regular file in the bundle (no separator, no '..', no symbolic link, no second hard link)
    listed in ``files`` with its size; every initializer a graph stores outside itself names a listed
    ``.bin`` file and lies inside it (:func:`graph_data_problems`); every tensor lies inside its file with
    the length its dtype and shape give; the plan has the model's layer count and the per-layer graphs
    match it; ``genai_config.json`` names no op library but ``ops.native_library``
    (:func:`_genai_problems`); the parts describe one model that can run: the graphs' input sizes, the
    plan, genai_config.json's decoder, the config and the RoPE tables agree
    (``dipdeploy.bundle.runnable``). ``checksums`` (see ``CHECKSUMS``): which files' sha256 are compared too;
    "small" skips the tensor data files, whose full read is what a streaming runtime avoids at start
    (docs/bundle.md).

    The op library is code that onnxruntime-genai runs when it opens the bundle, so its sha256 in the
    bundle's own manifest vouches for nothing: with ``libraries`` (the sha256 of the libraries the caller
    trusts; this floor cannot locate them, ``dipdeploy.ops.native.known_library_hashes`` does) a shipped
    library must be one of them. It is the one listed file a bundle may lack: dipdeploy never loads the
    bundle's copy, and a host may bring its own.

    Every file is opened through one :class:`BundleDir` and checked on the descriptor that is read."""
    if checksums not in CHECKSUMS:
        raise ValueError(f"checksums={checksums!r}: choose one of {', '.join(CHECKSUMS)}")
    with held(bundle) as folder:
        manifest = manifest or _parse(folder)
        if folder.files is not manifest.files:
            folder.files = manifest.files
        return _verify(folder, manifest, checksums, libraries)


def _verify(bundle: BundleDir, manifest: Manifest, checksums: str, libraries: Collection[str] | None) -> list[str]:
    data = {t.get("file") for t in manifest.tensors.values() if isinstance(t, dict) and isinstance(t.get("file"), str)}
    lib = manifest.ops.get("native_library")
    problems, graphs = [], []
    for name, rec in manifest.files.items():
        problem = _file_problem(bundle, name, rec, checksums == "all" or (checksums == "small" and name not in data),
                                optional=name == lib and name.endswith(LIBRARY_SUFFIXES))
        if problem:
            problems.append(problem)
        elif name.endswith(GRAPH_SUFFIX):
            graphs.append(name)
    genai = None  # genai_config.json parsed, for the library rule and the runnable checks
    if GENAI_CONFIG in manifest.files and not any(p.startswith(GENAI_CONFIG + ":") for p in problems):
        found, genai = _genai_problems(bundle, lib)
        problems += found
    if libraries is not None and isinstance(lib, str) and lib in manifest.files and not name_problem(lib):
        problems += _library_problems(bundle, lib, libraries)
    problems += _path_problems(manifest)
    graph_data = {}  # each graph's bytes, read once through a checked descriptor (the files check hashed them)
    for name in graphs:
        try:
            graph_data[name] = bundle.read_bytes(name, hash_it=False)
        except FileProblem as exc:
            problems.append(exc.problem)
            continue
        problems += graph_data_problems(name, graph_data[name], manifest.files)
    for name, t in manifest.tensors.items():
        problems += _tensor_problems(manifest, name, t)
    return (problems + _overlap_problems(manifest) + _plan_problems(manifest) + _shape_problems(manifest)
            + _sizes_problems(manifest) + runnable_problems(manifest, genai, graph_data))


def _is_count(v) -> bool:
    return type(v) is int and v >= 0


def _file_problem(bundle: BundleDir, name: str, rec, hash_it: bool, optional: bool = False) -> str | None:
    try:
        fd = bundle.open(name)  # a plain name, no link followed, a regular file of one link, the listed size
    except FileProblem as exc:
        return None if optional and exc.problem == f"{name}: missing" else exc.problem
    with os.fdopen(fd, "rb") as f:
        if not isinstance(rec, dict) or not _is_count(rec.get("size")) or not isinstance(rec.get("sha256"), str):
            return f"{name}: no size and sha256 in the manifest"
        if hash_it and stream_sha256(f) != rec["sha256"]:
            return f"{name}: sha256 mismatch"
    return None


def graph_data_problems(name: str, data: bytes, files: dict) -> list[str]:
    """Every tensor the graph ``data`` stores outside itself must name a plain file listed in ``files``,
    and lie inside it: onnxruntime opens what ``location`` names relative to the graph before any check of
    ours could see the bytes (``dipdeploy.bundle.graphdata``). The runtime calls this on the very bytes it
    hands onnxruntime."""
    try:
        entries = external_data(data)
    except GraphDataError as exc:
        return [f"{name}: not a readable ONNX graph ({exc})"]
    problems = []
    for e in entries:
        where = f"{name}: initializer {e['name']!r} stores its data in {e['location']!r}"
        bad = name_problem(e["location"])
        if e["location"] is None:
            problems.append(f"{name}: initializer {e['name']!r} is external but names no file")
        elif bad:
            problems.append(f"{where}, {bad}")
        elif e["location"] not in files or not e["location"].endswith(DATA_SUFFIX):
            problems.append(f"{where}, not one of the bundle's data files")
        else:
            size = files[e["location"]].get("size") if isinstance(files[e["location"]], dict) else None
            try:
                offset, length = int(e["offset"]), int(e["length"] if e["length"] is not None else 0)
            except ValueError:
                problems.append(f"{where} at offset {e['offset']!r}, length {e['length']!r}: not byte counts")
                continue
            if offset < 0 or length < 0 or (_is_count(size) and offset + length > size):
                problems.append(f"{where}, bytes [{offset}, {offset + length}) outside its {size} bytes")
    return problems


def _genai_problems(bundle: BundleDir, lib) -> tuple[list[str], object]:
    """onnxruntime-genai loads whatever library ``custom_ops_library`` names (in any ``session_options``
    of ``genai_config.json``) when it opens the bundle: every such entry must be exactly the manifest's
    ``ops.native_library``, the plain file name whose bytes ``verify`` checks, never a path elsewhere.
    (The problems, and the file as parsed: None where it could not be read.)"""
    named = []

    def walk(node) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if key == GENAI_LIBRARY_KEY:
                named.append(value)
            else:
                walk(value)

    size = (bundle.files.get(GENAI_CONFIG) or {}).get("size")
    if type(size) is int and size > GENAI_CONFIG_MAX:
        return [f"{GENAI_CONFIG}: larger than {GENAI_CONFIG_MAX} bytes"], None
    try:
        genai = json.loads(bundle.read_bytes(GENAI_CONFIG, hash_it=False))
        walk(genai)
    except FileProblem as exc:
        return [exc.problem], None
    except (OSError, ValueError, RecursionError) as exc:
        return [f"{GENAI_CONFIG}: not readable JSON ({type(exc).__name__})"], None
    if lib is None:
        return [f"{GENAI_CONFIG}: {GENAI_LIBRARY_KEY} {v!r} names a library but the manifest lists none "
                f"(ops.native_library); onnxruntime-genai would load it" for v in named], genai
    return [f"{GENAI_CONFIG}: {GENAI_LIBRARY_KEY} {v!r} is not the bundle's ops.native_library {lib!r}; "
            f"onnxruntime-genai would load it" for v in named if v != lib], genai


def _library_problems(bundle: BundleDir, lib: str, libraries: Collection[str]) -> list[str]:
    try:
        if bundle.sha256(lib) in libraries:
            return []
    except FileProblem:  # absent (a host brings its own) or refused by the files check
        return []
    return [f"the bundle's {lib} is not a library this dipdeploy built or knows: remove it or re-export"]


def _path_problems(manifest: Manifest) -> list[str]:
    """The graphs, the native library and the files read by name must be plain names listed in ``files``."""
    if "model" not in manifest.graphs:
        return ["graphs.model: missing"]
    named = [("graphs." + role, v) for role, v in manifest.graphs.items() if not isinstance(v, list)]
    named += [(f"graphs.{role}[{i}]", n) for role, v in manifest.graphs.items() if isinstance(v, list)
              for i, n in enumerate(v)]
    if manifest.ops.get("native_library") is not None:
        named.append(("ops.native_library", manifest.ops["native_library"]))
    named += [(name, name) for name in READ_BY_NAME]
    problems = []
    for where, name in named:
        bad = name_problem(name)
        if bad:
            problems.append(f"{where}: {bad}")
        elif name not in manifest.files:
            problems.append(f"{where}: {name} is not one of the bundle's files")
    return problems


def _tensor_problems(manifest: Manifest, name: str, t) -> list[str]:
    keys = ("file", "offset", "length", "dtype", "shape")
    if not isinstance(t, dict) or any(k not in t for k in keys):
        return [f"tensor {name}: lacks one of {', '.join(keys)}"]
    bad = name_problem(t["file"])
    if bad:
        return [f"tensor {name}: file {bad}"]
    shape = t["shape"]
    if not (_is_count(t["offset"]) and _is_count(t["length"]) and isinstance(shape, list)
            and all(_is_count(s) for s in shape)):
        return [f"tensor {name}: offset, length and shape must be non-negative integers"]
    if not isinstance(t["dtype"], str) or t["dtype"] not in DTYPES:
        return [f"tensor {name}: dtype {t['dtype']!r} is not one of {', '.join(DTYPES)}"]
    problems = []
    rec = manifest.files.get(t["file"])
    size = rec.get("size") if isinstance(rec, dict) else None
    if rec is None:
        problems.append(f"tensor {name}: file {t['file']} not in the manifest")
    elif _is_count(size) and t["offset"] + t["length"] > size:  # a malformed size is the files check's problem
        problems.append(f"tensor {name}: bytes [{t['offset']}, {t['offset'] + t['length']}) beyond {size}")
    if t["offset"] % manifest.alignment:
        problems.append(f"tensor {name}: offset {t['offset']} not aligned to {manifest.alignment}")
    want = math.prod(shape) * DTYPES[t["dtype"]]
    if t["length"] != want:
        problems.append(f"tensor {name}: length {t['length']} != {want} (shape {shape} of {t['dtype']})")
    return problems


def _overlap_problems(manifest: Manifest) -> list[str]:
    """Export writes every tensor once (docs/bundle.md): two tensors sharing bytes mean an edited
    manifest that would read one tensor's weights as another's. The one exception is a declared view
    (``view_of``: a tied lm_head reading the int4 embedding's blocks), which must cover exactly the
    bytes of the tensor it names."""
    problems, spans = [], []
    for name, t in manifest.tensors.items():
        if not (isinstance(t, dict) and isinstance(t.get("file"), str) and _is_count(t.get("offset"))
                and _is_count(t.get("length"))):
            continue
        if "view_of" in t:
            src = manifest.tensors.get(t["view_of"]) if isinstance(t["view_of"], str) else None
            if not (isinstance(src, dict) and "view_of" not in src
                    and all(src.get(k) == t[k] for k in ("file", "offset", "length", "dtype"))):
                problems.append(f"tensor {name}: view_of {t['view_of']!r} is not a tensor with the same file, "
                                "offset, length and dtype")
        elif t["length"] > 0:
            spans.append((t["file"], t["offset"], t["offset"] + t["length"], name))
    spans.sort()
    return problems + [f"tensor {b[3]}: bytes [{b[1]}, {b[2]}) of {b[0]} overlap tensor {a[3]}"
                       for a, b in zip(spans, spans[1:]) if a[0] == b[0] and b[1] < a[2]]


def _sizes_problems(manifest: Manifest) -> list[str]:
    """``sizes`` (what the runtime budgets dense memory from) must be byte counts; ``bytes_<f>`` that of
    ``<f>.bin``."""
    problems = []
    for key, value in manifest.sizes.items():
        rec = manifest.files.get(key.removeprefix("bytes_") + ".bin")
        if not _is_count(value):
            problems.append(f"sizes.{key}: {value!r} is not a byte count")
        elif isinstance(rec, dict) and _is_count(rec.get("size")) and value != rec["size"]:
            problems.append(f"sizes.{key}: {value} != the size of {key.removeprefix('bytes_')}.bin, {rec['size']}")
    return problems


def _plan_problems(manifest: Manifest) -> list[str]:
    """The plan must describe the model the graphs were built for: its layer count and K ranges."""
    plan, cfg = manifest.plan, manifest.source.get("config")
    if plan is None:
        return []
    layers = plan.get("layers")
    if not isinstance(layers, list) or not all(isinstance(lp, dict) for lp in layers):
        return ["plan.layers: not a list of per-layer tables"]
    n = len(layers)
    problems = []
    want = cfg.get("num_hidden_layers") if isinstance(cfg, dict) else None
    if type(want) is not int or want != n:
        problems.append(f"plan.layers: {n} layers but source.config.num_hidden_layers is {want!r}")
    for key, width in (("k_in", "hidden_size"), ("k_glu", "intermediate_size")):
        top = plan.get(width)
        if not all(_is_count(lp.get(key)) and type(top) is int and 0 < lp[key] <= top for lp in layers):
            problems.append(f"plan.layers: every {key} must be an integer in [1, plan.{width} = {top!r}]")
    listed = manifest.graphs.get("layers")
    if listed is not None and listed != layer_graph_names(n):
        count = len(listed) if isinstance(listed, list) else listed
        problems.append(f"graphs.layers: {count} graphs do not match the plan's {n} layers "
                        f"(3 per layer + {' + '.join(g.removesuffix('.onnx') for g in EDGE_GRAPHS)} = "
                        f"{3 * n + len(EDGE_GRAPHS)})")
    return problems


def _shape_problems(manifest: Manifest) -> list[str]:
    """The plan and the embedding table must have the config's widths, and the table a row for every
    token of the config's vocabulary: a bundle that differs passes every file check, then runs with the
    wrong widths or embeds the ids past the table as zero rows (a wrong answer with exit 0)."""
    plan, cfg = manifest.plan or {}, manifest.source.get("config")
    if not isinstance(cfg, dict):
        return []
    problems = [f"plan.{key} is {plan[key]!r} but source.config.{key} is {cfg[key]!r}"
                for key in ("hidden_size", "intermediate_size")
                if type(plan.get(key)) is int and type(cfg.get(key)) is int and plan[key] != cfg[key]]
    table = manifest.tensors.get(f"{EMBEDDING}.weight") or manifest.tensors.get(f"{EMBEDDING}.qweight")
    shape = table.get("shape") if isinstance(table, dict) else None
    if not (isinstance(shape, list) and len(shape) == 2 and all(type(n) is int for n in shape)):
        return problems
    vocab, hidden = cfg.get("vocab_size"), cfg.get("hidden_size")
    if type(vocab) is int and vocab > shape[0]:
        problems.append(f"source.config.vocab_size {vocab} exceeds the embedding table's {shape[0]} rows")
    if f"{EMBEDDING}.weight" in manifest.tensors and type(hidden) is int and shape[1] != hidden:
        problems.append(f"the embedding table's width {shape[1]} is not source.config.hidden_size {hidden}")
    return problems
