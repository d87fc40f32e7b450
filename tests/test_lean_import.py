"""`import dipdeploy` and the torch-free floors must not import torch (docs/design.md)."""

import subprocess
import sys


def test_floors_import_without_torch():
    code = ("import sys, dipdeploy, dipdeploy.arch, dipdeploy.registry, dipdeploy.cache, dipdeploy.paths, dipdeploy.data, "
            "dipdeploy.flash, dipdeploy.bundle.manifest, dipdeploy.sparsity.plan; "
            "bad = [m for m in ('torch', 'transformers', 'onnxruntime') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_runtime_and_simulator_import_without_torch():
    """`dipdeploy run` must work on a board with numpy, onnxruntime and tokenizers only (no onnx either)."""
    code = ("import sys, dipdeploy.runtime, dipdeploy.runtime.chat, dipdeploy.runtime.engine, "
            "dipdeploy.runtime.positions, dipdeploy.runtime.backends.joined, dipdeploy.sim, dipdeploy.trace, "
            "dipdeploy.bundle.manifest, dipdeploy.bundle.names, dipdeploy.ops.native, dipdeploy.cli.run; "
            "from dipdeploy.runtime.template import ChatTemplate; "
            "assert ChatTemplate('{{ messages[0].content }}', {}).render([{'role': 'user', 'content': 'x'}]) == 'x'; "
            "bad = [m for m in ('torch', 'transformers', 'peft', 'onnx') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
