// A batched prefill on the graph (dd_cache_prefill): CacheStep places a chunk's rows in full-height
// buffers (prefill_fill), CacheSettle warms the cache from the chunk's selection (prefill_warm). The room's
// overview is group.h.
#include "cache/group.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace dd_cache {

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
  if (policy_of(g.policy).updates && g.capacity > 0) {
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
  // The selection's memory goes back now, not at the next chunk: it is tokens × k indices per group, and
  // every group of every layer keeping its capacity would hold all the layers' selections at once.
  std::vector<int64_t>().swap(g.chunk);
  g.chunk_tokens = 0;
  return n;
}

}  // namespace dd_cache

using namespace dd_cache;

extern "C" {

// A batched prefill on the graph (dipdeploy/runtime/backends/joined.py): with `n` (the group's arrays) full-height
// buffers `bufs[a]` ([rows, row_bytes[a]], the ones the graph's SparseGatherMatMul is bound to meanwhile),
// CacheStep fills them with each chunk's rows and CacheSettle warms the cache from the chunk's selection;
// n = 0 ends it. A key that depends on the step (belady's), which a chunk takes at once: refused.
__attribute__((visibility("default"))) int64_t dd_cache_prefill(void * gp, int64_t n, uint8_t ** bufs) {
  Group * g = static_cast<Group *>(gp);
  if (!g) return kBadArgs;
  g->chunk.clear();
  g->chunk_tokens = 0;
  if (n == 0) {
    g->full.clear();
    return 0;
  }
  if (n != int64_t(g->slabs.size()) || !bufs || step_keyed(policy_of(g->policy))) return kBadArgs;
  if (!g->release.empty() || !g->deferred_rows.empty()) return kOutOfStep;  // a token's step is pending
  for (int64_t a = 0; a < n; ++a)
    if (!bufs[a]) return kBadArgs;
  g->full.assign(bufs, bufs + n);
  return 0;
}

// The bytes a group still holds for a batched prefill's chunk (its selection's capacity): none once the
// chunk has settled. Tests read it (tests/test_prefill.py); the runtime does not.
__attribute__((visibility("default"))) int64_t dd_cache_chunk_bytes(void * gp) {
  const Group * g = static_cast<const Group *>(gp);
  return g ? int64_t(g->chunk.capacity() * sizeof(int64_t)) : kBadArgs;
}

}  // extern "C"
