"""The fuzzer's outside-read detectors (``dipdeploy.devtools.fuzzwatch``) see what a Python audit hook cannot: a
file opened by native code (libc's ``open``, as onnxruntime or tokenizers would), in the strace log
and in a scan of the process's ``/proc`` descriptors; and they leave the bundle's own files and locks alone."""

import os
import subprocess
import sys

import pytest

from dipdeploy.devtools import fuzzwatch

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
    judge = fuzzwatch.Judge(str(work), str(work / "canary.bin"))
    bundle = str(work / "case0")
    assert judge.outside(str(work / "canary.bin"), bundle)
    assert judge.outside("/etc/passwd", bundle)
    assert judge.outside(str(work / "case1" / "mlp.bin"), bundle)
    assert judge.outside(str(work / ".case0.tmp-1" / "mlp.bin"), bundle)
    assert not judge.outside(str(work / ".case0.tmp-1" / "mlp.bin"), bundle, race=True)
    assert not judge.outside(str(work / "case0" / "mlp.bin"), bundle)
    assert not judge.outside(str(work / ".case0.reading"), bundle)
    assert not judge.outside("/usr/lib/libc.so.6", bundle)


@pytest.mark.skipif(not os.access(fuzzwatch.STRACE, os.X_OK), reason="strace is not installed")
def test_strace_sees_a_native_open(work):
    log = work.parent / f"{work.name}-strace.log"
    canary = work / "canary.bin"
    subprocess.run([fuzzwatch.STRACE, "-f", "-qq", "-y", "-s", "512", "-e", "trace=open,openat,openat2", "-o",
                    str(log), sys.executable, "-c", NATIVE_OPEN, str(canary), "0"], check=True, capture_output=True)
    judge = fuzzwatch.Judge(str(work), str(canary))
    jobs = {7: {"bundle": str(work / "case0")}}
    assert fuzzwatch.strace_outside([log], judge, jobs) == {7: str(canary)}
    # the same open, by a job whose bundle folder holds that file, is none
    jobs = {7: {"bundle": str(work)}}
    assert fuzzwatch.strace_outside([log], fuzzwatch.Judge(str(work.parent), str(work / "elsewhere")), jobs) == {}


def test_proc_scan_sees_a_native_open(work):
    canary = work / "canary.bin"
    child = subprocess.Popen([sys.executable, "-c", NATIVE_OPEN, str(canary), "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert int(child.stdout.readline()) >= 0
        w = fuzzwatch.Worker(work, canary)
        w.pid = child.pid
        bundle = str(work / "case0")
        assert w.scan(bundle, False, None, False, set()) == str(canary)
        assert w.scan(bundle, False, None, False, w.held()) is None  # held before the job: not this job's
    finally:
        child.kill()
        child.wait()
