// Kernel dispatch: the kernel set (kernels/sets/) for this CPU, decided once by its features.
#include "kernels/kernels.h"

#include <cstdlib>
#include <cstring>
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
