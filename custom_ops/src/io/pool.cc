// Parallel positioned reads for the Flash store's `direct` path (dipdeploy/runtime/blockio.py,
// docs/method.md "Flash layout"). Python plans the block-aligned requests (offsets, lengths and places
// in an aligned bounce buffer) and gathers the wanted rows out of the bounce buffer afterwards; this
// file only keeps many preads in flight: a Flash device serves many requests at once, and one
// synchronous read after another leaves it idle between them (benchmarks/results/flash.md, "reads in
// flight"). Two engines, the same contract (dd_io_read / dd_io_ring_read):
// - a small persistent pool of pread threads (created once per store, not per batch), taking the
//   requests in order from an atomic counter, the calling thread too (the default);
// - an io_uring ring (Linux 5.1+, raw syscalls, no liburing): the kernel keeps up to `depth` requests
//   in flight, submitted in one io_uring_enter, the rest as reads complete, with no thread of its own.
//   It spends less system CPU than the pool; by wall time it replayed the 1 B decode's reads slower than
//   the pool on an AMD EPYC's virtio disk (both 16 deep) and faster on an Intel Xeon's
//   (benchmarks/results/read-gaps.md, read-gaps-xeon.md); NULL where the kernel has none or refuses it.
// Both have the same two halves (dd_io_begin / dd_io_end, dd_io_ring_begin / dd_io_ring_end) for a
// caller that computes while the reads are in flight.
// Plain C ABI for ctypes; no ORT types.
//
// This file: the pool of pread threads (dd_io_pool_new, dd_io_read, dd_io_begin / dd_io_end); the ring is
// ring.cc, the batch both take batch.h.
#include "io/batch.h"

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

using dd_io::Batch;

// One request: pread until `need` bytes arrived (a positioned read may return fewer than asked).
void read_one(Batch & b, int64_t i) {
  int64_t done = 0;
  while (done < b.length[i]) {
    ssize_t r = pread(b.fd, b.dest + b.place[i] + done, size_t(b.length[i] - done), off_t(b.offset[i] + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int expected = 0;
      if (b.error.compare_exchange_strong(expected, errno)) b.failed.store(i);
      return;
    }
    if (r == 0) break;  // end of file
    done += r;
  }
  if (done < b.need[i]) {
    int expected = 0;
    if (b.error.compare_exchange_strong(expected, EIO)) b.failed.store(i);
    return;
  }
  b.got.fetch_add(done);
}

void drain(Batch & b) {
  for (int64_t i = b.next.fetch_add(1); i < b.n && b.error.load() == 0; i = b.next.fetch_add(1)) read_one(b, i);
}

struct Pool {
  std::vector<std::thread> workers;
  std::mutex m;
  std::condition_variable wake, idle;
  Batch * batch = nullptr;
  uint64_t generation = 0;
  int busy = 0;
  bool stop = false;

  explicit Pool(int threads) {
    for (int t = 1; t < threads; ++t) workers.emplace_back([this] { loop(); });
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> g(m);
      stop = true;
    }
    wake.notify_all();
    for (auto & w : workers) w.join();
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      Batch * b;
      {
        std::unique_lock<std::mutex> g(m);
        wake.wait(g, [&] { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
        b = batch;
      }
      drain(*b);
      {
        std::lock_guard<std::mutex> g(m);
        if (--busy == 0) idle.notify_one();
      }
    }
  }

  void run(Batch & b) {
    begin(b);
    end(b);
  }

  // The workers start on `b` and the caller returns at once (the reads overlap what it does next)...
  void begin(Batch & b) {
    {
      std::lock_guard<std::mutex> g(m);
      batch = &b;
      busy = int(workers.size());
      ++generation;
    }
    wake.notify_all();
  }

  // ... until it takes the requests left over itself and waits for the workers.
  void end(Batch & b) {
    drain(b);
    std::unique_lock<std::mutex> g(m);
    idle.wait(g, [&] { return busy == 0; });
    batch = nullptr;
  }

  std::unique_ptr<Batch> pending;  // dd_io_begin's batch until dd_io_end
};

}  // namespace

extern "C" {

// A pool of `threads` readers (the caller counts as one); NULL if threads < 1.
__attribute__((visibility("default"))) void * dd_io_pool_new(int threads) {
  if (threads < 1) return nullptr;
  try {
    return new Pool(threads);
  } catch (...) {
    return nullptr;
  }
}

__attribute__((visibility("default"))) void dd_io_pool_free(void * pool) { delete static_cast<Pool *>(pool); }

// Reads the n requests into dest (see Batch). Returns the bytes read, or -errno of the first failure
// (-EIO: fewer than need[i] bytes before the end of the file) with its request index in *failed.
__attribute__((visibility("default"))) int64_t dd_io_read(void * pool, int fd, int64_t n, const int64_t * offset,
                                                        const int64_t * length, const int64_t * need, uint8_t * dest,
                                                        const int64_t * place, int64_t * failed) {
  if (pool == nullptr || n < 0) return -EINVAL;
  Batch b(fd, n, offset, length, need, dest, place);
  static_cast<Pool *>(pool)->run(b);
  return b.result(failed);
}

// dd_io_read in two halves: dd_io_begin hands the requests to the pool's other threads and returns, so the
// caller computes while they read (the joined decoder multiplies a group's resident rows meanwhile,
// cache/graph.cc); dd_io_end reads the requests still left on the calling thread, waits for the others and
// returns dd_io_read's result. The arrays must stay valid until dd_io_end; one batch per pool at a time
// (-EBUSY otherwise). A pool of one thread reads everything in dd_io_end.
__attribute__((visibility("default"))) int64_t dd_io_begin(void * pool, int fd, int64_t n, const int64_t * offset,
                                                         const int64_t * length, const int64_t * need, uint8_t * dest,
                                                         const int64_t * place) {
  if (pool == nullptr || n < 0) return -EINVAL;
  Pool * p = static_cast<Pool *>(pool);
  if (p->pending) return -EBUSY;
  try {
    p->pending.reset(new Batch(fd, n, offset, length, need, dest, place));
  } catch (...) {
    return -ENOMEM;
  }
  p->begin(*p->pending);
  return 0;
}

__attribute__((visibility("default"))) int64_t dd_io_end(void * pool, int64_t * failed) {
  if (pool == nullptr) return -EINVAL;
  Pool * p = static_cast<Pool *>(pool);
  if (!p->pending) return -EINVAL;
  p->end(*p->pending);
  const int64_t got = p->pending->result(failed);
  p->pending.reset();
  return got;
}

}  // extern "C"
