"""The machine a benchmark ran on, recorded in every file it writes: a figure without its machine and
its date cannot be compared with another.

The CPU's model name and core count come from ``lscpu`` (``/proc/cpuinfo`` where it is missing), the
instruction-set extensions the kernels choose among from its flags (only those: the whole list is noise),
the versions of Python, onnxruntime, numpy and dipdeploy, the op library's kernel set, the git revision of
the source tree (with ``+dirty`` when it differs from the commit), the load average, and the date in UTC.
Whatever cannot be read is recorded as unknown; nothing here fails a benchmark.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

#: the CPU flags that decide which kernels run (x86: AVX2/AVX-512/VNNI; ARM: dot product, i8mm, SVE)
FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
         "amx_tile", "asimd", "asimddp", "i8mm", "sve", "sve2")
UNKNOWN = "unknown"
_TIMEOUT = 10  # seconds for lscpu or git: a hung tool must not hang the benchmark


@dataclass(frozen=True)
class Machine:
    cpu: str
    cores: int
    threads_per_core: str
    hypervisor: str
    flags: str
    os: str
    python: str
    onnxruntime: str
    numpy: str
    dipdeploy: str
    kernel_set: str
    git: str
    load_1min: float
    date: str

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """One line naming the machine and the software, for the top of a markdown file."""
        virt = f", {self.hypervisor}" if self.hypervisor != UNKNOWN else ""
        return (f"{self.cpu} ({self.cores} cores{virt}; {self.flags or 'no listed flags'}), {self.os}, "
                f"Python {self.python}, onnxruntime {self.onnxruntime}, dipdeploy {self.dipdeploy} "
                f"(git {self.git}, kernels {self.kernel_set}), load {self.load_1min:g}, {self.date}")


def _run(*args: str, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=_TIMEOUT, cwd=cwd,
                              env={**os.environ, "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def lscpu() -> dict[str, str]:
    """``lscpu``'s fields by name (empty where it is missing)."""
    out = {}
    for line in _run("lscpu").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = " ".join(value.split())
    return out


def _cpuinfo() -> dict[str, str]:
    out = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() in ("model name", "flags", "Features") and key.strip() not in out:
                out[key.strip()] = " ".join(value.split())
    except OSError:
        pass
    return out


def flags_summary(flags: str) -> str:
    have = set(flags.split())
    return " ".join(f for f in FLAGS if f in have)


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return UNKNOWN


def git_revision(where: Path | None = None) -> str:
    """The short commit of the source tree holding this package, ``+dirty`` when tracked files differ;
    unknown outside a git checkout (an installed wheel)."""
    where = where or Path(__file__).resolve().parents[2]
    rev = _run("git", "rev-parse", "--short=12", "HEAD", cwd=where).strip()
    if not rev:
        return UNKNOWN
    dirty = _run("git", "status", "--porcelain", "--untracked-files=no", cwd=where).strip()
    return rev + ("+dirty" if dirty else "")


def _kernel_set() -> str:
    try:
        from dipdeploy.ops.native import kernel_set, library_path

        return (kernel_set() or UNKNOWN) if library_path() is not None else "none (ONNX fallback)"
    except Exception:  # noqa: BLE001  (a record, not a check: an unreadable library is recorded as unknown)
        return UNKNOWN


def load_now() -> float:
    """The 1-minute load average (NaN where the platform has none): recorded when a run starts and ends,
    since another process's work during a run changes its figures."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else float("nan")


def machine() -> Machine:
    cpu, info = lscpu(), _cpuinfo()
    from dipdeploy import __version__

    return Machine(
        cpu=cpu.get("Model name") or info.get("model name") or platform.processor() or UNKNOWN,
        cores=os.cpu_count() or 0,
        threads_per_core=cpu.get("Thread(s) per core", UNKNOWN),
        hypervisor=cpu.get("Hypervisor vendor", UNKNOWN),
        flags=flags_summary(cpu.get("Flags") or info.get("flags") or info.get("Features") or ""),
        os=f"{platform.system()} {platform.release()} {platform.machine()}",
        python=platform.python_version(),
        onnxruntime=_version("onnxruntime"),
        numpy=_version("numpy"),
        dipdeploy=__version__,
        kernel_set=_kernel_set(),
        git=git_revision(),
        load_1min=load_now(),
        date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
