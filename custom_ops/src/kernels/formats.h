// The weight formats of SparseGatherMatMul: ONE traits table, which every part of the library reads
// (the ORT glue's attribute and weight-input checks, the work split, the kernels' dispatch), so a format's
// identity is one record here. It mirrors dipdeploy/ops/formats.py's WeightFormat records (name, the
// weight arrays' dtypes, how many are optional, quantised, the shared arrays), which the C ABI of
// formats.cc exports and tests/test_traits_native.py holds equal. Adding a format: its record below,
// then its kernel (kernels/impl/, listed in chunk.inc) and its shape rule (ort/op_sgmm_weights.cc); both
// lists are checked against this table at compile time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

enum dd_format {
    DD_FORMAT_FP32 = 0,
    DD_FORMAT_FP16 = 1,
    DD_FORMAT_BQ4  = 2,
    DD_FORMAT_VQ3  = 3,
};

// The element types of weight arrays, named as numpy (and formats.py) names them.
enum dd_dtype : uint8_t { DD_DTYPE_FLOAT32, DD_DTYPE_FLOAT16, DD_DTYPE_UINT8, DD_DTYPE_INT8 };
constexpr const char * DD_DTYPE_NAMES[] = {"float32", "float16", "uint8", "int8"};

constexpr int DD_FORMAT_MAX_ARRAYS = 3;

// One weight input of a format, in the op's input order.
struct dd_weight_array {
    const char * name;  // as errors name it (README, "SparseGatherMatMul")
    dd_dtype dtype;
    int rank;
    bool shared;        // indexed by the original row's group, not per W row: a slab keeps it whole
};

struct dd_format_traits {
    dd_format id;       // == its index in DD_FORMATS
    const char * name;  // the `format` attribute
    int n_arrays;       // weight inputs: the required ones, then n_optional optional ones
    int n_optional;
    dd_weight_array arrays[DD_FORMAT_MAX_ARRAYS];
    bool packed;        // quantised rows (formats.py `quantised`): the width O is the `cols` attribute, not a shape
    int bits;           // bits of weight data per column of a row (sets the work chunk's width)
    int block_min;      // > 0: rows in blocks of B columns with a scale each, B derived from the shapes, B >= block_min
                        // and dividing DD_CHUNK_ALIGN (kernels.h); 0: no blocks
    bool grouped;       // codebooks per group of group_rows x group_cols (attributes), shared by the group's rows
    bool int8_level4;   // accuracy_level 4 takes the int8-coefficient kernels (README, "accuracy level")
};

constexpr dd_format_traits DD_FORMATS[] = {
    {DD_FORMAT_FP32, "fp32", 1, 0, {{"W", DD_DTYPE_FLOAT32, 2, false}}, false, 32, 0, false, false},
    {DD_FORMAT_FP16, "fp16", 1, 0, {{"W", DD_DTYPE_FLOAT16, 2, false}}, false, 16, 0, false, false},
    {DD_FORMAT_BQ4, "bq4", 3, 1,
     {{"qweight", DD_DTYPE_UINT8, 2, false}, {"scales", DD_DTYPE_FLOAT16, 2, false},
      {"zeros", DD_DTYPE_UINT8, 2, false}},
     true, 4, 2, false, true},
    {DD_FORMAT_VQ3, "vq3", 3, 0,
     {{"codes", DD_DTYPE_UINT8, 2, false}, {"codebooks", DD_DTYPE_INT8, 4, true},
      {"codebook_scales", DD_DTYPE_FLOAT16, 2, true}},
     true, 3, 0, true, false},
};

constexpr int DD_FORMAT_COUNT = int(sizeof(DD_FORMATS) / sizeof(DD_FORMATS[0]));

constexpr bool dd_formats_in_order() {
    for (int i = 0; i < DD_FORMAT_COUNT; ++i) {
        if (int(DD_FORMATS[i].id) != i || DD_FORMATS[i].n_arrays > DD_FORMAT_MAX_ARRAYS ||
            DD_FORMATS[i].n_optional > DD_FORMATS[i].n_arrays) {
            return false;
        }
    }
    return true;
}
static_assert(dd_formats_in_order(), "DD_FORMATS: record i must be format i, with at most DD_FORMAT_MAX_ARRAYS arrays");

inline const dd_format_traits & dd_format_of(dd_format f) {
    return DD_FORMATS[int(f)];
}

// The record named `name` (exactly, `len` bytes: an attribute may hold a NUL), or null.
inline const dd_format_traits * dd_format_named(const char * name, size_t len) {
    for (const dd_format_traits & t : DD_FORMATS) {
        if (std::strlen(t.name) == len && std::memcmp(t.name, name, len) == 0) {
            return &t;
        }
    }
    return nullptr;
}
