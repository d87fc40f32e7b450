"""The fuzzer's outside-read detectors (scripts/fuzz_watch.py) see what a Python audit hook cannot: a
file opened by native code (libc's ``open``, as onnxruntime or tokenizers would), in the strace log
and in a scan of the process's ``/proc`` descriptors; and they leave the bundle's own files and locks alone."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import fuzz_watch  # noqa: E402

NATIVE_OPEN = ("import ctypes, os, sys, time\n"
               "libc = ctypes.CDLL(None)\n"
               "try:\n    os.open('/dd-fuzz-mark/7', os.O_RDONLY)\nexcept OSError:\n    pass\n"
               "fd = libc.open(sys.argv[1].encode(), os.O_RDONLY)\n"
               "print(fd, flush=True)\n"
               "time.sleep(float(sys.argv[2]))\n")


@pytest.fixture
def work(tmp_path):
    (tmp_path / "case0").mkdir()
    (tmp_path / "case0" / "mlp.bin").write_bytes(b"x")
    (tmp_path / "canary.bin").write_bytes(b"CANARY")
    return tmp_path


def test_judge(work):
    judge = fuzz_watch.Judge(str(work), str(work / "canary.bin"))
    bundle = str(work / "case0")
    assert judge.outside(str(work / "canary.bin"), bundle)
    assert judge.outside("/etc/passwd", bundle)
    assert judge.outside(str(work / "case1" / "mlp.bin"), bundle)
    assert judge.outside(str(work / ".case0.tmp-1" / "mlp.bin"), bundle)
    assert not judge.outside(str(work / ".case0.tmp-1" / "mlp.bin"), bundle, race=True)
    assert not judge.outside(str(work / "case0" / "mlp.bin"), bundle)
    assert not judge.outside(str(work / ".case0.reading"), bundle)
    assert not judge.outside("/usr/lib/libc.so.6", bundle)


@pytest.mark.skipif(not os.access(fuzz_watch.STRACE, os.X_OK), reason="strace is not installed")
def test_strace_sees_a_native_open(work):
    log = work.parent / f"{work.name}-strace.log"
    canary = work / "canary.bin"
    subprocess.run([fuzz_watch.STRACE, "-f", "-qq", "-y", "-s", "512", "-e", "trace=open,openat,openat2", "-o",
                    str(log), sys.executable, "-c", NATIVE_OPEN, str(canary), "0"], check=True, capture_output=True)
    judge = fuzz_watch.Judge(str(work), str(canary))
    jobs = {7: {"bundle": str(work / "case0")}}
    assert fuzz_watch.strace_outside([log], judge, jobs) == {7: str(canary)}
    # the same open, by a job whose bundle folder holds that file, is none
    jobs = {7: {"bundle": str(work)}}
    assert fuzz_watch.strace_outside([log], fuzz_watch.Judge(str(work.parent), str(work / "elsewhere")), jobs) == {}


def test_proc_scan_sees_a_native_open(work):
    canary = work / "canary.bin"
    child = subprocess.Popen([sys.executable, "-c", NATIVE_OPEN, str(canary), "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert int(child.stdout.readline()) >= 0
        w = fuzz_watch.Worker(work, canary)
        w.pid = child.pid
        bundle = str(work / "case0")
        assert w.scan(bundle, False, None, False, set()) == str(canary)
        assert w.scan(bundle, False, None, False, w.held()) is None  # held before the job: not this job's
    finally:
        child.kill()
        child.wait()
