// The format traits table (formats.h) through a C ABI, for Python (ctypes) to read and hold equal to
// dipdeploy/ops/formats.py (tests/test_traits_native.py). Nothing in the library calls these.
#include "kernels/formats.h"

#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t kBadArgs = -6;  // as the cache's C ABI: no such format, array or trait

const dd_format_traits * format_at(int64_t f) {
    return f >= 0 && f < DD_FORMAT_COUNT ? &DD_FORMATS[f] : nullptr;
}

}  // namespace

extern "C" {

// How many formats the table holds; format f in [0, count) is dd_format f.
__attribute__((visibility("default"))) int64_t dd_format_count(void) {
    return DD_FORMAT_COUNT;
}

// The `format` attribute of format f, or NULL.
__attribute__((visibility("default"))) const char * dd_format_name(int64_t f) {
    const dd_format_traits * t = format_at(f);
    return t ? t->name : nullptr;
}

// One integer trait of format f, named as its field in formats.h: "arrays" (weight inputs, the required
// ones first), "optional" (how many of them are optional), "packed", "bits" (per column of a row),
// "block_min" (0: no blocks), "grouped", "int8_level4"; booleans are 0 or 1. -6: no such format or trait.
__attribute__((visibility("default"))) int64_t dd_format_trait(int64_t f, const char * trait) {
    const dd_format_traits * t = format_at(f);
    if (!t || !trait) return kBadArgs;
    const struct {
        const char * name;
        int64_t value;
    } traits[] = {{"arrays", t->n_arrays},     {"optional", t->n_optional},   {"packed", t->packed},
                  {"bits", t->bits},           {"block_min", t->block_min},   {"grouped", t->grouped},
                  {"int8_level4", t->int8_level4}};
    for (const auto & e : traits)
        if (std::strcmp(e.name, trait) == 0) return e.value;
    return kBadArgs;
}

// Weight input a of format f: its name, dtype (numpy's name), rank and whether it is shared (indexed by
// the original row's group: a slab keeps it whole). Returns 0, or -6 for no such format or input.
__attribute__((visibility("default"))) int64_t dd_format_array(int64_t f, int64_t a, const char ** name,
                                                               const char ** dtype, int64_t * rank, int64_t * shared) {
    const dd_format_traits * t = format_at(f);
    if (!t || a < 0 || a >= t->n_arrays || !name || !dtype || !rank || !shared) return kBadArgs;
    const dd_weight_array & arr = t->arrays[a];
    *name = arr.name;
    *dtype = DD_DTYPE_NAMES[arr.dtype];
    *rank = arr.rank;
    *shared = arr.shared;
    return 0;
}

}  // extern "C"
