// Kernel-level test of libdipdeploy_ops's kernels, without ONNX Runtime, so it also runs under
// qemu-aarch64 for the NEON paths. Each case compares dd_sgmm_chunk (split into column chunks and
// row groups as ort/op_sgmm.cc does) against an independent double-precision decode of the same packed
// data, and dd_topk_row against a stable sort. Exit status 0 = all cases pass.
#include "kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

namespace {

float half_to_float(uint16_t h) {
    const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
    return (float) ((h & 0x8000) ? -v : v);
}

uint16_t float_to_half(float f) {  // truncating; magnitudes below the normal half range become zero
    uint32_t b;
    std::memcpy(&b, &f, 4);
    const uint32_t sign = (b >> 16) & 0x8000;
    const int e = (int) ((b >> 23) & 0xFF) - 112;
    if (e <= 0) {
        return (uint16_t) sign;
    }
    return (uint16_t) (sign | ((uint32_t) e << 10) | ((b >> 13) & 0x3FF));
}

struct test_case {
    dd_format format;
    int64_t rows, cols, k, block_or_gc, group_rows;
    bool zeros;
    int64_t slab_rows;  // 0: full mode (W has the D = rows rows); else W is a slab of this many rows, read via slots
    int64_t level = 0;  // accuracy_level (4: BQ4 int8 coefficients)
};


// Independent decode of W row r, column c, in double; `orig` is the original row it holds (VQ3's group).
double weight_at(const dd_sgmm_params & p, int64_t r, int64_t orig, int64_t c) {
    switch (p.format) {
        case DD_FORMAT_FP32: return static_cast<const float *>(p.w)[r * p.w_stride + c];
        case DD_FORMAT_FP16: return half_to_float(static_cast<const uint16_t *>(p.w)[r * p.w_stride + c]);
        case DD_FORMAT_BQ4: {
            const uint8_t byte = p.q[r * p.q_stride + c / 2];
            const int q = (c % 2) ? byte >> 4 : byte & 15;
            const int64_t b = c / p.block;
            const int z = p.zeros ? (p.zeros[r * p.z_stride + b / 2] >> (4 * (b % 2))) & 15 : 8;
            return (double) (q - z) * half_to_float(p.scales[r * p.nb + b]);
        }
        case DD_FORMAT_VQ3: {
            const int64_t v = c / 2, bit = 6 * v;
            int code = 0;
            for (int i = 0; i < 6; ++i) {
                const int64_t bb = bit + i;
                code |= ((p.codes[r * p.codes_stride + bb / 8] >> (bb % 8)) & 1) << i;
            }
            const int64_t g = (orig / p.group_rows) * p.ngc + (2 * v) / p.group_cols;
            return (double) p.cb[g * 128 + 2 * code + c % 2] * half_to_float(p.cb_scales[g]);
        }
    }
    return 0.0;
}

// Independent level-4 reference (README, "accuracy level"): chunks of DD_I8_ROWS selected rows in index
// order, per chunk and block one coefficient scale, integer sums, then y += σ · sum, in double.
std::vector<double> level4_reference(const dd_sgmm_params & p, const std::vector<float> & x,
                                     const std::vector<int64_t> & idx) {
    std::vector<double> ref(p.o, 0.0);
    for (int64_t g0 = 0; g0 < p.k; g0 += DD_I8_ROWS) {
        const int64_t g1 = std::min(p.k, g0 + DD_I8_ROWS);
        for (int64_t b = 0; b * p.block < p.o; ++b) {
            std::vector<float> c;
            float amax = 0.0f;
            for (int64_t j = g0; j < g1; ++j) {
                c.push_back(half_to_float(p.scales[p.rows[j] * p.nb + b]) * x[idx[j]]);
                amax = std::max(amax, std::fabs(c.back()));
            }
            const float inv = amax > 0.0f ? 127.0f / amax : 0.0f, sigma = amax / 127.0f;
            for (int64_t col = b * p.block; col < std::min(p.o, (b + 1) * p.block); ++col) {
                long acc = 0;
                for (int64_t j = g0; j < g1; ++j) {
                    const long cq = std::lrint(std::min(127.0f, std::max(-127.0f, c[j - g0] * inv)));
                    const double w = weight_at(p, p.rows[j], idx[j], col) / half_to_float(p.scales[p.rows[j] * p.nb + b]);
                    acc += cq * std::lrint(w);  // q - z, recovered exactly from the decoded weight
                }
                ref[col] += (double) sigma * (double) acc;
            }
        }
    }
    return ref;
}

bool run_sgmm(const test_case & tc, std::mt19937 & rng) {
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::uniform_int_distribution<int> byte(0, 255);
    const int64_t D = tc.rows, R = tc.slab_rows ? tc.slab_rows : D, O = tc.cols, k = tc.k;
    std::vector<float> x(D), wf, y(O, 0.0f);
    std::vector<uint16_t> wh, scales;
    std::vector<uint8_t> q, zeros, codes;
    std::vector<int8_t> cb;
    std::vector<int64_t> idx(D), slots(R);
    std::iota(idx.begin(), idx.end(), 0);
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(k);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(k);
    for (auto & v : x) v = uni(rng);
    dd_sgmm_params p{};
    p.format = tc.format;
    p.accuracy_level = tc.level;
    p.n = 1; p.d = D; p.k = k; p.o = O;
    p.x = x.data(); p.idx = idx.data(); p.rows = tc.slab_rows ? slots.data() : idx.data(); p.y = y.data();
    if (tc.format == DD_FORMAT_FP32) {
        wf.resize(R * O);
        for (auto & v : wf) v = uni(rng);
        p.w = wf.data(); p.w_stride = O;
    } else if (tc.format == DD_FORMAT_FP16) {
        wh.resize(R * O);
        for (auto & v : wh) v = float_to_half(0.5f + 0.5f * uni(rng));
        p.w = wh.data(); p.w_stride = O;
    } else if (tc.format == DD_FORMAT_BQ4) {
        const int64_t B = tc.block_or_gc, nb = (O + B - 1) / B;
        q.resize(R * nb * B / 2);
        for (auto & v : q) v = (uint8_t) byte(rng);
        scales.resize(R * nb);
        for (auto & v : scales) v = float_to_half(0.01f + 0.01f * uni(rng));
        p.q = q.data(); p.q_stride = nb * B / 2; p.scales = scales.data(); p.nb = nb; p.block = B;
        if (tc.zeros) {
            zeros.resize(R * ((nb + 1) / 2));
            for (auto & v : zeros) v = (uint8_t) byte(rng);
            p.zeros = zeros.data(); p.z_stride = (nb + 1) / 2;
        }
    } else {
        const int64_t gc = tc.block_or_gc, gr = tc.group_rows;
        // Codebooks cover the original D rows; a slab holds only the codes of its R rows.
        const int64_t ngr = (D + gr - 1) / gr, ngc = (O + gc - 1) / gc, stride = (6 * (O / 2) + 7) / 8;
        codes.resize(R * stride);
        for (auto & v : codes) v = (uint8_t) byte(rng);
        cb.resize(ngr * ngc * 128);
        for (auto & v : cb) v = (int8_t) (byte(rng) - 128);
        scales.resize(ngr * ngc);
        for (auto & v : scales) v = float_to_half(0.01f + 0.005f * uni(rng));
        p.codes = codes.data(); p.codes_stride = stride; p.cb = cb.data(); p.cb_scales = scales.data();
        p.group_rows = gr; p.group_cols = gc; p.ngc = ngc;
    }
    // Split like ort/op_sgmm.cc: 2 row groups summed (the split at a multiple of DD_I8_ROWS), columns in
    // chunks of 256, or 1280 for wide outputs (level 4 takes another loop order past 1024 columns).
    const int64_t chunk = O >= 2048 ? 1280 : 256, half = (k / 2) / DD_I8_ROWS * DD_I8_ROWS;
    std::vector<float> part(O, 0.0f);
    for (int64_t o0 = 0; o0 < O; o0 += chunk) {
        const int64_t o1 = std::min(O, o0 + chunk);
        dd_sgmm_chunk(&p, 0, o0, o1, 0, half, y.data());
        dd_sgmm_chunk(&p, 0, o0, o1, half, k, part.data());
    }
    double err = 0.0, ref2 = 0.0;
    const std::vector<double> ref4 = tc.level >= 4 ? level4_reference(p, x, idx) : std::vector<double>();
    for (int64_t c = 0; c < O; ++c) {
        double ref = 0.0;
        for (int64_t j = 0; j < k; ++j) ref += (double) x[idx[j]] * weight_at(p, p.rows[j], idx[j], c);
        if (tc.level >= 4) {
            ref = ref4[c];
        }
        const double got = (double) y[c] + (double) part[c];
        err += (got - ref) * (got - ref);
        ref2 += ref * ref;
    }
    const double nmse = err / std::max(ref2, 1e-30);
    const bool ok = nmse <= 1e-10;
    std::printf("%s sgmm format=%d level=%lld D=%lld R=%lld O=%lld k=%lld%s nmse=%.3g\n", ok ? "ok  " : "FAIL",
                (int) tc.format, (long long) tc.level, (long long) D, (long long) R, (long long) O, (long long) k,
                tc.slab_rows ? " slab" : "", nmse);
    return ok;
}

// Level 4 on a row with a coefficient of NaN or ±Inf (from an activation, a scale, or a product that
// overflows): the int8 kernels flag the row, whichever task (column chunk, row group) holds that
// coefficient, so ort/op_sgmm.cc recomputes it at level 0; a finite row stays unflagged.
bool run_level4_nonfinite(std::mt19937 & rng) {
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::uniform_int_distribution<int> byte(0, 255);
    const int64_t D = 100, O = 1000, B = 64, nb = (O + B - 1) / B, k = 70;
    std::vector<float> x(D);
    std::vector<uint8_t> q(D * nb * B / 2);
    std::vector<uint16_t> scales(D * nb);
    std::vector<int64_t> idx(D);
    for (auto & v : x) v = uni(rng);
    for (auto & v : q) v = (uint8_t) byte(rng);
    for (auto & v : scales) v = float_to_half(0.01f + 0.01f * uni(rng));
    std::iota(idx.begin(), idx.end(), 0);
    std::shuffle(idx.begin(), idx.end(), rng);
    dd_sgmm_params p{};
    p.format = DD_FORMAT_BQ4;
    p.accuracy_level = 4;
    p.n = 1; p.d = D; p.k = k; p.o = O;
    p.idx = idx.data(); p.rows = idx.data();
    p.q = q.data(); p.q_stride = nb * B / 2; p.nb = nb; p.block = B;
    std::vector<float> y(O), part(O);
    // Split like ort/op_sgmm.cc: column chunks of 256, two row groups at a multiple of DD_I8_ROWS.
    auto flagged = [&](const std::vector<float> & xc, const std::vector<uint16_t> & sc) {
        uint8_t flag = 0;
        p.x = xc.data(); p.scales = sc.data(); p.nonfinite_rows = &flag;
        for (int64_t o0 = 0; o0 < O; o0 += 256) {
            dd_sgmm_chunk(&p, 0, o0, std::min(O, o0 + 256), 0, DD_I8_ROWS, y.data());
            dd_sgmm_chunk(&p, 0, o0, std::min(O, o0 + 256), DD_I8_ROWS, k, part.data());
        }
        return flag != 0;
    };
    bool ok = !flagged(x, scales);
    std::printf("%s level4 finite row not flagged\n", ok ? "ok  " : "FAIL");
    const struct { float x; uint16_t scale; int64_t j, b; const char * what; } cases[] = {
        {INFINITY, 0, 3, 0, "x=+inf"}, {-INFINITY, 0, 40, 0, "x=-inf"}, {NAN, 0, 69, 0, "x=nan"},
        {0.0f, 0x7C00, 5, nb - 1, "scale=+inf (last block)"}, {0.0f, 0xFE00, 50, 6, "scale=nan"},
        {1e35f, 0x7BFF, 33, 9, "x=1e35 * scale=65504 overflows"}};
    for (const auto & c : cases) {
        std::vector<float> xc = x;
        std::vector<uint16_t> sc = scales;
        if (c.scale) {
            sc[idx[c.j] * nb + c.b] = c.scale;
        }
        if (c.x != 0.0f) {
            xc[idx[c.j]] = c.x;
        }
        const bool case_ok = flagged(xc, sc);
        std::printf("%s level4 non-finite %s flagged\n", case_ok ? "ok  " : "FAIL", c.what);
        ok = case_ok && ok;
    }
    // A whole row of tiny activations: max|c| < 127 / FLT_MAX, so 127 / max|c| overflows (flagged);
    // 1e6 times larger it does not.
    for (const float scale : {1e-36f, 1e-30f}) {
        std::vector<float> xc = x;
        for (auto & v : xc) v *= scale;
        const bool want = scale < 1e-33f, case_ok = flagged(xc, scales) == want;
        std::printf("%s level4 x*%g %s\n", case_ok ? "ok  " : "FAIL", (double) scale, want ? "flagged" : "not flagged");
        ok = case_ok && ok;
    }
    return ok;
}

bool run_topk(int64_t d, int64_t k, float gamma, int64_t fixed, bool cache, std::mt19937 & rng) {
    std::vector<float> x(d);
    std::vector<uint8_t> res(d);
    std::uniform_int_distribution<int> small(-4, 4);
    for (int64_t i = 0; i < d; ++i) {
        x[i] = 0.5f * (float) small(rng);  // many ties
        res[i] = (rng() & 1) ? (uint8_t) (1 + rng() % 255) : 0;  // any nonzero byte is resident
    }
    std::vector<float> m(d), s(d);
    float peak = 0.0f;
    for (int64_t i = 0; i < d; ++i) peak = std::max(peak, m[i] = std::fabs(x[i]));
    const float safe = peak > 0.0f ? peak : 1.0f;
    std::vector<int64_t> order(d);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return m[a] > m[b]; });
    for (int64_t i = 0; i < d; ++i) s[i] = m[i] / safe;
    if (cache && gamma != 1.0f) {
        std::vector<bool> exempt(d, false);
        for (int64_t i = 0; i < std::min(fixed, d); ++i) exempt[order[i]] = true;
        for (int64_t i = 0; i < d; ++i) s[i] = s[i] * ((res[i] || exempt[i]) ? 1.0f : gamma);
    }
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
    std::vector<int64_t> out(k);
    const dd_topk_params tp{d, k, gamma, fixed};
    dd_topk_row(&tp, x.data(), cache ? res.data() : nullptr, nullptr, out.data());
    const bool ok = std::equal(out.begin(), out.end(), order.begin());
    std::printf("%s topk d=%lld k=%lld gamma=%g fixed=%lld cache=%d\n", ok ? "ok  " : "FAIL", (long long) d,
                (long long) k, (double) gamma, (long long) fixed, (int) cache);
    return ok;
}

}  // namespace

int main() {
    std::mt19937 rng(1234);
    std::printf("kernel set: %s\n", dd_kernels_isa());
    const test_case cases[] = {
        {DD_FORMAT_FP32, 300, 1000, 150, 0, 0, false, 0},  {DD_FORMAT_FP16, 300, 1000, 151, 0, 0, false, 0},
        {DD_FORMAT_BQ4, 300, 1024, 150, 32, 0, false, 0},  {DD_FORMAT_BQ4, 200, 1000, 77, 64, 0, true, 0},
        {DD_FORMAT_BQ4, 130, 640, 64, 128, 0, false, 0},   {DD_FORMAT_VQ3, 300, 1024, 150, 256, 32, false, 0},
        {DD_FORMAT_VQ3, 257, 576, 100, 192, 40, false, 0}, {DD_FORMAT_VQ3, 64, 1000, 33, 250, 7, false, 0},
        {DD_FORMAT_BQ4, 200, 1000, 77, 64, 0, true, 90},
        {DD_FORMAT_VQ3, 300, 1024, 150, 256, 32, false, 170}, {DD_FORMAT_VQ3, 64, 1000, 33, 250, 7, false, 500},
        {DD_FORMAT_BQ4, 300, 1024, 150, 32, 0, false, 0, 4}, {DD_FORMAT_BQ4, 200, 1000, 77, 64, 0, true, 0, 4},
        {DD_FORMAT_BQ4, 130, 640, 45, 128, 0, false, 0, 4},  {DD_FORMAT_BQ4, 200, 1000, 77, 64, 0, true, 90, 4},
        {DD_FORMAT_BQ4, 100, 600, 3, 32, 0, false, 0, 4},    {DD_FORMAT_BQ4, 100, 600, 40, 16, 0, false, 0, 4},
        {DD_FORMAT_BQ4, 150, 960, 70, 96, 0, false, 0, 4},   {DD_FORMAT_BQ4, 150, 1000, 70, 96, 0, true, 0, 4},
        {DD_FORMAT_BQ4, 120, 2560, 100, 32, 0, false, 0, 4}, {DD_FORMAT_BQ4, 120, 2600, 45, 64, 0, true, 80, 4},
        {DD_FORMAT_BQ4, 120, 2560, 100, 32, 0, false, 0, 0},
    };
    bool ok = true;
    for (const auto & tc : cases) ok = run_sgmm(tc, rng) && ok;
    ok = run_level4_nonfinite(rng) && ok;
    ok = run_topk(300, 50, 1.0f, 0, false, rng) && ok;
    ok = run_topk(300, 100, 0.2f, 3, true, rng) && ok;
    ok = run_topk(4096, 1024, 0.3f, 0, true, rng) && ok;
    std::printf(ok ? "all ok\n" : "FAILED\n");
    return ok ? 0 : 1;
}
