"""Golden cases for the Android engine's bundle checks (issue #56): what the Python reader says about hostile
graph bytes and damaged bundle copies, for the Java reader (BundleCheck, GraphData, BundleDir) to say too.

  graphdata  hand-built ModelProto bytes (the protobuf wire format written here, field numbers from
             dipdeploy/bundle/graphdata.py) and the problems ``graph_data_problems`` finds in them: external
             data in initializers, node attributes, subgraphs, sparse tensors, functions and training graphs;
             names outside the bundle, unlisted or non-.bin files, ranges past a file's end, offsets that are
             not byte counts; truncated bytes, overlong varints, another wire type, subgraphs nested too deep
  bundles    copies of the exported bundle, each with one kind of damage, and ``verify`` of each (or the one
             line ``read_manifest`` raises): genai_config.json naming an op library, a hard link to a file
             outside the bundle, a FIFO, graphs naming data outside the bundle or past a file's end

Written by make_golden.py into sandbox.json; the copies lie under <out>/sandbox/.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from dipdeploy.bundle.bundledir import BundleError
from dipdeploy.bundle.manifest import file_record, graph_data_problems, parse_manifest, verify

# ---------------------------------------------------------------- protobuf bytes, by hand


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _ld(number: int, payload: bytes | str) -> bytes:
    payload = payload.encode() if isinstance(payload, str) else payload
    return _key(number, 2) + _varint(len(payload)) + payload


def _vi(number: int, value: int) -> bytes:
    return _key(number, 0) + _varint(value)


def _tensor(name: bytes | str, external: bool = True, **entries) -> bytes:
    """A TensorProto: name (8), external_data entries (13: key 1, value 2), data_location EXTERNAL (14)."""
    body = _ld(8, name) + _vi(1, 1) + _vi(2, 1)  # dims and data_type, skipped by the walk
    for k, v in entries.items():
        body += _ld(13, _ld(1, k) + (_ld(2, v) if v is not None else b""))
    return body + (_vi(14, 1) if external else b"")


def _graph(*parts: bytes) -> bytes:
    return _ld(2, "g") + b"".join(parts)  # GraphProto.name (2), skipped


def _model(*parts: bytes) -> bytes:
    return _vi(1, 9) + _ld(2, "dipdeploy") + b"".join(parts)  # ir_version, producer_name: skipped


def _init(t: bytes) -> bytes:
    return _ld(5, t)  # GraphProto.initializer


def _nested(depth: int, leaf: bytes) -> bytes:
    """A graph whose one node holds a subgraph attribute (AttributeProto.g = 6), ``depth`` levels down."""
    g = leaf
    for _ in range(depth):
        g = _graph(_ld(1, _ld(5, _ld(1, "body") + _ld(6, g))))  # node(1).attribute(5).g(6)
    return g


FILES = {"dense.bin": {"size": 8192, "sha256": "0" * 64}, "mlp.bin": {"size": 4096, "sha256": "0" * 64},
         "tokenizer.json": {"size": 10, "sha256": "0" * 64}}


def graphdata_cases() -> list[dict]:
    ok = _tensor("w", location="dense.bin", offset="0", length="4096")
    cases = {
        "an initializer inside dense.bin": _model(_ld(7, _graph(_init(ok)))),
        "no external data": _model(_ld(7, _graph(_init(_tensor("w", external=False))))),
        "an unlisted file": _model(_ld(7, _graph(_init(_tensor("w", location="other.bin"))))),
        "a listed file that is not .bin": _model(_ld(7, _graph(_init(_tensor("w", location="tokenizer.json"))))),
        "paths out of the bundle": _model(_ld(7, _graph(
            _init(_tensor("a", location="../canary.bin")), _init(_tensor("b", location="/etc/dense.bin")),
            _init(_tensor("c", location="sub\\dense.bin")), _init(_tensor("d", location="")),
            _init(_tensor("e", location=".."))))),
        "external without a location": _model(_ld(7, _graph(_init(_tensor("w"))))),
        "entries without the EXTERNAL flag": _model(_ld(7, _graph(_init(_tensor("w", external=False,
                                                                                location="mlp.bin", offset="4000",
                                                                                length="200"))))),
        "ranges": _model(_ld(7, _graph(
            _init(_tensor("end", location="dense.bin", offset="4096", length="4096")),
            _init(_tensor("past", location="dense.bin", offset="4097", length="4096")),
            _init(_tensor("huge", location="dense.bin", offset="99999999999999999999999", length="1")),
            _init(_tensor("negative", location="dense.bin", offset="-1", length="1")),
            _init(_tensor("no length", location="dense.bin", offset="8192")),
            _init(_tensor("no offset", location="dense.bin", length="8193"))))),
        "offsets Python's int() reads": _model(_ld(7, _graph(
            _init(_tensor("blanks", location="dense.bin", offset=" 12 ", length="+4")),
            _init(_tensor("underscores", location="dense.bin", offset="1_000", length="8_000"))))),
        "not byte counts": _model(_ld(7, _graph(
            _init(_tensor("x", location="dense.bin", offset="x1", length="4")),
            _init(_tensor("float", location="dense.bin", offset="0", length="4.0")),
            _init(_tensor("hex", location="dense.bin", offset="0x10", length=None))))),
        "names Python's repr quotes": _model(_ld(7, _graph(
            _init(_tensor("it's", location="x.bin")), _init(_tensor('say "hi"', location="it's.bin")),
            _init(_tensor(b"\xff\xfebad utf-8", location="tab\there.bin"))))),
        "a node attribute's tensor": _model(_ld(7, _graph(_ld(1, _ld(5, _ld(1, "value") + _ld(5, _tensor(
            "const", location="other.bin"))))))),
        "an attribute's tensors list": _model(_ld(7, _graph(_ld(1, _ld(5, _ld(1, "values") + _ld(10, _tensor(
            "t0", location="mlp.bin", offset="0", length="5000")) + _ld(10, ok)))))),
        "a subgraph's initializer": _model(_ld(7, _nested(2, _graph(_init(_tensor("deep", location="x.bin")))))),
        "subgraphs 32 deep": _model(_ld(7, _nested(32, _graph(_init(_tensor("deep", location="x.bin")))))),
        "subgraphs 33 deep": _model(_ld(7, _nested(33, _graph(_init(_tensor("deep", location="x.bin")))))),
        "a sparse initializer": _model(_ld(7, _graph(_ld(15, _ld(1, _tensor("values", location="v.bin"))
                                                           + _ld(2, _tensor("indices", location="dense.bin",
                                                                            offset="8000", length="400")))))),
        "a sparse attribute": _model(_ld(7, _graph(_ld(1, _ld(5, _ld(1, "s") + _ld(22, _ld(
            1, _tensor("sv", location="s.bin")))))))),
        "a function's node and attribute": _model(_ld(25, _ld(1, "f") + _ld(7, _ld(5, _ld(1, "a") + _ld(
            5, _tensor("fn node", location="f.bin")))) + _ld(11, _ld(5, _tensor("fn attr", location="g.bin"))))),
        "a training graph": _model(_ld(20, _ld(1, _graph(_init(_tensor("init", location="t.bin"))))
                                       + _ld(2, _graph(_init(_tensor("algo", location="u.bin")))))),
        "fixed-width fields skipped": _model(_key(3, 5) + b"\0\0\0\0", _key(4, 1) + b"\0" * 8,
                                             _ld(7, _graph(_key(9, 5) + b"\1\2\3\4", _init(ok)))),
        "truncated": _model(_ld(7, _graph(_init(ok))))[:-5],
        "a truncated varint": b"\x08\x80",
        "an overlong varint": b"\x08" + b"\xff" * 10 + b"\x01",
        "a truncated fixed32": _key(3, 5) + b"\0\0",
        "wire type 3": _key(1, 3),
        "wire type 7 in a graph": _model(_ld(7, _key(2, 7))),
        "empty bytes": b"",
    }
    out = []
    for name, data in cases.items():
        out.append({"name": name, "hex": data.hex(), "files": FILES,
                    "problems": graph_data_problems("g.onnx", data, FILES)})
    return out

# ---------------------------------------------------------------- damaged bundle copies


def _rewrite(bundle: Path, name: str, data: bytes, raw: dict) -> None:
    (bundle / name).write_bytes(data)
    raw["files"][name] = file_record(bundle / name)


def _edit_graph(bundle: Path, name: str, edit, raw: dict) -> None:
    import onnx

    model = onnx.load(str(bundle / name), load_external_data=False)
    for k, init in enumerate(model.graph.initializer):
        entries = {e.key: e.value for e in init.external_data}
        edit(k, entries)
        del init.external_data[:]
        for key, value in entries.items():
            init.external_data.add(key=key, value=value)
    _rewrite(bundle, name, model.SerializeToString(), raw)


def _genai(bundle: Path, raw: dict, edit) -> None:
    cfg = json.loads((bundle / "genai_config.json").read_text())
    edit(cfg)
    _rewrite(bundle, "genai_config.json", json.dumps(cfg, indent=1).encode(), raw)


def _library(bundle: Path, raw: dict, present: bool = True) -> None:
    _rewrite(bundle, "libdipdeploy_ops.so", b"\x7fELF not a library", raw)
    raw["ops"]["native_library"] = "libdipdeploy_ops.so"
    if not present:
        (bundle / "libdipdeploy_ops.so").unlink()


def _session(cfg: dict) -> dict:
    return cfg["model"]["decoder"]["session_options"]


def _edit_embed(k: int, e: dict) -> None:
    if k == 0:
        e["location"] = "../canary.bin"
    else:
        e["length"] = str(int(e["length"]) + 10 ** 7)


def _edit_head(k: int, e: dict) -> None:
    if k == 0:
        e["location"] = "tokenizer.json"
    elif k == 1:
        e["offset"] = "x1"
    else:
        del e["location"]


def _hard_link(bundle: Path, raw: dict, name: str) -> None:
    outside = bundle.parent / f"{bundle.name}.outside"
    shutil.copyfile(bundle / name, outside)
    (bundle / name).unlink()
    os.link(outside, bundle / name)


def _damage() -> dict:
    """Each case: what it does to a copy of the bundle (the folder, the manifest's raw table)."""
    return {
        "genai names a library, the manifest none": lambda b, raw: _genai(
            b, raw, lambda c: _session(c).update(custom_ops_library="/data/local/tmp/libevil.so")),
        "genai names other libraries than the manifest's": lambda b, raw: (_library(b, raw), _genai(
            b, raw, lambda c: (_session(c).update(custom_ops_library="libdipdeploy_ops.so"),
                               c["search"].update(custom_ops_library=["libother.so"]),
                               c["model"]["decoder"].update(pipeline=[{"custom_ops_library": "../libdipdeploy_ops.so"},
                                                                      {"custom_ops_library": None}])))),
        "the manifest's library absent": lambda b, raw: (_library(b, raw, present=False), _genai(
            b, raw, lambda c: _session(c).update(custom_ops_library="libdipdeploy_ops.so"))),
        "genai not JSON": lambda b, raw: _rewrite(b, "genai_config.json", b'{"model": ', raw),
        "a hard link to a file outside": lambda b, raw: _hard_link(b, raw, "dense.bin"),
        "a FIFO": lambda b, raw: ((b / "tokenizer_config.json").unlink(), os.mkfifo(b / "tokenizer_config.json")),
        "graphs name data outside the bundle or past a file's end": lambda b, raw: (
            _edit_graph(b, "embed.onnx", _edit_embed, raw), _edit_graph(b, "head.onnx", _edit_head, raw),
            _edit_graph(b, "layer.0.attn.onnx", lambda k, e: e.update(location="mlp.bin") if k == 0 else None, raw)),
        "a graph that is not protobuf": lambda b, raw: _rewrite(
            b, "positions.onnx", (b / "positions.onnx").read_bytes()[:100], raw),
        "the manifest a hard link": lambda b, raw: None,  # after the manifest is written (below)
    }


def bundle_cases(bundle: Path, out: Path) -> list[dict]:
    root = out / "sandbox"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    cases = []
    for k, (name, damage) in enumerate(_damage().items()):
        copy = root / f"case{k}"
        shutil.copytree(bundle, copy)
        raw = json.loads((copy / "manifest.json").read_text())
        damage(copy, raw)
        (copy / "manifest.json").write_text(json.dumps(raw, indent=1))
        if name == "the manifest a hard link":
            _hard_link(copy, raw, "manifest.json")
        case = {"name": name, "bundle": str(copy)}
        try:
            parse_manifest(copy)  # the manifest itself must pass before any file is checked
            case["verify"] = verify(copy)
        except BundleError as exc:
            case["error"] = str(exc)
        cases.append(case)
    return cases


def sandbox_golden(bundle: Path, out: Path) -> dict:
    return {"graphdata": graphdata_cases(), "bundles": bundle_cases(bundle, out)}
