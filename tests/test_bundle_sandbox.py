"""A bundle is a sandbox: a manifest cannot point a reader outside its directory, at a range outside a
file, or at another model than its graphs; every refusal is one line with the fix, exit code 2 in the CLI.

Each hostile edit is applied to a copy of one tiny exported bundle and must be refused by the manifest
reader, the runtime's Engine and the ``inspect`` and ``run`` commands, with the checker's own message
(so the refusal happened before any file the manifest names was opened) and without opening the canary
file that the edit points at (``open``/``os.open``/``np.memmap`` are watched in-process).
"""

from __future__ import annotations

import builtins
import copy
import json
import os
import random
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dipdeploy.cli.export  # noqa: F401  (registers inspect)
import dipdeploy.cli.run  # noqa: F401  (registers run)
from dipdeploy.bundle.manifest import BUNDLE_VERSION, BundleError, read_manifest, verify
from dipdeploy.bundle.names import MANIFEST
from dipdeploy.cli._app import app

runner = CliRunner()
CANARY = "canary.bin"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = tmp_path_factory.mktemp("sandbox") / "bundle"
    export_model(ExportConfig(model="tiny-llama", method="dip", rho_in=0.6, quant="vq3", vq_hessian="none",
                              validate_tokens=0), out)  # plain k-means: no calibration text needed
    return out


def _edit_manifest(bundle: Path, change) -> None:
    raw = json.loads((bundle / MANIFEST).read_text())
    change(raw)
    (bundle / MANIFEST).write_text(json.dumps(raw))


def _codebook(raw) -> dict:
    """A VQ3 codebook table: a shared tensor the runtime reads whole (what a hostile path would leak)."""
    return next(t for n, t in raw["tensors"].items() if n.endswith("codebooks"))


def _last_mlp_tensor(raw) -> dict:
    return max((t for t in raw["tensors"].values() if t["file"] == "mlp.bin"), key=lambda t: t["offset"])


def _symlinked_mlp(bundle: Path) -> None:
    canary = bundle.parent / CANARY
    shutil.copy2(bundle / "mlp.bin", canary)  # same bytes and size: only the link itself is wrong
    (bundle / "mlp.bin").unlink()
    (bundle / "mlp.bin").symlink_to(canary)


def _past_eof(raw) -> None:
    t = _last_mlp_tensor(raw)
    t["offset"] += raw["alignment"] * (1 + raw["files"]["mlp.bin"]["size"] // raw["alignment"])


def _rename_file_entry(raw) -> None:
    raw["files"]["../" + CANARY] = raw["files"].pop("tokenizer_config.json")


def _before_positions(raw) -> None:
    """The manifest of a bundle exported before positions.onnx (its attention graphs built their own mask)."""
    raw["graphs"]["layers"].remove("positions.onnx")
    del raw["files"]["positions.onnx"]


def _graph_names(location: str):
    """An edit pointing one of head.onnx's external initializers at ``location`` (the bundle folder is
    substituted for ``{bundle}``), the graph's size and sha256 recomputed into the manifest, so only the
    location check can refuse it."""
    def edit(bundle: Path) -> None:
        import onnx

        from dipdeploy.bundle.manifest import file_record

        graph = onnx.load(str(bundle / "head.onnx"), load_external_data=False)
        init = next(t for t in graph.graph.initializer if t.external_data)
        entry = next(e for e in init.external_data if e.key == "location")
        entry.value = location.format(bundle=bundle)
        if entry.value == "unlisted.bin":
            shutil.copy2(bundle / "dense.bin", bundle / "unlisted.bin")
        onnx.save(graph, str(bundle / "head.onnx"))
        _edit_manifest(bundle, lambda r: r["files"].__setitem__("head.onnx", file_record(bundle / "head.onnx")))
    return edit


def _hard_linked_mlp(bundle: Path) -> None:
    """mlp.bin as one more name of a file outside the bundle (same bytes, so its size and sha256 pass)."""
    canary = bundle.parent / CANARY
    canary.unlink()
    os.link(bundle / "mlp.bin", canary)


HOSTILE = {
    "graph external data ../canary": (_graph_names("../" + CANARY), "stores its data in '../canary.bin'"),
    "graph external data absolute": (_graph_names("{bundle}/../" + CANARY), "not a plain file name"),
    "graph external data unlisted": (_graph_names("unlisted.bin"), "not one of the bundle's data files"),
    "graph external data tokenizer": (_graph_names("tokenizer.json"), "not one of the bundle's data files"),
    "hard-linked mlp.bin": (_hard_linked_mlp, "mlp.bin: 2 hard links"),
    "tensor file ../canary": (lambda b: _edit_manifest(b, lambda r: _codebook(r).update(file="../" + CANARY)),
                              "not a plain file name"),
    "tensor file absolute": (lambda b: _edit_manifest(b, lambda r: _codebook(r).update(file=str(b.parent / CANARY))),
                             "not a plain file name"),
    "files entry ../canary": (lambda b: _edit_manifest(b, _rename_file_entry), "not a plain file name"),
    "symlinked mlp.bin": (_symlinked_mlp, "mlp.bin: a symbolic link"),
    "negative offset": (lambda b: _edit_manifest(b, lambda r: _codebook(r).update(offset=-r["alignment"])),
                        "non-negative"),
    "offset+length past EOF": (lambda b: _edit_manifest(b, _past_eof), "beyond"),
    "length not matching shape": (lambda b: _edit_manifest(b, lambda r: _codebook(r)["shape"].__setitem__(
        0, _codebook(r)["shape"][0] - 1)), "length"),
    "plan.layers shortened": (lambda b: _edit_manifest(b, lambda r: r["plan"].__setitem__(
        "layers", r["plan"]["layers"][:-1])), "num_hidden_layers"),
    "graphs.model absolute": (lambda b: _edit_manifest(b, lambda r: r["graphs"].__setitem__(
        "model", str(b.parent / CANARY))), "graphs.model"),
    "tensor moved onto another": (lambda b: _edit_manifest(b, lambda r: _codebook(r).update(offset=0)), "overlap"),
    "per-layer graphs without positions.onnx": (lambda b: _edit_manifest(b, _before_positions),
                                                "graphs.layers: 8 graphs"),
    "bundle version 1": (lambda b: _edit_manifest(b, lambda r: r.update(version=1)),
                         "bundle version 1 is not supported"),
}


@pytest.fixture(params=sorted(HOSTILE))
def hostile(request, tiny, tmp_path):
    """A damaged copy of the tiny bundle, a canary file beside it, and the message the checker gives."""
    edit, message = HOSTILE[request.param]
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny, bundle)
    (tmp_path / CANARY).write_bytes(os.urandom(1 << 16))
    edit(bundle)
    return bundle, tmp_path / CANARY, message


@pytest.fixture
def opened(monkeypatch):
    """Every path this process opens with ``open``, ``os.open`` or ``np.memmap`` from now on, resolved."""
    import io

    import numpy as np

    seen: list[Path] = []
    real_open, real_os_open, real_memmap = builtins.open, os.open, np.memmap.__new__

    def spy(path):
        if isinstance(path, (str, os.PathLike)):
            seen.append(Path(path).resolve())

    for mod in (builtins, io):
        monkeypatch.setattr(mod, "open", lambda f, *a, **k: (spy(f), real_open(f, *a, **k))[1])
    monkeypatch.setattr(os, "open", lambda f, *a, **k: (spy(f), real_os_open(f, *a, **k))[1])
    monkeypatch.setattr(np.memmap, "__new__", lambda cls, f, *a, **k: (spy(f), real_memmap(cls, f, *a, **k))[1])
    return seen


def _one_line_exit_2(result, message: str) -> None:
    out = result.output.strip()
    assert result.exit_code == 2, out
    assert len(out.splitlines()) == 1 and out.startswith("error:") and message in out, out
    assert "Traceback" not in out and isinstance(result.exception, SystemExit)
    assert "dipdeploy export" in out  # the fix


def test_intact_bundle_passes_every_check(tiny):
    """The control: the checks accept what export writes, so each refusal below is due to its edit."""
    from dipdeploy.runtime import Engine

    m = read_manifest(tiny, checksums="all")
    assert verify(tiny, m, "all") == []
    Engine(tiny, native=False)
    res = runner.invoke(app, ["inspect", str(tiny), "--verify"])
    assert res.exit_code == 0, res.output


def test_reader_refuses_before_opening(hostile, opened):
    bundle, canary, message = hostile
    with pytest.raises(BundleError, match=message) as err:
        read_manifest(bundle)
    assert "dipdeploy export" in str(err.value) and "\n" not in str(err.value)
    assert canary.resolve() not in opened


def test_engine_refuses_before_opening(hostile, opened):
    from dipdeploy.runtime import Engine

    bundle, canary, message = hostile
    with pytest.raises(BundleError, match=message):
        Engine(bundle, native=False)
    with pytest.raises(BundleError, match=message):
        Engine(bundle, native=False, verify=True)
    assert canary.resolve() not in opened


@pytest.mark.parametrize("args", [["inspect"], ["inspect", "--verify"], ["inspect", "--prompt", "Hi"],
                                  ["run", "--prompt", "Hi", "-n", "2", "--no-native"],
                                  ["run", "--prompt", "Hi", "-n", "2", "--no-native", "--verify"]],
                         ids=" ".join)
def test_cli_refuses_with_one_line(hostile, opened, args):
    bundle, canary, message = hostile
    _one_line_exit_2(runner.invoke(app, [args[0], str(bundle), *args[1:]]), message)
    assert canary.resolve() not in opened


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_checksums_small_files_by_default_data_files_with_verify(tiny, tmp_path):
    """Default: the graphs, configs and tokenizer are hashed (cheap); the tensor data files only under
    --verify (a full read of the Flash file is what streaming avoids at start)."""
    graph, data = tmp_path / "graph", tmp_path / "data"
    shutil.copytree(tiny, graph)
    shutil.copytree(tiny, data)
    _flip(graph / "head.onnx", (graph / "head.onnx").stat().st_size // 2)
    _flip(data / "mlp.bin", (data / "mlp.bin").stat().st_size // 2)
    _one_line_exit_2(runner.invoke(app, ["inspect", str(graph)]), "head.onnx: sha256 mismatch")
    assert read_manifest(data) is not None
    _one_line_exit_2(runner.invoke(app, ["run", str(data), "-p", "Hi", "-n", "2", "--no-native", "--verify"]),
                     "mlp.bin: sha256 mismatch")
    res = runner.invoke(app, ["inspect", str(data), "--verify"])
    assert res.exit_code == 1 and "mlp.bin: sha256 mismatch" in res.output


def _mutations(raw: dict, rng: random.Random, n: int):
    """Manifests with one value somewhere replaced by a value of another type or sign."""
    paths = []

    def walk(node, path):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            paths.append(path + [k])
            if len(paths) < 20000:
                walk(v, path + [k])

    walk(raw, [])
    values = [None, -1, -(1 << 40), 1 << 62, 0.5, "x", "../x", "/etc/passwd", [], {}, True, [1, "a"]]
    for _ in range(n):
        r, path = copy.deepcopy(raw), rng.choice(paths)
        node = r
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = rng.choice(values)
        yield r


def test_mutated_manifests_raise_bundle_error_only(tiny, tmp_path):
    """Any type or sign swap is a BundleError (or caught by the CLI), never another exception type."""
    raw = json.loads((tiny / MANIFEST).read_text())
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny, bundle)
    refused = 0
    for r in _mutations(raw, random.Random(0), 300):
        (bundle / MANIFEST).write_text(json.dumps(r))
        try:
            read_manifest(bundle)
        except BundleError as err:
            assert "\n" not in str(err)
            refused += 1
    assert refused > 0
    lacking = json.dumps({"format": "dipdeploy-bundle", "version": BUNDLE_VERSION}).encode()
    for text in (b"\xff\xfe", b"[" * 100000, b"[]", lacking):
        (bundle / MANIFEST).write_bytes(text)
        with pytest.raises(BundleError, match="dipdeploy export"):
            read_manifest(bundle)


@pytest.mark.parametrize("args", [["inspect"], ["run", "-p", "Hi", "-n", "2", "--no-native"]], ids=" ".join)
def test_mutated_manifests_never_give_a_traceback(tiny, tmp_path, args):
    """What the reader lets through, the commands present or refuse with their one line (exit 0 or 2)."""
    raw = json.loads((tiny / MANIFEST).read_text())
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny, bundle)
    codes = set()
    for r in _mutations(raw, random.Random(1), 60):
        (bundle / MANIFEST).write_text(json.dumps(r))
        res = runner.invoke(app, [args[0], str(bundle), *args[1:]])
        assert res.exit_code in (0, 2) and isinstance(res.exception, (SystemExit, type(None))), res.output
        codes.add(res.exit_code)
    assert codes == {0, 2}


def test_a_hard_linked_manifest_or_a_fifo_file_is_refused(tiny, tmp_path):
    """Not only the listed files: the manifest itself must be the bundle's own regular file, and a FIFO in
    a listed file's place is refused by its kind, never opened (a read would block)."""
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny, bundle)
    os.link(bundle / MANIFEST, tmp_path / "elsewhere.json")
    with pytest.raises(BundleError, match="manifest.json: 2 hard links"):
        read_manifest(bundle)
    (tmp_path / "elsewhere.json").unlink()
    (bundle / "tokenizer.json").unlink()
    os.mkfifo(bundle / "tokenizer.json")
    _one_line_exit_2(runner.invoke(app, ["inspect", str(bundle)]), "tokenizer.json: not a regular file")
