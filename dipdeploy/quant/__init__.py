"""Weight quantisation in the sparse row layout (floor 2, numpy only): BQ4, VQ3 and the RTN3 baseline.

DIP reads only selected rows (docs/method.md, Flash layout), so every format keeps each row self-contained:
``quantize(rows, cfg)`` packs a row matrix [R, C]; ``dequantize_rows(packed, idx)`` decodes any subset
of rows — the reference the ONNX ops and native kernels implement. Each packed layout is documented in
its module: ``block`` (BQ4, RTN3), ``vq`` (VQ3), bit order in ``bits``. The torch fake-quant path for
whole Hugging Face models is ``dipdeploy.quant.fake`` (imports torch; not imported here).
"""

from dipdeploy.quant.api import dequantize_rows, fake_quantize, quantize
from dipdeploy.quant.block import BlockQuantTensor
from dipdeploy.quant import gptq as _gptq  # noqa: F401  (registers the error-feedback quantisers)
from dipdeploy.quant.config import (
    QUANT_PRESETS,
    Block4QuantConfig,
    RTN3QuantConfig,
    VQ3QuantConfig,
    config_from_dict,
    config_to_dict,
    quant_config_from_name,
)
from dipdeploy.quant.layout import mlp_to_rows, rows_to_mlp
from dipdeploy.quant.vq import VQTensor

__all__ = [
    "QUANT_PRESETS",
    "Block4QuantConfig",
    "BlockQuantTensor",
    "RTN3QuantConfig",
    "VQ3QuantConfig",
    "VQTensor",
    "config_from_dict",
    "config_to_dict",
    "dequantize_rows",
    "fake_quantize",
    "mlp_to_rows",
    "quant_config_from_name",
    "quantize",
    "rows_to_mlp",
]
