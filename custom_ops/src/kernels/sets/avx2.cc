// x86-64-v3 kernel set (AVX2, FMA, F16C): this file alone is built with -march=x86-64-v3 and is
// called only after a CPUID check (kernels/dispatch.cc), so the library still loads on older x86-64 CPUs.
#include "kernels/kernels.h"

#include <cmath>
#include <cstring>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dd_avx2 {
#include "kernels/impl/kernels.inc"

void sgmm_chunk(const dd_sgmm_params * p, int64_t n, int64_t o0, int64_t o1, int64_t j0, int64_t j1, float * y) {
    dd_sgmm_chunk_impl(p, n, o0, o1, j0, j1, y);
}
}  // namespace dd_avx2
