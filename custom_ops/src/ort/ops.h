// The ops of the ORT glue (custom_ops/src/ort/): their kernel objects and entry points, which register.cc
// declares to ORT. One file per op family: op_topk.cc (TopKColumnMask), op_sgmm.cc and op_sgmm_weights.cc
// (SparseGatherMatMul), op_cache.cc (CacheStep, CacheSettle, CacheBegin, CacheEnd, CachePrefetch).
#pragma once

#include "kernels/kernels.h"
#include "ort/glue.h"

namespace dd_ort {

struct dd_topk_kernel {
    const OrtApi * api;
    int64_t k;
    float gamma;
    int64_t fixed_top_n;
    bool wina;
};

struct dd_sgmm_kernel {
    const OrtApi * api;
    dd_format format;
    int64_t cols;
    int64_t group_rows;
    int64_t group_cols;
    int64_t accuracy_level;
};

struct dd_cache_op_kernel {
    const OrtApi * api;
};

// TopKColumnMask's attributes (CachePrefetch takes the same ones, as `op`).
OrtStatus * dd_topk_attrs(const OrtApi * api, const OrtKernelInfo * info, const char * op, void ** kernel);
// The column norms input of a TopKColumnMask-like op (`op`): present exactly when score='wina', float32 [D].
OrtStatus * dd_topk_colnorm(const OrtApi * api, const dd_topk_kernel * kn, const char * op, const dd_view & cn,
                            int64_t d);

// Fills the format part of `p` from the weight inputs, checking dtypes and shapes against each other.
// `slab` (slots present) and `d` (X's width) say which rows VQ3's codebooks cover: in slab mode the
// original D rows (a slab holds codes only, in any number of rows), otherwise the R rows of the codes.
OrtStatus * dd_sgmm_weights(const dd_sgmm_kernel * kn, const dd_view * w, size_t n_w, bool slab, int64_t d,
                            dd_sgmm_params * p, int64_t * rows_out);

using dd_create_fn = OrtStatus * (ORT_API_CALL *) (const OrtCustomOp *, const OrtApi *, const OrtKernelInfo *, void **);

OrtStatus * ORT_API_CALL dd_topk_create(const OrtCustomOp *, const OrtApi * api, const OrtKernelInfo * info,
                                        void ** kernel);
OrtStatus * ORT_API_CALL dd_topk_compute(void * kernel_ptr, OrtKernelContext * ctx);
OrtStatus * ORT_API_CALL dd_sgmm_create(const OrtCustomOp *, const OrtApi * api, const OrtKernelInfo * info,
                                        void ** kernel);
OrtStatus * ORT_API_CALL dd_sgmm_compute(void * kernel_ptr, OrtKernelContext * ctx);
OrtStatus * ORT_API_CALL dd_cache_op_create(const OrtCustomOp *, const OrtApi * api, const OrtKernelInfo *,
                                            void ** kernel);
OrtStatus * ORT_API_CALL dd_cstep_compute(void * kernel_ptr, OrtKernelContext * ctx);
OrtStatus * ORT_API_CALL dd_csettle_compute(void * kernel_ptr, OrtKernelContext * ctx);
OrtStatus * ORT_API_CALL dd_cbegin_compute(void * kernel_ptr, OrtKernelContext * ctx);
OrtStatus * ORT_API_CALL dd_cend_compute(void * kernel_ptr, OrtKernelContext * ctx);
OrtStatus * ORT_API_CALL dd_prefetch_create(const OrtCustomOp *, const OrtApi * api, const OrtKernelInfo * info,
                                            void ** kernel);
OrtStatus * ORT_API_CALL dd_prefetch_compute(void * kernel_ptr, OrtKernelContext * ctx);

}  // namespace dd_ort
