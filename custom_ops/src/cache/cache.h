// The cache step's C ABI (cache/) as the graph ops of ort/op_cache.cc use it. A handle is a Group made by
// dd_cache_new (dipdeploy/runtime/native_cache.py); dd_cache_live tells whether a number is one.
#pragma once

#include <cstdint>

extern "C" {
int dd_cache_live(const void * group);
int64_t dd_cache_graph_step(void * group, const int64_t * sel, int64_t tokens, int64_t k, int64_t * slots);
int64_t dd_cache_graph_settle(void * group);
int64_t dd_cache_graph_begin(void * group, const int64_t * sel, int64_t tokens, int64_t k, int64_t * idx,
                             int64_t * slots);
int64_t dd_cache_graph_misses(const void * group);
int64_t dd_cache_graph_end(void * group, int64_t * idx, int64_t * slots);
int64_t dd_cache_graph_prefetch(void * group, const int64_t * pred, int64_t k);
int64_t dd_cache_draft(void * const * groups, int64_t n, int on);
int64_t dd_cache_drain(void * const * groups, int64_t n, int64_t * out);
const char * dd_cache_error(int64_t code);
int64_t dd_cache_read_errno(const void * group);
}
