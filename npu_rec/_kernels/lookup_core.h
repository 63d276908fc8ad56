// The steps of npu_rec's fused training lookup (NpuRecTrainLookup, whose op
// and kernel are in lookup_op.cc). See docs/design.md, "Compiled kernels".
//
//   Deduplicate  a batch's ids -> unique keys (first-occurrence order, as
//                tf.unique_with_counts), the index of each id, sightings and
//                the newest time per unique key; the keys mixed as KeyIndex
//                mixes them.
//   LookupRows   the unique keys -> their rows (probe of the key index:
//                npu_rec's NpuRecKeyMap directly, or a DenseHashTable through
//                LookupInterface; the two reserved mixed values through the
//                `reserved_rows` variable), the keys without a row admitted
//                in place when the table admits at once, and the rows'
//                values gathered while their counts and last-seen times are
//                updated.
//
// Locks: the hash map's own (shared) lock for the probe, then the table's
// variables' locks (exclusive, increasing address order); the admission
// inserts into the map (its exclusive lock) under the variables' locks. No
// other op takes a variable's lock while holding the map's.
#ifndef NPU_REC_KERNELS_LOOKUP_CORE_H_
#define NPU_REC_KERNELS_LOOKUP_CORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"

namespace npu_rec {

// NpuRecTrainLookup's input positions (the slots list comes last).
enum LookupInput {
  kTable, kReserved, kValues, kCounts, kLastSeen, kSavedCounts, kRowKeys, kFree, kNextRow,
  kNumFree, kIds, kIdCounts, kTimes, kLimit, kClock, kKnownRows, kSlots
};

// One table's settings (the kernel attributes of its lookup).
struct TableAttrs {
  int64_t dim = 1;
  bool admit = false;  // admit every key without a row (keyed initialiser)
  std::vector<float> slot_init;  // one per slot (input kSlots + k)
  int64_t seed = 0;
  bool dynamic = false;
  std::string full_head, full_tail;  // the "table is full" message around the rows needed
};

// A batch's ids deduplicated.
struct Unique {
  std::vector<int64_t> keys, mixed, sightings;
  std::vector<int64_t> newest;  // per key; empty when the batch has one time
};

// Deduplicates ids[i] for i < n into `out`; writes index[i] (the position of
// id i among the unique keys). `weights` (sightings per id) and `times` (per
// id) may be null: one sighting each, one time for the batch.
void Deduplicate(const int64_t* ids, int64_t n, const int64_t* weights, const int64_t* times,
                 int64_t* index, Unique* out);

// `out` for keys[i], i < n, already unique (each its own index), with
// `weights` (may be null: one sighting each) and one time for the batch.
void AsUnique(const int64_t* keys, int64_t n, const int64_t* weights, Unique* out);

// rows[i] and emb[i * dim ...] for every unique key of the table at the
// kernel's inputs (LookupInput): probed (those `known` gives a row, when
// not null, taken as found: known[i] >= 0), admitted (when attrs.admit),
// gathered (zeros where no row), counts += sightings and
// last_seen = max(last_seen, time) in place. `batch` is the one time of the
// batch when u.newest is empty. The positions of keys left without a row go
// to `miss`.
absl::Status LookupRows(::tensorflow::OpKernelContext* ctx, const TableAttrs& attrs,
                        const Unique& u, int64_t batch, int64_t* rows, float* emb,
                        std::vector<int64_t>* miss, const int64_t* known = nullptr);

// rows[i] = the key index's row of mixed[i], or -1: the index (a `KeyIndex`'s
// map) at the op's input `index` and its `reserved_rows` variable at input
// `reserved`, probed as NpuRecTrainLookup probes. Reads only (the map's
// shared lock).
absl::Status ProbeKeyIndex(::tensorflow::OpKernelContext* ctx, const std::vector<int64_t>& mixed,
                           int64_t* rows, int index, int reserved);

}  // namespace npu_rec

#endif  // NPU_REC_KERNELS_LOOKUP_CORE_H_
