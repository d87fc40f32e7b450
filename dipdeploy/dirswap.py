"""Replace a directory so that a crash at any point leaves a complete one at its path, or a state the
next writer repairs.

Where Linux's ``renameat2(RENAME_EXCHANGE)`` works, the new directory (built in ``.<name>.tmp-*``)
and the old ``final`` trade places in one step, so ``final`` is always the old or the new directory;
the old one, now at the temporary name, is removed after. Elsewhere the swap is two renames in one
parent directory: the old ``final`` moves aside to ``.<name>.old-*``, the new one is renamed to
``final``, and only then is the old one removed. Between those two renames ``final`` is briefly
absent; a crash there leaves the complete old directory in ``.<name>.old-*``, and :func:`recover`
(run by the next writer, or by a reader that finds ``final`` missing) renames it back.

Writers hold an exclusive ``flock`` on ``.<name>.lock`` for the whole build, so leftovers seen under
the lock belong to no live writer and can be removed. The holder unlinks the lock file before
releasing it, and a process that locked an inode no longer at the path retries, so two processes
never hold "the" lock on different inodes; a writer killed with SIGKILL leaves an unlocked lock file,
which the next holder reuses and removes.

Readers of the directory (a bundle's ``run``) hold a shared ``flock`` on ``.<name>.reading`` while they
open it (:func:`reading`), and :func:`replace_dir` takes it exclusively around its renames: a swap waits
for a reader's opens to finish, and a reader waits out a swap, so no reader opens half of one directory
and half of the other, or a name the swap is about to remove. It is a lock of its own, not the writers'
``.<name>.lock``, because a writer holds that one for its whole build and a reader of the old directory
must not wait for that. The last reader out removes the file, by the same inode rule. Floor 1: no torch.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import secrets
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

Hook = Callable[[str], None]
#: The swap's steps, in order; a hook is called with each name just before that step runs.
STEPS = ("aside", "in", "drop", "done")

_held: dict[str, int] = {}  # lock path → open descriptor, for the locks this process holds


class OutputBusy(RuntimeError):
    """Another process is writing the same directory (it holds the lock)."""


def lock_path(final: Path) -> Path:
    return final.parent / f".{final.name}.lock"


def reading_path(final: Path) -> Path:
    return final.parent / f".{final.name}.reading"


def tmp_prefix(final: Path) -> str:
    return f".{final.name}.tmp-"


def old_prefix(final: Path) -> str:
    return f".{final.name}.old-"


def leftovers(final: Path) -> list[Path]:
    """The temporary and moved-aside siblings of ``final`` (only stale while the lock is held)."""
    final = Path(final)
    if not final.parent.is_dir():
        return []
    prefixes = (tmp_prefix(final), old_prefix(final))
    return sorted(p for p in final.parent.iterdir() if p.name.startswith(prefixes))


def holds(final: Path) -> bool:
    return str(lock_path(Path(final)).absolute()) in _held


@contextmanager
def hold(final: Path, wait: bool = True, what: str = "another process"):
    """Hold the exclusive lock of ``final`` for the block; re-entrant within this process.

    ``wait`` False raises :class:`OutputBusy` at once instead of waiting for the holder."""
    final = Path(final)
    key = str(lock_path(final).absolute())
    if key in _held:
        yield
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    fd = _lock(key, wait, f"{what} is writing {final} (it holds {key}); wait for it to finish or choose "
                          "another path")
    _held[key] = fd
    try:
        yield
    finally:
        del _held[key]
        _release_exclusive(key, fd)


def _release_exclusive(path: str, fd: int) -> None:
    """Drop an exclusive hold: the file goes first, while still held, so a waiter on the old inode
    sees a new one and retries (:func:`_lock`)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.close(fd)


@contextmanager
def reading(final: Path):
    """Hold ``final``'s reading lock shared for the block (see the module docstring): opens done inside
    it see one directory, never a swap half done. Where the lock file cannot be made (a read-only or
    foreign parent folder, where no writer of this user swaps either) the block runs without it."""
    key = str(reading_path(Path(final)))
    try:
        fd = _lock(key, True, "", shared=True)
    except OSError as err:
        if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT):
            raise
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            _release_shared(key, fd)


def _release_shared(path: str, fd: int) -> None:
    """Drop a shared hold; the last holder (the one that can take it exclusively at once) unlinks the
    file first, as :func:`hold` does, so a waiter on the old inode retries on a new one."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # another reader or a swap holds it: they remove it
    else:
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                os.unlink(path)
        except OSError:
            pass
    os.close(fd)


@contextmanager
def _swapping(final: Path):
    """The reading lock held exclusively (waiting for readers' opens) for a swap's renames."""
    key = str(reading_path(final))
    fd = _lock(key, True, "")
    try:
        yield
    finally:
        _release_exclusive(key, fd)


def _lock(path: str, wait: bool, busy: str, shared: bool = False) -> int:
    """An open descriptor of ``path`` holding its flock (``shared``: LOCK_SH), retried until the locked
    inode is still the one at ``path`` (a releasing holder unlinks it)."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except PermissionError:
            if not shared:
                raise
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # flock needs no write access
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
        except BaseException as err:
            os.close(fd)
            if isinstance(err, OSError) and err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise OutputBusy(busy) from None
            raise
        if same:
            return fd
        os.close(fd)


def _is_dir(path: Path) -> bool:
    return path.is_dir()


def recover(final: Path, complete: Callable[[Path], bool] = _is_dir, tidy: bool = True) -> list[str]:
    """Repair what a killed writer left; the caller holds the lock. Returns one line per action.

    ``final`` missing with a complete ``.<name>.old-*`` (killed between the two renames): the old
    directory is renamed back, since the new one was never committed. ``tidy``: every other
    temporary or moved-aside sibling is removed."""
    final = Path(final)
    done = []
    olds = sorted((p for p in leftovers(final) if p.name.startswith(old_prefix(final))),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    if not final.exists():
        for old in olds:
            if complete(old):
                os.rename(old, final)
                done.append(f"restored {final} from {old.name} (an interrupted replacement)")
                break
    if tidy:
        stale = leftovers(final)
        if stale:
            size = sum(_du(p) for p in stale)
            for p in stale:
                shutil.rmtree(p, ignore_errors=True)
            done.append(f"removed {len(stale)} stale temporary director{'y' if len(stale) == 1 else 'ies'} "
                        f"of a killed writer next to {final} ({size / 1e6:.1f} MB)")
    return done


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


#: Swap with one ``renameat2(RENAME_EXCHANGE)`` where the kernel and filesystem support it (Linux ≥ 3.15;
#: ext4, xfs, btrfs, tmpfs): then ``final`` is never absent. False forces the two-rename swap.
EXCHANGE = True
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two existing paths; False where that is not supported (nothing changed)."""
    if not EXCHANGE or not sys.platform.startswith("linux"):
        return False
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def replace_dir(tmp: Path, final: Path, hook: Hook | None = None) -> None:
    """Swap the complete directory ``tmp`` in at ``final`` (see the module docstring); the caller holds
    the lock. An exception before the new directory is in leaves the old one at ``final``. The old
    directory ends at ``tmp`` (at once where :func:`_exchange` works, else via ``.<name>.old-*``), so
    the caller's cleanup of ``tmp`` removes it even when its removal here is interrupted.

    ``hook(step)`` runs before each of :data:`STEPS`; tests and benchmarks raise or signal there."""
    hook = hook or (lambda step: None)
    tmp, final = Path(tmp), Path(final)
    with _swapping(final):  # no reader is between its opens while the directories trade places
        old = _swap(tmp, final, hook)
    try:
        hook("drop")
    finally:  # the new directory is in: the old one goes even when interrupted here
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    hook("done")


def _swap(tmp: Path, final: Path, hook: Hook) -> Path | None:
    """:func:`replace_dir`'s renames; the old directory's path after them (None: there was none)."""
    old = None
    hook("aside")
    if not final.exists():
        hook("in")
        os.rename(tmp, final)
    elif _can_exchange(final.parent):
        hook("in")
        if not _exchange(tmp, final):
            raise OSError(errno.EINVAL, f"renameat2(RENAME_EXCHANGE) stopped working in {final.parent}")
        old = tmp
    else:
        old = final.parent / f"{old_prefix(final)}{secrets.token_hex(4)}"
        os.rename(final, old)
        try:
            hook("in")
            os.rename(tmp, final)
        except BaseException:
            if not final.exists():
                os.rename(old, final)
            raise
        os.rename(old, tmp)  # as after an exchange: the caller's cleanup of ``tmp`` finishes an interrupted drop
        old = tmp
    return old


_exchange_ok: dict[int, bool] = {}  # st_dev → whether RENAME_EXCHANGE works there


def _can_exchange(parent: Path) -> bool:
    """Whether :func:`_exchange` works on ``parent``'s filesystem (tried once per filesystem on two
    empty scratch directories)."""
    if not EXCHANGE:
        return False
    dev = os.stat(parent).st_dev
    if dev not in _exchange_ok:
        a = Path(tempfile.mkdtemp(prefix=".dirswap-probe-", dir=parent))
        b = Path(tempfile.mkdtemp(prefix=".dirswap-probe-", dir=parent))
        try:
            _exchange_ok[dev] = _exchange(a, b)
        finally:
            a.rmdir()
            b.rmdir()
    return _exchange_ok[dev]
