// A group's C ABI for the host (dipdeploy/runtime/native_cache.py, through ctypes): made over caller-owned
// state, handed its slab arrays, its mapping or its reader, stepped one token at a time (dd_cache_select,
// dd_cache_settle in slots.cc), drained, freed; and the live set the graph ops check a handle against.
// The room's overview is group.h.
#include "cache/cache.h"
#include "cache/group.h"

#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace {

// The groups alive in this process: a graph's handle input is only a number, so a kernel checks it here
// before using it as a pointer (a stale or forged handle is an error, not a crash).
std::mutex live_mutex;
std::unordered_set<const void *> live_groups;

}  // namespace

using namespace dd_cache;

extern "C" {

// A group over caller-owned state (see Group); `policy` indexes dipdeploy.cache.POLICIES (= kPolicies,
// policy.h); `next_use` ([next_use_steps, rows] int32) is required where the policy needs_future (belady).
// NULL on bad arguments.
__attribute__((visibility("default"))) void * dd_cache_new(int64_t rows, int64_t capacity, int64_t staging,
                                                           int policy, uint8_t * resident, int64_t * last_use,
                                                           int64_t * uses, int64_t * counters, int64_t * slot_of,
                                                           int64_t * row_of, const int32_t * next_use,
                                                           int64_t next_use_steps) {
  if (rows < 1 || rows >= (int64_t(1) << kIdxBits) || capacity < 0 || capacity > rows || staging < 0 ||
      policy < 0 || policy >= kPolicyCount || !resident || !last_use || !uses || !counters || !slot_of ||
      (capacity > 0 && !row_of) || (policy_of(policy).needs_future && (!next_use || next_use_steps < 1)))
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

// A graph step without a mapping reads its misses itself: `fd` (O_DIRECT where the Flash store got it),
// `io` an io/pool.cc pool (ring = 0) or ring (ring = 1), `bounce` a block-aligned buffer of `bounce_len`
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
    case kDraftStep: return "a speculative draft runs the joined decoder's overlap graph (CacheBegin/CacheEnd), not CacheStep";
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
  g->draft = false;
}

}  // extern "C"
