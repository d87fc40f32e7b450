"""The graph builders import no torch (the bundle reader, ``dipdeploy.bundle``, is held to it by
test_lean_import.py)."""

import subprocess
import sys

TORCH_FREE = ["weights", "spec", "graph", "blocks", "mlp", "decoder", "layers", "config", "generate"]


def test_export_modules_are_torch_free():
    code = ("import sys\n" + "".join(f"import dipdeploy.export.{m}\n" for m in TORCH_FREE)
            + "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\nassert not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
