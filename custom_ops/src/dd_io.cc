// Parallel positioned reads for the Flash store's `direct` path (dipdeploy/runtime/blockio.py,
// docs/method.md "Flash layout"). Python plans the block-aligned requests (offsets, lengths and places
// in an aligned bounce buffer) and gathers the wanted rows out of the bounce buffer afterwards; this
// file only keeps many preads in flight: a Flash device serves many requests at once, and one
// synchronous read after another leaves it idle between them (benchmarks/results/flash.md, "reads in
// flight"). A small persistent pool (threads created once per store, not per batch: a batch is a few
// hundred microseconds of reads) takes the requests in order from an atomic counter; the calling
// thread works too. Plain C ABI for ctypes; no ORT types.
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

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
};

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
    {
      std::lock_guard<std::mutex> g(m);
      batch = &b;
      busy = int(workers.size());
      ++generation;
    }
    wake.notify_all();
    drain(b);
    std::unique_lock<std::mutex> g(m);
    idle.wait(g, [&] { return busy == 0; });
    batch = nullptr;
  }
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
  Batch b;
  b.fd = fd;
  b.n = n;
  b.offset = offset;
  b.length = length;
  b.need = need;
  b.dest = dest;
  b.place = place;
  static_cast<Pool *>(pool)->run(b);
  if (b.error.load() != 0) {
    if (failed) *failed = b.failed.load();
    return -int64_t(b.error.load());
  }
  return b.got.load();
}

}  // extern "C"
