// The cache step as the graph ops of ort/op_cache.cc run it (CacheStep, CacheSettle, CacheBegin, CacheEnd,
// CachePrefetch; declared in cache.h): a step whose misses are copied from the mapping or read with the
// group's reader, the step split in two halves around the product over the resident rows, and a
// read-ahead for the next step. The room's overview is group.h.
#include "cache/cache.h"
#include "cache/group.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

using namespace dd_cache;

extern "C" {

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
  if (g && g->draft) return kDraftStep;
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

// CacheBegin's work in a speculative draft (dd_cache_draft): the entries of one token's selection `sel`
// [1, k] that the cache holds and their slots in `idx`, `slots` (hits in selection order, [1, H]), and no
// misses for CacheEnd: the draft's product runs over the resident rows alone. The cache, its slots and its
// counters do not change and nothing is read. Returns H.
static int64_t draft_begin(Group & g, const int64_t * sel, int64_t tokens, int64_t k, int64_t * idx,
                           int64_t * slots) {
  if (k < 0 || tokens < 0) return kBadArgs;
  if (!g.full.empty() || tokens != 1) return kOneToken;
  int64_t h = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t r = sel[j];
    if (r < 0 || r >= g.rows) return kOutOfRange;
    if (!g.resident[r]) continue;
    if (g.slot_of[r] < 0) return kOutOfStep;
    idx[h] = r;
    slots[h] = g.slot_of[r];
    ++h;
  }
  g.open_misses = 0;
  g.open_reads = 0;
  g.begin_ns = 0;
  return h;
}

// CacheBegin's work (the joined decoder reading while it multiplies, dipdeploy/runtime/backends/joined.py): the step
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
  if (g && g->draft) return draft_begin(*g, sel, tokens, k, idx, slots);
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

// CachePrefetch's work (dipdeploy/export/joined.py): the rows of `pred` [k], a prediction of the group's
// next selection made before the layer's attention runs, that are not resident, read with the group's reader
// into the bounce buffer while the attention runs; the next CacheBegin takes the misses among them from
// there and reads only the others. The cache's state does not change, so neither do its decisions; a wrong
// prediction costs only reads. Nothing is read with the mapping, in a batched prefill or while another read
// of the group is open. Returns the rows read ahead.
__attribute__((visibility("default"))) int64_t dd_cache_graph_prefetch(void * gp, const int64_t * pred, int64_t k) {
  Group * g = static_cast<Group *>(gp);
  if (!g || k < 0 || (k > 0 && !pred)) return kBadArgs;
  if (!g->ahead_on || g->draft || g->map || g->direct.fd < 0 || !g->full.empty() || g->direct.pending ||
      g->ahead || g->open_misses >= 0)
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

// Puts the `n` groups in or out of a speculative draft (dipdeploy/runtime/speculate.py): in it, CacheBegin
// and CacheEnd multiply the selection's resident rows only (draft_begin), CacheSettle and CachePrefetch do
// nothing, and CacheStep is refused (kDraftStep). A read-ahead in flight is waited for first (its reads
// count, as a read-ahead no step used does). Refused while a group has a step open or is in a prefill.
// Returns 0, or an error code.
__attribute__((visibility("default"))) int64_t dd_cache_draft(void * const * groups, int64_t n, int on) {
  if (n < 0 || (n > 0 && !groups)) return kBadArgs;
  for (int64_t i = 0; i < n; ++i) {
    const Group * g = static_cast<const Group *>(groups[i]);
    if (!g) return kBadArgs;
    if (g->open_misses >= 0 || !g->full.empty()) return kOutOfStep;
  }
  for (int64_t i = 0; i < n; ++i) {
    Group * g = static_cast<Group *>(groups[i]);
    if (on && g->ahead) {
      const int64_t rc = end_ahead(*g);
      if (rc < 0) return rc;
    }
    g->draft = on != 0;
  }
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

// CacheSettle's work: the slot rule's deferred moves after a token's step, or, during a batched prefill,
// the warm-up from the chunk's selection (prefill_warm). Returns the rows moved or placed.
__attribute__((visibility("default"))) int64_t dd_cache_graph_settle(void * gp) {
  Group * g = static_cast<Group *>(gp);
  if (!g) return kBadArgs;
  if (g->draft) return 0;
  if (g->full.empty()) return dd_cache_settle(g);
  try {
    return prefill_warm(*g);
  } catch (...) {
    return kBadArgs;
  }
}

}  // extern "C"
