"""Where dipdeploy keeps what it builds once and reuses (converted checkpoints, tiny models, headers).

``$DIPDEPLOY_CACHE`` if set, else ``~/.cache/dipdeploy``. Floor 1: no torch.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from dipdeploy import dirswap
from dipdeploy.dirswap import Hook


def cache_dir(*parts: str) -> Path:
    root = Path(os.environ.get("DIPDEPLOY_CACHE", Path.home() / ".cache" / "dipdeploy"))
    path = root.joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def atomic_dir(final: Path, *, wait: bool = True, tidy: bool = False,
               complete: Callable[[Path], bool] | None = None, hook: Hook | None = None):
    """Yield a temporary sibling directory that replaces ``final`` only if the block succeeds, so an
    interrupted build never leaves a half-written directory, and an interrupted replacement never
    loses the old one (:mod:`dipdeploy.dirswap`).

    The lock of ``final`` is held for the block (``wait`` False: refuse at once when another process
    holds it). ``tidy`` removes the leftovers of killed writers first; it is off by default because
    a shared cache directory may be written by older dipdeploy versions that take no lock.
    ``complete`` tells a restorable moved-aside directory from a partial one; ``hook`` is passed to
    :func:`dipdeploy.dirswap.replace_dir`."""
    final = Path(final)
    with dirswap.hold(final, wait=wait):
        dirswap.recover(final, complete or Path.is_dir, tidy=tidy)
        tmp = Path(tempfile.mkdtemp(prefix=dirswap.tmp_prefix(final), dir=final.parent))
        try:
            yield tmp
            umask = os.umask(0)
            os.umask(umask)
            tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary directory
            dirswap.replace_dir(tmp, final, hook)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def check_output(path: Path, force: bool) -> Path:
    """Refuse to clobber an existing output unless ``force``: nothing is lost by accident."""
    path = Path(path)
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force to overwrite it or choose another path")
    return path


def write_atomic(path: Path, data: bytes | str, force: bool = False) -> Path:
    """Write ``data`` to ``path`` via a temporary file and a rename."""
    path = check_output(Path(path), force)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)
    return path
