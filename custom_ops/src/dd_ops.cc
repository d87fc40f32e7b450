// ONNX Runtime glue of the dipdeploy ops: op declarations, attribute parsing, input validation,
// threading, registration. The contract is custom_ops/README.md.
//
// Written against the plain C API (OrtCustomOp) rather than the lite C++ wrapper: the lite wrapper
// dereferences a null OrtValue for an absent optional input that precedes a present one (our K/C
// inputs) and builds every variadic input with the first input's dtype, so it could neither keep the
// contract's optional inputs nor reject a wrong dtype with an error. No exception crosses this file's
// boundary: every failure is an OrtStatus naming the op, the input and the fix.
#include "dd_cache.h"
#include "dd_kernels.h"

#include "onnxruntime_c_api.h"

#include <algorithm>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

namespace {

constexpr const char * DD_DOMAIN = "ai.dipdeploy";
constexpr int DD_MAX_RANK = 8;

OrtStatus * dd_error(const OrtApi * api, OrtErrorCode code, const char * fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return api->CreateStatus(code, msg);
}

// Checked int64 arithmetic where shapes and attributes combine: attributes come from the model file
// and dims from the caller, so a product of them may not fit in int64; this returns false instead of
// wrapping (signed overflow is undefined behaviour, and a wrapped size would let a short tensor pass a
// shape check).
bool dd_i64_mul(int64_t a, int64_t b, int64_t * out) {
    return !__builtin_mul_overflow(a, b, out);
}

// ceil(a / b) for a >= 0 and b >= 1, without forming a + b - 1 (which overflows for b near INT64_MAX).
int64_t dd_ceil_div(int64_t a, int64_t b) {
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

// Checks dtype and rank; `what` names the input in the error ("SparseGatherMatMul input 'X'").
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

// Attribute readers: an absent attribute gives the default; the values are then validated by the caller.
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

// The whole value, whatever its length (asked for its size first), so the caller compares it exactly:
// a value read into a fixed buffer would be cut, or mistaken for an absent attribute.
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

// ---------------------------------------------------------------------------------------------
// TopKColumnMask(X[N,D] f32, K? i64, C? bool [D]|[N,D], colnorm? f32 [D]) -> indices [N,k] i64

struct dd_topk_kernel {
    const OrtApi * api;
    int64_t k;
    float gamma;
    int64_t fixed_top_n;
    bool wina;
};

struct dd_topk_job {
    dd_topk_params params;
    const float * x;
    const uint8_t * resident;  // C's bytes, nonzero = resident (dd_topk_row)
    int64_t resident_stride;
    const float * colnorm;
    int64_t * out;
};

void dd_topk_task(void * user, size_t n) {
    const dd_topk_job * job = static_cast<const dd_topk_job *>(user);
    const int64_t d = job->params.d;
    const uint8_t * res = job->resident ? job->resident + (int64_t) n * job->resident_stride : nullptr;
    dd_topk_row(&job->params, job->x + (int64_t) n * d, res, job->colnorm, job->out + (int64_t) n * job->params.k);
}

// TopKColumnMask's attributes (CachePrefetch takes the same ones, as `op`).
OrtStatus * dd_topk_attrs(const OrtApi * api, const OrtKernelInfo * info, const char * op, void ** kernel) {
    const int64_t k = dd_attr_int(api, info, "k", 0);
    const int64_t fixed = dd_attr_int(api, info, "fixed_top_n", 0);
    const float gamma = dd_attr_float(api, info, "gamma", 1.0f);
    std::string score;
    DD_TRY(dd_attr_string(api, info, "score", "abs", &score));
    if (!(gamma >= 0.0f && gamma <= 1.0f)) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: attribute gamma=%g must lie in [0, 1]", op, (double) gamma);
    }
    if (fixed < 0 || k < 0) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: attributes k=%lld and fixed_top_n=%lld must be >= 0", op,
                        (long long) k, (long long) fixed);
    }
    const bool wina = score == "wina";
    if (!wina && score != "abs") {
        return dd_error(api, ORT_INVALID_ARGUMENT,
                        "%s: attribute score='%.64s' is not allowed (%zu bytes); use 'abs' or 'wina'", op,
                        score.c_str(), score.size());
    }
    *kernel = new (std::nothrow) dd_topk_kernel{api, k, gamma, fixed, wina};
    return *kernel ? nullptr : dd_error(api, ORT_FAIL, "%s: out of memory", op);
}

OrtStatus * ORT_API_CALL dd_topk_create(const OrtCustomOp *, const OrtApi * api, const OrtKernelInfo * info,
                                        void ** kernel) {
    return dd_topk_attrs(api, info, "TopKColumnMask", kernel);
}

// The column norms input of a TopKColumnMask-like op (`op`): present exactly when score='wina', float32 [D].
OrtStatus * dd_topk_colnorm(const OrtApi * api, const dd_topk_kernel * kn, const char * op, const dd_view & cn,
                            int64_t d) {
    if (kn->wina != cn.present) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: score='%s' %s input 'colnorm'", op, kn->wina ? "wina" : "abs",
                        kn->wina ? "needs" : "takes no");
    }
    if (cn.present) {
        DD_TRY(dd_expect(api, cn, op, "colnorm", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, 1));
        if (cn.dims[0] != d) {
            return dd_error(api, ORT_INVALID_ARGUMENT, "%s: input 'colnorm' must have shape [D=%lld]", op, (long long) d);
        }
    }
    return nullptr;
}

OrtStatus * ORT_API_CALL dd_topk_compute(void * kernel_ptr, OrtKernelContext * ctx) {
    const dd_topk_kernel * kn = static_cast<const dd_topk_kernel *>(kernel_ptr);
    const OrtApi * api = kn->api;
    const char * op = "TopKColumnMask";
    dd_view x, kin, c, cn;
    DD_TRY(dd_input(api, ctx, 0, &x));
    DD_TRY(dd_input(api, ctx, 1, &kin));
    DD_TRY(dd_input(api, ctx, 2, &c));
    DD_TRY(dd_input(api, ctx, 3, &cn));
    DD_TRY(dd_expect(api, x, op, "X", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, 2));
    const int64_t n = x.dims[0], d = x.dims[1];
    int64_t k = kn->k;
    if (kin.present) {
        if (kin.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 || kin.numel != 1) {
            return dd_error(api, ORT_INVALID_ARGUMENT, "%s: input 'K' must be one int64 (scalar or [1]), got %s with %lld elements",
                            op, dd_type_name(kin.type), (long long) kin.numel);
        }
        k = *static_cast<const int64_t *>(kin.data);
    }
    if (k < 1 || k > d) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: k=%lld must lie in [1, D=%lld] (input K or attribute k)", op,
                        (long long) k, (long long) d);
    }
    int64_t res_stride = 0;
    if (c.present) {
        if (c.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL) {
            return dd_error(api, ORT_INVALID_ARGUMENT, "%s: input 'C' must be bool, got %s", op, dd_type_name(c.type));
        }
        const bool per_row = c.rank == 2 && c.dims[0] == n && c.dims[1] == d;
        if (!(c.rank == 1 && c.dims[0] == d) && !per_row) {
            return dd_error(api, ORT_INVALID_ARGUMENT, "%s: input 'C' must have shape [D] or [N, D] = [%lld, %lld]", op,
                            (long long) n, (long long) d);
        }
        res_stride = per_row ? d : 0;
    }
    DD_TRY(dd_topk_colnorm(api, kn, op, cn, d));
    const int64_t out_dims[2] = {n, k};
    OrtValue * out = nullptr;
    DD_TRY(api->KernelContext_GetOutput(ctx, 0, out_dims, 2, &out));
    void * out_data = nullptr;
    DD_TRY(api->GetTensorMutableData(out, &out_data));
    if (n == 0) {
        return nullptr;
    }
    dd_topk_job job{{d, k, kn->gamma, kn->fixed_top_n}, static_cast<const float *>(x.data),
                    c.present ? static_cast<const uint8_t *>(c.data) : nullptr, res_stride,
                    cn.present ? static_cast<const float *>(cn.data) : nullptr, static_cast<int64_t *>(out_data)};
    if (n == 1) {
        dd_topk_task(&job, 0);
        return nullptr;
    }
    return api->KernelContext_ParallelFor(ctx, dd_topk_task, (size_t) n, 0, &job);
}

// ---------------------------------------------------------------------------------------------
// SparseGatherMatMul(X[N,D] f32, indices[N,k] i64, slots? i64 [N,k], weights...) -> Y [N,O] f32

struct dd_sgmm_kernel {
    const OrtApi * api;
    dd_format format;
    int64_t cols;
    int64_t group_rows;
    int64_t group_cols;
    int64_t accuracy_level;
};

OrtStatus * ORT_API_CALL dd_sgmm_create(const OrtCustomOp *, const OrtApi * api, const OrtKernelInfo * info,
                                        void ** kernel) {
    const char * op = "SparseGatherMatMul";
    std::string fmt;
    DD_TRY(dd_attr_string(api, info, "format", "", &fmt));
    const int64_t cols = dd_attr_int(api, info, "cols", 0);
    const int64_t gr = dd_attr_int(api, info, "group_rows", 0);
    const int64_t gc = dd_attr_int(api, info, "group_cols", 0);
    const int64_t level = dd_attr_int(api, info, "accuracy_level", 0);
    if (level < 0 || level > 4) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: attribute accuracy_level=%lld must lie in [0, 4]", op,
                        (long long) level);
    }
    static const struct { const char * name; dd_format format; } formats[] = {
        {"fp32", DD_FORMAT_FP32}, {"fp16", DD_FORMAT_FP16}, {"bq4", DD_FORMAT_BQ4}, {"vq3", DD_FORMAT_VQ3}};
    for (const auto & f : formats) {
        if (fmt == f.name) {
            if (f.format == DD_FORMAT_VQ3 && (gr < 1 || gc < 2 || gc % 2 != 0)) {
                return dd_error(api, ORT_INVALID_ARGUMENT,
                                "%s: format 'vq3' needs attributes group_rows >= 1 and an even group_cols >= 2, got %lld, %lld",
                                op, (long long) gr, (long long) gc);
            }
            *kernel = new (std::nothrow) dd_sgmm_kernel{api, f.format, cols, gr, gc, level};
            return *kernel ? nullptr : dd_error(api, ORT_FAIL, "%s: out of memory", op);
        }
    }
    return dd_error(api, ORT_INVALID_ARGUMENT,
                    "%s: attribute format='%.64s' is not allowed (%zu bytes); use fp32, fp16, bq4 or vq3", op,
                    fmt.c_str(), fmt.size());
}

// Work split: the output row is cut into column chunks, and when there are few chunks the selected
// rows are cut into groups too (each group sums into its own partial row, reduced afterwards), so
// 1..8 threads get work at every shape while each weight row is read in long contiguous runs.
struct dd_sgmm_job {
    dd_sgmm_params params;
    int64_t chunk, n_chunks;     // columns per chunk, chunks per output row
    int64_t group, n_groups;     // selected rows per group, groups
    float * partial;             // [n, n_groups, o] when n_groups > 1
};

void dd_sgmm_task(void * user, size_t t) {
    const dd_sgmm_job * job = static_cast<const dd_sgmm_job *>(user);
    const dd_sgmm_params & p = job->params;
    const int64_t per_row = job->n_chunks * job->n_groups;
    const int64_t n = (int64_t) t / per_row, rem = (int64_t) t % per_row;
    const int64_t c = rem / job->n_groups, g = rem % job->n_groups;
    const int64_t o0 = c * job->chunk, o1 = std::min(o0 + job->chunk, p.o);
    const int64_t j0 = g * job->group, j1 = std::min(j0 + job->group, p.k);
    float * y = job->n_groups == 1 ? p.y + n * p.o : job->partial + (n * job->n_groups + g) * p.o;
    dd_sgmm_chunk(&p, n, o0, o1, j0, j1, y);
}

// Bytes of weight data per output column of one row, per format (sets the chunk width).
double dd_bytes_per_col(dd_format f) {
    switch (f) {
        case DD_FORMAT_FP32: return 4.0;
        case DD_FORMAT_FP16: return 2.0;
        case DD_FORMAT_BQ4: return 0.5;
        case DD_FORMAT_VQ3: return 0.375;
    }
    return 4.0;
}

void dd_sgmm_plan(dd_sgmm_job * job) {
    const dd_sgmm_params & p = job->params;
    constexpr double piece_bytes = 16384.0;  // contiguous bytes read from one weight row per visit
    constexpr int64_t max_chunk = 16384;     // keeps the y chunk within L2
    constexpr int64_t target_tasks = 8, min_group = 64;
    int64_t chunk = (int64_t) (piece_bytes / dd_bytes_per_col(p.format));
    chunk = std::min(std::max(dd_ceil_div(chunk, DD_CHUNK_ALIGN) * DD_CHUNK_ALIGN, DD_CHUNK_ALIGN), max_chunk);
    job->chunk = std::min(chunk, dd_ceil_div(p.o, DD_CHUNK_ALIGN) * DD_CHUNK_ALIGN);
    job->n_chunks = dd_ceil_div(p.o, job->chunk);
    int64_t visits = 0;  // row visits already available; saturates instead of wrapping
    if (!dd_i64_mul(job->n_chunks, p.n, &visits)) {
        visits = INT64_MAX;
    }
    const int64_t want = dd_ceil_div(target_tasks, visits);
    job->n_groups = std::max<int64_t>(1, std::min(want, p.k / min_group));
    job->group = dd_ceil_div(dd_ceil_div(std::max<int64_t>(p.k, 1), job->n_groups), DD_I8_ROWS) * DD_I8_ROWS;
    job->n_groups = dd_ceil_div(std::max<int64_t>(p.k, 1), job->group);
}


// Fills the format part of `p` from the weight inputs, checking dtypes and shapes against each other.
// `slab` (slots present) and `d` (X's width) say which rows VQ3's codebooks cover: in slab mode the
// original D rows (a slab holds codes only, in any number of rows), otherwise the R rows of the codes.
OrtStatus * dd_sgmm_weights(const dd_sgmm_kernel * kn, const dd_view * w, size_t n_w, bool slab, int64_t d,
                            dd_sgmm_params * p, int64_t * rows_out) {
    const OrtApi * api = kn->api;
    const char * op = "SparseGatherMatMul";
    const auto F32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, F16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
               U8 = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, I8 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    switch (kn->format) {
        case DD_FORMAT_FP32:
        case DD_FORMAT_FP16: {
            if (n_w != 1) {
                return dd_error(api, ORT_INVALID_ARGUMENT, "%s: format fp32/fp16 takes 1 weight input W, got %zu", op, n_w);
            }
            DD_TRY(dd_expect(api, w[0], op, "W", kn->format == DD_FORMAT_FP32 ? F32 : F16, 2));
            *rows_out = w[0].dims[0];
            p->o = w[0].dims[1];
            p->w = w[0].data;
            p->w_stride = w[0].dims[1];
            if (kn->cols != 0 && kn->cols != p->o) {
                return dd_error(api, ORT_INVALID_ARGUMENT, "%s: attribute cols=%lld but W has %lld columns", op,
                                (long long) kn->cols, (long long) p->o);
            }
            return nullptr;
        }
        case DD_FORMAT_BQ4: {
            if (n_w != 2 && n_w != 3) {
                return dd_error(api, ORT_INVALID_ARGUMENT, "%s: format bq4 takes qweight, scales[, zeros], got %zu inputs", op, n_w);
            }
            DD_TRY(dd_expect(api, w[0], op, "qweight", U8, 2));
            DD_TRY(dd_expect(api, w[1], op, "scales", F16, 2));
            const int64_t R = w[0].dims[0], qs = w[0].dims[1], nb = w[1].dims[1];
            if (w[1].dims[0] != R || nb < 1 || (2 * qs) % nb != 0) {
                return dd_error(api, ORT_INVALID_ARGUMENT, "%s: bq4 scales [%lld, %lld] do not match qweight [%lld, %lld]",
                                op, (long long) w[1].dims[0], (long long) nb, (long long) R, (long long) qs);
            }
            const int64_t B = 2 * qs / nb;
            if (B < 2 || DD_CHUNK_ALIGN % B != 0) {
                return dd_error(api, ORT_INVALID_ARGUMENT, "%s: bq4 block size %lld must divide %lld (use 32, 64 or 128)",
                                op, (long long) B, (long long) DD_CHUNK_ALIGN);
            }
            if (kn->cols <= (nb - 1) * B || kn->cols > nb * B) {
                return dd_error(api, ORT_INVALID_ARGUMENT, "%s: attribute cols=%lld does not fit %lld blocks of %lld", op,
                                (long long) kn->cols, (long long) nb, (long long) B);
            }
            p->zeros = nullptr;
            if (n_w == 3) {
                DD_TRY(dd_expect(api, w[2], op, "zeros", U8, 2));
                if (w[2].dims[0] != R || w[2].dims[1] != dd_ceil_div(nb, 2)) {
                    return dd_error(api, ORT_INVALID_ARGUMENT, "%s: bq4 zeros must have shape [%lld, %lld]", op,
                                    (long long) R, (long long) dd_ceil_div(nb, 2));
                }
                p->zeros = static_cast<const uint8_t *>(w[2].data);
                p->z_stride = w[2].dims[1];
            }
            *rows_out = R;
            p->o = kn->cols;
            p->q = static_cast<const uint8_t *>(w[0].data);
            p->q_stride = qs;
            p->scales = static_cast<const uint16_t *>(w[1].data);
            p->nb = nb;
            p->block = B;
            return nullptr;
        }
        case DD_FORMAT_VQ3: {
            if (n_w != 3) {
                return dd_error(api, ORT_INVALID_ARGUMENT,
                                "%s: format vq3 takes codes, codebooks (int8), codebook_scales, got %zu inputs", op, n_w);
            }
            DD_TRY(dd_expect(api, w[0], op, "codes", U8, 2));
            DD_TRY(dd_expect(api, w[1], op, "codebooks", I8, 4));
            DD_TRY(dd_expect(api, w[2], op, "codebook_scales", F16, 2));
            const int64_t R = w[0].dims[0], C = kn->cols;
            int64_t code_bits = 0;  // 6 bits per pair of columns
            if (C < 2 || C % 2 != 0 || !dd_i64_mul(6, C / 2, &code_bits) || w[0].dims[1] != dd_ceil_div(code_bits, 8)) {
                return dd_error(api, ORT_INVALID_ARGUMENT, "%s: vq3 codes [%lld, %lld] do not fit cols=%lld (even)", op,
                                (long long) R, (long long) w[0].dims[1], (long long) C);
            }
            const int64_t covered = slab ? d : R;
            const int64_t ngr = dd_ceil_div(covered, kn->group_rows), ngc = dd_ceil_div(C, kn->group_cols);
            if (w[1].dims[0] != ngr || w[1].dims[1] != ngc || w[1].dims[2] != 64 || w[1].dims[3] != 2 ||
                w[2].dims[0] != ngr || w[2].dims[1] != ngc) {
                return dd_error(api, ORT_INVALID_ARGUMENT,
                                "%s: vq3 codebooks must be [%lld, %lld, 64, 2] and scales [%lld, %lld] for group %lldx%lld "
                                "over %lld rows (%s), got codebooks [%lld, %lld, %lld, %lld] and scales [%lld, %lld]",
                                op, (long long) ngr, (long long) ngc, (long long) ngr, (long long) ngc,
                                (long long) kn->group_rows, (long long) kn->group_cols, (long long) covered,
                                slab ? "slab mode: the width D of X, the original rows" : "the rows R of codes",
                                (long long) w[1].dims[0], (long long) w[1].dims[1], (long long) w[1].dims[2],
                                (long long) w[1].dims[3], (long long) w[2].dims[0], (long long) w[2].dims[1]);
            }
            *rows_out = R;
            p->o = C;
            p->codes = static_cast<const uint8_t *>(w[0].data);
            p->codes_stride = w[0].dims[1];
            p->cb = static_cast<const int8_t *>(w[1].data);
            p->cb_scales = static_cast<const uint16_t *>(w[2].data);
            p->group_rows = kn->group_rows;
            p->group_cols = kn->group_cols;
            p->ngc = ngc;
            return nullptr;
        }
    }
    return dd_error(api, ORT_FAIL, "%s: unknown format", op);
}

OrtStatus * ORT_API_CALL dd_sgmm_compute(void * kernel_ptr, OrtKernelContext * ctx) {
    const dd_sgmm_kernel * kn = static_cast<const dd_sgmm_kernel *>(kernel_ptr);
    const OrtApi * api = kn->api;
    const char * op = "SparseGatherMatMul";
    size_t n_in = 0;
    DD_TRY(api->KernelContext_GetInputCount(ctx, &n_in));
    constexpr size_t max_w = 3;
    if (n_in < 4 || n_in > 3 + max_w) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: expected X, indices, slots (or ''), then 1..3 weight inputs; got %zu inputs", op, n_in);
    }
    dd_view x, idx, slots, w[max_w];
    DD_TRY(dd_input(api, ctx, 0, &x));
    DD_TRY(dd_input(api, ctx, 1, &idx));
    DD_TRY(dd_input(api, ctx, 2, &slots));
    for (size_t i = 3; i < n_in; ++i) {
        DD_TRY(dd_input(api, ctx, i, &w[i - 3]));
    }
    DD_TRY(dd_expect(api, x, op, "X", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, 2));
    DD_TRY(dd_expect(api, idx, op, "indices", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, 2));
    const int64_t n = x.dims[0], d = x.dims[1], k = idx.dims[1];
    if (idx.dims[0] != n) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: indices has %lld rows but X has %lld", op,
                        (long long) idx.dims[0], (long long) n);
    }
    if (slots.present) {
        DD_TRY(dd_expect(api, slots, op, "slots", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, 2));
        if (slots.dims[0] != n || slots.dims[1] != k) {
            return dd_error(api, ORT_INVALID_ARGUMENT, "%s: slots must have the shape of indices [%lld, %lld]", op,
                            (long long) n, (long long) k);
        }
    }
    dd_sgmm_params p{};
    p.format = kn->format;
    p.accuracy_level = kn->accuracy_level;
    int64_t R = 0;
    DD_TRY(dd_sgmm_weights(kn, w, n_in - 3, slots.present, d, &p, &R));
    DD_TRY(dd_check_range(api, op, "indices", static_cast<const int64_t *>(idx.data), n * k, d));
    if (slots.present) {
        DD_TRY(dd_check_range(api, op, "slots", static_cast<const int64_t *>(slots.data), n * k, R));
    } else if (R < d) {
        DD_TRY(dd_check_range(api, op, "indices (as rows of W)", static_cast<const int64_t *>(idx.data), n * k, R));
    }
    const int64_t out_dims[2] = {n, p.o};
    OrtValue * out = nullptr;
    DD_TRY(api->KernelContext_GetOutput(ctx, 0, out_dims, 2, &out));
    void * out_data = nullptr;
    DD_TRY(api->GetTensorMutableData(out, &out_data));
    if (n == 0 || p.o == 0) {
        return nullptr;
    }
    if (k == 0) {  // no rows selected (CacheEnd's misses when every row was resident): Y = 0
        std::memset(out_data, 0, (size_t) (n * p.o) * sizeof(float));
        return nullptr;
    }
    p.n = n;
    p.d = d;
    p.k = k;
    p.x = static_cast<const float *>(x.data);
    p.idx = static_cast<const int64_t *>(idx.data);
    p.rows = slots.present ? static_cast<const int64_t *>(slots.data) : p.idx;
    p.y = static_cast<float *>(out_data);
    if (p.format == DD_FORMAT_BQ4 && p.accuracy_level >= 4) {
        // The int8 kernels flag rows whose coefficients they cannot quantise (NaN, ±Inf, or a chunk's
        // 127 / max|c| overflowing); those are recomputed at level 0 below (README, "accuracy level"). Every task covers its own coefficients, so the flag is
        // the whole row's, whatever the split.
        thread_local std::vector<uint8_t> nonfinite;
        try {
            if ((int64_t) nonfinite.size() < n) {
                nonfinite.resize((size_t) n);
            }
        } catch (const std::exception &) {
            return dd_error(api, ORT_FAIL, "%s: out of memory (%lld row flags)", op, (long long) n);
        }
        std::memset(nonfinite.data(), 0, (size_t) n);
        p.nonfinite_rows = nonfinite.data();
    }
    dd_sgmm_job job{};
    job.params = p;
    dd_sgmm_plan(&job);
    int64_t total = 0, need = 0;
    if (!dd_i64_mul(n, job.n_chunks, &total) || !dd_i64_mul(total, job.n_groups, &total) ||
        !dd_i64_mul(n, job.n_groups, &need) || !dd_i64_mul(need, p.o, &need)) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: N=%lld x cols=%lld is too large to split", op, (long long) n,
                        (long long) p.o);
    }
    if (job.n_groups > 1) {
        // Partial sums live in per-thread scratch that only grows: no allocation once warmed up.
        thread_local std::vector<float> scratch;
        try {
            if (scratch.size() < (size_t) need) {
                scratch.resize((size_t) need);
            }
        } catch (const std::exception &) {
            return dd_error(api, ORT_FAIL, "%s: out of memory (%lld partial sums)", op, (long long) need);
        }
        job.partial = scratch.data();
    }
    if (total == 1) {
        dd_sgmm_task(&job, 0);
    } else {
        DD_TRY(api->KernelContext_ParallelFor(ctx, dd_sgmm_task, (size_t) total, 0, &job));
    }
    if (p.nonfinite_rows != nullptr) {
        // Flagged rows again at level 0, on this thread: only hostile rows (NaN, ±Inf, ~1e-37) get here.
        dd_sgmm_job job0 = job;
        job0.params.accuracy_level = 0;
        job0.params.nonfinite_rows = nullptr;
        const int64_t per_row = job.n_chunks * job.n_groups;
        for (int64_t r = 0; r < n; ++r) {
            if (p.nonfinite_rows[r] == 0) {
                continue;
            }
            for (int64_t t = 0; t < per_row; ++t) {
                dd_sgmm_task(&job0, (size_t) (r * per_row + t));
            }
        }
    }
    if (job.n_groups > 1) {
        for (int64_t r = 0; r < n; ++r) {
            float * __restrict y = p.y + r * p.o;
            const float * part = job.partial + r * job.n_groups * p.o;
            for (int64_t t = 0; t < p.o; ++t) {
                y[t] = part[t];
            }
            for (int64_t g = 1; g < job.n_groups; ++g) {
                const float * __restrict src = part + g * p.o;
                for (int64_t t = 0; t < p.o; ++t) {
                    y[t] += src[t];
                }
            }
        }
    }
    return nullptr;
}

// ---------------------------------------------------------------------------------------------
// CacheStep(indices [N,K] i64, handle [1] i64) -> slots [N,K] i64 (N = 1 but in a batched prefill)
// CacheSettle(X f32, handle [1] i64) -> X
//
// The host runtime's per-token cache step (dd_cache.cc) as graph nodes, so a whole decoder with its row
// caches runs as one session (dipdeploy/runtime/fused.py). `handle` is a group made by the host; the
// step updates that group's state and copies its misses into the slab the next SparseGatherMatMul
// reads; CacheSettle runs the deferred moves of the slot rule once X (which depends on that
// SparseGatherMatMul) exists, and passes X on, so that every later node, the next group's CacheStep
// included, runs after it. Both ops have side effects: the graph orders them by these data edges only.
// While the host runs a batched prefill (dd_cache_prefill), the same two nodes fill the full-height
// buffers with a chunk's rows and warm the cache from its selection instead (dd_cache.cc).

struct dd_cache_op_kernel {
    const OrtApi * api;
};

OrtStatus * ORT_API_CALL dd_cache_op_create(const OrtCustomOp *, const OrtApi * api, const OrtKernelInfo *,
                                            void ** kernel) {
    *kernel = new (std::nothrow) dd_cache_op_kernel{api};
    return *kernel ? nullptr : dd_error(api, ORT_FAIL, "cache op: out of memory");
}

OrtStatus * dd_cache_handle(const OrtApi * api, OrtKernelContext * ctx, const char * op, void ** group) {
    dd_view h;
    DD_TRY(dd_input(api, ctx, 1, &h));
    if (!h.present || h.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 || h.numel != 1) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: input 'handle' must be one int64", op);
    }
    void * g = reinterpret_cast<void *>(static_cast<intptr_t>(*static_cast<const int64_t *>(h.data)));
    if (!dd_cache_live(g)) {
        return dd_error(api, ORT_INVALID_ARGUMENT,
                        "%s: input 'handle' names no live cache group; bind the handles the engine made", op);
    }
    *group = g;
    return nullptr;
}

OrtStatus * dd_cache_status(const OrtApi * api, const char * op, void * g, int64_t rc) {
    const int64_t err = dd_cache_read_errno(g);
    return dd_error(api, ORT_INVALID_ARGUMENT, "%s: %s%s%s", op, dd_cache_error(rc), err ? ": " : "",
                    err ? std::strerror(int(err)) : "");
}

// Input 0 (`name`, a 2-D tensor of `type`) and the live group input 1 names: how every step op begins.
OrtStatus * dd_cache_inputs(const OrtApi * api, OrtKernelContext * ctx, const char * op, const char * name,
                            ONNXTensorElementDataType type, dd_view * x, void ** g) {
    DD_TRY(dd_input(api, ctx, 0, x));
    DD_TRY(dd_expect(api, *x, op, name, type, 2));
    return dd_cache_handle(api, ctx, op, g);
}

// Output 0 = the float32 input `x`, unchanged: how the ops with side effects order what follows them.
OrtStatus * dd_pass_on(const OrtApi * api, OrtKernelContext * ctx, const dd_view & x) {
    OrtValue * out = nullptr;
    DD_TRY(api->KernelContext_GetOutput(ctx, 0, x.dims, x.rank, &out));
    void * y = nullptr;
    DD_TRY(api->GetTensorMutableData(out, &y));
    if (x.numel > 0 && y != x.data) {
        std::memcpy(y, x.data, (size_t) x.numel * sizeof(float));
    }
    return nullptr;
}

OrtStatus * ORT_API_CALL dd_cstep_compute(void * kernel_ptr, OrtKernelContext * ctx) {
    const OrtApi * api = static_cast<const dd_cache_op_kernel *>(kernel_ptr)->api;
    const char * op = "CacheStep";
    dd_view idx;
    void * g = nullptr;
    DD_TRY(dd_cache_inputs(api, ctx, op, "indices", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, &idx, &g));
    OrtValue * out = nullptr;
    DD_TRY(api->KernelContext_GetOutput(ctx, 0, idx.dims, 2, &out));
    void * slots = nullptr;
    DD_TRY(api->GetTensorMutableData(out, &slots));
    const int64_t rc = dd_cache_graph_step(g, static_cast<const int64_t *>(idx.data), idx.dims[0], idx.dims[1],
                                           static_cast<int64_t *>(slots));
    if (rc < 0) {
        return dd_cache_status(api, op, g, rc);
    }
    return nullptr;
}

OrtStatus * ORT_API_CALL dd_csettle_compute(void * kernel_ptr, OrtKernelContext * ctx) {
    const OrtApi * api = static_cast<const dd_cache_op_kernel *>(kernel_ptr)->api;
    const char * op = "CacheSettle";
    dd_view x;
    DD_TRY(dd_input(api, ctx, 0, &x));
    if (!x.present || x.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: input 'X' must be float32", op);
    }
    void * g = nullptr;
    DD_TRY(dd_cache_handle(api, ctx, op, &g));
    const int64_t rc = dd_cache_graph_settle(g);
    if (rc < 0) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: %s", op, dd_cache_error(rc));
    }
    return dd_pass_on(api, ctx, x);
}

// CacheBegin(indices [N,K] i64, handle [1] i64) -> hit_indices [N,H] i64, hit_slots [N,H] i64
// CacheEnd(Y f32, handle [1] i64) -> Y, miss_indices [N,M] i64, miss_slots [N,M] i64
//
// CacheStep in two halves, so the reads overlap the compute (dipdeploy/runtime/fused.py, --io direct):
// CacheBegin steps the cache and starts the misses' reads, and gives the hits' selected entries and slots
// to a SparseGatherMatMul over the resident rows, which runs while the reads are in flight; CacheEnd, on
// that product, waits for the reads, copies the rows into their staging slots and gives the misses'
// entries and slots to a second SparseGatherMatMul; the graph adds the two. In a batched prefill every
// selected row is placed by CacheBegin (H = K, M = 0).

OrtStatus * dd_index_pair(const OrtApi * api, OrtKernelContext * ctx, size_t first, int64_t rows, int64_t cols,
                          const int64_t * idx, const int64_t * slots) {
    const int64_t dims[2] = {rows, cols};
    const int64_t * src[2] = {idx, slots};
    for (size_t i = 0; i < 2; ++i) {
        OrtValue * out = nullptr;
        DD_TRY(api->KernelContext_GetOutput(ctx, first + i, dims, 2, &out));
        void * data = nullptr;
        DD_TRY(api->GetTensorMutableData(out, &data));
        if (rows * cols > 0) {
            std::memcpy(data, src[i], (size_t) (rows * cols) * sizeof(int64_t));
        }
    }
    return nullptr;
}

// Scratch for `n` entries and their slots (the op's outputs' sizes are known only after the step).
OrtStatus * dd_index_scratch(const OrtApi * api, const char * op, int64_t n, std::vector<int64_t> & idx,
                             std::vector<int64_t> & slots) {
    try {
        idx.resize((size_t) n);
        slots.resize((size_t) n);
    } catch (const std::exception &) {
        return dd_error(api, ORT_FAIL, "%s: out of memory", op);
    }
    return nullptr;
}

OrtStatus * ORT_API_CALL dd_cbegin_compute(void * kernel_ptr, OrtKernelContext * ctx) {
    const OrtApi * api = static_cast<const dd_cache_op_kernel *>(kernel_ptr)->api;
    const char * op = "CacheBegin";
    dd_view idx;
    void * g = nullptr;
    DD_TRY(dd_cache_inputs(api, ctx, op, "indices", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, &idx, &g));
    thread_local std::vector<int64_t> hit_idx, hit_slots;
    DD_TRY(dd_index_scratch(api, op, idx.numel, hit_idx, hit_slots));
    const int64_t h = dd_cache_graph_begin(g, static_cast<const int64_t *>(idx.data), idx.dims[0], idx.dims[1],
                                           hit_idx.data(), hit_slots.data());
    if (h < 0) {
        return dd_cache_status(api, op, g, h);
    }
    const int64_t rows = idx.dims[0];
    return dd_index_pair(api, ctx, 0, rows, rows > 0 ? h / rows : 0, hit_idx.data(), hit_slots.data());
}

OrtStatus * ORT_API_CALL dd_cend_compute(void * kernel_ptr, OrtKernelContext * ctx) {
    const OrtApi * api = static_cast<const dd_cache_op_kernel *>(kernel_ptr)->api;
    const char * op = "CacheEnd";
    dd_view y;
    void * g = nullptr;
    DD_TRY(dd_cache_inputs(api, ctx, op, "Y", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &y, &g));
    const int64_t m = dd_cache_graph_misses(g);
    if (m < 0) {
        return dd_cache_status(api, op, g, m);
    }
    thread_local std::vector<int64_t> miss_idx, miss_slots;
    DD_TRY(dd_index_scratch(api, op, m, miss_idx, miss_slots));
    const int64_t rc = dd_cache_graph_end(g, miss_idx.data(), miss_slots.data());
    if (rc < 0) {
        return dd_cache_status(api, op, g, rc);
    }
    DD_TRY(dd_pass_on(api, ctx, y));
    return dd_index_pair(api, ctx, 1, y.dims[0], m, miss_idx.data(), miss_slots.data());
}

// CachePrefetch(X f32, handle [1] i64, H f32 [1, 1, D] | [1, D], W f32 [D], C bool [D], colnorm? f32 [D]) -> X
//
// A read-ahead for the up|gate group of a pre-norm layer whose MLP input is x = RMSNorm(H + attn(H)) ⊙ W
// (dipdeploy/runtime/fused.py inserts it where a layer has that form, with `X` the value the attention
// starts from, so that it runs first). RMSNorm's per-token scale leaves a top-K unchanged, so the
// TopKColumnMask of H ⊙ W with the same attributes, residency C and column norms predicts the group's
// selection before the attention runs (recall 0.86-0.89 measured, dipdeploy/runtime/DESIGN.md); the rows
// it names that are not resident are read meanwhile (dd_cache_graph_prefetch) and the group's CacheBegin
// takes the misses among them. X passes on unchanged. A chunk of more than one token reads nothing ahead.

OrtStatus * ORT_API_CALL dd_prefetch_create(const OrtCustomOp *, const OrtApi * api, const OrtKernelInfo * info,
                                            void ** kernel) {
    return dd_topk_attrs(api, info, "CachePrefetch", kernel);
}

OrtStatus * ORT_API_CALL dd_prefetch_compute(void * kernel_ptr, OrtKernelContext * ctx) {
    const dd_topk_kernel * kn = static_cast<const dd_topk_kernel *>(kernel_ptr);
    const OrtApi * api = kn->api;
    const char * op = "CachePrefetch";
    dd_view x, h, w, c, cn;
    DD_TRY(dd_input(api, ctx, 0, &x));
    if (!x.present || x.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: input 'X' must be float32", op);
    }
    void * g = nullptr;
    DD_TRY(dd_cache_handle(api, ctx, op, &g));
    DD_TRY(dd_input(api, ctx, 2, &h));
    DD_TRY(dd_input(api, ctx, 3, &w));
    DD_TRY(dd_input(api, ctx, 4, &c));
    DD_TRY(dd_input(api, ctx, 5, &cn));
    DD_TRY(dd_expect(api, w, op, "W", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, 1));
    const int64_t d = w.dims[0];
    if (!h.present || h.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || h.rank < 1 || h.dims[h.rank - 1] != d) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: input 'H' must be float32 [..., D=%lld]", op, (long long) d);
    }
    if (!c.present || c.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL || c.rank != 1 || c.dims[0] != d) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: input 'C' must be bool [D=%lld]", op, (long long) d);
    }
    DD_TRY(dd_topk_colnorm(api, kn, op, cn, d));
    if (kn->k < 1 || kn->k > d) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: attribute k=%lld must lie in [1, D=%lld]", op,
                        (long long) kn->k, (long long) d);
    }
    if (h.numel == d) {
        thread_local std::vector<float> z;
        thread_local std::vector<int64_t> pred;
        try {
            z.resize((size_t) d);
            pred.resize((size_t) kn->k);
        } catch (const std::exception &) {
            return dd_error(api, ORT_FAIL, "%s: out of memory", op);
        }
        const float * hv = static_cast<const float *>(h.data);
        const float * wv = static_cast<const float *>(w.data);
        for (int64_t i = 0; i < d; ++i) {
            z[(size_t) i] = hv[i] * wv[i];
        }
        const dd_topk_params params{d, kn->k, kn->gamma, kn->fixed_top_n};
        dd_topk_row(&params, z.data(), static_cast<const uint8_t *>(c.data),
                    cn.present ? static_cast<const float *>(cn.data) : nullptr, pred.data());
        const int64_t rc = dd_cache_graph_prefetch(g, pred.data(), kn->k);
        if (rc < 0) {
            return dd_cache_status(api, op, g, rc);
        }
    }
    return dd_pass_on(api, ctx, x);
}

// ---------------------------------------------------------------------------------------------
// Op declarations

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
