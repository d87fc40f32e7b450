"""`import dipdeploy` and the torch-free floors must not import torch (architecture.md)."""

import subprocess
import sys


def test_floors_import_without_torch():
    code = ("import sys, dipdeploy, dipdeploy.registry, dipdeploy.cache, dipdeploy.paths, dipdeploy.sparsity.plan; "
            "bad = [m for m in ('torch', 'transformers', 'onnxruntime') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
