"""The ``--out`` directory of an export: claimed under a lock, checked, repaired.

Rules (docs/bundle.md):

* one export at a time per ``--out``: the second is refused at once (:class:`dipdeploy.dirswap.OutputBusy`);
* an existing bundle is replaced only with ``--force``, and never lost (:mod:`dipdeploy.dirswap`);
* what a killed export left (``.<out>.tmp-*``, ``.<out>.old-*``) is repaired or removed by the next
  export, which says so in one line;
* a directory without ``manifest.json`` is replaced with ``--force`` only when every entry in it is a
  file an export writes (a bundle whose deletion was interrupted by an older dipdeploy); anything
  else is refused, so ``--force`` never deletes a directory that is not ours.
"""

from __future__ import annotations

import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from dipdeploy import dirswap
from dipdeploy.bundle.names import JOINED, MANIFEST

Notice = Callable[[str], None]

_BUNDLE_ENTRY = re.compile(
    r"(manifest\.json|genai_config\.json|(model|model\.level0|embed|positions|head)\.onnx"
    r"|layer\.\d+\.(attn|mlp_up|mlp_down)\.onnx|(dense|mlp)\.bin|libdipdeploy_ops\.\w+"
    r"|tokenizer(_config)?\.json|tokenizer\.model|special_tokens_map\.json|added_tokens\.json"
    r"|vocab\.json|merges\.txt|chat_template\.jinja|" + "|".join(re.escape(n) for n in JOINED.values()) + ")")


def is_bundle(path: Path) -> bool:
    """Complete: the manifest is written last, so its presence means every other file is there."""
    return (Path(path) / MANIFEST).is_file()


def is_partial_bundle(path: Path) -> bool:
    """A non-empty directory without a manifest whose entries are all files an export writes."""
    entries = list(Path(path).iterdir())
    return bool(entries) and not is_bundle(path) and all(
        e.is_file() and _BUNDLE_ENTRY.fullmatch(e.name) for e in entries)


@contextmanager
def claim(out: Path, notice: Notice = lambda line: None):
    """Hold ``out``'s lock for the block (refusing if another export holds it) and repair what a
    killed export left, reporting each repair through ``notice``. Re-entrant: an inner claim of the
    same ``out`` does nothing."""
    out = Path(out)
    if dirswap.holds(out):
        yield
        return
    _writable_parent(out)
    with dirswap.hold(out, wait=False, what="another export"):
        for line in dirswap.recover(out, is_bundle, tidy=True):
            notice(line)
        yield


def prepare_out(out: Path, force: bool) -> Path:
    """Check that ``out`` may be written (see the module docstring); hold its :func:`claim` for the
    check to stay true."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is a file, not a bundle directory; choose another --out")
    if out.exists() and not is_bundle(out) and any(out.iterdir()):
        if not is_partial_bundle(out):
            raise FileExistsError(f"{out} exists and is not a dipdeploy bundle; refusing to replace it even "
                                  "with --force")
        if not force:
            raise FileExistsError(f"{out} exists and holds an incomplete bundle (no {MANIFEST}); pass --force "
                                  "to replace it or choose another --out")
    elif out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass --force to replace it or choose another --out")
    _writable_parent(out)
    return out


def _writable_parent(out: Path) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        probe = Path(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=out.parent))
        probe.rmdir()
    except OSError as err:
        raise PermissionError(f"cannot write the bundle into {out.parent} ({err.strerror}); "
                              "choose another --out") from err
