// The misses' rows of a step: copied from the read-only mapping of the bundle's MLP file (copy_rows, with
// the blocks a device would return for them, touched_blocks), or read with the Flash store's reader
// (io/pool.cc, io/ring.cc) in block-aligned requests planned as dipdeploy/flash.py plan_reads plans them,
// into the bounce buffer and from there into their slots (begin_direct .. end_direct); a read-ahead's rows
// taken by the next step (take_ahead). The room's overview is group.h.
#include "cache/group.h"
#include "io/io.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <vector>

namespace dd_cache {

// The arrays' indices in file order (ascending offset): the order touched_blocks walks them in.
std::vector<int64_t> file_order(int64_t arrays, const int64_t * offset) {
  std::vector<int64_t> order(static_cast<size_t>(arrays));
  for (int64_t a = 0; a < arrays; ++a) order[size_t(a)] = a;
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return offset[x] < offset[y]; });
  return order;
}

// The bytes of the whole `block`s that hold `rows` (n, ascending) of every array (`offset[a]` + row *
// `row_bytes[a]`; arrays do not overlap), the arrays taken in `order` (file_order), and in `*requests` the
// requests a device serves them in (a run of touching blocks each, split at `max_request` bytes):
// dipdeploy/flash.py touched_blocks, the blocks a device returns for rows read through the page cache, where a row
// smaller than a block costs the whole block and rows that share a block share its read. What the emulated
// Flash paces (flash.py FlashStore.account).
int64_t touched_blocks(const std::vector<int64_t> & order, const int64_t * offset, const int64_t * row_bytes,
                      const int64_t * rows, int64_t n, int64_t block, int64_t max_request, int64_t * requests) {
  const int64_t per_request = max_request / block;
  int64_t blocks = 0, last = -1, run = 0;  // the highest block counted so far; the blocks of its run
  *requests = 0;
  for (int64_t a : order) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b0 = (offset[a] + rows[i] * row_bytes[a]) / block;
      const int64_t b1 = (offset[a] + (rows[i] + 1) * row_bytes[a] - 1) / block;
      if (b1 > last) {
        if (b0 > last + 1) {  // not touching the blocks before: the run before is done
          *requests += (run + per_request - 1) / per_request;
          run = 0;
        }
        const int64_t fresh = b1 - std::max(b0, last + 1) + 1;
        blocks += fresh;
        run += fresh;
        last = b1;
      }
    }
  }
  *requests += (run + per_request - 1) / per_request;
  return blocks * block;
}

// The misses' rows from the mapping into their slots of `dest` (the slabs, or a prefill's full-height
// buffers), every array; then the span's pages leave this
// process's mapping (flash.py FlashStore._unmap_pages: they stay in the page cache, not in RSS).
int64_t copy_rows(Group & g, const int64_t * rows, const int64_t * slots, int64_t n,
                  const std::vector<uint8_t *> & dest) {
  const long page = sysconf(_SC_PAGESIZE);
  for (size_t a = 0; a < g.slabs.size(); ++a) {
    const int64_t rb = g.row_bytes[a];
    for (int64_t i = 0; i < n; ++i) {
      int64_t at = g.offset[a] + rows[i] * rb;
      if (at < 0 || at + rb > g.map_len) return kOutsideFile;
      std::memcpy(dest[a] + slots[i] * rb, g.map + at, size_t(rb));
    }
    int64_t start = g.offset[a] + rows[0] * rb, end = g.offset[a] + (rows[n - 1] + 1) * rb;
    int64_t lo = start - start % page;
    madvise(const_cast<uint8_t *>(g.map) + lo, size_t(end - lo), MADV_DONTNEED);
  }
  return 0;
}

// dipdeploy/flash.py plan_reads for the misses' rows (ascending) of every array, started into the bounce buffer: the
// pool's threads, or the device with the ring's first requests, read while the caller goes on. end_direct
// completes it.
int64_t begin_direct(Group & g, const int64_t * rows, int64_t n) {
  Direct & d = g.direct;
  if (d.pending) return kOutOfStep;
  const int64_t arrays = int64_t(g.slabs.size()), m = n * arrays, block = d.block;
  d.start.resize(size_t(m));
  d.end.resize(size_t(m));
  d.order.resize(size_t(m));
  d.src.resize(size_t(m));
  for (int64_t a = 0; a < arrays; ++a)
    for (int64_t i = 0; i < n; ++i) {
      d.start[size_t(a * n + i)] = g.offset[size_t(a)] + rows[i] * g.row_bytes[size_t(a)];
      d.end[size_t(a * n + i)] = d.start[size_t(a * n + i)] + g.row_bytes[size_t(a)];
    }
  for (int64_t j = 0; j < m; ++j) d.order[size_t(j)] = j;
  std::stable_sort(d.order.begin(), d.order.end(), [&](int64_t x, int64_t y) { return d.start[size_t(x)] < d.start[size_t(y)]; });
  d.offset.clear();
  d.length.clear();
  d.need.clear();
  d.place.clear();
  int64_t b1 = 0, total = 0;  // the running max of the items' last blocks, as plan_reads' accumulate
  for (int64_t lo = 0; lo < m;) {
    const int64_t g0 = d.start[size_t(d.order[size_t(lo)])] / block;
    int64_t hi = lo, gend = 0;
    for (; hi < m; ++hi) {
      const int64_t j = d.order[size_t(hi)];
      if (hi > lo && d.start[size_t(j)] / block > b1 + d.max_gap) break;
      b1 = std::max(b1, (d.end[size_t(j)] + block - 1) / block);
      gend = std::max(gend, d.end[size_t(j)]);
      d.src[size_t(j)] = total + d.start[size_t(j)] - g0 * block;
    }
    const int64_t glen = (b1 - g0) * block;
    for (int64_t k = 0; k * d.max_request < glen; ++k) {
      const int64_t off = g0 * block + k * d.max_request, len = std::min(d.max_request, glen - k * d.max_request);
      d.offset.push_back(off);
      d.length.push_back(len);
      d.need.push_back(std::min(std::max(gend - off, int64_t(0)), len));
      d.place.push_back(total + k * d.max_request);
    }
    total += glen;
    lo = hi;
  }
  if (total > d.bounce_len) return kBounce;
  const int64_t nreq = int64_t(d.offset.size());
  const int64_t begun = d.ring ? dd_io_ring_begin(d.io, d.fd, nreq, d.offset.data(), d.length.data(), d.need.data(),
                                                  d.bounce, d.place.data())
                               : dd_io_begin(d.io, d.fd, nreq, d.offset.data(), d.length.data(), d.need.data(),
                                             d.bounce, d.place.data());
  if (begun < 0) {
    d.error = -begun;
    return kReadFailed;
  }
  d.pending = true;
  return 0;
}

// The end half of begin_direct's reads, through the reader that began them: the bytes read or -errno.
int64_t end_reads(Direct & d) {
  int64_t failed = -1;
  return d.ring ? dd_io_ring_end(d.io, &failed) : dd_io_end(d.io, &failed);
}

// Waits for begin_direct's reads and adds their device bytes and requests; returns 0 or an error code.
int64_t wait_direct(Direct & d, int64_t * device, int64_t * requests) {
  if (!d.pending) return kOutOfStep;
  d.pending = false;
  const int64_t got = end_reads(d);
  if (got < 0) {
    d.error = -got;
    return kReadFailed;
  }
  *device += got;
  *requests += int64_t(d.offset.size());
  return 0;
}

// wait_direct, then each row copied into its slot of `dest` (as copy_rows).
int64_t end_direct(Group & g, const int64_t * slots, int64_t n, const std::vector<uint8_t *> & dest, int64_t * device,
                   int64_t * requests) {
  const int64_t rc = wait_direct(g.direct, device, requests);
  if (rc < 0) return rc;
  const Direct & d = g.direct;
  const int64_t arrays = int64_t(g.slabs.size());
  for (int64_t a = 0; a < arrays; ++a) {
    const int64_t rb = g.row_bytes[size_t(a)];
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(dest[size_t(a)] + slots[i] * rb, d.bounce + d.src[size_t(a * n + i)], size_t(rb));
  }
  return 0;
}

// Both halves at once: the misses' rows read into their slots of `dest`.
int64_t read_direct(Group & g, const int64_t * rows, const int64_t * slots, int64_t n,
                    const std::vector<uint8_t *> & dest, int64_t * device, int64_t * requests) {
  const int64_t rc = begin_direct(g, rows, n);
  return rc < 0 ? rc : end_direct(g, slots, n, dest, device, requests);
}

int64_t now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// A graph step's `n` misses read in `ns` nanoseconds, counted for dd_cache_drain (the requests are counted
// where they are made: runs of adjacent rows from the mapping, the reader's requests).
void count_reads(Group & g, int64_t n, int64_t ns) {
  int64_t row_bytes = 0;
  for (int64_t rb : g.row_bytes) row_bytes += rb;
  g.totals[0] += n;
  g.totals[2] += n * row_bytes;
  g.totals[3] += ns;
}

// Ends the read-ahead of dd_cache_graph_prefetch, its reads counted; what a CacheStep, which does not take
// its rows, does with it.
int64_t end_ahead(Group & g) {
  g.ahead = false;
  return wait_direct(g.direct, &g.totals[4], &g.totals[1]);
}

// end_ahead, then the step's `n` misses (op_rows/op_slots) that the read-ahead holds copied into their slots;
// the others, in order, into rest_rows/rest_slots for the step to read. The misses themselves stay as they
// are: CacheEnd hands all of them, in selection order, to the product over the rows read, so the sums are
// those of the step without a read-ahead, bit for bit. Returns how many arrived, or an error code.
int64_t take_ahead(Group & g, int64_t n) {
  const int64_t rc = end_ahead(g);
  if (rc < 0) return rc;
  const Direct & d = g.direct;
  const int64_t m = int64_t(g.ahead_rows.size()), arrays = int64_t(g.slabs.size());
  int64_t arrived = 0;
  g.rest_rows.clear();
  g.rest_slots.clear();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = g.op_rows[size_t(i)], s = g.op_slots[size_t(i)];
    const auto it = std::lower_bound(g.ahead_rows.begin(), g.ahead_rows.end(), r);
    if (it == g.ahead_rows.end() || *it != r) {
      g.rest_rows.push_back(r);
      g.rest_slots.push_back(s);
      continue;
    }
    const int64_t j = it - g.ahead_rows.begin();
    for (int64_t a = 0; a < arrays; ++a) {
      const int64_t rb = g.row_bytes[size_t(a)];
      std::memcpy(g.slabs[size_t(a)] + s * rb, d.bounce + d.src[size_t(a * m + j)], size_t(rb));
    }
    ++arrived;
  }
  g.totals[6] += arrived;
  return arrived;
}

}  // namespace dd_cache
