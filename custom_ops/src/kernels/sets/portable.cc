// Baseline kernel set: built with the target's default flags (x86-64 SSE2, aarch64 NEON).
#include "kernels/kernels.h"

#include <cmath>
#include <cstring>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace dd_portable {
#include "kernels/impl/kernels.inc"

void sgmm_chunk(const dd_sgmm_params * p, int64_t n, int64_t o0, int64_t o1, int64_t j0, int64_t j1, float * y) {
    dd_sgmm_chunk_impl(p, n, o0, o1, j0, j1, y);
}
}  // namespace dd_portable
