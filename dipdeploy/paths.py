"""Where dipdeploy keeps what it builds once and reuses (converted checkpoints, tiny models, headers),
and the one rule for the files a command reads and writes (checked before any work; written atomically).

``$DIPDEPLOY_CACHE`` if set, else ``~/.cache/dipdeploy``. Floor 1: no torch.
"""

from __future__ import annotations

import os
import shutil
import stat
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


#: what an existing file output may not be, by ``stat.S_IFMT`` (a directory has its own message)
_NOT_REGULAR = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a device",
                stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}


def check_output(path: Path, force: bool, *, directory: bool = False, flag: str = "") -> Path:
    """Refuse, before any work, an output that cannot be written or would clobber an existing one.

    One rule for every output of every command (``--json``, ``--out``, ``--plot``, ``--trace``): an
    existing path is replaced only with ``force``; a file output must not be a directory (a directory
    output, ``directory``, must not be a file); the nearest existing ancestor must be a writable
    directory (missing folders in between are created when writing). Checked up front so that minutes
    of work are never lost to a typo in an output path. ``flag`` names the option in the message.

    An existing file output must be a regular file, even with ``force``: outputs are replaced by a
    rename (:func:`write_atomic`), which would put a file where a symbolic link, a FIFO or a device node
    (``/dev/null``, ``/dev/stdout``) was, instead of writing through it as the user meant."""
    path = Path(path)
    name = f"{flag} {path}" if flag else str(path)
    if path.is_dir() and not directory:
        raise IsADirectoryError(f"{name} is a directory; give a file path")
    if not directory:
        try:
            kind = _NOT_REGULAR.get(stat.S_IFMT(path.lstat().st_mode))
        except OSError:  # missing, or under a file: the checks below name it
            kind = None
        if kind is not None:
            raise FileExistsError(f"{name} is {kind}, not a regular file; give the path of a new or a regular "
                                  f"file (outputs are replaced, never written through)")
    if path.exists() and directory and not path.is_dir():
        raise FileExistsError(f"{name} is a file, not a directory; give a directory path")
    if path.exists() and not force:
        raise FileExistsError(f"{name} exists; pass --force to overwrite it or choose another path")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(f"{name}: {parent} is not a directory; choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{name}: {parent} is not writable; choose another path")
    return path


def check_outputs(force: bool, outputs: dict[str, Path | None]) -> None:
    """:func:`check_output` for each given file output, keyed by its option (``{"--json": path}``)."""
    for flag, path in outputs.items():
        if path is not None:
            check_output(path, force, flag=flag)


def check_input_dir(path: Path | str | None, flag: str) -> Path | None:
    """An input folder the user named must exist: a typo must not fall back silently to a default."""
    if path is None:
        return None
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{flag} {path} is not an existing directory; give the folder that holds the "
                                f"files (or leave {flag} out)")
    return path


def read_capped(path: Path | str, cap: int) -> bytes | None:
    """The bytes of ``path``, or None when it holds more than ``cap``: at most ``cap + 1`` bytes are read,
    so a huge file (or one that grows while it is read) costs no more than the cap before its reader
    refuses it in its own words."""
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return data if len(data) <= cap else None


def check_input_file(path: Path | str | None, flag: str) -> Path | None:
    """An input file the user named must exist before any work starts (not after the model loaded)."""
    if path is None:
        return None
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"{flag} {path} {what}; give an existing file")
    return path


def write_atomic(path: Path, data: bytes | str, force: bool = False) -> Path:
    """Write ``data`` to ``path`` via a temporary sibling and a rename (a kill never leaves half a file);
    the overwrite rule is :func:`check_output`'s."""
    path = check_output(Path(path), force)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; the result is an ordinary file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_figure(fig, out: Path, dpi: int = 120) -> Path:
    """Save a matplotlib figure as a PNG at ``out`` atomically (a temporary sibling renamed in, so a kill
    leaves the old file or none) and close it; ``out`` already passed ``check_output``."""
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".png", dir=out.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=dpi)
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
