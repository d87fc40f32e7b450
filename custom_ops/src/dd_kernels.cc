// Kernel dispatch (by CPU features, decided once) and the TopKColumnMask row kernel.
#include "dd_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace dd_portable {
void sgmm_chunk(const dd_sgmm_params * p, int64_t n, int64_t o0, int64_t o1, int64_t j0, int64_t j1, float * y);
}
#if defined(DD_WITH_AVX2)
namespace dd_avx2 {
void sgmm_chunk(const dd_sgmm_params * p, int64_t n, int64_t o0, int64_t o1, int64_t j0, int64_t j1, float * y);
}
namespace dd_avx512 {
void sgmm_chunk(const dd_sgmm_params * p, int64_t n, int64_t o0, int64_t o1, int64_t j0, int64_t j1, float * y);
}
#endif
#if defined(DD_WITH_DOTPROD)
namespace dd_dotprod {
void sgmm_chunk(const dd_sgmm_params * p, int64_t n, int64_t o0, int64_t o1, int64_t j0, int64_t j1, float * y);
}
#endif

using dd_chunk_fn = void (*)(const dd_sgmm_params *, int64_t, int64_t, int64_t, int64_t, int64_t, float *);

#if defined(__aarch64__)
static bool dd_cpu_has_dotprod() {
#if defined(DD_WITH_DOTPROD) && defined(HWCAP_ASIMDDP)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
    return false;
#endif
}
#else
static bool dd_cpu_has_avx2() {
#if defined(DD_WITH_AVX2)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

static bool dd_cpu_has_avx512vnni() {
#if defined(DD_WITH_AVX2)
    __builtin_cpu_init();
    return dd_cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}
#endif

// $DIPDEPLOY_OPS_ISA=portable|avx2 caps the kernel set (tests use it to cover every set on one machine).
static bool dd_isa_capped_at(const char * name) {
    const char * isa = std::getenv("DIPDEPLOY_OPS_ISA");
    return isa != nullptr && std::strcmp(isa, name) == 0;
}

static const char * dd_pick_isa() {
#if defined(__aarch64__)
    // The baseline aarch64 set is NEON already; "portable" caps at it.
    return dd_cpu_has_dotprod() && !dd_isa_capped_at("portable") ? "neon-dotprod" : "neon";
#else
    if (dd_isa_capped_at("portable")) {
        return "portable";
    }
    if (dd_cpu_has_avx512vnni() && !dd_isa_capped_at("avx2")) {
        return "avx512vnni";
    }
    return dd_cpu_has_avx2() ? "avx2" : "portable";
#endif
}

static dd_chunk_fn dd_pick_chunk_fn() {
#if defined(DD_WITH_DOTPROD)
    if (std::strcmp(dd_pick_isa(), "neon-dotprod") == 0) {
        return dd_dotprod::sgmm_chunk;
    }
#endif
#if defined(DD_WITH_AVX2)
    const char * isa = dd_pick_isa();
    if (std::strcmp(isa, "avx512vnni") == 0) {
        return dd_avx512::sgmm_chunk;
    }
    if (std::strcmp(isa, "avx2") == 0) {
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
    return dd_pick_isa();
}

// Top-k selection in O(d + k): scores become order-preserving uint32 keys (ascending key = descending
// score, NaN last, -0 == +0), the k-th smallest key is found with nth_element, the k winners are taken
// in index order (so ties go to the lower index), then a stable LSD radix sort orders them by key.
// The key buffers hold d + 1 entries: the branch-free gather writes one slot past the last taken.
struct dd_topk_scratch {
    std::vector<uint32_t> key, key_copy, tmp_key;
    std::vector<int32_t> sel, tmp_sel;

    void reserve(int64_t d) {
        if ((int64_t) key.size() < d + 1) {
            key.resize(d + 1);
            key_copy.resize(d + 1);
            tmp_key.resize(d + 1);
            sel.resize(d + 1);
            tmp_sel.resize(d + 1);
        }
    }
};

static inline uint32_t dd_desc_key(float v) {
    if (std::isnan(v)) {
        return 0xFFFFFFFFu;
    }
    if (v == 0.0f) {
        v = 0.0f;  // -0 and +0 are equal scores
    }
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending u = ascending float
    return ~u;
}

// Indices of the k best of s[0:d) into out[0:k), best first, ties to the lower index.
static void dd_select(const float * s, int64_t d, int64_t k, dd_topk_scratch & sc, int32_t * out) {
    uint32_t * __restrict key = sc.key.data();
    uint32_t * __restrict key_copy = sc.key_copy.data();
    for (int64_t i = 0; i < d; ++i) {
        key[i] = key_copy[i] = dd_desc_key(s[i]);
    }
    std::nth_element(key_copy, key_copy + (k - 1), key_copy + d);
    const uint32_t cut = key_copy[k - 1];
    int64_t less = 0;
    for (int64_t i = 0; i < d; ++i) {
        less += key[i] < cut;
    }
    int64_t equal_left = k - less, n = 0;
    uint32_t * kin = sc.tmp_key.data();
    int32_t * iin = sc.sel.data();
    for (int64_t i = 0; i < d && n < k; ++i) {  // branch-free: write always, advance when taken
        const bool tie = key[i] == cut && equal_left > 0;
        const bool take = key[i] < cut || tie;
        equal_left -= tie;
        iin[n] = (int32_t) i;
        kin[n] = key[i];
        n += take;
    }
    // Stable LSD radix sort of (key, index) by key: 3 passes of 11 bits, skipping a pass whose digit
    // is the same for every key.
    uint32_t * kout = key_copy;
    int32_t * iout = sc.tmp_sel.data();
    for (int shift = 0; shift < 32; shift += 11) {
        uint32_t count[2049] = {0};
        for (int64_t i = 0; i < k; ++i) {
            ++count[((kin[i] >> shift) & 0x7FF) + 1];
        }
        if (count[((kin[0] >> shift) & 0x7FF) + 1] == (uint32_t) k) {
            continue;
        }
        for (int b = 0; b < 2048; ++b) {
            count[b + 1] += count[b];
        }
        for (int64_t i = 0; i < k; ++i) {
            const uint32_t pos = count[(kin[i] >> shift) & 0x7FF]++;
            kout[pos] = kin[i];
            iout[pos] = iin[i];
        }
        std::swap(kin, kout);
        std::swap(iin, iout);
    }
    std::copy(iin, iin + k, out);
}

void dd_topk_row(const dd_topk_params * p, const float * x, const uint8_t * resident, const float * colnorm,
                 int64_t * out) {
    // Per-thread scratch: grows to the largest d seen, then no allocation per call.
    thread_local std::vector<float> mag, score;
    thread_local std::vector<int32_t> top;
    thread_local dd_topk_scratch sc;
    const int64_t d = p->d;
    if ((int64_t) mag.size() < d) {
        mag.resize(d);
        score.resize(d);
        top.resize(d);
    }
    sc.reserve(d);
    float * __restrict m = mag.data();
    float * __restrict s = score.data();
    int32_t * t = top.data();
    // Same float32 operations, in the same order, as dipdeploy/cache/score.py.
    float peak = -INFINITY;
    bool peak_nan = false;
    for (int64_t i = 0; i < d; ++i) {
        m[i] = colnorm ? std::fabs(x[i]) * colnorm[i] : std::fabs(x[i]);
    }
    for (int64_t i = 0; i < d; ++i) {
        peak_nan |= std::isnan(m[i]);
        peak = m[i] > peak ? m[i] : peak;
    }
    if (peak_nan) {
        peak = NAN;
    }
    const float safe = peak > 0.0f ? peak : 1.0f;
    for (int64_t i = 0; i < d; ++i) {
        s[i] = m[i] / safe;
    }
    if (resident && p->gamma != 1.0f) {
        const float gamma = p->gamma;
        for (int64_t i = 0; i < d; ++i) {
            s[i] = resident[i] != 0 ? s[i] : s[i] * gamma;
        }
        const int64_t n_top = std::min(p->fixed_top_n, d);
        if (n_top > 0) {
            dd_select(m, d, n_top, sc, t);
            for (int64_t i = 0; i < n_top; ++i) {
                s[t[i]] = m[t[i]] / safe;
            }
        }
    }
    dd_select(s, d, p->k, sc, t);
    for (int64_t i = 0; i < p->k; ++i) {
        out[i] = t[i];
    }
}
