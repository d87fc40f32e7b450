// The TopKColumnMask row kernel: the DIP-CA score of dipdeploy/cache/score.py, then top-k.
#include "kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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
