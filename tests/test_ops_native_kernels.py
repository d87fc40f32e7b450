"""The C++ kernel test (custom_ops/tests/dd_test_kernels.cc), built by `make ops` beside the library.

It checks every SparseGatherMatMul kernel set against an independent double-precision decode and the
TopK row kernel against a stable sort, without ONNX Runtime: on this machine's best set, on the
portable set, and on aarch64 (the NEON set and the ARMv8.2 dot-product set) under qemu-aarch64 when the
cross build and qemu exist.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from dipdeploy.ops.native import built_library, host_arch


def kernel_test(arch: str):
    return built_library(arch).parent / "dd_test_kernels"


def run(cmd: list[str], env: dict | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]
    assert done.stdout.strip().endswith("all ok")
    return done.stdout


@pytest.mark.parametrize("isa", ["best", "portable"])
def test_host_kernels(isa: str) -> None:
    exe = kernel_test(host_arch())
    if not exe.is_file():
        pytest.skip(f"{exe} not built (run `make ops`)")
    env = dict(os.environ, DIPDEPLOY_OPS_ISA=isa)
    out = run([str(exe)], env)
    if isa == "portable":
        assert "kernel set: portable" in out


def test_aarch64_kernels_under_qemu() -> None:
    exe = kernel_test("aarch64")
    if host_arch() == "aarch64":
        pytest.skip("host is aarch64: test_host_kernels covers it")
    if not exe.is_file():
        pytest.skip(f"{exe} not built (needs aarch64-linux-gnu-g++, then `make ops`)")
    qemu = shutil.which("qemu-aarch64")
    if qemu is None:
        pytest.skip("qemu-aarch64 not installed (apt-get install qemu-user)")
    # qemu's default CPU ("max") has the dot-product extension; Cortex-A72 (ARMv8.0, Raspberry Pi 4)
    # does not, and $DIPDEPLOY_OPS_ISA=portable caps at the baseline NEON set.
    assert "kernel set: neon-dotprod" in run([qemu, str(exe)])
    assert "kernel set: neon\n" in run([qemu, "-cpu", "cortex-a72", str(exe)])
    assert "kernel set: neon\n" in run([qemu, str(exe)], dict(os.environ, DIPDEPLOY_OPS_ISA="portable"))
