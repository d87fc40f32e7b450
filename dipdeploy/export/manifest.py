"""``manifest.json``: what a bundle holds, and the reader the runtime uses (torch-free: json + hashlib).

A bundle is a directory::

    manifest.json        this file (format, version, source model, method, plan, quant, tensors, files)
    model.onnx           the whole decoder with KV cache (I/O names of onnxruntime-genai)
    embed.onnx, layer.{i}.attn/mlp_up/mlp_down.onnx, head.onnx   per-layer graphs for the host runtime
    dense.bin, mlp.bin   weights as ONNX external data, every tensor aligned (4 KiB by default);
                         mlp.bin holds the MLP in the Flash layout (see ``tensors[*].layout``)
    genai_config.json, tokenizer files

The reader rejects another ``format`` or an unknown ``version`` with the command that regenerates it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

BUNDLE_FORMAT = "dipdeploy-bundle"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
# First dim of the per-layer MLP graphs' per-row weight inputs (the host binds a slab of that many rows);
# shared tables (VQ3 codebooks) keep fixed shapes. The runtime reads this dim to know what it streams.
SLAB_DIM = "slab_rows"
REGENERATE = "regenerate the bundle with `dipdeploy export`"


@dataclass
class Manifest:
    """Everything a reader needs to trust and use a bundle. ``tensors``: name → {file, offset, length,
    dtype, shape, layout}; ``files``: name → {size, sha256}; ``graphs``: role → file(s)."""

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
    alignment: int = 4096
    format: str = BUNDLE_FORMAT
    version: int = BUNDLE_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        raw = json.loads(text)
        if raw.get("format") != BUNDLE_FORMAT:
            raise ValueError(f"not a dipdeploy bundle manifest (format {raw.get('format')!r}); {REGENERATE}")
        if raw.get("version") != BUNDLE_VERSION:
            raise ValueError(f"bundle version {raw.get('version')!r} is not supported (this dipdeploy reads "
                             f"{BUNDLE_VERSION}); {REGENERATE}")
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"manifest has unknown fields {sorted(unknown)}; {REGENERATE}")
        return cls(**raw)


def read_manifest(bundle: str | Path) -> Manifest:
    """The manifest of ``bundle``; a bundle missing because an export was killed between its two
    renames is restored first (:func:`restore_interrupted`)."""
    restore_interrupted(Path(bundle))
    path = Path(bundle) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {bundle} is not a dipdeploy bundle; {REGENERATE}")
    return Manifest.from_json(path.read_text())


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


def open_tensor(bundle: str | Path, manifest: Manifest, name: str):
    """A read-only ``np.memmap`` of one tensor of the table (what a host runtime reads rows from)."""
    import numpy as np

    if name not in manifest.tensors:
        raise KeyError(f"tensor {name!r} is not in the bundle; it has {len(manifest.tensors)} tensors")
    t = manifest.tensors[name]
    return np.memmap(Path(bundle) / t["file"], dtype=np.dtype(t["dtype"]), mode="r", offset=t["offset"],
                     shape=tuple(t["shape"]))


def file_record(path: Path) -> dict:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return {"size": path.stat().st_size, "sha256": h.hexdigest()}


def verify(bundle: str | Path, manifest: Manifest | None = None, checksums: bool = True) -> list[str]:
    """Problems found (empty = intact): missing files, wrong sizes or checksums, tensors out of bounds
    or misaligned. ``checksums=False`` skips reading every byte (what a runtime checks at each start)."""
    bundle = Path(bundle)
    manifest = manifest or read_manifest(bundle)
    problems = []
    for name, rec in manifest.files.items():
        path = bundle / name
        if not path.is_file():
            problems.append(f"{name}: missing")
            continue
        size = path.stat().st_size
        if size != rec["size"]:
            problems.append(f"{name}: size {size} != {rec['size']}")
        elif checksums and file_record(path)["sha256"] != rec["sha256"]:
            problems.append(f"{name}: sha256 mismatch")
    for name, t in manifest.tensors.items():
        size = manifest.files.get(t["file"], {}).get("size")
        if size is None:
            problems.append(f"tensor {name}: file {t['file']} not in the manifest")
        elif t["offset"] + t["length"] > size:
            problems.append(f"tensor {name}: bytes [{t['offset']}, {t['offset'] + t['length']}) beyond {size}")
        if t["offset"] % manifest.alignment:
            problems.append(f"tensor {name}: offset {t['offset']} not aligned to {manifest.alignment}")
    return problems
