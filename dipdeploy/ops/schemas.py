"""The op declarations, in one place: domain, version, names, inputs, attributes.

``register_schemas()`` adds them to onnx's schema registry so onnx, onnxscript and the torch exporter
accept nodes of our domain. It runs only when called (importing dipdeploy registers nothing), and a
second call is a no-op. ONNX Runtime does not read this registry: without the native library it
inlines the model-local functions of ``fallback``; with it, the library declares its own kernels.
"""

from __future__ import annotations

DOMAIN = "ai.dipdeploy"
OPSET_VERSION = 1
#: The accuracy levels a bundle runs at: 0 (float32 arithmetic) and 4 (int8 activations and
#: coefficients). MatMulNBits also names 1–3 (fp32, fp16, bf16 compute), but SparseGatherMatMul has no
#: kernel for them and on CPU they compute as level 0, so export and the runtime refuse them rather than
#: run level 0 under another name.
BUNDLE_ACCURACY_LEVELS = (0, 4)
TOPK_OP = "TopKColumnMask"
SGMM_OP = "SparseGatherMatMul"
#: The cache ops of the joined decoder (``export.joined``; custom_ops/src/ort/): the host's cache step
#: as nodes. Only the native library has them (no fallback function), so a graph that uses them needs it.
CACHE_OPS = ("CacheStep", "CacheSettle", "CacheBegin", "CacheEnd", "CachePrefetch")
# The standard-op opset the fallback function bodies and the test models use.
ONNX_OPSET = 21
# IR 10 is the first with function overloads (one body per input variant, see ``fallback``).
IR_VERSION = 10

SCORES = ("abs", "wina")


def _topk_schema():
    from onnx.defs import OpSchema

    fp = OpSchema.FormalParameterOption
    return OpSchema(
        TOPK_OP,
        DOMAIN,
        OPSET_VERSION,
        doc="DIP / DIP-CA column selection: indices [N, k] of the k largest scores per row, "
        "largest first, ties to the lower index. See custom_ops/README.md.",
        inputs=[
            OpSchema.FormalParameter("X", "T", "activations [N, D]"),
            OpSchema.FormalParameter("K", "tensor(int64)", "k as a scalar or [1] (else attribute k)", param_option=fp.Optional),
            OpSchema.FormalParameter("C", "tensor(bool)", "cache residency [D] or [N, D]", param_option=fp.Optional),
            OpSchema.FormalParameter("colnorm", "T", "per-column norms [D] (score='wina')", param_option=fp.Optional),
        ],
        outputs=[OpSchema.FormalParameter("indices", "tensor(int64)", "[N, k]")],
        type_constraints=[("T", ["tensor(float)"], "activations")],
        attributes=[
            OpSchema.Attribute("k", OpSchema.AttrType.INT, "k when input K is absent", required=False),
            OpSchema.Attribute("gamma", OpSchema.AttrType.FLOAT, "weight of non-resident columns, in [0, 1]", required=False),
            OpSchema.Attribute("fixed_top_n", OpSchema.AttrType.INT, "top-n raw |x| exempt from re-weighting", required=False),
            OpSchema.Attribute("score", OpSchema.AttrType.STRING, "'abs' or 'wina'", required=False),
        ],
    )


def _sgmm_schema():
    from onnx.defs import OpSchema

    fp = OpSchema.FormalParameterOption
    return OpSchema(
        SGMM_OP,
        DOMAIN,
        OPSET_VERSION,
        doc="Y[n] = sum over j of X[n, indices[n, j]] * W[row(n, j), :], row = slots[n, j] when given "
        "(a slab of cached rows) else indices[n, j]. See custom_ops/README.md.",
        inputs=[
            OpSchema.FormalParameter("X", "T", "activations [N, D]"),
            OpSchema.FormalParameter("indices", "tensor(int64)", "selected columns of X [N, k]"),
            OpSchema.FormalParameter("slots", "tensor(int64)", "rows of W to use [N, k]", param_option=fp.Optional),
            OpSchema.FormalParameter(
                "weights", "V", "the weight arrays of the format", param_option=fp.Variadic, is_homogeneous=False
            ),
        ],
        outputs=[OpSchema.FormalParameter("Y", "T", "[N, O]")],
        type_constraints=[
            ("T", ["tensor(float)"], "activations"),
            ("V", ["tensor(float)", "tensor(float16)", "tensor(uint8)", "tensor(int8)"], "weight arrays"),
        ],
        attributes=[
            OpSchema.Attribute("format", OpSchema.AttrType.STRING, "fp32 | fp16 | bq4 | vq3", required=True),
            OpSchema.Attribute("cols", OpSchema.AttrType.INT, "output width O (quantised formats)", required=False),
            OpSchema.Attribute("group_rows", OpSchema.AttrType.INT, "VQ3 group height", required=False),
            OpSchema.Attribute("group_cols", OpSchema.AttrType.INT, "VQ3 group width (even)", required=False),
            OpSchema.Attribute("accuracy_level", OpSchema.AttrType.INT,
                               "0: float32; 4: int8 coefficients (bq4), as MatMulNBits' level 4", required=False),
        ],
    )


def register_schemas() -> None:
    """Declare both ops to onnx (idempotent). Needed by onnx shape inference, onnxscript, torch export."""
    import onnx.defs

    for make in (_topk_schema, _sgmm_schema):
        schema = make()
        if not onnx.defs.has(schema.name, schema.domain):
            onnx.defs.register_schema(schema)
