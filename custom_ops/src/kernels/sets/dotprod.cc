// aarch64 kernel set for ARMv8.2 CPUs with the dot-product extension (Cortex-A55/A75 and later: every
// recent phone core): the NEON kernels of the baseline set plus sdot for BQ4 at accuracy level 4.
// Built with -march=armv8.2-a+dotprod and called only after a HWCAP check (kernels/dispatch.cc), so the
// library still loads on ARMv8.0 cores (Cortex-A53/A72, Raspberry Pi 3/4).
#include "kernels/kernels.h"

#include <arm_neon.h>
#include <cmath>
#include <cstring>
#include <vector>

namespace dd_dotprod {
#include "kernels/impl/kernels.inc"

void sgmm_chunk(const dd_sgmm_params * p, int64_t n, int64_t o0, int64_t o1, int64_t j0, int64_t j1, float * y) {
    dd_sgmm_chunk_impl(p, n, o0, o1, j0, j1, y);
}
}  // namespace dd_dotprod
