"""The bundle fuzzer's worker process and its outside-read detectors (``scripts/fuzz_bundles.py`` runs them).

A worker runs CLI calls in-process (a case costs milliseconds, not an interpreter start), one job at a
time over a socket; a worker that dies by a signal or outlives the timeout is recorded and replaced.
Three detectors see a file outside the bundle opened, each where the others are blind:
- a Python audit hook on ``open`` in the worker (Python's own opens, with the path as given);
- the parent scanning the worker's ``/proc/<pid>/fd`` (every descriptor's target) and ``/proc/<pid>/maps``
  (a mapping of the canary's inode, which also sees a hard link to it) while each command runs: native
  opens by onnxruntime or tokenizers, as long as they stay open for a scan;
- on a sample of cases, a worker under ``strace -f -e trace=open,openat,openat2 -y``: every open of every
  thread, with the resolved path of the descriptor it returned (``/proc/self/fd/N/x`` shows as the file
  it reached). The worker opens a marker name (``/dd-fuzz-mark/<job>``, which fails) before each job, so
  the log's lines are attributed to the job after the last marker.
Outside: the canary, ``/etc/passwd``, or anything under the fuzzer's work folder that is not in the
case's bundle folder (its ``.<name>.reading`` and ``.<name>.lock`` siblings are the runtime's locks, and
in a race an export's ``.<name>.tmp-*``/``.<name>.old-*`` hold one of the two whole bundles).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

MARK = "/dd-fuzz-mark/"
STRACE = "/usr/bin/strace"


class Judge:
    """Whether a path is outside the case's bundle (see the module docstring)."""

    def __init__(self, root: str, canary: str):
        self.root, self.canary = os.path.realpath(root), canary

    def outside(self, path: str, bundle: str, race: bool = False) -> bool:
        path = path.removesuffix(" (deleted)")
        if path in (self.canary, "/etc/passwd"):
            return True
        if not path.startswith(self.root + os.sep):
            return False
        if path == bundle or path.startswith(bundle + os.sep):
            return False
        parent, name = os.path.split(bundle)
        rel = os.path.relpath(path, parent).split(os.sep)
        siblings = (f".{name}.reading", f".{name}.lock")
        return not (rel[0] in siblings or race and rel[0].startswith((f".{name}.tmp-", f".{name}.old-")))


def worker_main(fd: int, root: str, canary: str) -> None:
    """Runs CLI calls in this process; answers each job with (outcome, detail, tokens)."""
    import json
    import logging

    from typer.testing import CliRunner

    from dipdeploy.cli import app

    logging.disable(logging.CRITICAL)
    conn = Connection(fd)
    judge, state = Judge(root, canary), {"bundle": None, "race": False, "outside": None, "json": None}

    def audit(event, args):
        if event == "open" and state["bundle"] is not None and args and isinstance(args[0], (str, bytes, os.PathLike)):
            p = os.fsdecode(args[0])
            if p and not p.startswith(MARK) and p != state["json"]:
                real = os.path.realpath(p)
                if judge.outside(real, state["bundle"], state["race"]):
                    state["outside"] = real

    sys.addaudithook(audit)
    runner = CliRunner()
    conn.send(("ready", os.getpid()))
    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            os.close(os.open(f"{MARK}{job['id']}", os.O_RDONLY))
        except OSError:
            pass
        state.update(bundle=os.path.realpath(job["bundle"]), race=job.get("race", False), outside=None,
                     json=job.get("json"))
        res = runner.invoke(app, job["argv"])
        state["bundle"] = None
        tb = res.exception is not None and not isinstance(res.exception, SystemExit)
        outcome = "outside" if state["outside"] else "traceback" if tb else f"rc{res.exit_code}"
        detail = state["outside"] or (repr(res.exception)[:300] if tb else " ".join(res.output.strip().splitlines()[-1:])[:300])
        tokens = None
        if outcome == "rc0" and job.get("json"):
            try:
                tokens = json.loads(Path(job["json"]).read_text())["tokens"]
            except (OSError, ValueError, KeyError):
                tokens = "unreadable --json"
        conn.send((outcome, detail, tokens))


class Worker:
    """One worker process (under strace when ``log`` is given), restarted after a crash or a hang."""

    def __init__(self, root: Path, canary: Path, log: Path | None = None):
        self.root, self.canary, self.log, self.logs, self.proc = root, canary, log, [], None
        self.judge = Judge(str(root), str(canary))

    def _start(self) -> None:
        import dipdeploy

        ours, theirs = socket.socketpair()
        cmd = [sys.executable, "-m", __name__, str(theirs.fileno()), str(self.root), str(self.canary)]
        if self.log is not None:
            log = self.log.with_name(f"{self.log.stem}-{len(self.logs)}.log")
            self.logs.append(log)
            cmd = [STRACE, "-f", "-qq", "-y", "-s", "512", "--seccomp-bpf", "-e", "trace=open,openat,openat2",
                   "-o", str(log), "--"] + cmd
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(Path(dipdeploy.__file__).parents[1])] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
        self.proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.conn = Connection(os.dup(ours.fileno()))
        ours.close()
        if not self.conn.poll(120):
            raise RuntimeError("the fuzz worker did not start")
        _, self.pid = self.conn.recv()

    def _stop(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)  # the session this worker leads: it and strace, nothing else
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.conn.close()
        self.proc = None

    def held(self) -> set:
        """(descriptor, target) of every file the worker holds open now."""
        out = set()
        try:
            for fd in os.listdir(f"/proc/{self.pid}/fd"):
                try:
                    out.add((fd, os.readlink(f"/proc/{self.pid}/fd/{fd}")))
                except OSError:
                    pass
        except OSError:
            pass
        return out

    def scan(self, bundle: str, race: bool, ino: int | None, maps: bool, before: set) -> str | None:
        """An outside file the worker holds open or mapped now and did not hold when the job was sent
        (``before``: a descriptor an earlier command left open is that command's), None: none seen."""
        base = f"/proc/{self.pid}"
        try:
            for fd, target in self.held() - before:
                if target.startswith("/") and self.judge.outside(target, bundle, race):
                    return target
            if maps and ino is not None:
                with open(f"{base}/maps") as f:
                    for line in f:
                        parts = line.split(None, 5)
                        if len(parts) >= 5 and parts[4] == str(ino):
                            return f"canary inode {ino} mapped as {parts[5].strip() if len(parts) > 5 else '?'}"
        except OSError:
            pass
        return None

    def call(self, job: dict, timeout: float, ino: int | None, during=None):
        """(outcome, detail, tokens, watched): ``watched`` is what the /proc scan saw."""
        if self.proc is None:
            self._start()
        before = self.held()
        self.conn.send(job)
        if during is not None:
            during.start()
        deadline, seen, tick = time.monotonic() + timeout, None, 0
        bundle = os.path.realpath(job["bundle"])
        while True:
            if self.conn.poll(0.01):
                try:
                    outcome, detail, tokens = self.conn.recv()
                except (EOFError, OSError):
                    pass
                else:
                    return outcome, detail, tokens, seen or self.scan(bundle, job.get("race", False), ino, True, before)
            if seen is None:
                seen = self.scan(bundle, job.get("race", False), ino, tick % 2 == 0, before)
            tick += 1
            code = self.proc.poll()
            if code is not None:
                self._stop()
                return "crash", f"worker exit code {code}", None, seen
            if time.monotonic() > deadline:
                self._stop()
                return "hang", f"over {timeout} s", None, seen

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.conn.send(None)
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._stop()


_OPEN = re.compile(r"open(?:at2?)?\(|<\.\.\. open(?:at2?)? resumed>")
_RESULT = re.compile(r"= (\d+)<(.*)>$")


def strace_outside(logs: list[Path], judge: Judge, jobs: dict) -> dict:
    """{job id: the first outside path its worker opened}, from the strace logs (``jobs``: job id →
    the job, for its bundle and race flag)."""
    found: dict = {}
    for log in logs:
        current = None
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if MARK in line:
                m = re.search(re.escape(MARK) + r"(\d+)", line)
                current = int(m.group(1)) if m else current
                continue
            if current is None or current in found or not _OPEN.search(line):
                continue
            r = _RESULT.search(line.rstrip())
            job = jobs.get(current)
            if r and job is not None and judge.outside(r.group(2), os.path.realpath(job["bundle"]),
                                                        job.get("race", False)):
                found[current] = r.group(2)
    return found


if __name__ == "__main__":
    worker_main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
