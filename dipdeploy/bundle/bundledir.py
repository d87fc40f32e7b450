"""A bundle folder held open: every read of a bundle file goes through one directory descriptor, and
each file's checks are made on the descriptor that is then read, never on a name looked up again.

A check by path followed by an open by path checks one file and reads another when the name changes in
between (a symbolic link swapped in, a swap of the whole folder by ``export --force``). Here a name is
opened once, relative to the held folder (``openat(dirfd, name, O_NOFOLLOW)``: no link followed, no
lookup of the folder's own path again), and the open descriptor is checked (``fstat``: a regular file,
one hard link, the manifest's size); :meth:`BundleDir.read_bytes` hashes exactly the bytes it returns,
so what a parser gets is what the manifest's sha256 vouches for. A weight file a reader takes in place
(onnxruntime's external data) is mapped from its checked descriptor (:meth:`BundleDir.map`): the mapping
holds the inode that was checked, so a name changed afterwards cannot change what is read. Floor 1,
standard library only (``dirswap`` for the readers' lock).
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import stat
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable

REGENERATE = "regenerate the bundle with `dipdeploy export`"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_HASH_BLOCK = 1 << 22


class BundleError(ValueError):
    """A bundle that cannot be used as it is; the message is one line naming the problem and the fix."""


def name_problem(name) -> str | None:
    """Why ``name`` is not a plain file name inside the bundle (None: it is one)."""
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        return f"{name!r} is not a plain file name inside the bundle (no directories, '..' or absolute paths)"
    return None


def kind_problem(name: str, st: os.stat_result) -> str | None:
    """A bundle file must be a regular file of its own: not a link, a FIFO or a device, and with one
    name only, as a hard link shares its bytes with a file that may lie outside the bundle (its sha256,
    recomputed into the manifest, would vouch for those bytes)."""
    if stat.S_ISLNK(st.st_mode):
        return f"{name}: a symbolic link (a bundle holds plain files)"
    if not stat.S_ISREG(st.st_mode):
        return f"{name}: not a regular file (a bundle holds plain files)"
    if st.st_nlink > 1:  # a filesystem that reports 0 keeps no count to judge by
        return (f"{name}: {st.st_nlink} hard links to the same bytes (a bundle file must be its own copy; a link "
                "may be a file outside the bundle)")
    return None


def stream_sha256(f) -> str:
    """The sha256 of an open binary file from where it stands, read a block at a time (a data file is
    never held whole): the one hash of a bundle file, for the manifest's records and their checks."""
    h = hashlib.sha256()
    while block := f.read(_HASH_BLOCK):
        h.update(block)
    return h.hexdigest()


class FileProblem(OSError):
    """One file failed its open-time checks; ``problem`` is the line ``verify`` lists."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


class BundleDir:
    """The bundle folder ``path`` held by one descriptor (see the module docstring). ``files``: the
    manifest's records (name → {size, sha256}), set once the manifest is read; a listed file must have
    its size, and :meth:`read_bytes` its sha256. ``lock``: hold the folder's reading lock (shared,
    ``dirswap.reading``) from now until :meth:`release`, so an export's swap waits for the opens."""

    #: called with each name after its descriptor passed the checks and before it is read: tests swap
    #: the name there to show the read is bound to the check
    after_check: Callable[[str], None] | None = None

    def __init__(self, path: str | Path, files: dict | None = None, lock: bool = False):
        from dipdeploy import dirswap

        self.path = Path(path)
        self.files = files if files is not None else {}
        self.checked: dict[str, tuple[int, int]] = {}  # name → (st_dev, st_ino) of what was checked
        self._maps: dict[str, mmap.mmap] = {}
        self._stack = ExitStack()
        if lock:
            self._stack.enter_context(dirswap.reading(self.path.absolute()))
        try:
            self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
        except BaseException:
            self._stack.close()
            raise

    def __str__(self) -> str:  # in messages, the bundle's path (never a path to open: use the methods)
        return str(self.path)

    def __enter__(self) -> "BundleDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def release(self) -> None:
        """Let an export swap the folder again (the reads this startup needs are done)."""
        self._stack.close()

    def close(self) -> None:
        self.release()
        self._maps.clear()  # never closed here: views of a map (a session's weights) keep it alive
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @property
    def folder(self) -> str:
        """A path of the held folder itself, for onnxruntime's check that a graph's external data names
        exist (it reads none of them: ``sessions.open_session`` hands it views of :meth:`map`):
        ``/proc/self/fd/N`` resolves to the directory this descriptor holds even after the bundle's path
        names another; the bundle's path where there is no ``/proc``."""
        held = f"/proc/self/fd/{self.fd}"
        return held if os.path.isdir(held) else str(self.path)

    def open(self, name: str) -> int:
        """A read-only descriptor of ``name`` in the held folder (the caller closes it), opened without
        following a link and checked: a regular file of one link, of the manifest's size where it lists
        one. Raises :class:`FileProblem` (missing, a link, another kind, another size)."""
        bad = name_problem(name)
        if bad:
            raise FileProblem(f"files: {bad}")
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0), dir_fd=self.fd)
        except FileNotFoundError:
            raise FileProblem(f"{name}: missing") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link
                raise FileProblem(f"{name}: a symbolic link (a bundle holds plain files)") from None
            raise FileProblem(f"{name}: cannot be read ({exc.strerror})") from None
        try:
            st = os.fstat(fd)
            problem = kind_problem(name, st)
            rec = self.files.get(name)
            size = rec.get("size") if isinstance(rec, dict) else None
            if problem is None and type(size) is int and st.st_size != size:
                problem = f"{name}: size {st.st_size} != {size}"
            if problem:
                raise FileProblem(problem)
            if hasattr(os, "set_blocking"):
                os.set_blocking(fd, True)  # O_NONBLOCK only kept a FIFO's open from waiting for a writer
        except BaseException:
            os.close(fd)
            raise
        self.checked[name] = (st.st_dev, st.st_ino)
        if BundleDir.after_check is not None:
            BundleDir.after_check(name)
        return fd

    def map(self, name: str) -> mmap.mmap:
        """``name`` mapped read-only, whole, from the descriptor :meth:`open` checked; one map per name for
        this folder, so every session's views of a file share its pages. A map stays valid while anything
        views it, after :meth:`close` and whatever the name holds later. Raises :class:`FileProblem`."""
        if name not in self._maps:
            fd = self.open(name)
            try:
                self._maps[name] = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:  # ValueError: an empty file cannot be mapped
                raise FileProblem(f"{name}: cannot be mapped ({exc})") from None
            finally:
                os.close(fd)
        return self._maps[name]

    def read_bytes(self, name: str, cap: int | None = None, hash_it: bool = True) -> bytes:
        """The bytes of ``name``, read through the descriptor :meth:`open` checked, and, where the manifest
        lists a sha256 (and ``hash_it``), compared with the sha256 of exactly these bytes. ``cap``: the
        most bytes a file the manifest does not size may hold. Raises :class:`FileProblem`."""
        rec = self.files.get(name)
        size = rec.get("size") if isinstance(rec, dict) else None
        limit = size if type(size) is int else cap
        if limit is None:
            raise FileProblem(f"{name}: not one of the bundle's files")
        fd = self.open(name)
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)  # the limit holds even if the file grows after the fstat
        if len(data) > limit or (type(size) is int and len(data) != size):
            what = f"over {limit} bytes" if len(data) > limit else f"{len(data)} bytes read"
            raise FileProblem(f"{name}: {what} where {limit} were checked (changed while read)")
        want = rec.get("sha256") if isinstance(rec, dict) else None
        if hash_it and isinstance(want, str) and hashlib.sha256(data).hexdigest() != want:
            raise FileProblem(f"{name}: sha256 mismatch")
        return data

    def sha256(self, name: str) -> str:
        """The sha256 of ``name``, read through one checked descriptor (a data file: never held whole)."""
        with os.fdopen(self.open(name), "rb") as f:
            return stream_sha256(f)

    def stat_problem(self, name: str) -> str | None:
        """The :meth:`open` checks of ``name`` (None: it passes them), its descriptor closed again."""
        try:
            os.close(self.open(name))
        except FileProblem as exc:
            return exc.problem
        return None

    def unchanged(self, names) -> list[str]:
        """The names among ``names`` that no longer hold the file :meth:`open` checked (another inode, a
        link, gone): what a reader that opened them by name may have read instead."""
        changed = []
        for name in names:
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                same = (st.st_dev, st.st_ino) == self.checked.get(name) and kind_problem(name, st) is None
            except OSError:
                same = False
            if not same:
                changed.append(name)
        return changed

    @contextmanager
    def refusing(self):
        """A reader's block: a :class:`FileProblem` raised in it (:meth:`open`, :meth:`read_bytes`) ends
        as the one line of :meth:`error`."""
        try:
            yield
        except FileProblem as exc:
            raise self.error(exc.problem) from None

    def error(self, problem: str) -> BundleError:
        """The one line for a file that failed its checks while the bundle was read."""
        return BundleError(f"bundle {self.path}: {problem}; {REGENERATE} (`dipdeploy inspect --verify` checks "
                           "every file)")
