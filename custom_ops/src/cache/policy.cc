// The cache rule of dipdeploy/cache/policies.py (RowCache): hits = resident[selected]; last use and use
// count updated; the new residency is the top-C of resident ∪ selected by the policy's packed unique
// int64 key. The room's overview is group.h.
#include "cache/group.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace dd_cache {

// policies.py _pack: ((primary << SEC | secondary) << IDX) | (rows - 1 - index), in wrapping int64
// arithmetic as numpy computes it.
inline int64_t pack(int64_t primary, int64_t secondary, int64_t index, int64_t rows) {
  uint64_t k = ((uint64_t(primary) << kSecBits) | uint64_t(secondary)) << kIdxBits;
  return int64_t(k | uint64_t(rows - 1 - index));
}

// One statistic of row r (Stat).
inline int64_t stat_of(const Group & g, Stat s, int64_t r) {
  switch (s) {
    case Stat::kZero:
      return 0;
    case Stat::kLastUse:
      return g.last_use[r];
    case Stat::kUses:
      return g.uses[r];
    case Stat::kNextUse: {  // nearer next use → higher key, from the step just taken
      const int64_t step = g.counters[0];
      int64_t t = std::min(step - 1, g.next_use_steps - 1);
      int64_t horizon = g.next_use_steps + 1;
      return horizon - int64_t(g.next_use[t * g.rows + r]);
    }
  }
  return 0;
}

// The policy's packed key of row r (policies.py RowCache._key).
inline int64_t key_of(const Group & g, const PolicyTraits & p, int64_t r) {
  return pack(stat_of(g, p.primary, r), stat_of(g, p.secondary, r), r, g.rows);
}

// policies.py RowCache._admit on a residency already marked with the selected rows: the top-C by the
// policy's unique key stay, the others go into g.dropped.
void admit(Group & g) {
  g.cand.clear();
  for (int64_t r = 0; r < g.rows; ++r)
    if (g.resident[r]) g.cand.push_back(r);
  const int64_t over = int64_t(g.cand.size()) - g.capacity;
  if (over > 0) {  // drop the `over` lowest keys (unique, so the set is the reference's)
    const PolicyTraits & p = policy_of(g.policy);
    g.keys.resize(g.cand.size());
    for (size_t i = 0; i < g.cand.size(); ++i)
      g.keys[i] = uint64_t(key_of(g, p, g.cand[i])) ^ (uint64_t(1) << 63);  // signed order as unsigned
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
  if (!policy_of(g.policy).updates || g.capacity <= 0) return 0;
  for (int64_t j = 0; j < k; ++j) g.resident[sel[j]] = 1;
  admit(g);
  return 0;
}

}  // namespace dd_cache

namespace {

const dd_cache::PolicyTraits * policy_at(int64_t p) {
  return p >= 0 && p < dd_cache::kPolicyCount ? &dd_cache::kPolicies[p] : nullptr;
}

}  // namespace

// The policy traits table (policy.h) through a C ABI, for Python (ctypes) to read and hold equal to
// dipdeploy/cache/policies.py (tests/test_traits_native.py). Nothing in the library calls these.
extern "C" {

// How many policies the table holds; policy p in [0, count) is what dd_cache_new's `policy` p means.
__attribute__((visibility("default"))) int64_t dd_policy_count(void) { return dd_cache::kPolicyCount; }

// dipdeploy.cache.POLICIES[p] as the table names it, or NULL.
__attribute__((visibility("default"))) const char * dd_policy_name(int64_t p) {
  const dd_cache::PolicyTraits * t = policy_at(p);
  return t ? t->name : nullptr;
}

// One trait of policy p, 0 or 1, named as its field in policy.h: "updates", "needs_future", "pinned",
// "bypass", "no_capacity", or "step_keyed" (its key changes with the step: no batched prefill).
// -6: no such policy or trait.
__attribute__((visibility("default"))) int64_t dd_policy_trait(int64_t p, const char * trait) {
  const dd_cache::PolicyTraits * t = policy_at(p);
  if (!t || !trait) return dd_cache::kBadArgs;
  const struct {
    const char * name;
    bool value;
  } traits[] = {{"updates", t->updates}, {"needs_future", t->needs_future}, {"pinned", t->pinned},
                {"bypass", t->bypass},   {"no_capacity", t->no_capacity},   {"step_keyed", dd_cache::step_keyed(*t)}};
  for (const auto & e : traits)
    if (std::strcmp(e.name, trait) == 0) return e.value;
  return dd_cache::kBadArgs;
}

// The statistics policy p's packed key is made of, (primary, secondary, lower index first): "0",
// "last_use", "uses" or "next_use" each. Returns 0, or -6 for no such policy.
__attribute__((visibility("default"))) int64_t dd_policy_key(int64_t p, const char ** primary,
                                                             const char ** secondary) {
  const dd_cache::PolicyTraits * t = policy_at(p);
  if (!t || !primary || !secondary) return dd_cache::kBadArgs;
  *primary = dd_cache::kStatNames[int(t->primary)];
  *secondary = dd_cache::kStatNames[int(t->secondary)];
  return 0;
}

}  // extern "C"
