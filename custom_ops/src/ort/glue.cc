// The ORT glue's shared helpers (glue.h): the error status, input views and their checks, attributes.
#include "ort/glue.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

namespace dd_ort {

OrtStatus * dd_error(const OrtApi * api, OrtErrorCode code, const char * fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return api->CreateStatus(code, msg);
}

const char * dd_type_name(ONNXTensorElementDataType t) {
    switch (t) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
        default: return "another dtype";
    }
}

OrtStatus * dd_input(const OrtApi * api, OrtKernelContext * ctx, size_t i, dd_view * v) {
    size_t count = 0;
    DD_TRY(api->KernelContext_GetInputCount(ctx, &count));
    *v = dd_view{};
    if (i >= count) {
        return nullptr;
    }
    const OrtValue * value = nullptr;
    DD_TRY(api->KernelContext_GetInput(ctx, i, &value));
    if (value == nullptr) {
        return nullptr;
    }
    int is_tensor = 0;
    DD_TRY(api->IsTensor(value, &is_tensor));
    if (!is_tensor) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "input %zu is not a tensor", i);
    }
    OrtTensorTypeAndShapeInfo * info = nullptr;
    DD_TRY(api->GetTensorTypeAndShape(value, &info));
    OrtStatus * st = api->GetTensorElementType(info, &v->type);
    if (st == nullptr) {
        st = api->GetDimensionsCount(info, &v->rank);
    }
    if (st == nullptr && v->rank > (size_t) DD_MAX_RANK) {
        st = dd_error(api, ORT_INVALID_ARGUMENT, "input %zu has rank %zu (at most %d)", i, v->rank, DD_MAX_RANK);
    }
    if (st == nullptr) {
        st = api->GetDimensions(info, v->dims, v->rank);
    }
    api->ReleaseTensorTypeAndShapeInfo(info);
    DD_TRY(st);
    void * data = nullptr;
    DD_TRY(api->GetTensorMutableData(const_cast<OrtValue *>(value), &data));
    v->data = data;
    v->numel = 1;
    for (size_t d = 0; d < v->rank; ++d) {
        if (v->dims[d] < 0 || !dd_i64_mul(v->numel, v->dims[d], &v->numel)) {
            return dd_error(api, ORT_INVALID_ARGUMENT, "input %zu has a shape whose element count does not fit in int64", i);
        }
    }
    v->present = true;
    return nullptr;
}

OrtStatus * dd_expect(const OrtApi * api, const dd_view & v, const char * op, const char * what,
                      ONNXTensorElementDataType type, size_t rank) {
    if (!v.present) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: input '%s' is missing", op, what);
    }
    if (v.type != type) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: input '%s' must be %s, got %s", op, what,
                        dd_type_name(type), dd_type_name(v.type));
    }
    if (v.rank != rank) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: input '%s' must have rank %zu, got rank %zu", op, what,
                        rank, v.rank);
    }
    return nullptr;
}

OrtStatus * dd_check_range(const OrtApi * api, const char * op, const char * what, const int64_t * a, int64_t n,
                           int64_t hi) {
    for (int64_t i = 0; i < n; ++i) {
        if (a[i] < 0 || a[i] >= hi) {
            return dd_error(api, ORT_INVALID_ARGUMENT,
                            "%s: %s[%lld] = %lld is out of range [0, %lld); fix the indices fed to the op", op, what,
                            (long long) i, (long long) a[i], (long long) hi);
        }
    }
    return nullptr;
}

int64_t dd_attr_int(const OrtApi * api, const OrtKernelInfo * info, const char * name, int64_t dflt) {
    int64_t out = dflt;
    OrtStatus * st = api->KernelInfoGetAttribute_int64(info, name, &out);
    if (st != nullptr) {
        api->ReleaseStatus(st);
        out = dflt;
    }
    return out;
}

float dd_attr_float(const OrtApi * api, const OrtKernelInfo * info, const char * name, float dflt) {
    float out = dflt;
    OrtStatus * st = api->KernelInfoGetAttribute_float(info, name, &out);
    if (st != nullptr) {
        api->ReleaseStatus(st);
        out = dflt;
    }
    return out;
}

OrtStatus * dd_attr_string(const OrtApi * api, const OrtKernelInfo * info, const char * name, const char * dflt,
                           std::string * out) {
    size_t size = 0;
    OrtStatus * st = api->KernelInfoGetAttribute_string(info, name, nullptr, &size);
    if (st != nullptr) {
        api->ReleaseStatus(st);
        *out = dflt;
        return nullptr;
    }
    try {
        out->assign(size, '\0');
    } catch (const std::exception &) {
        return dd_error(api, ORT_FAIL, "out of memory reading string attribute '%s' (%zu bytes)", name, size);
    }
    DD_TRY(api->KernelInfoGetAttribute_string(info, name, &(*out)[0], &size));
    out->resize(size > 0 ? size - 1 : 0);  // ORT's size counts the terminating NUL
    return nullptr;
}

}  // namespace dd_ort
