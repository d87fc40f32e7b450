// The host runtime's per-token cache step in C++ (dipdeploy/runtime/native_cache.py, through ctypes):
// one layer-group's row cache access, its slot assignment and the misses' reads into the slab, in one
// call per group and token instead of a dozen numpy calls (dipdeploy/runtime/DESIGN.md measures why).
//
// The rules are dipdeploy.cache's, not new ones: the cache rule of dipdeploy/cache/policies.py (hits =
// resident[selected]; last use and use count updated; the new residency is the top-C of resident ∪
// selected by the policy's packed unique int64 key) and the slot rule of dipdeploy/cache/slots.py
// (hits keep their slot; evicted rows the token does not use free theirs; misses in ascending row order
// take the lowest free slot if admitted, else staging; after the MLP, `settle` frees the used evicted
// rows and moves the admitted rows that waited in staging). The numpy code stays the reference: the
// tests hold this code to the same integer decisions on random traces (tests/test_native_cache.py).
//
// The state lives in caller-owned arrays (numpy buffers), so the Python side can hand it to the numpy
// reference and back (a batched prefill runs there) without a conversion. Rows are read from the
// read-only mapping of the bundle's MLP file at the byte offsets the Flash store gives for each array
// (offset + row * row_bytes); without a mapping the step only returns the rows and slots to read and
// the Flash store reads them (pread, direct). Plain C ABI for ctypes; no ORT types.
//
// The same step also runs inside a graph (the ops CacheStep and CacheSettle of dd_ops.cc, declared in
// dd_cache.h): the graph carries each group's handle as an int64 input, so a handle is checked against
// the groups alive in this process before a kernel touches it, and the step counts its misses, requests,
// bytes and read time in the group for the host to collect once per token (dd_cache_drain). With no
// caller left to read the misses, a graph step either copies them from the mapping or reads them itself
// through the Flash store's reader (dd_io.cc) with block-aligned requests planned as
// dipdeploy/flash.py plan_reads plans them (dd_cache_direct).
#include "dd_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace {

// dipdeploy.cache.POLICIES, in order
enum Policy { kNone = 0, kLru = 1, kLfu = 2, kBelady = 3, kStatic = 4 };

constexpr int kIdxBits = 17;  // policies.py _IDX_BITS
constexpr int kSecBits = 24;  // policies.py _SEC_BITS

// Error codes (native_cache.py turns each into the exception the numpy reference raises).
constexpr int64_t kOutOfRange = -1;   // a selected row outside [0, rows)
constexpr int64_t kOutOfStep = -2;    // a hit without a slot or a miss holding one
constexpr int64_t kNoStaging = -3;    // more rows need staging than the slab has
constexpr int64_t kNoFreeSlot = -4;   // settle: no free slot for an admitted row
constexpr int64_t kOutsideFile = -5;  // a row's bytes lie outside the mapped file
constexpr int64_t kBadArgs = -6;
constexpr int64_t kNoMapping = -7;    // a graph step with neither the mapped file nor a reader
constexpr int64_t kBounce = -8;       // the misses' blocks do not fit in the bounce buffer
constexpr int64_t kReadFailed = -9;   // a read failed or came back short (errno in Direct::error)

// The Flash store's O_DIRECT reader for a graph step (dd_cache_direct): its file, its dd_io.cc reader,
// the block-aligned bounce buffer the plan reserves (Residency.read), and plan_reads' parameters.
struct Direct {
  int fd = -1;
  void * io = nullptr;
  bool ring = false;
  int64_t block = 4096, max_request = 0, max_gap = 0;
  uint8_t * bounce = nullptr;
  int64_t bounce_len = 0;
  int64_t error = 0;
  std::vector<int64_t> start, end, order, src, offset, length, need, place;
  bool pending = false;  // a read begun and not yet ended (begin_direct .. end_direct)
};

constexpr int kTotals = 8;  // a group's counters, dd_cache_drain's out[]
constexpr int64_t kFlashBlock = 4096;  // dipdeploy/flash.py BLOCK: the unit a device returns for rows copied from the mapping
constexpr int64_t kMaxRequest = 128 * 1024;  // dipdeploy/flash.py MAX_REQUEST: the longest request of a run of blocks

struct Group {
  int64_t rows, capacity, staging;
  int policy;
  // caller-owned state (dipdeploy/runtime/native_cache.py NativeState)
  uint8_t * resident;      // [rows] bool
  int64_t * last_use;      // [rows]
  int64_t * uses;          // [rows]
  int64_t * counters;      // [3]: step, hits, misses
  int64_t * slot_of;       // [rows], -1: no cache slot
  int64_t * row_of;        // [capacity], -1: free
  const int32_t * next_use = nullptr;  // belady: [steps, rows] (policies.py _next_use_table)
  int64_t next_use_steps = 0;
  // the slab arrays and where their rows lie in the file; by_offset: the arrays in file order (touched_blocks)
  std::vector<uint8_t *> slabs;
  std::vector<int64_t> offset, row_bytes, by_offset;
  const uint8_t * map = nullptr;
  int64_t map_len = 0;
  // scratch and the pending step (SlotStep.release / deferred_*)
  std::vector<int64_t> cand, dropped, misses, admitted_rows, given, release, deferred_rows, deferred_from, to;
  std::vector<int64_t> where;  // [rows]: position of a row in the selection, -1 elsewhere (kept so)
  std::vector<uint64_t> keys;
  // the graph step's own outputs besides the slots, and what it read since the last drain: misses (rows),
  // requests (runs of adjacent rows x arrays from the mapping, the reader's requests), bytes wanted, copy or
  // read nanoseconds, bytes read from the device
  std::vector<uint8_t> op_hits;
  std::vector<int64_t> op_rows, op_slots;
  // between CacheBegin and CacheEnd (dd_cache_graph_begin/end): the step's misses (op_rows/op_slots), -1
  // when no step is open, how many of them are still on their way and their slots (open_slots: op_slots, or
  // rest_slots where a read-ahead held the others), and the nanoseconds the begin spent reading or starting
  // the reads
  int64_t open_misses = -1, open_reads = 0, begin_ns = 0;
  const int64_t * open_slots = nullptr;
  // a read-ahead (dd_cache_graph_prefetch) begun for the group's next step: the predicted rows that were not
  // resident, ascending, while `ahead`; their place in the bounce buffer is Direct::src until CacheBegin,
  // which keeps the misses it did not hold in rest_rows/rest_slots. `ahead_on`: dd_cache_read_ahead's switch
  std::vector<int64_t> ahead_rows, rest_rows, rest_slots;
  bool ahead = false, ahead_on = true;
  int64_t ahead_ns = 0;
  // since the last drain (dd_cache_drain): misses, requests, bytes wanted, ns, block bytes (read from the
  // device by the reader; with the mapping, the blocks holding the copied rows: touched_blocks), the rows
  // read ahead and those of them the step then missed (used), and with the mapping the requests a device
  // would serve the blocks in (touched_blocks)
  int64_t totals[kTotals] = {};
  Direct direct;
  // a batched prefill (dd_cache_prefill): per array a full-height buffer [rows, row_bytes], the one the
  // graph's SparseGatherMatMul reads while it is set; the chunk's selection [tokens, k] the fill took,
  // which the settle warms the cache from
  std::vector<uint8_t *> full;
  std::vector<int64_t> chunk, chunk_missing;
  std::vector<uint8_t> mark;
  int64_t chunk_tokens = 0;
};

// The groups alive in this process: a graph's handle input is only a number, so a kernel checks it here
// before using it as a pointer (a stale or forged handle is an error, not a crash).
std::mutex live_mutex;
std::unordered_set<const void *> live_groups;

// policies.py _pack: ((primary << SEC | secondary) << IDX) | (rows - 1 - index), in wrapping int64
// arithmetic as numpy computes it.
inline int64_t pack(int64_t primary, int64_t secondary, int64_t index, int64_t rows) {
  uint64_t k = ((uint64_t(primary) << kSecBits) | uint64_t(secondary)) << kIdxBits;
  return int64_t(k | uint64_t(rows - 1 - index));
}

inline int64_t key_of(const Group & g, int64_t r) {
  const int64_t step = g.counters[0];
  switch (g.policy) {
    case kLru:
      return pack(g.last_use[r], 0, r, g.rows);
    case kLfu:
      return pack(g.uses[r], g.last_use[r], r, g.rows);
    default: {  // belady: nearer next use → higher key, from the step just taken
      int64_t t = std::min(step - 1, g.next_use_steps - 1);
      int64_t horizon = g.next_use_steps + 1;
      return pack(horizon - int64_t(g.next_use[t * g.rows + r]), g.last_use[r], r, g.rows);
    }
  }
}

// policies.py RowCache._admit on a residency already marked with the selected rows: the top-C by the
// policy's unique key stay, the others go into g.dropped.
void admit(Group & g) {
  g.cand.clear();
  for (int64_t r = 0; r < g.rows; ++r)
    if (g.resident[r]) g.cand.push_back(r);
  const int64_t over = int64_t(g.cand.size()) - g.capacity;
  if (over > 0) {  // drop the `over` lowest keys (unique, so the set is the reference's)
    g.keys.resize(g.cand.size());
    for (size_t i = 0; i < g.cand.size(); ++i)
      g.keys[i] = uint64_t(key_of(g, g.cand[i])) ^ (uint64_t(1) << 63);  // signed order as unsigned
    std::nth_element(g.keys.begin(), g.keys.begin() + (over - 1), g.keys.end());
    const uint64_t tie = (uint64_t(1) << kIdxBits) - 1;  // the low bits hold rows - 1 - index exactly
    for (int64_t i = 0; i < over; ++i) {
      const int64_t r = g.rows - 1 - int64_t(g.keys[size_t(i)] & tie);
      g.resident[r] = 0;
      g.dropped.push_back(r);
    }
  }
}

// policies.py RowCache._access_one: hits, statistics, then the top-C admission (_admit).
int64_t access(Group & g, const int64_t * sel, int64_t k, uint8_t * hits) {
  for (int64_t j = 0; j < k; ++j)
    if (sel[j] < 0 || sel[j] >= g.rows) return kOutOfRange;
  int64_t n_hit = 0;
  for (int64_t j = 0; j < k; ++j) n_hit += hits[j] = g.resident[sel[j]];
  g.counters[1] += n_hit;
  g.counters[2] += k - n_hit;
  const int64_t step = ++g.counters[0];
  for (int64_t j = 0; j < k; ++j) {
    int64_t r = sel[j];
    if (g.last_use[r] != step) ++g.uses[r];  // numpy's uses[sel] += 1 counts a repeated row once
    g.last_use[r] = step;
  }
  g.dropped.clear();
  if (g.policy == kStatic || g.policy == kNone || g.capacity <= 0) return 0;
  for (int64_t j = 0; j < k; ++j) g.resident[sel[j]] = 1;
  admit(g);
  return 0;
}

// slots.py SlotTable._take: the lowest free slots for `rows` in order; returns how many got one.
int64_t take(Group & g, const int64_t * rows, int64_t n, int64_t * given) {
  int64_t done = 0;
  for (int64_t s = 0; s < g.capacity && done < n; ++s) {
    if (g.row_of[s] >= 0) continue;
    g.row_of[s] = rows[done];
    g.slot_of[rows[done]] = s;
    given[done++] = s;
  }
  return done;
}

inline void free_row(Group & g, int64_t r) {
  g.row_of[g.slot_of[r]] = -1;
  g.slot_of[r] = -1;
}

// slots.py SlotTable.assign (rule steps 1–3); the misses' rows and slots into read_rows/read_slots.
int64_t assign(Group & g, const int64_t * sel, int64_t k, const uint8_t * hits, int64_t * slots,
               int64_t * read_rows, int64_t * read_slots) {
  for (int64_t j = 0; j < k; ++j) {
    slots[j] = g.slot_of[sel[j]];
    if ((slots[j] >= 0) != bool(hits[j])) return kOutOfStep;
  }
  // Evicted rows: those the step dropped that held a slot (a slot is held exactly by the rows resident
  // before the step). The ones this token uses (last use = this step) free their slots in `settle`.
  g.release.clear();
  const int64_t step = g.counters[0];
  for (int64_t r : g.dropped) {
    if (g.slot_of[r] < 0) continue;  // a miss the cache did not admit: it never held a slot
    if (g.last_use[r] == step)
      g.release.push_back(r);
    else
      free_row(g, r);
  }
  // the misses' positions in ascending row order (rows are distinct): a sort when they are few, else
  // a pass over the rows
  std::vector<int64_t> & misses = g.misses;
  misses.clear();
  for (int64_t j = 0; j < k; ++j)
    if (!hits[j]) misses.push_back(j);
  if (int64_t(misses.size()) * 16 < g.rows) {
    std::sort(misses.begin(), misses.end(), [&](int64_t a, int64_t b) { return sel[a] < sel[b]; });
  } else {
    g.where.resize(size_t(g.rows), -1);
    for (int64_t j : misses) g.where[size_t(sel[j])] = j;
    misses.clear();
    for (int64_t r = 0; r < g.rows; ++r)
      if (g.where[size_t(r)] >= 0) {
        misses.push_back(g.where[size_t(r)]);
        g.where[size_t(r)] = -1;
      }
  }
  g.admitted_rows.clear();  // admitted misses take the lowest free slots, in row order
  for (int64_t j : misses)
    if (g.resident[sel[j]]) g.admitted_rows.push_back(sel[j]);
  g.given.resize(g.admitted_rows.size());
  const int64_t n_given = take(g, g.admitted_rows.data(), int64_t(g.admitted_rows.size()), g.given.data());
  // staging, in row order: the misses not admitted and the admitted ones beyond the free slots
  g.deferred_rows.clear();
  g.deferred_from.clear();
  int64_t admitted = 0, staged = 0;
  for (int64_t j : misses) {
    if (g.resident[sel[j]] && admitted < n_given) {
      slots[j] = g.given[size_t(admitted++)];
      continue;
    }
    if (staged == g.staging) return kNoStaging;
    slots[j] = g.capacity + staged++;
    if (g.resident[sel[j]]) {
      ++admitted;
      g.deferred_rows.push_back(sel[j]);
      g.deferred_from.push_back(slots[j]);
    }
  }
  for (size_t i = 0; i < misses.size(); ++i) {
    read_rows[i] = sel[misses[i]];
    read_slots[i] = slots[misses[i]];
  }
  return int64_t(misses.size());
}

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

}  // namespace

extern "C" int64_t dd_io_begin(void * pool, int fd, int64_t n, const int64_t * offset, const int64_t * length,
                               const int64_t * need, uint8_t * dest, const int64_t * place);
extern "C" int64_t dd_io_end(void * pool, int64_t * failed);
extern "C" int64_t dd_io_ring_begin(void * ring, int fd, int64_t n, const int64_t * offset, const int64_t * length,
                                    const int64_t * need, uint8_t * dest, const int64_t * place);
extern "C" int64_t dd_io_ring_end(void * ring, int64_t * failed);

namespace {

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

constexpr int64_t kOneToken = -10;  // a step outside a prefill with more than one token's selection

// A batched prefill's fill (engine.py Engine._fill_prefill): every row the chunk's selection `sel`
// [tokens * k] names is placed once in the full-height buffers at its row index (the rows the cache holds
// copied from their slots, the others read like misses, counted in the totals); the slots the
// SparseGatherMatMul reads are the row indices themselves. The selection is kept for the settle.
int64_t prefill_fill(Group & g, const int64_t * sel, int64_t tokens, int64_t k, int64_t * slots) {
  const int64_t m = tokens * k;
  for (int64_t j = 0; j < m; ++j)
    if (sel[j] < 0 || sel[j] >= g.rows) return kOutOfRange;
  g.chunk.assign(sel, sel + m);
  g.chunk_tokens = tokens;
  std::memcpy(slots, sel, size_t(m) * sizeof(int64_t));
  g.mark.assign(size_t(g.rows), 0);
  for (int64_t j = 0; j < m; ++j) g.mark[size_t(sel[j])] = 1;
  g.chunk_missing.clear();
  for (int64_t r = 0; r < g.rows; ++r) {
    if (!g.mark[size_t(r)]) continue;
    const int64_t s = g.slot_of[r];
    if (s < 0) {
      g.chunk_missing.push_back(r);
      continue;
    }
    for (size_t a = 0; a < g.slabs.size(); ++a)
      std::memcpy(g.full[a] + r * g.row_bytes[a], g.slabs[a] + s * g.row_bytes[a], size_t(g.row_bytes[a]));
  }
  const int64_t n = int64_t(g.chunk_missing.size());
  if (n == 0) return 0;
  const int64_t * rows = g.chunk_missing.data();
  const int64_t t0 = now_ns();
  if (g.map) {
    const int64_t rc = copy_rows(g, rows, rows, n, g.full);
    if (rc < 0) return rc;
    int64_t runs = 1;
    for (int64_t i = 1; i < n; ++i) runs += rows[i] != rows[i - 1] + 1;
    g.totals[1] += runs * int64_t(g.slabs.size());
    int64_t requests = 0;
    g.totals[4] += touched_blocks(g.by_offset, g.offset.data(), g.row_bytes.data(), rows, n, kFlashBlock, kMaxRequest,
                                  &requests);
    g.totals[7] += requests;
  } else {
    const int64_t rc = read_direct(g, rows, rows, n, g.full, &g.totals[4], &g.totals[1]);
    if (rc < 0) return rc;
  }
  count_reads(g, n, now_ns() - t0);
  return n;
}

// A batched prefill's settle (engine.py Engine._warm): the cache takes the chunk's selections in token
// order (policies.py RowCache.access_steps: hits against the residency before the chunk, last use and
// use counts as the steps leave them, the top-C of resident ∪ selected), the slot table follows
// (slots.py SlotTable.rebase: rows no longer resident free their slots, newly resident rows take the
// lowest free ones in row order) and the new rows are copied from the full-height buffers into the slab.
int64_t prefill_warm(Group & g) {
  const int64_t tokens = g.chunk_tokens;
  if (tokens == 0) return 0;
  const int64_t m = int64_t(g.chunk.size()), k = m / tokens;
  const int64_t * sel = g.chunk.data();
  int64_t n_hit = 0;
  for (int64_t j = 0; j < m; ++j) n_hit += g.resident[sel[j]];
  g.counters[1] += n_hit;
  g.counters[2] += m - n_hit;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t step = g.counters[0] + t + 1;
    for (int64_t j = t * k; j < (t + 1) * k; ++j) {
      g.last_use[sel[j]] = std::max(g.last_use[sel[j]], step);
      ++g.uses[sel[j]];  // numpy's bincount over the chunk
    }
  }
  g.counters[0] += tokens;
  g.dropped.clear();
  if (!(g.policy == kStatic || g.policy == kNone || g.capacity <= 0)) {
    for (int64_t j = 0; j < m; ++j) g.resident[sel[j]] = 1;
    admit(g);
  }
  for (int64_t s = 0; s < g.capacity; ++s)
    if (g.row_of[s] >= 0 && !g.resident[g.row_of[s]]) free_row(g, g.row_of[s]);
  g.admitted_rows.clear();
  for (int64_t r = 0; r < g.rows; ++r)
    if (g.resident[r] && g.slot_of[r] < 0) g.admitted_rows.push_back(r);
  const int64_t n = int64_t(g.admitted_rows.size());
  g.given.resize(size_t(n));
  if (take(g, g.admitted_rows.data(), n, g.given.data()) != n) return kNoFreeSlot;
  for (size_t a = 0; a < g.slabs.size(); ++a) {
    const int64_t rb = g.row_bytes[a];
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(g.slabs[a] + g.given[size_t(i)] * rb, g.full[a] + g.admitted_rows[size_t(i)] * rb, size_t(rb));
  }
  g.chunk.clear();
  g.chunk_tokens = 0;
  return n;
}

}  // namespace

extern "C" {

void dd_cache_drop_step(void * gp);

// A group over caller-owned state (see Group); `policy` indexes dipdeploy.cache.POLICIES; `next_use`
// ([next_use_steps, rows] int32) is required by belady. NULL on bad arguments.
__attribute__((visibility("default"))) void * dd_cache_new(int64_t rows, int64_t capacity, int64_t staging,
                                                           int policy, uint8_t * resident, int64_t * last_use,
                                                           int64_t * uses, int64_t * counters, int64_t * slot_of,
                                                           int64_t * row_of, const int32_t * next_use,
                                                           int64_t next_use_steps) {
  if (rows < 1 || rows >= (int64_t(1) << kIdxBits) || capacity < 0 || capacity > rows || staging < 0 ||
      policy < kNone || policy > kStatic || !resident || !last_use || !uses || !counters || !slot_of ||
      (capacity > 0 && !row_of) || (policy == kBelady && (!next_use || next_use_steps < 1)))
    return nullptr;
  try {
    Group * g = new Group();
    g->rows = rows;
    g->capacity = capacity;
    g->staging = staging;
    g->policy = policy;
    g->resident = resident;
    g->last_use = last_use;
    g->uses = uses;
    g->counters = counters;
    g->slot_of = slot_of;
    g->row_of = row_of;
    g->next_use = next_use;
    g->next_use_steps = next_use_steps;
    std::lock_guard<std::mutex> lock(live_mutex);
    live_groups.insert(g);
    return g;
  } catch (...) {
    return nullptr;
  }
}

__attribute__((visibility("default"))) void dd_cache_free(void * g) {
  {
    std::lock_guard<std::mutex> lock(live_mutex);
    live_groups.erase(g);
  }
  if (g) dd_cache_drop_step(g);  // a read a failed run left in flight ends before its group does
  delete static_cast<Group *>(g);
}

__attribute__((visibility("default"))) int dd_cache_live(const void * g) {
  std::lock_guard<std::mutex> lock(live_mutex);
  return live_groups.count(g) != 0;
}

// The slab arrays (`slabs[a]`: capacity + staging rows of row_bytes[a]) and their rows' file offsets;
// `map` (may be NULL: the caller reads) is the MLP file mapped read-only, `map_len` bytes.
__attribute__((visibility("default"))) int64_t dd_cache_arrays(void * gp, int64_t n, uint8_t ** slabs,
                                                               const int64_t * offset, const int64_t * row_bytes,
                                                               const uint8_t * map, int64_t map_len) {
  Group * g = static_cast<Group *>(gp);
  if (!g || n < 0 || (n > 0 && (!slabs || !offset || !row_bytes))) return kBadArgs;
  for (int64_t a = 0; a < n; ++a)
    if (!slabs[a] || row_bytes[a] < 1 || offset[a] < 0) return kBadArgs;
  g->slabs.assign(slabs, slabs + n);
  g->offset.assign(offset, offset + n);
  g->row_bytes.assign(row_bytes, row_bytes + n);
  g->by_offset = file_order(n, offset);
  g->map = map;
  g->map_len = map ? map_len : 0;
  return 0;
}

// One token's step for the selection `sel` [k] (distinct rows, as TopK gives them): hits [k], slots [k]
// for the op, and the misses' rows and slots (ascending rows) in read_rows/read_slots [k]. With a
// mapping the rows are copied into the slab; info[0] = the reads' nanoseconds, info[1] = runs of
// adjacent rows, info[2] = with the mapping, the bytes of the blocks holding the misses' rows and info[3] the
// requests a device serves them in (touched_blocks).
// Returns the number of misses, or a negative error code.
__attribute__((visibility("default"))) int64_t dd_cache_select(void * gp, const int64_t * sel, int64_t k,
                                                               int64_t * slots, uint8_t * hits, int64_t * read_rows,
                                                               int64_t * read_slots, int64_t * info) {
  Group * g = static_cast<Group *>(gp);
  if (!g || k < 0 || (k > 0 && (!sel || !slots || !hits || !read_rows || !read_slots)) || !info) return kBadArgs;
  try {
    int64_t rc = access(*g, sel, k, hits);
    if (rc < 0) return rc;
    int64_t n = assign(*g, sel, k, hits, slots, read_rows, read_slots);
    if (n < 0) return n;
    info[0] = info[1] = info[2] = info[3] = 0;
    if (n > 0) {
      int64_t runs = 1;
      for (int64_t i = 1; i < n; ++i) runs += read_rows[i] != read_rows[i - 1] + 1;
      info[1] = runs;
      if (g->map) {
        info[2] = touched_blocks(g->by_offset, g->offset.data(), g->row_bytes.data(), read_rows, n, kFlashBlock,
                                kMaxRequest, &info[3]);
        int64_t t0 = now_ns();
        rc = copy_rows(*g, read_rows, read_slots, n, g->slabs);
        info[0] = now_ns() - t0;
        if (rc < 0) return rc;
      }
    }
    return n;
  } catch (...) {
    return kBadArgs;
  }
}

// slots.py SlotTable.finish after the MLP ran: the used evicted rows free their slots, the admitted rows
// that waited in staging move to the lowest free ones (a DRAM copy in every slab array).
__attribute__((visibility("default"))) int64_t dd_cache_settle(void * gp) {
  Group * g = static_cast<Group *>(gp);
  if (!g) return kBadArgs;
  for (int64_t r : g->release) free_row(*g, r);
  g->release.clear();
  const int64_t n = int64_t(g->deferred_rows.size());
  if (n == 0) return 0;
  std::vector<int64_t> & to = g->to;
  to.resize(size_t(n));
  if (take(*g, g->deferred_rows.data(), n, to.data()) != n) return kNoFreeSlot;
  for (size_t a = 0; a < g->slabs.size(); ++a) {
    const int64_t rb = g->row_bytes[a];
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(g->slabs[a] + to[size_t(i)] * rb, g->slabs[a] + g->deferred_from[size_t(i)] * rb, size_t(rb));
  }
  g->deferred_rows.clear();
  g->deferred_from.clear();
  return n;
}

// What CacheStep and CacheBegin share: the checks, then during a batched prefill (dd_cache_prefill) the
// chunk's selection `sel` [tokens, k] placed in the full-height buffers (prefill_fill, which writes the rows'
// indices to `slots` [tokens, k]; *filled = true), else one token's dd_cache_select into `slots` [k] and the
// op scratch (hits, the misses' rows and slots), its misses copied from the mapping if there is one.
// Returns what the fill or the select returns.
static int64_t open_step(Group * g, const int64_t * sel, int64_t tokens, int64_t k, int64_t * slots, int64_t * info,
                         bool * filled) {
  *filled = false;
  if (!g || k < 0 || tokens < 0) return kBadArgs;
  if (!g->map && g->direct.fd < 0) return kNoMapping;
  g->direct.error = 0;  // the errno of this step's read, if it fails
  try {
    if (!g->full.empty()) {
      *filled = true;
      return prefill_fill(*g, sel, tokens, k, slots);
    }
    if (tokens != 1) return kOneToken;
    g->op_hits.resize(size_t(k));
    g->op_rows.resize(size_t(k));
    g->op_slots.resize(size_t(k));
  } catch (...) {
    return kBadArgs;
  }
  return dd_cache_select(g, sel, k, slots, g->op_hits.data(), g->op_rows.data(), g->op_slots.data(), info);
}

// dd_cache_select for a kernel (CacheStep): the selection `sel` [1, k] → `slots` [1, k], the misses copied
// from the mapping or read with the group's reader (no caller is left to read them) and counted in the
// group's totals. During a batched prefill the chunk's selection [tokens, k] is placed instead (open_step).
__attribute__((visibility("default"))) int64_t dd_cache_graph_step(void * gp, const int64_t * sel, int64_t tokens,
                                                                   int64_t k, int64_t * slots) {
  Group * g = static_cast<Group *>(gp);
  if (g && g->ahead) {
    const int64_t rc = end_ahead(*g);
    if (rc < 0) return rc;
  }
  int64_t info[4] = {0, 0, 0, 0};
  bool filled = false;
  const int64_t n = open_step(g, sel, tokens, k, slots, info, &filled);
  if (filled || n <= 0) return n;
  if (g->map) {
    g->totals[1] += info[1] * int64_t(g->slabs.size());
    g->totals[4] += info[2];
    g->totals[7] += info[3];
  } else {
    const int64_t t0 = now_ns();
    try {
      const int64_t rc = read_direct(*g, g->op_rows.data(), g->op_slots.data(), n, g->slabs, &g->totals[4], &g->totals[1]);
      if (rc < 0) return rc;
    } catch (...) {
      return kBadArgs;
    }
    info[0] = now_ns() - t0;
  }
  count_reads(*g, n, info[0]);
  return n;
}

// CacheBegin's work (the joined decoder reading while it multiplies, dipdeploy/runtime/fused.py): the step
// of dd_cache_graph_step for the selection `sel` [tokens, k], with the misses' reads only started (the
// group's reader) or already copied (the mapping), and the hits' entries of the selection and their slots
// in `idx`, `slots` (hits in selection order, [1, H]) for the SparseGatherMatMul over the resident rows,
// which runs while the reads are in flight. The misses a read-ahead (dd_cache_graph_prefetch) holds are
// copied to their slots here and CacheEnd reads only the others, but still hands all the misses to the
// product over the rows read, so a read-ahead changes the reads and not one bit of the sums.
// Returns H. In a batched prefill every row of the chunk is
// placed first (prefill_fill), so all of `sel` counts as hits ([tokens, k]) and CacheEnd has none left.
__attribute__((visibility("default"))) int64_t dd_cache_graph_begin(void * gp, const int64_t * sel, int64_t tokens,
                                                                    int64_t k, int64_t * idx, int64_t * slots) {
  Group * g = static_cast<Group *>(gp);
  if (g && g->open_misses >= 0) return kOutOfStep;
  int64_t info[4] = {0, 0, 0, 0};
  bool filled = false;
  const int64_t misses = open_step(g, sel, tokens, k, slots, info, &filled);  // slots: every entry's, for now
  if (misses < 0) return misses;
  if (filled) {
    std::memcpy(idx, sel, size_t(tokens * k) * sizeof(int64_t));
    g->open_misses = 0;
    g->open_reads = 0;
    g->begin_ns = 0;
    return tokens * k;
  }
  int64_t h = 0;
  for (int64_t j = 0; j < k; ++j)  // the hits, compacted in place (h <= j)
    if (g->op_hits[size_t(j)]) {
      idx[h] = sel[j];
      slots[h] = slots[j];
      ++h;
    }
  g->begin_ns = info[0];
  int64_t n = misses;
  const int64_t * reads = g->op_rows.data();
  g->open_slots = g->op_slots.data();
  if (g->ahead) {  // the misses read ahead are in their slots already; only the others are read now
    const int64_t t0 = now_ns();
    int64_t arrived = 0;
    try {
      arrived = take_ahead(*g, n);
    } catch (...) {
      return kBadArgs;
    }
    if (arrived < 0) return arrived;
    count_reads(*g, arrived, g->ahead_ns + now_ns() - t0);
    n -= arrived;
    reads = g->rest_rows.data();
    g->open_slots = g->rest_slots.data();
  }
  if (n > 0 && g->map) {
    g->totals[1] += info[1] * int64_t(g->slabs.size());
    g->totals[4] += info[2];
    g->totals[7] += info[3];
  } else if (n > 0) {
    const int64_t t0 = now_ns();
    try {
      const int64_t rc = begin_direct(*g, reads, n);
      if (rc < 0) return rc;
    } catch (...) {
      return kBadArgs;
    }
    g->begin_ns = now_ns() - t0;
  }
  g->open_misses = misses;
  g->open_reads = n;
  return h;
}

// CachePrefetch's work (dipdeploy/runtime/fused.py): the rows of `pred` [k], a prediction of the group's
// next selection made before the layer's attention runs, that are not resident, read with the group's reader
// into the bounce buffer while the attention runs; the next CacheBegin takes the misses among them from
// there and reads only the others. The cache's state does not change, so neither do its decisions; a wrong
// prediction costs only reads. Nothing is read with the mapping, in a batched prefill or while another read
// of the group is open. Returns the rows read ahead.
__attribute__((visibility("default"))) int64_t dd_cache_graph_prefetch(void * gp, const int64_t * pred, int64_t k) {
  Group * g = static_cast<Group *>(gp);
  if (!g || k < 0 || (k > 0 && !pred)) return kBadArgs;
  if (!g->ahead_on || g->map || g->direct.fd < 0 || !g->full.empty() || g->direct.pending || g->ahead ||
      g->open_misses >= 0)
    return 0;
  const int64_t t0 = now_ns();
  try {
    g->ahead_rows.clear();
    for (int64_t j = 0; j < k; ++j) {
      if (pred[j] < 0 || pred[j] >= g->rows) return kOutOfRange;
      if (!g->resident[pred[j]]) g->ahead_rows.push_back(pred[j]);
    }
    std::sort(g->ahead_rows.begin(), g->ahead_rows.end());
    g->ahead_rows.erase(std::unique(g->ahead_rows.begin(), g->ahead_rows.end()), g->ahead_rows.end());
    const int64_t n = int64_t(g->ahead_rows.size());
    if (n == 0) return 0;
    const int64_t rc = begin_direct(*g, g->ahead_rows.data(), n);
    if (rc == kBounce) return 0;  // more than the bounce buffer holds: the step reads them itself
    if (rc < 0) return rc;
    g->ahead = true;
    g->ahead_ns = now_ns() - t0;
    g->totals[5] += n;
    return n;
  } catch (...) {
    return kBadArgs;
  }
}

// Turns the read-ahead of the `n` groups on or off (on when made): off, CachePrefetch reads nothing for
// them. Since a read-ahead changes no sum (dd_cache_graph_begin), the engine may switch it between tokens
// (dipdeploy/runtime/readahead.py). Returns 0, or kBadArgs.
__attribute__((visibility("default"))) int64_t dd_cache_read_ahead(void * const * groups, int64_t n, int on) {
  if (n < 0 || (n > 0 && !groups)) return kBadArgs;
  for (int64_t i = 0; i < n; ++i)
    if (!groups[i]) return kBadArgs;
  for (int64_t i = 0; i < n; ++i) static_cast<Group *>(groups[i])->ahead_on = on != 0;
  return 0;
}

// The misses of the step CacheBegin opened (0 in a batched prefill), or an error if none is open.
__attribute__((visibility("default"))) int64_t dd_cache_graph_misses(const void * gp) {
  const Group * g = static_cast<const Group *>(gp);
  if (!g) return kBadArgs;
  return g->open_misses >= 0 ? g->open_misses : kOutOfStep;
}

// CacheEnd's work: waits for the open step's reads, copies the rows into their staging slots and gives the
// misses' rows (their entries of the selection: a row of a group is its input column) and slots in `idx`,
// `slots` ([1, M], M = dd_cache_graph_misses), for the SparseGatherMatMul over the rows just read. Returns M.
__attribute__((visibility("default"))) int64_t dd_cache_graph_end(void * gp, int64_t * idx, int64_t * slots) {
  Group * g = static_cast<Group *>(gp);
  if (!g) return kBadArgs;
  const int64_t n = g->open_misses, reads = g->open_reads;
  if (n < 0) return kOutOfStep;
  g->open_misses = -1;
  if (n == 0) return 0;
  int64_t ns = g->begin_ns;
  if (!g->map && reads > 0) {
    const int64_t t0 = now_ns();
    const int64_t rc = end_direct(*g, g->open_slots, reads, g->slabs, &g->totals[4], &g->totals[1]);
    if (rc < 0) return rc;
    ns += now_ns() - t0;
  }
  if (reads > 0) count_reads(*g, reads, ns);
  std::memcpy(idx, g->op_rows.data(), size_t(n) * sizeof(int64_t));
  std::memcpy(slots, g->op_slots.data(), size_t(n) * sizeof(int64_t));
  return n;
}

// A graph step without a mapping reads its misses itself: `fd` (O_DIRECT where the Flash store got it),
// `io` a dd_io.cc pool (ring = 0) or ring (ring = 1), `bounce` a block-aligned buffer of `bounce_len`
// bytes shared by every group (one group reads at a time), plan_reads' block, max_request and max_gap.
__attribute__((visibility("default"))) int64_t dd_cache_direct(void * gp, int fd, void * io, int ring, int64_t block,
                                                               int64_t max_request, int64_t max_gap, uint8_t * bounce,
                                                               int64_t bounce_len) {
  Group * g = static_cast<Group *>(gp);
  if (!g || fd < 0 || !io || block < 1 || max_request < block || max_request % block || max_gap < 0 || !bounce ||
      bounce_len < 0)
    return kBadArgs;
  Direct & d = g->direct;
  d.fd = fd;
  d.io = io;
  d.ring = ring != 0;
  d.block = block;
  d.max_request = max_request;
  d.max_gap = max_gap;
  d.bounce = bounce;
  d.bounce_len = bounce_len;
  return 0;
}

// A batched prefill on the graph (dipdeploy/runtime/fused.py): with `n` (the group's arrays) full-height
// buffers `bufs[a]` ([rows, row_bytes[a]], the ones the graph's SparseGatherMatMul is bound to meanwhile),
// CacheStep fills them with each chunk's rows and CacheSettle warms the cache from the chunk's selection;
// n = 0 ends it. Belady's key depends on the step, which a chunk takes at once: refused.
__attribute__((visibility("default"))) int64_t dd_cache_prefill(void * gp, int64_t n, uint8_t ** bufs) {
  Group * g = static_cast<Group *>(gp);
  if (!g) return kBadArgs;
  g->chunk.clear();
  g->chunk_tokens = 0;
  if (n == 0) {
    g->full.clear();
    return 0;
  }
  if (n != int64_t(g->slabs.size()) || !bufs || g->policy == kBelady) return kBadArgs;
  if (!g->release.empty() || !g->deferred_rows.empty()) return kOutOfStep;  // a token's step is pending
  for (int64_t a = 0; a < n; ++a)
    if (!bufs[a]) return kBadArgs;
  g->full.assign(bufs, bufs + n);
  return 0;
}

// CacheSettle's work: the slot rule's deferred moves after a token's step, or, during a batched prefill,
// the warm-up from the chunk's selection (prefill_warm). Returns the rows moved or placed.
__attribute__((visibility("default"))) int64_t dd_cache_graph_settle(void * gp) {
  Group * g = static_cast<Group *>(gp);
  if (!g) return kBadArgs;
  if (g->full.empty()) return dd_cache_settle(g);
  try {
    return prefill_warm(*g);
  } catch (...) {
    return kBadArgs;
  }
}

// touched_blocks for a caller (dipdeploy/flash.py touched_blocks is held equal to it by tests/test_native_cache.py):
// the bytes of the `block`s holding `rows` (n, ascending) of `arrays` arrays, and in `*requests` the
// requests of at most `max_request` bytes they are read in; -6 on bad arguments.
__attribute__((visibility("default"))) int64_t dd_flash_touched(int64_t arrays, const int64_t * offset,
                                                                const int64_t * row_bytes, const int64_t * rows,
                                                                int64_t n, int64_t block, int64_t max_request,
                                                                int64_t * requests) {
  if (arrays < 0 || n < 0 || block < 1 || max_request < block || max_request % block || !requests ||
      (arrays > 0 && (!offset || !row_bytes)) || (n > 0 && !rows))
    return kBadArgs;
  for (int64_t a = 0; a < arrays; ++a)
    if (offset[a] < 0 || row_bytes[a] < 1) return kBadArgs;
  for (int64_t i = 0; i < n; ++i)
    if (rows[i] < 0 || (i > 0 && rows[i] <= rows[i - 1])) return kBadArgs;
  try {
    return touched_blocks(file_order(arrays, offset), offset, row_bytes, rows, n, block, max_request, requests);
  } catch (...) {
    return kBadArgs;
  }
}

// The errno of a group's last failed read (kReadFailed).
__attribute__((visibility("default"))) int64_t dd_cache_read_errno(const void * gp) {
  return gp ? static_cast<const Group *>(gp)->direct.error : 0;
}

// The graph steps' totals of `n` groups summed into out[8] (misses, requests, bytes wanted, read or copy
// ns, block bytes (read from the device, or with the mapping the blocks holding the copied rows), rows read
// ahead, rows read ahead that a step missed, and with the mapping the requests a device serves the copied
// rows' blocks in), each group's reset: the host's once-per-token collection.
__attribute__((visibility("default"))) int64_t dd_cache_drain(void * const * groups, int64_t n, int64_t * out) {
  if (n < 0 || (n > 0 && !groups) || !out) return kBadArgs;
  for (int i = 0; i < kTotals; ++i) out[i] = 0;
  for (int64_t j = 0; j < n; ++j) {
    Group * g = static_cast<Group *>(groups[j]);
    if (!g) return kBadArgs;
    for (int i = 0; i < kTotals; ++i) {
      out[i] += g->totals[i];
      g->totals[i] = 0;
    }
  }
  return 0;
}

__attribute__((visibility("default"))) const char * dd_cache_error(int64_t code) {
  switch (code) {
    case kOutOfRange: return "a selected row lies outside the group's rows";
    case kOutOfStep: return "slot table out of step with the cache: a hit has no slot or a miss holds one";
    case kNoStaging: return "more rows need staging than the slab has";
    case kNoFreeSlot: return "no free slot for an admitted row after the step";
    case kOutsideFile: return "a row's bytes lie outside the mapped MLP file: the bundle is truncated";
    case kNoMapping: return "the group has neither the mapped MLP file nor a reader to read its misses with";
    case kBounce: return "the misses' blocks exceed the bounce buffer the plan reserved";
    case kReadFailed: return "a read of the MLP file failed or came back short: the bundle may be truncated; run `dipdeploy inspect --verify`";
    case kOneToken: return "input 'indices' must be one token's selection [1, K] outside a batched prefill";
    default: return "bad arguments";
  }
}

// Forget a pending step (the Python side handed the state to the numpy reference).
__attribute__((visibility("default"))) void dd_cache_drop_step(void * gp) {
  Group * g = static_cast<Group *>(gp);
  if (!g) return;
  g->release.clear();
  g->deferred_rows.clear();
  g->deferred_from.clear();
  // a run that failed between CacheBegin and CacheEnd: its reads still land, so they are waited for
  if (g->direct.pending) end_reads(g->direct);
  g->direct.pending = false;
  g->ahead = false;
  g->open_misses = -1;
}

}  // extern "C"
