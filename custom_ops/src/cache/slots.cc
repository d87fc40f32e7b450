// The slot rule of dipdeploy/cache/slots.py (SlotTable): hits keep their slot; evicted rows the token does
// not use free theirs; misses in ascending row order take the lowest free slot if admitted, else staging;
// after the MLP, `settle` frees the used evicted rows and moves the admitted rows that waited in staging.
// The room's overview is group.h.
#include "cache/group.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace dd_cache {

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

}  // namespace dd_cache

using namespace dd_cache;

extern "C" {

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

}  // extern "C"
