"""Where the native op library is, and how to build it. The one place Python finds the library.

Nothing here loads the library at import; ``session_options(native=True)`` registers it with ORT.
The build (``custom_ops/build.sh``, also ``make ops`` and ``dipdeploy build-ops``) writes
``build/custom_ops/<arch>/libdipdeploy_ops.so`` in the source tree; a wheel carries that build as
``dipdeploy/ops/lib/<arch>/libdipdeploy_ops.so`` (``setup.py``); ``$DIPDEPLOY_OPS_LIB`` overrides both
(a library built elsewhere). The copy a bundle ships is never loaded from here: it is code, trusted only
as one of these (docs/decisions/0007-op-library-in-the-wheel.md).
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ARCHES = ("x86_64", "aarch64")
LIB_NAME = "libdipdeploy_ops.so"
ENV_LIB = "DIPDEPLOY_OPS_LIB"
_SOURCE_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = _SOURCE_ROOT / "custom_ops" / "build.sh"


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _check_arch(arch: str) -> str:
    if arch not in ARCHES:
        raise ValueError(f"arch {arch!r} is not supported; choose one of {', '.join(ARCHES)}")
    return arch


def built_library(arch: str | None = None) -> Path:
    """Where the build writes the library for ``arch`` (default: this machine's); it may not exist."""
    return _SOURCE_ROOT / "build" / "custom_ops" / _check_arch(arch or host_arch()) / LIB_NAME


def packaged_library(arch: str | None = None) -> Path:
    """Where an installed wheel keeps the library for ``arch``; it exists only in a wheel built with it."""
    return Path(__file__).resolve().parent / "lib" / _check_arch(arch or host_arch()) / LIB_NAME


def library_path(arch: str | None = None) -> Path | None:
    """The native library for ``arch``: ``$DIPDEPLOY_OPS_LIB`` (for the host), else the checkout's build,
    else the wheel's copy; None when there is none."""
    if arch in (None, host_arch()) and os.environ.get(ENV_LIB):
        path = Path(os.environ[ENV_LIB])
        if not path.is_file():
            raise FileNotFoundError(f"${ENV_LIB}={path} does not exist; unset it, or point it at a "
                                    f"{LIB_NAME} that `dipdeploy build-ops` built")
        return path
    for path in (built_library(arch), packaged_library(arch)):
        if path.is_file():
            return path
    return None


def missing_library_hint() -> str:
    """What a user without the library can do, for where this dipdeploy came from (a checkout or a wheel)."""
    if BUILD_SCRIPT.is_file():
        return "`make ops` (or `dipdeploy build-ops`) builds it"
    return (f"this installed dipdeploy has none for {host_arch()}: install a wheel built with it (one built "
            f"from a checkout after `make ops`), or set ${ENV_LIB} to a {LIB_NAME} built from a checkout")


def known_library_hashes() -> frozenset[str]:
    """The sha256 of every op library this dipdeploy would load or has built: ``$DIPDEPLOY_OPS_LIB``,
    ``build/custom_ops/<arch>/`` and the wheel's ``lib/<arch>/`` for each arch. A bundle's copy of the library is code that
    onnxruntime-genai runs, so ``inspect --verify`` trusts it only when it is one of these, never on the
    word of the bundle's own manifest; dipdeploy itself loads only :func:`library_path`."""
    from dipdeploy.bundle.manifest import file_record

    paths = [where(arch) for arch in ARCHES for where in (built_library, packaged_library)]
    if os.environ.get(ENV_LIB):
        paths.append(Path(os.environ[ENV_LIB]))
    return frozenset(file_record(path)["sha256"] for path in paths if path.is_file())


def kernel_set(path: Path | None = None) -> str | None:
    """The kernel set the native library picks on this CPU (``avx512vnni``, ``avx2``, ``neon-dotprod``,
    ``neon``, ``portable``), or None when no library is built."""
    import ctypes

    path = path or library_path()
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    lib.dd_ops_isa.restype = ctypes.c_char_p
    return lib.dd_ops_isa().decode()


def require_library(arch: str | None = None) -> Path:
    """Like :func:`library_path` but raises a clear error naming the fix when the library is absent."""
    path = library_path(arch)
    if path is None:
        raise FileNotFoundError(f"the dipdeploy custom-op library is not built ({built_library(arch)} is "
                                f"missing): {missing_library_hint()}")
    return path


def build_ops(arch: str | None = None, force: bool = False) -> Path:
    """Build the library with ``custom_ops/build.sh`` (fetches the ORT headers once); returns its path."""
    arch = _check_arch(arch or host_arch())
    if not BUILD_SCRIPT.is_file():
        raise FileNotFoundError(f"{BUILD_SCRIPT} not found: building needs a source checkout of dipdeploy "
                                f"(git clone, then `make ops`); {missing_library_hint()}")
    cmd = ["bash", str(BUILD_SCRIPT), "--arch", arch] + (["--force"] if force else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building the ops failed ({' '.join(cmd)}):\n{done.stderr.strip()}")
    return built_library(arch)


def session_options(threads: int = 1, native: bool = True):
    """ORT SessionOptions with ``threads`` intra-op threads and, if ``native``, the op library registered.

    Without the library, ORT inlines the fallback functions each model carries (stock ORT path).
    """
    import onnxruntime as ort

    if threads < 1:
        raise ValueError(f"threads={threads} must be >= 1")
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if native:
        so.register_custom_ops_library(str(require_library()))
    return so
