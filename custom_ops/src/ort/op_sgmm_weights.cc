// SparseGatherMatMul's weight inputs: their count, dtypes and shapes checked against each other and the
// attributes, then handed to the kernels in dd_sgmm_params. The contract is custom_ops/README.md.
#include "ort/ops.h"

namespace dd_ort {

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

}  // namespace dd_ort
