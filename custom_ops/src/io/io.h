// The Flash store's readers (pool.cc, ring.cc) as the cache step uses them (cache/reads.cc): the two halves
// of a batch of reads, so the caller computes while they are in flight. Plain C ABI, also loaded by ctypes.
#pragma once

#include <cstdint>

extern "C" {
int64_t dd_io_begin(void * pool, int fd, int64_t n, const int64_t * offset, const int64_t * length,
                    const int64_t * need, uint8_t * dest, const int64_t * place);
int64_t dd_io_end(void * pool, int64_t * failed);
int64_t dd_io_ring_begin(void * ring, int fd, int64_t n, const int64_t * offset, const int64_t * length,
                         const int64_t * need, uint8_t * dest, const int64_t * place);
int64_t dd_io_ring_end(void * ring, int64_t * failed);
}
