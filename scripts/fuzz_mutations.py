"""The fuzzer's mutation classes (scripts/fuzz_bundles.py): each builds seeded specs and applies one to a
copy of the tiny bundle.

A spec is a dict: ``cls`` (its class), ``refuse`` (the commands that must exit non-zero on it: exit 0
there is ``accepted``, a failure; elsewhere ``content_accepted``), and what to change. The classes:
- ``manifest``: a manifest field set to a hostile value (paths pointing outside, ranges, shapes, plan);
- ``data``: a tensor data file replaced by a link, truncated, removed or bit-flipped (a flip in
  ``mlp.bin``/``dense.bin`` is seen only by ``--verify``, which hashes those files whole);
- ``graph``, ``tokenizer``, ``config``: an ONNX graph, ``tokenizer.json``, ``genai_config.json`` or the
  manifest's model config edited, with the file's size and sha256 recomputed in the manifest so only a
  deeper check than the hash can catch it;
- ``hardlink``: a listed file replaced by a hard link to the canary (size and sha256 recomputed);
- ``fifo``: a listed file replaced by a FIFO (an open must not wait for a writer);
- ``swap``: a link to the canary swapped in for a file while ``run`` runs (the fuzzer's thread does it);
- ``race``: ``export --force`` of another model into the same folder while ``run`` runs again and again.
The canary is a file beside the bundle; an open of it by anyone is an outside read.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

ALL = ("inspect", "verify", "run")
HOSTILE = ["../canary.bin", "{canary}", "/etc/passwd", "", ".", "..", "sub/mlp.bin", "mlp.bin/..", "mlp.bin\x00x",
           -1, -4096, 2**63 - 1, 2**31, 0, 1.5, None, [], {}, "x" * 300, True]
DATA_FILES = ("mlp.bin", "dense.bin")
#: classes drawn in equal shares; ``swap`` and ``race`` get a few cases of their own (fuzz_bundles.plan)
SHARED = ("manifest", "data", "graph", "tokenizer", "config", "hardlink", "fifo")


def _spec(cls: str, refuse=ALL, **what) -> dict:
    return {"cls": cls, "refuse": list(refuse), **what}


def _manifest(m: dict, rng: random.Random) -> dict:
    pick = rng.randrange(10)
    if pick < 6:
        name = rng.choice(sorted(m["tensors"]))
        key = rng.choice(("file", "offset", "length", "dtype", "shape"))
        return _spec("manifest", set=("tensors", name, key), value=rng.choice(HOSTILE))
    if pick == 6:
        name = rng.choice(sorted(m["files"]))
        if rng.random() < 0.5:
            return _spec("manifest", set=("files", name, "size"), value=rng.choice([0, -1, 10**12]))
        return _spec("manifest", rename_files_key=name, value=rng.choice(["../canary.bin", "{canary}"]))
    if pick == 7:
        role = rng.choice(sorted(m["graphs"]))
        return _spec("manifest", set=("graphs", role), value=rng.choice(["{canary}", "../canary.bin", "/etc/passwd",
                                                                         5, None]))
    return rng.choice([_spec("manifest", plan_layers=-1), _spec("manifest", plan_layers=+1),
                       _spec("manifest", set=("version",), value=99), _spec("manifest", set=("format",), value="other"),
                       _spec("manifest", remove="manifest.json"), _spec("manifest", garble_manifest=True)])


def _data(m: dict, rng: random.Random) -> dict:
    name = rng.choice(DATA_FILES)
    how = rng.choice(("symlink", "truncate", "remove", "flip", "flip", "flip"))
    if how == "flip":  # caught only by --verify: a streaming runtime does not hash the data at start
        return _spec("data", refuse=("verify",), flip=name, seed=rng.randrange(1 << 30))
    return _spec("data", **{how: name})


def _graph(m: dict, rng: random.Random) -> dict:
    graphs = sorted(n for n in m["files"] if n.endswith(".onnx"))
    how = rng.choice(("op_type", "input", "location", "location", "huge_dim", "huge_input"))
    if how == "location":  # an initializer's external data pointed outside, at an unlisted file or a link
        where = rng.choice(["../canary.bin", "{canary}", "unlisted.bin", "/etc/passwd", "mlp.bin/../dense.bin"])
        return _spec("graph", graph=rng.choice([g for g in graphs if g.startswith(("decoder", "layer.0.attn",
                                                                                    "model", "head"))]),
                      how=how, value=where, index=rng.randrange(1 << 16))
    # runs only where the run opens that graph: exit 0 of a graph it does not open is content_accepted
    return _spec("graph", refuse=(), graph=rng.choice(graphs), how=how, index=rng.randrange(1 << 16))


def _tokenizer(m: dict, rng: random.Random) -> dict:
    how = rng.choice(("truncate", "huge_vocab", "utf8", "model_type", "nesting"))
    refuse = () if how == "model_type" else ("run",)  # inspect and verify do not parse the tokenizer
    return _spec("tokenizer", refuse=refuse, how=how, value=rng.choice(["WordPiece", "Unigram", "WordLevel", "None"]))


GENAI_EDITS = [(("model", "decoder", "session_options", "custom_ops_library"), "../canary.bin", ALL),
               (("model", "decoder", "session_options", "custom_ops_library"), "{canary}", ALL),
               (("model", "vocab_size"), 0, ()), (("model", "decoder", "num_attention_heads"), 3, ()),
               (("model", "decoder", "num_key_value_heads"), 3, ()), (("model", "decoder", "num_key_value_heads"), 0, ()),
               (("model", "decoder", "head_size"), 7, ()), (("model", "decoder", "head_size"), 2**31, ()),
               (("model", "context_length"), 0, ()), (("model", "context_length"), 2**40, ()),
               (("model", "decoder"), None, ()), (("model",), [], ())]
CONFIG_EDITS = [(("vocab_size",), 0, ()), (("num_attention_heads",), 3, ()), (("num_key_value_heads",), 3, ()),
                (("head_dim",), 7, ()), (("max_position_embeddings",), 0, ()), (("max_position_embeddings",), -1, ()),
                (("hidden_size",), 65, ALL), (("num_hidden_layers",), 3, ALL), (("vocab_size",), 10**9, ALL)]


def _config(m: dict, rng: random.Random) -> dict:
    if rng.random() < 0.6:
        path, value, refuse = rng.choice(GENAI_EDITS)
        return _spec("config", refuse=refuse, genai=path, value=value)
    path, value, refuse = rng.choice(CONFIG_EDITS)
    return _spec("config", refuse=refuse, set=("source", "config") + path, value=value)


def _hardlink(m: dict, rng: random.Random) -> dict:
    return _spec("hardlink", hardlink=rng.choice(sorted(m["files"])), seed=rng.randrange(1 << 30))


def _fifo(m: dict, rng: random.Random) -> dict:
    return _spec("fifo", fifo=rng.choice(sorted(n for n in m["files"] if n != "libdipdeploy_ops.so")))


def swap(m: dict, rng: random.Random) -> dict:
    """A link to the canary put in place of a file at a random moment of ``run``; ``inspect`` and
    ``verify`` run after, on the folder with the link in it."""
    return _spec("swap", refuse=("inspect", "verify"), swap=rng.choice(["mlp.bin", "tokenizer.json", "dense.bin",
                                                                          "genai_config.json", "decoder.prefetch.onnx"]),
                 delay=round(rng.uniform(0.0, 0.5), 3))


def race(m: dict, rng: random.Random) -> dict:
    """``export --force`` of the other bundle into the folder while ``run`` runs again and again."""
    return _spec("race", refuse=(), race=rng.choice(["A", "B"]))


MAKERS = {"manifest": _manifest, "data": _data, "graph": _graph, "tokenizer": _tokenizer, "config": _config,
          "hardlink": _hardlink, "fifo": _fifo, "swap": swap, "race": race}


def record(bundle: Path, m: dict, name: str) -> None:
    """``files[name]`` made to vouch for what ``name`` now holds (size and sha256 recomputed)."""
    data = (bundle / name).read_bytes()
    m["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _flip(data: bytes, seed: int, count: int = 8) -> bytes:
    r, out = random.Random(seed), bytearray(data)
    for _ in range(count):
        i = r.randrange(len(out))
        out[i] ^= 1 << r.randrange(8)
    return bytes(out)


def _set(node, path, value) -> None:
    *parents, last = path
    for p in parents:
        node = node[p]
    node[last] = value


def _edit_graph(bundle: Path, canary: Path, spec: dict) -> None:
    import onnx

    path = bundle / spec["graph"]
    model = onnx.load(str(path), load_external_data=False)
    g, i, how = model.graph, spec["index"], spec["how"]
    if how == "op_type":
        g.node[i % len(g.node)].op_type = "DipFuzzNoSuchOp"
    elif how == "input":
        nodes = [n for n in g.node if n.input]
        nodes[i % len(nodes)].input[0] = "dip_fuzz_missing_value"
    elif how == "location":
        ext = [t for t in g.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        value = str(canary) if spec["value"] == "{canary}" else spec["value"]
        if value == "unlisted.bin":
            shutil.copy(bundle / "dense.bin", bundle / value)
        for e in ext[i % len(ext)].external_data:
            if e.key == "location":
                e.value = value
    elif how == "huge_dim":
        inits = [t for t in g.initializer if t.dims] or list(g.initializer)
        t = inits[i % len(inits)]
        del t.dims[:]
        t.dims.extend([2**31, 2**31])
    elif how == "huge_input":
        dims = [d for v in g.input for d in v.type.tensor_type.shape.dim]
        if dims:
            dims[i % len(dims)].dim_value = 2**40
    path.write_bytes(model.SerializeToString())


def _edit_tokenizer(bundle: Path, spec: dict) -> None:
    path = bundle / "tokenizer.json"
    data, how = path.read_bytes(), spec["how"]
    if how == "truncate":
        data = data[: len(data) // 2]
    elif how == "utf8":
        i = data.index(b'"version"') + 1
        data = data[:i] + b"\xff\xfe\xc3(" + data[i:]
    elif how == "nesting":
        data = b'{"version": "1.0", "model": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    else:
        t = json.loads(data)
        if how == "huge_vocab":
            base = len(t["model"]["vocab"])
            t["model"]["vocab"].update({f"dipfuzz{n}": base + n for n in range(100_000)})
        else:
            t["model"]["type"] = spec["value"]
        data = json.dumps(t).encode()
    path.write_bytes(data)


def apply(bundle: Path, canary: Path, spec: dict, other: Path) -> None:
    """Apply ``spec`` to the bundle copy ``bundle`` (``other``: the second bundle, whose files make a
    canary of the same size and kind). ``swap`` and ``race`` change nothing here."""
    mpath = bundle / "manifest.json"
    m = json.loads(mpath.read_text())

    def resolve(v):
        return str(canary) if v == "{canary}" else v

    if "set" in spec:
        _set(m, spec["set"], resolve(spec["value"]))
    elif "rename_files_key" in spec:
        m["files"][resolve(spec["value"])] = m["files"].pop(spec["rename_files_key"])
    elif "plan_layers" in spec:
        layers = m["plan"]["layers"]
        m["plan"]["layers"] = layers[:-1] if spec["plan_layers"] < 0 else layers + [copy.deepcopy(layers[-1])]
    elif "symlink" in spec:
        target = bundle / spec["symlink"]
        shutil.copy(target, canary)
        target.unlink()
        target.symlink_to(canary)
    elif "truncate" in spec:
        target = bundle / spec["truncate"]
        with open(target, "r+b") as f:
            f.truncate(max(0, target.stat().st_size // 2))
    elif "remove" in spec:
        (bundle / spec["remove"]).unlink()
    elif "flip" in spec:
        target = bundle / spec["flip"]
        target.write_bytes(_flip(target.read_bytes(), spec["seed"]))
    elif spec["cls"] == "graph":
        _edit_graph(bundle, canary, spec)
        record(bundle, m, spec["graph"])
    elif spec["cls"] == "tokenizer":
        _edit_tokenizer(bundle, spec)
        record(bundle, m, "tokenizer.json")
    elif "genai" in spec:
        path = bundle / "genai_config.json"
        g = json.loads(path.read_text())
        _set(g, spec["genai"], resolve(spec["value"]))
        path.write_text(json.dumps(g, indent=1))
        record(bundle, m, "genai_config.json")
    elif "hardlink" in spec:
        name = spec["hardlink"]
        canary.write_bytes(_flip((bundle / name).read_bytes(), spec["seed"]))
        (bundle / name).unlink()
        os.link(canary, bundle / name)
        record(bundle, m, name)
    elif "fifo" in spec:
        (bundle / spec["fifo"]).unlink()
        os.mkfifo(bundle / spec["fifo"])
    if spec.get("garble_manifest"):
        mpath.write_text(mpath.read_text()[: len(mpath.read_text()) // 2])
    elif spec.get("remove") != "manifest.json":
        mpath.write_text(json.dumps(m))


def swap_in(bundle: Path, canary: Path, name: str, other: Path) -> None:
    """Put a link to the canary at ``name`` in one rename; the canary holds ``other``'s copy of that file
    (same size, another model's bytes), so a read through the link would also change the tokens."""
    shutil.copy(other / name, canary)
    tmp = bundle / f".{name}.swap"
    tmp.symlink_to(canary)
    os.replace(tmp, bundle / name)
