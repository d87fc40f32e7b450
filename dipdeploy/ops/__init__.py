"""Custom ONNX ops of DIP / DIP-CA (floor 3, no torch): contract, fallbacks, references, native library.

The contract is written down in ``custom_ops/README.md``. Two ops in the domain ``ai.dipdeploy``
(version 1): ``TopKColumnMask`` (the DIP-CA top-K rule of ``dipdeploy.cache.score``) and
``SparseGatherMatMul`` (Y = Σ over selected rows of x·W[row], for fp32, fp16, BQ4 and VQ3 weights).

Modules, one job each:

- ``schemas``   domain, version, op names; ``register_schemas()`` for onnx/onnxscript (lazy, idempotent)
- ``formats``   the weight formats SparseGatherMatMul accepts (inputs, dtypes, shapes)
- ``reference`` numpy references (they call ``dipca_scores``/``topk_indices`` and ``dipdeploy.quant``)
- ``fallback``  model-local ONNX functions made of standard ops, so stock ORT runs every model
- ``nodes``     node builders and ``make_op_model`` (one op node + its function), shared by tests,
                benchmarks and the exporter
- ``native``    where the built native library is, and how to build it

Importing this package loads no native library and registers nothing.
"""

from dipdeploy.ops.schemas import DOMAIN, OPSET_VERSION, SGMM_OP, TOPK_OP

__all__ = ["DOMAIN", "OPSET_VERSION", "SGMM_OP", "TOPK_OP"]
