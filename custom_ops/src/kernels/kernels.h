// Kernels of the dipdeploy custom ops, free of ONNX Runtime types (ort/ is the ORT glue).
// Every pointer and index handed to these functions has been validated by the caller: the kernels
// never check bounds themselves, so they must only be reached through ort/.
#pragma once

#include "kernels/formats.h"

#include <cstddef>
#include <cstdint>

// One SparseGatherMatMul call: Y[n] = sum_j X[n, idx[n, j]] * W[rows[n, j], :].
struct dd_sgmm_params {
    dd_format format;
    int64_t accuracy_level;      // bq4: >= 4 takes the int8-coefficient path (README, "accuracy level")
    int64_t n, d, k, o;          // X [n, d], idx/rows [n, k], Y [n, o]
    const float * x;
    const int64_t * idx;         // columns of X
    const int64_t * rows;        // rows of W (== idx unless slab mode)
    float * y;
    // fp32 / fp16: W [R, w_stride] (elements)
    const void * w;
    int64_t w_stride;
    // bq4: qweight [R, q_stride] bytes, scales fp16 [R, nb], zeros [R, z_stride] bytes (may be null)
    const uint8_t * q;
    int64_t q_stride;
    const uint16_t * scales;
    int64_t nb;
    int64_t block;
    const uint8_t * zeros;
    int64_t z_stride;
    // vq3: codes [R, codes_stride] bytes, codebooks int8 [ngr, ngc, 64, 2], scales fp16 [ngr, ngc];
    // row j decodes codes[rows[j]] with the group of idx[j] / group_rows (the original row, also in slab mode)
    const uint8_t * codes;
    int64_t codes_stride;
    const int8_t * cb;
    const uint16_t * cb_scales;
    int64_t group_rows, group_cols, ngc;
    // bq4 at level 4, may be null: the int8 kernels set nonfinite_rows[n] = 1 (a relaxed atomic store,
    // tasks of one row may run at once) when a coefficient c = s[row_j, b] * X[n, idx_j] of row n is
    // NaN or ±Inf, or a chunk's 127 / max|c| overflows. int8 cannot represent those, so the caller
    // recomputes such rows at level 0 (custom_ops/README.md, "accuracy level"); their level-4 output
    // is meaningless.
    uint8_t * nonfinite_rows;
};

// Selected rows that share one int8 coefficient scale at accuracy level 4; row groups split across
// tasks start at multiples of it, so the result does not depend on the thread count.
constexpr int64_t DD_I8_ROWS = 32;

// Column granularity of a work chunk: chunk edges are multiples of this (BQ4 blocks align).
constexpr int64_t DD_CHUNK_ALIGN = 128;

// One work item: y[o0:o1) = sum over selected rows j in [j0, j1) of X[n_row] row n_row's terms.
// `y` is the start of a destination row of length p->o (Y itself, or a partial-sum row when the
// selected rows are split across tasks). o0 is a multiple of DD_CHUNK_ALIGN.
void dd_sgmm_chunk(const dd_sgmm_params * p, int64_t n_row, int64_t o0, int64_t o1, int64_t j0, int64_t j1,
                   float * y);

// Name of the kernel set picked for this CPU ("avx512vnni", "avx2", "portable", "neon-dotprod" or "neon").
const char * dd_kernels_isa();

// One TopKColumnMask row: the DIP-CA score of dipdeploy/cache/score.py, then top-k (largest first,
// ties to the lower index, NaN last). resident (the bytes of a bool[d] tensor: nonzero = resident) and
// colnorm (float[d]) may be null. resident is read as bytes because ORT hands a bool tensor's bytes over
// as they were fed, and a byte other than 0 or 1 read as a C++ bool is undefined behaviour.
struct dd_topk_params {
    int64_t d, k;
    float gamma;
    int64_t fixed_top_n;
};
void dd_topk_row(const dd_topk_params * p, const float * x, const uint8_t * resident, const float * colnorm,
                 int64_t * out);
