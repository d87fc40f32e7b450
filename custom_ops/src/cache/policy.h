// The cache policies of the native cache step: ONE traits table, which every part of cache/ reads (the
// cache rule's key and whether it runs, dd_cache_new's checks, a batched prefill's refusal), so a policy's
// identity is one record here. It mirrors dipdeploy/cache/policies.py: the records are in the order of
// dipdeploy.cache.POLICIES (the host passes dd_cache_new a policy's index there), and the traits are what
// RowCache does with each (the C ABI of policy.cc exports them; tests/test_traits_native.py holds them equal).
#pragma once

#include <cstdint>

namespace dd_cache {

// The statistics a packed key is made of (policies.py RowCache._key).
enum class Stat : uint8_t {
  kZero,     // 0
  kLastUse,  // the row's last use (a step)
  kUses,     // the row's use count, kept across evictions
  kNextUse,  // horizon − the row's next use after the step just taken (belady's table): nearer → higher
};
constexpr const char * kStatNames[] = {"0", "last_use", "uses", "next_use"};

struct PolicyTraits {
  const char * name;  // dipdeploy.cache.POLICIES[index]
  bool updates;       // every access runs the cache rule: the residency becomes the top-C of resident ∪ selected
                      // by the key (else it stays as the caller set it)
  bool needs_future;  // the key reads the next-use table of a recorded trace (dd_cache_new's next_use)
  bool pinned;        // the residency is a fixed pinned set the caller marks (static_rows)
  bool bypass;        // a selected row may be out of the cache after its step, with the capacity >= the selection
  bool no_capacity;   // the capacity is forced to 0: every row from Flash
  Stat primary, secondary;  // the packed key, (primary, secondary, lower index first); unused unless `updates`
};

constexpr PolicyTraits kPolicies[] = {
    {"none", false, false, false, true, true, Stat::kZero, Stat::kZero},
    {"lru", true, false, false, false, false, Stat::kLastUse, Stat::kZero},
    {"lfu", true, false, false, true, false, Stat::kUses, Stat::kLastUse},
    {"belady", true, true, false, true, false, Stat::kNextUse, Stat::kLastUse},
    {"static", false, false, true, true, false, Stat::kZero, Stat::kZero},
};

constexpr int kPolicyCount = int(sizeof(kPolicies) / sizeof(kPolicies[0]));

inline const PolicyTraits & policy_of(int policy) { return kPolicies[policy]; }

// The key changes with the step itself, so a chunk of steps taken at once cannot rank by it
// (policies.py access_steps steps belady one by one; dd_cache_prefill refuses it).
constexpr bool step_keyed(const PolicyTraits & p) {
  return p.primary == Stat::kNextUse || p.secondary == Stat::kNextUse;
}

}  // namespace dd_cache
