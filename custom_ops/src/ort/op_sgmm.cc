// SparseGatherMatMul: attributes, the work split over ORT's intra-op threads, the level-4 rows recomputed
// at level 0, the partial rows summed (the weight inputs' checks are op_sgmm_weights.cc; the kernels
// kernels/). The contract is custom_ops/README.md.
#include "ort/ops.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

namespace dd_ort {

// The format names for an error, from the traits table: "fp32, fp16, bq4 or vq3" (built once, no allocation).
static const char * dd_format_choices() {
    struct names {
        char text[256] = {};
        names() {
            size_t at = 0;
            for (int i = 0; i < DD_FORMAT_COUNT && at < sizeof(text); ++i) {
                const char * sep = i == 0 ? "" : i + 1 < DD_FORMAT_COUNT ? ", " : " or ";
                at += (size_t) std::snprintf(text + at, sizeof(text) - at, "%s%s", sep, DD_FORMATS[i].name);
            }
        }
    };
    static const names choices;
    return choices.text;
}

// ---------------------------------------------------------------------------------------------
// SparseGatherMatMul(X[N,D] f32, indices[N,k] i64, slots? i64 [N,k], weights...) -> Y [N,O] f32

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
    const dd_format_traits * f = dd_format_named(fmt.data(), fmt.size());
    if (f == nullptr) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: attribute format='%.64s' is not allowed (%zu bytes); use %s",
                        op, fmt.c_str(), fmt.size(), dd_format_choices());
    }
    if (f->grouped && (gr < 1 || gc < 2 || gc % 2 != 0)) {
        return dd_error(api, ORT_INVALID_ARGUMENT,
                        "%s: format '%s' needs attributes group_rows >= 1 and an even group_cols >= 2, got %lld, %lld",
                        op, f->name, (long long) gr, (long long) gc);
    }
    *kernel = new (std::nothrow) dd_sgmm_kernel{api, f->id, cols, gr, gc, level};
    return *kernel ? nullptr : dd_error(api, ORT_FAIL, "%s: out of memory", op);
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

void dd_sgmm_plan(dd_sgmm_job * job) {
    const dd_sgmm_params & p = job->params;
    constexpr double piece_bytes = 16384.0;  // contiguous bytes read from one weight row per visit
    constexpr int64_t max_chunk = 16384;     // keeps the y chunk within L2
    constexpr int64_t target_tasks = 8, min_group = 64;
    const double bytes_per_col = dd_format_of(p.format).bits / 8.0;  // of weight data, in one row
    int64_t chunk = (int64_t) (piece_bytes / bytes_per_col);
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
    if (dd_format_of(p.format).int8_level4 && p.accuracy_level >= 4) {
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

}  // namespace dd_ort
