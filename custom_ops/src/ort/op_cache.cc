// The host runtime's cache step as graph ops (cache/graph.cc does the work): CacheStep, CacheSettle,
// CacheBegin, CacheEnd and CachePrefetch. The contract is custom_ops/README.md.
#include "cache/cache.h"
#include "ort/ops.h"

#include <cstring>
#include <exception>
#include <new>
#include <vector>

namespace dd_ort {

// ---------------------------------------------------------------------------------------------
// CacheStep(indices [N,K] i64, handle [1] i64) -> slots [N,K] i64 (N = 1 but in a batched prefill)
// CacheSettle(X f32, handle [1] i64) -> X
//
// The host runtime's per-token cache step (cache/) as graph nodes, so a whole decoder with its row
// caches runs as one session (dipdeploy/export/joined.py). `handle` is a group made by the host; the
// step updates that group's state and copies its misses into the slab the next SparseGatherMatMul
// reads; CacheSettle runs the deferred moves of the slot rule once X (which depends on that
// SparseGatherMatMul) exists, and passes X on, so that every later node, the next group's CacheStep
// included, runs after it. Both ops have side effects: the graph orders them by these data edges only.
// While the host runs a batched prefill (dd_cache_prefill), the same two nodes fill the full-height
// buffers with a chunk's rows and warm the cache from its selection instead (cache/prefill.cc).

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
// CacheStep in two halves, so the reads overlap the compute (dipdeploy/runtime/backends/joined.py, --io direct):
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
// (dipdeploy/export/joined.py inserts it where a layer has that form, with `X` the value the attention
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

}  // namespace dd_ort
