// ONNX Runtime glue of the dipdeploy ops: the op declarations (inputs, outputs, their types and
// characteristics), the OrtCustomOp wrappers built from them, and the registration. The contract is
// custom_ops/README.md.
//
// Written against the plain C API (OrtCustomOp) rather than the lite C++ wrapper: the lite wrapper
// dereferences a null OrtValue for an absent optional input that precedes a present one (our K/C
// inputs) and builds every variadic input with the first input's dtype, so it could neither keep the
// contract's optional inputs nor reject a wrong dtype with an error. No exception crosses the glue's
// boundary: every failure is an OrtStatus naming the op, the input and the fix.
#include "ort/ops.h"

#include <cstring>

namespace {

using namespace dd_ort;

struct dd_op_decl {
    const char * name;
    size_t n_inputs;
    ONNXTensorElementDataType in_types[6];
    OrtCustomOpInputOutputCharacteristic in_chars[6];
    size_t n_outputs;
    ONNXTensorElementDataType out_types[3];
    OrtStatusPtr (ORT_API_CALL * create)(const OrtCustomOp *, const OrtApi *, const OrtKernelInfo *, void **);
    OrtStatusPtr (ORT_API_CALL * compute)(void *, OrtKernelContext *);
    void (ORT_API_CALL * destroy)(void *);
};

struct dd_op : OrtCustomOp {
    const dd_op_decl * decl;
};

const dd_op_decl * dd_decl_of(const OrtCustomOp * op) {
    return static_cast<const dd_op *>(op)->decl;
}

void dd_op_init(dd_op * op, const dd_op_decl * decl) {
    std::memset(static_cast<OrtCustomOp *>(op), 0, sizeof(OrtCustomOp));
    op->decl = decl;
    op->version = ORT_API_VERSION;
    op->GetName = [](const OrtCustomOp * o) { return dd_decl_of(o)->name; };
    op->GetExecutionProviderType = [](const OrtCustomOp *) -> const char * { return "CPUExecutionProvider"; };
    op->GetInputType = [](const OrtCustomOp * o, size_t i) { return dd_decl_of(o)->in_types[i]; };
    op->GetInputTypeCount = [](const OrtCustomOp * o) { return dd_decl_of(o)->n_inputs; };
    op->GetOutputType = [](const OrtCustomOp * o, size_t i) { return dd_decl_of(o)->out_types[i]; };
    op->GetOutputTypeCount = [](const OrtCustomOp * o) { return dd_decl_of(o)->n_outputs; };
    op->KernelDestroy = decl->destroy;
    op->GetInputCharacteristic = [](const OrtCustomOp * o, size_t i) { return dd_decl_of(o)->in_chars[i]; };
    op->GetOutputCharacteristic = [](const OrtCustomOp *, size_t) { return INPUT_OUTPUT_REQUIRED; };
    op->GetInputMemoryType = [](const OrtCustomOp *, size_t) { return OrtMemTypeDefault; };
    op->GetVariadicInputMinArity = [](const OrtCustomOp *) { return 1; };
    op->GetVariadicInputHomogeneity = [](const OrtCustomOp *) { return 0; };
    op->GetVariadicOutputMinArity = [](const OrtCustomOp *) { return 1; };
    op->GetVariadicOutputHomogeneity = [](const OrtCustomOp *) { return 1; };
    op->CreateKernelV2 = decl->create;
    op->KernelComputeV2 = decl->compute;
    op->GetStartVersion = [](const OrtCustomOp *) { return 1; };
    op->GetEndVersion = [](const OrtCustomOp *) { return 1; };
}

const dd_op_decl dd_topk_decl = {
    "TopKColumnMask", 4,
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL,
     ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT},
    {INPUT_OUTPUT_REQUIRED, INPUT_OUTPUT_OPTIONAL, INPUT_OUTPUT_OPTIONAL, INPUT_OUTPUT_OPTIONAL},
    1, {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64}, dd_topk_create, dd_topk_compute,
    [](void * k) { delete static_cast<dd_topk_kernel *>(k); },
};

const dd_op_decl dd_sgmm_decl = {
    "SparseGatherMatMul", 4,
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64,
     ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED},
    {INPUT_OUTPUT_REQUIRED, INPUT_OUTPUT_REQUIRED, INPUT_OUTPUT_OPTIONAL, INPUT_OUTPUT_VARIADIC},
    1, {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT}, dd_sgmm_create, dd_sgmm_compute,
    [](void * k) { delete static_cast<dd_sgmm_kernel *>(k); },
};

const dd_op_decl dd_cstep_decl = {
    "CacheStep", 2,
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64},
    {INPUT_OUTPUT_REQUIRED, INPUT_OUTPUT_REQUIRED},
    1, {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64}, dd_cache_op_create, dd_cstep_compute,
    [](void * k) { delete static_cast<dd_cache_op_kernel *>(k); },
};

const dd_op_decl dd_csettle_decl = {
    "CacheSettle", 2,
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64},
    {INPUT_OUTPUT_REQUIRED, INPUT_OUTPUT_REQUIRED},
    1, {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT}, dd_cache_op_create, dd_csettle_compute,
    [](void * k) { delete static_cast<dd_cache_op_kernel *>(k); },
};

const dd_op_decl dd_cbegin_decl = {
    "CacheBegin", 2,
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64},
    {INPUT_OUTPUT_REQUIRED, INPUT_OUTPUT_REQUIRED},
    2, {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64}, dd_cache_op_create, dd_cbegin_compute,
    [](void * k) { delete static_cast<dd_cache_op_kernel *>(k); },
};

const dd_op_decl dd_cend_decl = {
    "CacheEnd", 2,
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64},
    {INPUT_OUTPUT_REQUIRED, INPUT_OUTPUT_REQUIRED},
    3, {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64},
    dd_cache_op_create, dd_cend_compute,
    [](void * k) { delete static_cast<dd_cache_op_kernel *>(k); },
};

const dd_op_decl dd_cprefetch_decl = {
    "CachePrefetch", 6,
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
     ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT},
    {INPUT_OUTPUT_REQUIRED, INPUT_OUTPUT_REQUIRED, INPUT_OUTPUT_REQUIRED, INPUT_OUTPUT_REQUIRED, INPUT_OUTPUT_REQUIRED,
     INPUT_OUTPUT_OPTIONAL},
    1, {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT}, dd_prefetch_create, dd_prefetch_compute,
    [](void * k) { delete static_cast<dd_topk_kernel *>(k); },
};

// The op objects must outlive every session that uses them, so they live for the whole process
// (built once, immutable afterwards).
struct dd_ops {
    dd_op topk, sgmm, cstep, csettle, cbegin, cend, cprefetch;
    dd_ops() {
        dd_op_init(&topk, &dd_topk_decl);
        dd_op_init(&sgmm, &dd_sgmm_decl);
        dd_op_init(&cstep, &dd_cstep_decl);
        dd_op_init(&csettle, &dd_csettle_decl);
        dd_op_init(&cbegin, &dd_cbegin_decl);
        dd_op_init(&cend, &dd_cend_decl);
        dd_op_init(&cprefetch, &dd_cprefetch_decl);
    }
};

const dd_ops & dd_ops_get() {
    static const dd_ops ops;
    return ops;
}

}  // namespace

extern "C" {

// Entry point ORT calls from SessionOptions.register_custom_ops_library(path).
__attribute__((visibility("default"))) OrtStatus * ORT_API_CALL RegisterCustomOps(OrtSessionOptions * options,
                                                                                   const OrtApiBase * api_base) {
    const OrtApi * api = api_base->GetApi(ORT_API_VERSION);
    if (api == nullptr) {
        const OrtApi * old = api_base->GetApi(1);
        return old ? old->CreateStatus(ORT_FAIL, "dipdeploy ops need onnxruntime >= 1.29 (built against API 29)")
                   : nullptr;
    }
    const dd_ops & ops = dd_ops_get();
    OrtCustomOpDomain * domain = nullptr;
    DD_TRY(api->CreateCustomOpDomain(DD_DOMAIN, &domain));
    // The domain is handed to the session options and must outlive the sessions built from them;
    // ORT does not take ownership, so it is intentionally never released (one small object per call).
    DD_TRY(api->CustomOpDomain_Add(domain, const_cast<dd_op *>(&ops.topk)));
    DD_TRY(api->CustomOpDomain_Add(domain, const_cast<dd_op *>(&ops.sgmm)));
    DD_TRY(api->CustomOpDomain_Add(domain, const_cast<dd_op *>(&ops.cstep)));
    DD_TRY(api->CustomOpDomain_Add(domain, const_cast<dd_op *>(&ops.csettle)));
    DD_TRY(api->CustomOpDomain_Add(domain, const_cast<dd_op *>(&ops.cbegin)));
    DD_TRY(api->CustomOpDomain_Add(domain, const_cast<dd_op *>(&ops.cend)));
    DD_TRY(api->CustomOpDomain_Add(domain, const_cast<dd_op *>(&ops.cprefetch)));
    return api->AddCustomOpDomain(options, domain);
}

// For diagnostics (dipdeploy build-ops prints it): which kernel set this CPU runs.
__attribute__((visibility("default"))) const char * dd_ops_isa(void) {
    return dd_kernels_isa();
}
}
