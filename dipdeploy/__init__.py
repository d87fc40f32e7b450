"""dipdeploy: Dynamic Input Pruning (DIP, DIP-CA; arXiv 2412.01380) for gated-MLP (SwiGLU, GeGLU) LLMs, deployed with ONNX Runtime.

Importing the package has no side effects: no torch import, no native library load, no file access.
Each stage lives in its own module (the floors of ``docs/design.md``):
bundle · flash · data · arch · registry · defaults · paths · jsonout · trace (floor 1) → quant · cache (floor 2)
→ loading · sparsity · ops (floor 3) → eval · export · finetune · sim (floor 4) → runtime (floor 5) →
cli · demo (floor 6).
"""

__version__ = "0.1.0"
