"""dipdeploy: Dynamic Input Pruning (DIP, DIP-CA; arXiv 2412.01380) for gated-MLP (SwiGLU, GeGLU) LLMs, deployed with ONNX Runtime.

Importing the package has no side effects: no torch import, no native library load, no file access.
Each stage lives in its own module (the floors of ``docs/design.md``):
registry · cache · quant (floor 1) → loading · sparsity · ops (floor 2) → eval · export · finetune · sim
(floor 3) → runtime (floor 4) → cli · demo (floor 5).
"""

__version__ = "0.1.0"
