"""``python benchmarks/<name>.py`` puts benchmarks/ first on the import path, so a script named like an
installed package shadows it for everything that script imports: a ``benchmarks/kernels.py`` broke every
benchmark that loads a transformers model once transformers began importing the PyPI package ``kernels``."""

import importlib.metadata
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_no_benchmark_script_shadows_an_installed_or_standard_module():
    taken = set(importlib.metadata.packages_distributions()) | set(sys.stdlib_module_names)
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")}
    assert scripts, "no benchmark scripts found"
    assert not scripts & taken, f"rename these benchmarks/ scripts: {sorted(scripts & taken)}"
