// What the ORT glue's files share (custom_ops/src/ort/): checked arithmetic, the error status, a view
// of one input tensor and its checks, attribute readers. The contract is custom_ops/README.md.
#pragma once

#include "onnxruntime_c_api.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace dd_ort {

constexpr const char * DD_DOMAIN = "ai.dipdeploy";
constexpr int DD_MAX_RANK = 8;

OrtStatus * dd_error(const OrtApi * api, OrtErrorCode code, const char * fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Checked int64 arithmetic where shapes and attributes combine: attributes come from the model file
// and dims from the caller, so a product of them may not fit in int64; this returns false instead of
// wrapping (signed overflow is undefined behaviour, and a wrapped size would let a short tensor pass a
// shape check).
inline bool dd_i64_mul(int64_t a, int64_t b, int64_t * out) {
    return !__builtin_mul_overflow(a, b, out);
}

// ceil(a / b) for a >= 0 and b >= 1, without forming a + b - 1 (which overflows for b near INT64_MAX).
inline int64_t dd_ceil_div(int64_t a, int64_t b) {
    return a / b + (a % b != 0);
}

#define DD_TRY(expr)                     \
    do {                                 \
        OrtStatus * dd_st_ = (expr);     \
        if (dd_st_ != nullptr) {         \
            return dd_st_;               \
        }                                \
    } while (0)

// A read-only view of one input tensor (no allocation beyond ORT's type-info object).
struct dd_view {
    bool present = false;
    ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    size_t rank = 0;
    int64_t dims[DD_MAX_RANK] = {};
    const void * data = nullptr;
    int64_t numel = 0;
};

const char * dd_type_name(ONNXTensorElementDataType t);

// Input i of the kernel context into *v (absent: v->present = false).
OrtStatus * dd_input(const OrtApi * api, OrtKernelContext * ctx, size_t i, dd_view * v);

// Checks dtype and rank; `what` names the input in the error ("SparseGatherMatMul input 'X'").
OrtStatus * dd_expect(const OrtApi * api, const dd_view & v, const char * op, const char * what,
                      ONNXTensorElementDataType type, size_t rank);

// Every a[i] in [0, hi), else an error naming `what`.
OrtStatus * dd_check_range(const OrtApi * api, const char * op, const char * what, const int64_t * a, int64_t n,
                           int64_t hi);

// Attribute readers: an absent attribute gives the default; the values are then validated by the caller.
int64_t dd_attr_int(const OrtApi * api, const OrtKernelInfo * info, const char * name, int64_t dflt);
float dd_attr_float(const OrtApi * api, const OrtKernelInfo * info, const char * name, float dflt);
// The whole value, whatever its length (asked for its size first), so the caller compares it exactly:
// a value read into a fixed buffer would be cut, or mistaken for an absent attribute.
OrtStatus * dd_attr_string(const OrtApi * api, const OrtKernelInfo * info, const char * name, const char * dflt,
                           std::string * out);

}  // namespace dd_ort
