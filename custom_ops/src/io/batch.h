// One batch of block-aligned reads (dipdeploy/runtime/blockio.py plans them), as both readers of this
// room take it: the pool of pread threads (pool.cc) and the io_uring ring (ring.cc).
#pragma once

#include <atomic>
#include <cstdint>

namespace dd_io {

struct Batch {
  int fd;
  int64_t n;
  const int64_t * offset;  // file offset of each request
  const int64_t * length;  // bytes asked for
  const int64_t * need;    // bytes that must arrive (less than length only at the end of the file)
  uint8_t * dest;          // bounce buffer
  const int64_t * place;   // where each request lands in dest
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> got{0};
  std::atomic<int> error{0};  // first errno seen (EIO for a short read)
  std::atomic<int64_t> failed{-1};

  Batch(int fd_, int64_t n_, const int64_t * offset_, const int64_t * length_, const int64_t * need_,
        uint8_t * dest_, const int64_t * place_)
      : fd(fd_), n(n_), offset(offset_), length(length_), need(need_), dest(dest_), place(place_) {}

  // The C ABI's result: the bytes read, or -errno of the first failure with its request in *failed_out.
  int64_t result(int64_t * failed_out) const {
    if (error.load() != 0) {
      if (failed_out) *failed_out = failed.load();
      return -int64_t(error.load());
    }
    return got.load();
  }
};

}  // namespace dd_io
