// TopKColumnMask: the DIP / DIP-CA column selection (kernels/topk.cc computes each row), on ORT's
// intra-op threads one row per task. The contract is custom_ops/README.md.
#include "ort/ops.h"

#include <new>
#include <string>

namespace dd_ort {

// ---------------------------------------------------------------------------------------------
// TopKColumnMask(X[N,D] f32, K? i64, C? bool [D]|[N,D], colnorm? f32 [D]) -> indices [N,k] i64

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

}  // namespace dd_ort
