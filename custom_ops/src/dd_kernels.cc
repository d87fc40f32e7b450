// Kernel dispatch (by CPU features, decided once) and the TopKColumnMask row kernel.
#include "dd_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace dd_portable {
void sgmm_chunk(const dd_sgmm_params * p, int64_t n, int64_t o0, int64_t o1, int64_t j0, int64_t j1, float * y);
}
#if defined(DD_WITH_AVX2)
namespace dd_avx2 {
void sgmm_chunk(const dd_sgmm_params * p, int64_t n, int64_t o0, int64_t o1, int64_t j0, int64_t j1, float * y);
}
#endif

using dd_chunk_fn = void (*)(const dd_sgmm_params *, int64_t, int64_t, int64_t, int64_t, int64_t, float *);

static bool dd_cpu_has_avx2() {
#if defined(DD_WITH_AVX2)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

// $DIPDEPLOY_OPS_ISA=portable forces the baseline kernels (tests use it to cover them on AVX2 machines).
static bool dd_force_portable() {
    const char * isa = std::getenv("DIPDEPLOY_OPS_ISA");
    return isa != nullptr && std::strcmp(isa, "portable") == 0;
}

static dd_chunk_fn dd_pick_chunk_fn() {
#if defined(DD_WITH_AVX2)
    if (dd_cpu_has_avx2() && !dd_force_portable()) {
        return dd_avx2::sgmm_chunk;
    }
#endif
    return dd_portable::sgmm_chunk;
}

void dd_sgmm_chunk(const dd_sgmm_params * p, int64_t n_row, int64_t o0, int64_t o1, int64_t j0, int64_t j1,
                   float * y) {
    static const dd_chunk_fn fn = dd_pick_chunk_fn();
    fn(p, n_row, o0, o1, j0, j1, y);
}

const char * dd_kernels_isa() {
    if (dd_cpu_has_avx2() && !dd_force_portable()) {
        return "avx2";
    }
#if defined(__aarch64__)
    return "neon";
#else
    return "portable";
#endif
}

// Larger score first, then lower index; NaN sorts after every number (as numpy's argsort of -s).
struct dd_score_greater {
    const float * s;
    bool operator()(int32_t a, int32_t b) const {
        const float sa = s[a], sb = s[b];
        const bool na = std::isnan(sa), nb = std::isnan(sb);
        if (na || nb) {
            return (na == nb) ? a < b : nb;
        }
        return sa > sb || (sa == sb && a < b);
    }
};

// The k first of idx[0:d) under `cmp`, sorted, into idx[0:k).
static void dd_select(std::vector<int32_t> & idx, int64_t d, int64_t k, const dd_score_greater & cmp) {
    for (int64_t i = 0; i < d; ++i) {
        idx[i] = (int32_t) i;
    }
    if (k < d) {
        std::nth_element(idx.begin(), idx.begin() + k, idx.begin() + d, cmp);
    }
    std::sort(idx.begin(), idx.begin() + k, cmp);
}

void dd_topk_row(const dd_topk_params * p, const float * x, const bool * resident, const float * colnorm,
                 int64_t * out) {
    // Per-thread scratch: grows to the largest d seen, then no allocation per call.
    thread_local std::vector<float> mag, score;
    thread_local std::vector<int32_t> idx;
    const int64_t d = p->d;
    if ((int64_t) mag.size() < d) {
        mag.resize(d);
        score.resize(d);
        idx.resize(d);
    }
    // Same float32 operations, in the same order, as dipdeploy/cache/score.py.
    float peak = -INFINITY;
    bool peak_nan = false;
    for (int64_t i = 0; i < d; ++i) {
        float m = std::fabs(x[i]);
        if (colnorm) {
            m = m * colnorm[i];
        }
        mag[i] = m;
        peak_nan |= std::isnan(m);
        peak = m > peak ? m : peak;
    }
    if (peak_nan) {
        peak = NAN;
    }
    const float safe = peak > 0.0f ? peak : 1.0f;
    for (int64_t i = 0; i < d; ++i) {
        score[i] = mag[i] / safe;
    }
    if (resident && p->gamma != 1.0f) {
        for (int64_t i = 0; i < d; ++i) {
            if (!resident[i]) {
                score[i] = score[i] * p->gamma;
            }
        }
        const int64_t n_top = std::min(p->fixed_top_n, d);
        if (n_top > 0) {
            dd_select(idx, d, n_top, dd_score_greater{mag.data()});
            for (int64_t i = 0; i < n_top; ++i) {
                score[idx[i]] = mag[idx[i]] / safe;
            }
        }
    }
    dd_select(idx, d, p->k, dd_score_greater{score.data()});
    for (int64_t i = 0; i < p->k; ++i) {
        out[i] = idx[i];
    }
}
