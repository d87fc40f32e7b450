"""Every bundle read is bound to its checks (docs/decisions/0008-bundle-reads.md): a name swapped after
its descriptor was checked is never read again by name, so a link put in a file's place after the checks
makes the engine refuse the bundle or read the file that was checked, never the one outside; a file of
two hard links is refused; a reader's opens and an export's swap of the folder wait for each other.

The swap is made deterministically in ``BundleDir.after_check`` (between a name's check and its read),
not by racing a second process.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from dipdeploy import dirswap
from dipdeploy.bundle.bundledir import BundleDir, FileProblem
from dipdeploy.bundle.manifest import BundleError
from dipdeploy.runtime import Engine

PROMPT = [1, 5, 9, 2]
# mlp.bin is read row by row below 100 %; the one session at 100 % has onnxruntime map it by name
CONFIGS = {"per-layer": dict(dram_budget="50%", policy="lfu", native=False, single_session=False, fused=False),
           "one session": dict(dram_budget="100%", native=False, single_session=True)}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = tmp_path_factory.mktemp("reads") / "bundle"
    export_model(ExportConfig(model="tiny-llama", method="dip", rho_in=0.6, quant="bq4", validate_tokens=0), out)
    return out


@pytest.fixture(scope="module")
def clean(tiny) -> dict[str, tuple[list[int], dict[str, int]]]:
    """Per configuration: the intact bundle's tokens and how often each name is checked on the way."""
    out = {}
    for name, cfg in CONFIGS.items():
        counts: dict[str, int] = {}
        BundleDir.after_check = staticmethod(lambda n: counts.__setitem__(n, counts.get(n, 0) + 1))
        try:
            out[name] = (_tokens(tiny, cfg), counts)
        finally:
            BundleDir.after_check = None
    return out


def _tokens(bundle: Path, cfg: dict) -> list[int]:
    engine = Engine(bundle, **cfg)
    try:
        return engine.generate(PROMPT, 6, stop_at_eos=False).tokens
    finally:
        engine.close()


def _outside(bundle: Path, name: str) -> Path:
    """A file outside the bundle that a reader of ``name`` must never take for it: the same size, other
    bytes (zeros for weights; for a graph, a config or the tokenizer, bytes a reader would fail on)."""
    out = bundle.parent / f"outside-{name}"
    out.write_bytes((b"\0" if name.endswith(".bin") else b"{") * (bundle / name).stat().st_size)
    return out


def _swap_after_check(monkeypatch, bundle: Path, name: str, nth: int, link: bool = True) -> list[str]:
    """Put a link to an outside file (``link`` False: a copy of that file, another inode of other bytes)
    in ``name``'s place right after its ``nth`` check passed; the returned list is non-empty once it has."""
    outside = _outside(bundle, name)
    seen, done = [], []

    def swap(checked: str) -> None:
        if checked != name:
            return
        seen.append(checked)
        if len(seen) == nth:
            os.replace(bundle / name, bundle.parent / f"moved-{name}")
            if link:
                os.symlink(outside, bundle / name)
            else:
                shutil.copyfile(outside, bundle / name)
            done.append(name)

    monkeypatch.setattr(BundleDir, "after_check", staticmethod(swap))
    return done


def _each_check(n: int) -> list[int]:
    return list(range(1, n + 1)) if n <= 4 else [1, n - 1, n]


CASES = [("mlp.bin", "per-layer"), ("mlp.bin", "one session"), ("tokenizer.json", "per-layer"),
         ("genai_config.json", "per-layer"), ("layer.0.attn.onnx", "per-layer"), ("model.onnx", "one session")]


@pytest.mark.parametrize(("name", "config"), CASES)
def test_a_link_swapped_in_after_any_check_is_never_read(tiny, clean, tmp_path, monkeypatch, name, config):
    """After each check of ``name`` in turn a link to an outside file takes its place: the engine reads
    the checked file through its descriptor (the intact bundle's tokens) or refuses in one BundleError
    naming the file; it never reads the outside file (other tokens, or another error from onnxruntime,
    the tokenizer or the JSON reader)."""
    tokens, counts = clean[config]
    assert counts.get(name), f"{name} is never checked in {config}"
    read = 0
    for nth in _each_check(counts[name]):
        bundle = tmp_path / f"bundle-{nth}"
        shutil.copytree(tiny, bundle)
        done = _swap_after_check(monkeypatch, bundle, name, nth)
        try:
            got = _tokens(bundle, CONFIGS[config])
        except BundleError as exc:
            assert name in str(exc) and "\n" not in str(exc), exc
            continue
        assert done and got == tokens
        read += 1
    if name != "mlp.bin" or config == "per-layer":  # the one session's mlp.bin is opened by onnxruntime
        assert read, "the swap after the last check should leave the checked file to be read"


@pytest.mark.parametrize("link", [True, False], ids=["link", "other-bytes"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_weights_swapped_after_their_check_are_never_read(tiny, clean, tmp_path, monkeypatch, config, link):
    """dense.bin is mapped from its checked descriptor and handed to onnxruntime as views of that map:
    anything put in its place after the check (a link out, or a file of other bytes) is never read: the
    intact tokens, or one line naming the file where onnxruntime's own look-up of the name fails."""
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny, bundle)
    done = _swap_after_check(monkeypatch, bundle, "dense.bin", clean[config][1]["dense.bin"], link)
    try:
        got = _tokens(bundle, CONFIGS[config])
    except BundleError as exc:
        assert "dense.bin: not the file that was checked" in str(exc) and "\n" not in str(exc), exc
        return
    assert done and got == clean[config][0]


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_weights_swapped_and_back_while_onnxruntime_builds_are_never_read(tiny, clean, tmp_path, monkeypatch,
                                                                          config):
    """While onnxruntime builds each session, every weight file is renamed aside, a file of zeros renamed
    into its place, and the original renamed back afterwards: a comparison of the names after the build
    cannot see that, so the session must never have read the names. The intact tokens come out."""
    import onnxruntime as ort

    bundle = tmp_path / "bundle"
    shutil.copytree(tiny, bundle)
    weights = [n for n in ("dense.bin", "mlp.bin") if (bundle / n).exists()]
    real, builds = ort.InferenceSession, []

    def swapping(*args, **kwargs):
        for name in weights:
            zeros = _outside(bundle, name)
            os.replace(bundle / name, tmp_path / f"aside-{name}")
            os.replace(zeros, bundle / name)
        try:
            return real(*args, **kwargs)
        finally:
            for name in weights:
                os.replace(tmp_path / f"aside-{name}", bundle / name)
            builds.append(1)

    monkeypatch.setattr(ort, "InferenceSession", swapping)
    assert _tokens(bundle, CONFIGS[config]) == clean[config][0]
    assert builds


@pytest.mark.parametrize("name", ["mlp.bin", "tokenizer.json", "layer.0.attn.onnx"])
def test_a_second_hard_link_is_refused(tiny, tmp_path, name):
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny, bundle)
    os.link(bundle / name, tmp_path / "elsewhere")
    with pytest.raises(BundleError, match=f"{name}: 2 hard links"):
        Engine(bundle, **CONFIGS["per-layer"])
    with BundleDir(bundle) as folder, pytest.raises(FileProblem, match="2 hard links"):
        folder.open(name)


def test_read_bytes_hashes_the_bytes_it_returns(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    files = {"a.json": {"size": 2, "sha256": "0" * 64}}
    with BundleDir(tmp_path, files) as folder, pytest.raises(FileProblem, match="a.json: sha256 mismatch"):
        folder.read_bytes("a.json")


def test_a_link_or_a_fifo_is_refused_on_open(tmp_path):
    (tmp_path / "real").write_bytes(b"x")
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")  # opened without waiting for a writer, then refused
    with BundleDir(tmp_path) as folder:
        with pytest.raises(FileProblem, match="link: a symbolic link"):
            folder.open("link")
        with pytest.raises(FileProblem, match="fifo: not a regular file"):
            folder.open("fifo")
        with pytest.raises(FileProblem, match="not a plain file name"):
            folder.open("../real")


def _folder(path: Path, tag: str) -> Path:
    path.mkdir()
    (path / "tag").write_text(tag)
    return path


def test_a_swap_waits_for_a_reader_opening_the_folder(tmp_path):
    final, new = _folder(tmp_path / "bundle", "old"), _folder(tmp_path / ".bundle.tmp-1", "new")
    steps = []
    reader = BundleDir(final, lock=True)
    swap = threading.Thread(target=dirswap.replace_dir, args=(new, final, steps.append))
    swap.start()
    swap.join(0.5)
    assert swap.is_alive() and steps == []  # held at the reading lock, before its first step
    with os.fdopen(reader.open("tag"), "r") as f:
        assert f.read() == "old"
    reader.release()
    swap.join()
    assert steps == list(dirswap.STEPS) and (final / "tag").read_text() == "new"
    reader.close()
    assert not dirswap.reading_path(final).exists()  # the last holder removes the lock file


def test_a_reader_waits_out_a_swap_and_opens_the_new_folder(tmp_path):
    final, new = _folder(tmp_path / "bundle", "old"), _folder(tmp_path / ".bundle.tmp-1", "new")
    inside, go = threading.Event(), threading.Event()

    def hook(step: str) -> None:
        if step == "aside":
            inside.set()
            go.wait()

    swap = threading.Thread(target=dirswap.replace_dir, args=(new, final, hook))
    swap.start()
    inside.wait()
    seen = []

    def read() -> None:
        with BundleDir(final, lock=True) as folder, os.fdopen(folder.open("tag"), "r") as f:
            seen.append(f.read())

    reader = threading.Thread(target=read)
    reader.start()
    reader.join(0.5)
    assert reader.is_alive() and seen == []  # waiting for the swap's renames
    go.set()
    swap.join()
    reader.join()
    assert seen == ["new"]


def test_readers_share_the_lock(tmp_path):
    final = _folder(tmp_path / "bundle", "old")
    with BundleDir(final, lock=True) as a, BundleDir(final, lock=True) as b:
        assert np.array_equal(np.frombuffer(a.read_bytes("tag", cap=8), np.uint8),
                              np.frombuffer(b.read_bytes("tag", cap=8), np.uint8))
    assert not dirswap.reading_path(final).exists()
