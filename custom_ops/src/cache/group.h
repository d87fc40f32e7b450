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
// The same step also runs inside a graph (the ops CacheStep and CacheSettle of ort/op_cache.cc, declared in
// cache.h): the graph carries each group's handle as an int64 input, so a handle is checked against
// the groups alive in this process before a kernel touches it, and the step counts its misses, requests,
// bytes and read time in the group for the host to collect once per token (dd_cache_drain). With no
// caller left to read the misses, a graph step either copies them from the mapping or reads them itself
// through the Flash store's reader (io/) with block-aligned requests planned as
// dipdeploy/flash.py plan_reads plans them (dd_cache_direct).
//
// The room (custom_ops/src/cache/): this header holds the group's state and the internal functions the
// files share; policy.h the policies' traits table, policy.cc the cache rule (the keys and the top-C
// admission), slots.cc the slot rule, reads.cc the misses' copies from the mapping and the direct reads,
// prefill.cc a batched prefill, graph.cc the steps of the graph ops, group.cc the C ABI that makes, feeds,
// drains and frees a group.
#pragma once

#include "cache/policy.h"

#include <cstdint>
#include <vector>

namespace dd_cache {

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

// The Flash store's O_DIRECT reader for a graph step (dd_cache_direct): its file, its io/ reader,
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
  int policy;  // an index into kPolicies (policy.h)
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
  // a speculative draft (dd_cache_draft): CacheBegin hands the product the selection's resident rows only,
  // CacheEnd none; nothing is read, and neither the cache nor its counters change
  bool draft = false;
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
constexpr int64_t kOneToken = -10;  // a step outside a prefill with more than one token's selection
constexpr int64_t kDraftStep = -11;  // a draft through CacheStep (it has no product over the resident rows alone)

// policy.cc: the cache rule.
int64_t access(Group & g, const int64_t * sel, int64_t k, uint8_t * hits);
void admit(Group & g);

// slots.cc: the slot rule.
int64_t take(Group & g, const int64_t * rows, int64_t n, int64_t * given);
int64_t assign(Group & g, const int64_t * sel, int64_t k, const uint8_t * hits, int64_t * slots,
               int64_t * read_rows, int64_t * read_slots);

inline void free_row(Group & g, int64_t r) {
  g.row_of[g.slot_of[r]] = -1;
  g.slot_of[r] = -1;
}

// reads.cc: the misses' rows, from the mapping or with the group's reader.
std::vector<int64_t> file_order(int64_t arrays, const int64_t * offset);
int64_t touched_blocks(const std::vector<int64_t> & order, const int64_t * offset, const int64_t * row_bytes,
                       const int64_t * rows, int64_t n, int64_t block, int64_t max_request, int64_t * requests);
int64_t copy_rows(Group & g, const int64_t * rows, const int64_t * slots, int64_t n,
                  const std::vector<uint8_t *> & dest);
int64_t begin_direct(Group & g, const int64_t * rows, int64_t n);
int64_t end_reads(Direct & d);
int64_t end_direct(Group & g, const int64_t * slots, int64_t n, const std::vector<uint8_t *> & dest, int64_t * device,
                   int64_t * requests);
int64_t read_direct(Group & g, const int64_t * rows, const int64_t * slots, int64_t n,
                    const std::vector<uint8_t *> & dest, int64_t * device, int64_t * requests);
int64_t now_ns();
void count_reads(Group & g, int64_t n, int64_t ns);
int64_t end_ahead(Group & g);
int64_t take_ahead(Group & g, int64_t n);

// prefill.cc: a batched prefill's fill and settle.
int64_t prefill_fill(Group & g, const int64_t * sel, int64_t tokens, int64_t k, int64_t * slots);
int64_t prefill_warm(Group & g);

}  // namespace dd_cache

// group.cc: the C ABI the graph steps call too.
extern "C" {
int64_t dd_cache_select(void * gp, const int64_t * sel, int64_t k, int64_t * slots, uint8_t * hits, int64_t * read_rows,
                        int64_t * read_slots, int64_t * info);
int64_t dd_cache_settle(void * gp);
void dd_cache_drop_step(void * gp);
}
