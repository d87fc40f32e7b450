// x86-64-v4 kernel set with AVX512-VNNI: the same kernels as avx2.cc (256-bit vectors),
// plus vpdpbusd for the int8 dot products of accuracy level 4. Built with -march=x86-64-v4
// -mavx512vnni and called only after a CPUID check (kernels/dispatch.cc).
#include "kernels/kernels.h"

#include <cmath>
#include <cstring>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dd_avx512 {
#include "kernels/impl/kernels.inc"

void sgmm_chunk(const dd_sgmm_params * p, int64_t n, int64_t o0, int64_t o1, int64_t j0, int64_t j1, float * y) {
    dd_sgmm_chunk_impl(p, n, o0, o1, j0, j1, y);
}
}  // namespace dd_avx512
