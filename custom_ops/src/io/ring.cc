// The Flash store's io_uring reader (dipdeploy/runtime/blockio.py, `--io-engine io_uring`): the same batch
// contract as the pool of pread threads (pool.cc, batch.h), on an io_uring ring (Linux 5.1+, raw syscalls,
// no liburing): the kernel keeps up to `depth` requests in flight, submitted in one io_uring_enter, the
// rest as reads complete, with no thread of its own. NULL where the kernel has none or refuses it.
// Plain C ABI for ctypes; no ORT types.
#include "io/batch.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <unistd.h>
#include <vector>
#if defined(__linux__) && __has_include(<linux/io_uring.h>)
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#define DD_IO_URING 1
#endif

namespace {

using dd_io::Batch;

#ifdef DD_IO_URING
// One io_uring instance: the mapped submission and completion rings (the kernel's ABI, see io_uring(7)).
struct Ring {
  int fd = -1;
  unsigned depth = 0;
  unsigned * sq_head = nullptr, * sq_tail = nullptr, * sq_mask = nullptr, * sq_array = nullptr;
  unsigned * cq_head = nullptr, * cq_tail = nullptr, * cq_mask = nullptr;
  io_uring_sqe * sqes = nullptr;
  io_uring_cqe * cqes = nullptr;
  void * sq_map = MAP_FAILED, * cq_map = MAP_FAILED, * sqe_map = MAP_FAILED;
  size_t sq_len = 0, cq_len = 0, sqe_len = 0;

  ~Ring() {
    if (sqe_map != MAP_FAILED) munmap(sqe_map, sqe_len);
    if (cq_map != MAP_FAILED && cq_map != sq_map) munmap(cq_map, cq_len);
    if (sq_map != MAP_FAILED) munmap(sq_map, sq_len);
    if (fd >= 0) close(fd);
  }

  bool open(unsigned entries) {
    io_uring_params p;
    std::memset(&p, 0, sizeof p);
#if defined(IORING_SETUP_SINGLE_ISSUER) && defined(IORING_SETUP_DEFER_TASKRUN)
    // one thread submits and reaps: completions are run when it waits, not by interrupting it (6.1+)
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    fd = int(syscall(__NR_io_uring_setup, entries, &p));
    if (fd < 0 && errno == EINVAL) {
      std::memset(&p, 0, sizeof p);
      fd = int(syscall(__NR_io_uring_setup, entries, &p));
    }
#else
    fd = int(syscall(__NR_io_uring_setup, entries, &p));
#endif
    if (fd < 0) return false;
    depth = p.sq_entries;  // the kernel rounds up to a power of two; the CQ holds twice as many
    sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    cq_len = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    bool single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single) sq_len = cq_len = sq_len > cq_len ? sq_len : cq_len;
    sq_map = mmap(nullptr, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
    if (sq_map == MAP_FAILED) return false;
    cq_map = single ? sq_map
                    : mmap(nullptr, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
    if (cq_map == MAP_FAILED) return false;
    sqe_len = p.sq_entries * sizeof(io_uring_sqe);
    sqe_map = mmap(nullptr, sqe_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
    if (sqe_map == MAP_FAILED) return false;
    auto * sq = static_cast<char *>(sq_map);
    auto * cq = static_cast<char *>(cq_map);
    sq_head = reinterpret_cast<unsigned *>(sq + p.sq_off.head);
    sq_tail = reinterpret_cast<unsigned *>(sq + p.sq_off.tail);
    sq_mask = reinterpret_cast<unsigned *>(sq + p.sq_off.ring_mask);
    sq_array = reinterpret_cast<unsigned *>(sq + p.sq_off.array);
    cq_head = reinterpret_cast<unsigned *>(cq + p.cq_off.head);
    cq_tail = reinterpret_cast<unsigned *>(cq + p.cq_off.tail);
    cq_mask = reinterpret_cast<unsigned *>(cq + p.cq_off.ring_mask);
    cqes = reinterpret_cast<io_uring_cqe *>(cq + p.cq_off.cqes);
    sqes = static_cast<io_uring_sqe *>(sqe_map);
    return true;
  }

  // A batch in flight: the Batch plus how far each request got, the requests to submit again (short or
  // interrupted reads) and the next one never submitted.
  struct Run {
    Batch b;
    std::vector<int64_t> done, again;
    int64_t next = 0, inflight = 0;
    bool broken = false;  // the ring itself failed: nothing more can be submitted or waited for

    Run(int fd, int64_t n, const int64_t * offset, const int64_t * length, const int64_t * need, uint8_t * dest,
        const int64_t * place)
        : b(fd, n, offset, length, need, dest, place), done(size_t(n), 0) {}
    bool more() const { return !broken && b.error.load() == 0 && (next < b.n || !again.empty()); }
    bool busy() const { return !broken && (inflight > 0 || more()); }
    void finished(int64_t i) {
      if (done[size_t(i)] < b.need[i]) {
        int expected = 0;
        if (b.error.compare_exchange_strong(expected, EIO)) b.failed.store(i);
      } else {
        b.got.fetch_add(done[size_t(i)]);
      }
    }
  };
  std::unique_ptr<Run> pending;  // dd_io_ring_begin's batch until dd_io_ring_end

  // One round of a Run (the Batch contract above), at most `depth` in flight: submit what the ring has
  // room for, then, with `wait`, wait for one completion (for every read in flight when nothing is left
  // to submit: one wake-up per batch) and take the completions; without, only submit, so the reads go on
  // while the caller computes. A short read is submitted again for the rest. On an error no new request
  // is submitted, and the rounds go on until every request in flight has completed: the kernel writes
  // into the caller's buffer.
  void round(Run & r, bool wait) {
    Batch & b = r.b;
    unsigned tail = *sq_tail, mask = *sq_mask;
    while (r.more() && r.inflight < int64_t(depth)) {
      int64_t i;
      if (!r.again.empty()) {
        i = r.again.back();
        r.again.pop_back();
      } else {
        i = r.next++;
      }
      io_uring_sqe * e = &sqes[tail & mask];
      std::memset(e, 0, sizeof *e);
      e->opcode = IORING_OP_READ;
      e->fd = b.fd;
      e->addr = reinterpret_cast<uint64_t>(b.dest + b.place[i] + r.done[size_t(i)]);
      e->len = unsigned(b.length[i] - r.done[size_t(i)]);
      e->off = uint64_t(b.offset[i] + r.done[size_t(i)]);
      e->user_data = uint64_t(i);
      sq_array[tail & mask] = tail & mask;
      ++tail;
      ++r.inflight;
    }
    __atomic_store_n(sq_tail, tail, __ATOMIC_RELEASE);
    unsigned submit = tail - __atomic_load_n(sq_head, __ATOMIC_ACQUIRE);  // with any an earlier call left
    if (!wait && submit == 0) return;
    auto want = unsigned(!wait ? 0 : r.more() ? 1 : r.inflight);
    long got = syscall(__NR_io_uring_enter, fd, submit, want, wait ? IORING_ENTER_GETEVENTS : 0, nullptr, 0);
    if (got < 0 && errno != EINTR && errno != EAGAIN && errno != EBUSY) {
      int expected = 0;
      if (b.error.compare_exchange_strong(expected, errno)) b.failed.store(r.next > 0 ? r.next - 1 : 0);
      r.broken = true;
      return;
    }
    if (!wait) return;
    unsigned head = *cq_head, ctail = __atomic_load_n(cq_tail, __ATOMIC_ACQUIRE), cmask = *cq_mask;
    for (; head != ctail; ++head) {
      const io_uring_cqe & c = cqes[head & cmask];
      auto i = int64_t(c.user_data);
      --r.inflight;
      if (c.res == -EINTR || c.res == -EAGAIN) {
        r.again.push_back(i);
      } else if (c.res < 0) {
        int expected = 0;
        if (b.error.compare_exchange_strong(expected, -c.res)) b.failed.store(i);
      } else if (c.res == 0) {
        r.finished(i);  // end of the file
      } else {
        r.done[size_t(i)] += c.res;
        if (r.done[size_t(i)] < b.length[i]) r.again.push_back(i);
        else r.finished(i);
      }
    }
    __atomic_store_n(cq_head, head, __ATOMIC_RELEASE);
  }

  void finish(Run & r) {
    while (r.busy()) round(r, true);
  }
};
#endif

}  // namespace

extern "C" {

// An io_uring ring of at least `depth` entries, or NULL where the kernel has none or refuses it (the
// caller then uses the pool).
__attribute__((visibility("default"))) void * dd_io_ring_new(int depth) {
#ifdef DD_IO_URING
  if (depth < 1) return nullptr;
  try {
    auto * ring = new Ring();
    if (!ring->open(unsigned(depth))) {
      delete ring;
      return nullptr;
    }
    return ring;
  } catch (...) {
    return nullptr;
  }
#else
  (void)depth;
  return nullptr;
#endif
}

__attribute__((visibility("default"))) void dd_io_ring_free(void * ring) {
#ifdef DD_IO_URING
  delete static_cast<Ring *>(ring);
#else
  (void)ring;
#endif
}

// dd_io_read through the ring: dd_io_ring_begin and dd_io_ring_end at once.
__attribute__((visibility("default"))) int64_t dd_io_ring_begin(void * ring, int fd, int64_t n, const int64_t * offset,
                                                              const int64_t * length, const int64_t * need,
                                                              uint8_t * dest, const int64_t * place);
__attribute__((visibility("default"))) int64_t dd_io_ring_end(void * ring, int64_t * failed);

__attribute__((visibility("default"))) int64_t dd_io_ring_read(void * ring, int fd, int64_t n, const int64_t * offset,
                                                             const int64_t * length, const int64_t * need,
                                                             uint8_t * dest, const int64_t * place, int64_t * failed) {
  const int64_t begun = dd_io_ring_begin(ring, fd, n, offset, length, need, dest, place);
  return begun < 0 ? begun : dd_io_ring_end(ring, failed);
}

// dd_io_begin / dd_io_end through the ring: dd_io_ring_begin submits the first `depth` requests and
// returns, the device reading them while the caller computes; dd_io_ring_end submits the rest as reads
// complete, waits, and returns dd_io_read's result. The arrays must stay valid until dd_io_ring_end; one
// batch per ring at a time (-EBUSY otherwise).
__attribute__((visibility("default"))) int64_t dd_io_ring_begin(void * ring, int fd, int64_t n, const int64_t * offset,
                                                              const int64_t * length, const int64_t * need,
                                                              uint8_t * dest, const int64_t * place) {
#ifdef DD_IO_URING
  if (ring == nullptr || n < 0) return -EINVAL;
  Ring * r = static_cast<Ring *>(ring);
  if (r->pending) return -EBUSY;
  try {
    r->pending.reset(new Ring::Run(fd, n, offset, length, need, dest, place));
  } catch (...) {
    return -ENOMEM;
  }
  r->round(*r->pending, false);
  return 0;
#else
  (void)ring, (void)fd, (void)n, (void)offset, (void)length, (void)need, (void)dest, (void)place;
  return -ENOSYS;
#endif
}

__attribute__((visibility("default"))) int64_t dd_io_ring_end(void * ring, int64_t * failed) {
#ifdef DD_IO_URING
  if (ring == nullptr) return -EINVAL;
  Ring * r = static_cast<Ring *>(ring);
  if (!r->pending) return -EINVAL;
  r->finish(*r->pending);
  const int64_t got = r->pending->b.result(failed);
  r->pending.reset();
  return got;
#else
  (void)ring, (void)failed;
  return -ENOSYS;
#endif
}

}  // extern "C"
