"""The wheel carries the native op library, so an installed dipdeploy runs bundles on its own kernels.

Why: a bundle's MLPs are our custom ops; without the library, onnxruntime runs their fallback functions,
several times slower and holding far more memory than the plan (docs/decisions/0007-op-library-in-the-wheel.md).
A wheel user has no checkout to run ``make ops`` in, and the copy a bundle ships is code that
dipdeploy never trusts on the bundle's word (docs/design.md, "The op library in a bundle"). So the wheel
built from a checkout takes the library that ``make ops`` built (``build/custom_ops/<arch>/``), building
it first when it is missing and the checkout can (``custom_ops/build.sh``: g++, CMake, npm for the ORT
headers; ``DIPDEPLOY_BUILD_OPS=0`` skips that), into ``dipdeploy/ops/lib/<arch>/``, where
``dipdeploy.ops.native.library_path`` finds it. A wheel holding it is tagged for the platform
(``py3-none-<platform>``: the library uses no Python ABI, and picks its kernel set at run time); without
it the wheel stays pure and the runtime says, in one line, how to get the library.
Everything else is in pyproject.toml.
"""

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# Where the library is built and kept is defined once, in dipdeploy/ops/native.py (standard library only),
# loaded here from its file: the package itself cannot be imported before its dependencies are installed.
_spec = importlib.util.spec_from_file_location("_dipdeploy_native", ROOT / "dipdeploy" / "ops" / "native.py")
native = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native)


def _built_library() -> Path | None:
    """The library ``make ops`` built for this machine, building it first if the checkout can."""
    lib = native.built_library()
    if not lib.is_file() and native.BUILD_SCRIPT.is_file() and os.environ.get("DIPDEPLOY_BUILD_OPS", "1") != "0":
        try:
            native.build_ops()
        except RuntimeError as err:
            print(f"dipdeploy: the op library did not build ({err}); the wheel is pure, and bundles run on the "
                  "ONNX fallback functions", file=sys.stderr)
    return lib if lib.is_file() else None


class BuildPyWithLibrary(build_py):
    """build_py, plus the op library into ``dipdeploy/ops/lib/<arch>/`` of the built package (a wheel's
    build only: an editable install finds ``build/custom_ops/`` in the checkout itself)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        lib = native.built_library()  # LibraryDistribution built it if it could
        if lib.is_file():
            packaged = native.packaged_library().relative_to(ROOT)  # dipdeploy/ops/lib/<arch>/<name>
            target = Path(self.build_lib) / packaged
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib, target)


class PlatformWheel(bdist_wheel):
    """A wheel that holds the library is for this platform and any Python 3 (the tag ``py3-none-<platform>``)."""

    def get_tag(self):
        python, abi, plat = super().get_tag()
        return ("py3", "none", plat) if not self.root_is_pure else (python, abi, plat)


class LibraryDistribution(Distribution):
    """Says it holds a binary when the library is there (built now if it can be), so setuptools builds into
    the platform's folder and the wheel is not pure; the question is asked before any build command runs,
    so the tag and the contents agree."""

    def has_ext_modules(self):
        if not hasattr(self, "_dd_library"):
            self._dd_library = _built_library() if "bdist_wheel" in self.commands else None
        return self._dd_library is not None


setup(distclass=LibraryDistribution, cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel})
