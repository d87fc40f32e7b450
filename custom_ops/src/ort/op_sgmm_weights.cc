// SparseGatherMatMul's weight inputs: their count, dtypes and ranks from the format's record
// (kernels/formats.h), then each format's shape rule, the shapes checked against each other and the
// attributes, then handed to the kernels in dd_sgmm_params. The contract is custom_ops/README.md.
#include "ort/ops.h"

#include <cstdio>

namespace dd_ort {

namespace {

constexpr const char * OP = "SparseGatherMatMul";

// ORT's element type of each dd_dtype.
constexpr ONNXTensorElementDataType DD_ORT_TYPES[] = {
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8};
static_assert(sizeof(DD_ORT_TYPES) / sizeof(DD_ORT_TYPES[0]) == sizeof(DD_DTYPE_NAMES) / sizeof(DD_DTYPE_NAMES[0]),
              "one ORT type per dd_dtype");

// Weight input i: the dtype and rank its format's record gives it.
OrtStatus * dd_expect_array(const OrtApi * api, const dd_format_traits & f, const dd_view * w, int i) {
    const dd_weight_array & a = f.arrays[i];
    return dd_expect(api, w[i], OP, a.name, DD_ORT_TYPES[a.dtype], (size_t) a.rank);
}

// One format's shape rule: the weight inputs (their count already checked) against each other and the
// attributes, and the format's part of `p`.
using dd_weights_rule = OrtStatus * (*) (const dd_sgmm_kernel * kn, const dd_format_traits & f, const dd_view * w,
                                         size_t n_w, bool slab, int64_t d, dd_sgmm_params * p, int64_t * rows_out);

// fp32 / fp16: W [R, O].
OrtStatus * dd_dense_rule(const dd_sgmm_kernel * kn, const dd_format_traits & f, const dd_view * w, size_t,
                          bool, int64_t, dd_sgmm_params * p, int64_t * rows_out) {
    const OrtApi * api = kn->api;
    const char * op = OP;
    DD_TRY(dd_expect_array(api, f, w, 0));
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

// bq4: qweight [R, Cp/2], scales [R, nb], zeros [R, ceil(nb/2)] (optional); the block size from the shapes.
OrtStatus * dd_bq4_rule(const dd_sgmm_kernel * kn, const dd_format_traits & f, const dd_view * w, size_t n_w,
                        bool, int64_t, dd_sgmm_params * p, int64_t * rows_out) {
    const OrtApi * api = kn->api;
    const char * op = OP;
    DD_TRY(dd_expect_array(api, f, w, 0));
    DD_TRY(dd_expect_array(api, f, w, 1));
    const int64_t R = w[0].dims[0], qs = w[0].dims[1], nb = w[1].dims[1];
    if (w[1].dims[0] != R || nb < 1 || (2 * qs) % nb != 0) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: bq4 scales [%lld, %lld] do not match qweight [%lld, %lld]",
                        op, (long long) w[1].dims[0], (long long) nb, (long long) R, (long long) qs);
    }
    const int64_t B = 2 * qs / nb;
    if (B < f.block_min || DD_CHUNK_ALIGN % B != 0) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: bq4 block size %lld must divide %lld (use 32, 64 or 128)",
                        op, (long long) B, (long long) DD_CHUNK_ALIGN);
    }
    if (kn->cols <= (nb - 1) * B || kn->cols > nb * B) {
        return dd_error(api, ORT_INVALID_ARGUMENT, "%s: attribute cols=%lld does not fit %lld blocks of %lld", op,
                        (long long) kn->cols, (long long) nb, (long long) B);
    }
    p->zeros = nullptr;
    if (n_w == 3) {
        DD_TRY(dd_expect_array(api, f, w, 2));
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

// vq3: codes [R, ceil(3 cols / 8)], codebooks int8 [ngr, ngc, 64, 2], codebook_scales [ngr, ngc]; `slab` (slots
// present) and `d` (X's width) say which rows the codebooks cover: in slab mode the original D rows (a slab
// holds codes only, in any number of rows), otherwise the R rows of the codes.
OrtStatus * dd_vq3_rule(const dd_sgmm_kernel * kn, const dd_format_traits & f, const dd_view * w, size_t,
                        bool slab, int64_t d, dd_sgmm_params * p, int64_t * rows_out) {
    const OrtApi * api = kn->api;
    const char * op = OP;
    DD_TRY(dd_expect_array(api, f, w, 0));
    DD_TRY(dd_expect_array(api, f, w, 1));
    DD_TRY(dd_expect_array(api, f, w, 2));
    const int64_t R = w[0].dims[0], C = kn->cols;
    int64_t code_bits = 0;  // 6 bits per pair of columns: the record's bits per column
    if (C < 2 || C % 2 != 0 || !dd_i64_mul(f.bits, C, &code_bits) || w[0].dims[1] != dd_ceil_div(code_bits, 8)) {
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

// Per format, in the order of DD_FORMATS: its shape rule.
struct dd_format_rule {
    dd_format format;
    dd_weights_rule rule;
};
constexpr dd_format_rule DD_RULES[] = {
    {DD_FORMAT_FP32, dd_dense_rule},
    {DD_FORMAT_FP16, dd_dense_rule},
    {DD_FORMAT_BQ4, dd_bq4_rule},
    {DD_FORMAT_VQ3, dd_vq3_rule},
};

constexpr bool dd_rules_match_formats() {
    if (sizeof(DD_RULES) / sizeof(DD_RULES[0]) != (size_t) DD_FORMAT_COUNT) {
        return false;
    }
    for (int i = 0; i < DD_FORMAT_COUNT; ++i) {
        if (int(DD_RULES[i].format) != i) {
            return false;
        }
    }
    return true;
}
static_assert(dd_rules_match_formats(), "DD_RULES: one shape rule per DD_FORMATS record, in its order");

}  // namespace

OrtStatus * dd_sgmm_weights(const dd_sgmm_kernel * kn, const dd_view * w, size_t n_w, bool slab, int64_t d,
                            dd_sgmm_params * p, int64_t * rows_out) {
    const dd_format_traits & f = dd_format_of(kn->format);
    const size_t lo = (size_t) (f.n_arrays - f.n_optional), hi = (size_t) f.n_arrays;
    if (n_w < lo || n_w > hi) {
        // "format bq4 takes qweight, scales[, zeros], got 1 inputs"
        char names[256] = {};
        size_t at = 0;
        for (int i = 0; i < f.n_arrays && at < sizeof(names); ++i) {
            at += (size_t) std::snprintf(names + at, sizeof(names) - at, "%s%s%s", (size_t) i == lo ? "[" : "",
                                         i == 0 ? "" : ", ", f.arrays[i].name);
        }
        return dd_error(kn->api, ORT_INVALID_ARGUMENT, "%s: format %s takes %s%s, got %zu inputs", OP, f.name, names,
                        f.n_optional > 0 ? "]" : "", n_w);
    }
    return DD_RULES[kn->format].rule(kn, f, w, n_w, slab, d, p, rows_out);
}

}  // namespace dd_ort
