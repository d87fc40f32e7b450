"""The runtime's reading of a bundle: the manifest after its structure checks and the values the engine
computes with (``open_bundle``), and the positions the bundle can run (``bundle_positions``), so a bundle
the engine cannot run is refused in one line when it opens, not minutes into a run. Torch-free (floor 5).
"""

from __future__ import annotations

import json
from pathlib import Path

from dipdeploy.bundle.bundledir import BundleDir
from dipdeploy.bundle.manifest import REGENERATE, BundleError, Manifest, held, read_manifest
from dipdeploy.bundle.names import GENAI_CONFIG


def open_bundle(path: str | Path | BundleDir, full_verify: bool = False) -> Manifest:
    """The manifest, after ``read_manifest``'s structure checks (paths inside the bundle, tensor ranges,
    plan against graphs, sizes, the small files' checksums) and, if asked, every file's checksum and the
    shipped op library against the libraries this dipdeploy knows (the check a bundle handed to
    onnxruntime-genai needs; the engine itself loads only its own library)."""
    from dipdeploy.ops.native import known_library_hashes

    manifest = read_manifest(path, checksums="all" if full_verify else "small",
                             libraries=known_library_hashes() if full_verify else None)
    path = path.path if isinstance(path, BundleDir) else Path(path)
    if "layers" not in manifest.graphs:
        raise BundleError(f"{path} has no per-layer graphs (exported with --no-per-layer or as dense); "
                          "export it again with `dipdeploy export --method dip|dip-ca` (per-layer graphs are the default)")
    problems = _settings_problems(manifest)
    if problems:
        raise BundleError(f"bundle {path}: {'; '.join(problems)}; {REGENERATE}")
    return manifest


def check_vocabulary(path: Path, manifest: Manifest, tokenizer_vocab: int | None) -> None:
    """Refuse a bundle whose tokenizer (``tokenizer_vocab``: its model's vocabulary, None when it has
    none) or whose config's ``vocab_size`` names more tokens than the embedding table has rows: such ids
    would embed as zero rows in ``model.onnx`` and decode garbage with exit 0. Added (special) tokens
    are not counted: a small model's tokenizer may list one past its table, and the engine refuses that
    id in one line where a text encodes to it (``embedding.check_token_ids``)."""
    from dipdeploy.runtime.embedding import embedding_rows

    rows = embedding_rows(manifest)
    if rows is None:
        return
    declared = (manifest.source.get("config") or {}).get("vocab_size")
    for what, n in (("the config's vocab_size", declared), ("the tokenizer's vocabulary", tokenizer_vocab)):
        if type(n) is int and n > rows:
            raise BundleError(f"bundle {path}: {what} ({n} tokens) exceeds the embedding table's {rows} rows; "
                              f"{REGENERATE}")


def bundle_positions(path: str | Path, manifest: Manifest | None = None, genai: dict | None = None) -> int:
    """Positions the bundle can run: the model's ``max_position_embeddings`` (the manifest's config), or
    fewer when the export built a shorter RoPE table (``context_length`` of genai_config.json; ``genai``:
    that file as already read). A longer context would fail inside onnxruntime at that position, after
    minutes of work."""
    path = Path(path)
    m = manifest or read_manifest(path)
    found = [(m.source.get("config") or {}).get("max_position_embeddings")]
    if genai is None and GENAI_CONFIG in m.files:
        genai = read_json(path, m, GENAI_CONFIG)
    if isinstance(genai, dict):
        found.append((genai.get("model") or {}).get("context_length"))
    found = [int(n) for n in found if isinstance(n, int) and n > 0]
    if not found:
        raise BundleError(f"{path}: the manifest's config has no max_position_embeddings; {REGENERATE}")
    return min(found)


def read_json(bundle: str | Path | BundleDir, manifest: Manifest, name: str):
    """A small JSON file of the bundle, read through ``BundleDir.read_bytes`` (its sha256 compared)."""
    with held(bundle, manifest.files) as folder:
        with folder.refusing():
            data = folder.read_bytes(name)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BundleError(f"bundle {folder.path}: {name} is not valid JSON ({type(exc).__name__}); {REGENERATE}") from None


def _settings_problems(m: Manifest) -> list[str]:
    """The manifest values the engine computes with (beyond ``verify``'s structure) have their types."""
    def number(v, lo, hi):
        return type(v) in (int, float) and lo <= v <= hi

    dipca, level = m.dipca or {}, (m.export_config or {}).get("accuracy_level", 0)
    checks = [(number(dipca.get("gamma", 1.0), 0, 1), "dipca.gamma must be a number in [0, 1]"),
              (number(dipca.get("gamma_warmup", 0) or 0, 0, float("inf")), "dipca.gamma_warmup must be >= 0"),
              (level in (0, 4) and type(level) is int, "export_config.accuracy_level must be 0 or 4")]
    return [message for ok, message in checks if not ok]
