// NpuRecKeyMap: the key index of npu_rec's tables on the kernel path (see
// docs/design.md, "The key index" and "Compiled kernels").
//
// An int64 -> int64 (values in int32 range) open-addressing hash map behind TensorFlow's
// LookupInterface, so the stock lookup ops (LookupTableFindV2, InsertV2,
// RemoveV2, SizeV2, ExportV2, ImportV2) and DenseHashTable's checkpoint format
// work on it unchanged, while npu_rec's kernels probe it directly.
//
// Layout: one array of 12-byte {int64 key, int32 value} buckets (values are
// rows or record locations, below 2**31 per shard; an insert of a value outside
// int32 is refused), linear probing from the key's home bucket (keys arrive
// mixed by KeyIndex, so all their bits are well spread), two reserved key
// values marking empty and deleted buckets (refused as keys). When the live
// keys would pass `max_load_factor`, the array grows by `growth_factor`:
// 2 keeps power-of-two sizes and the home bucket `key & mask` (the table's key
// index); another factor sizes the array exactly (at least
// `keys / max_load_factor` buckets) with the home bucket `(h * buckets) >> 64`
// (the high half of the 128-bit product, h = key times an odd constant), which
// bounds the bytes per key by 12 * growth / max_load (the tiered table's cold
// index). An insert reuses the first tombstone of its probe chain; when live
// keys plus tombstones would pass (1 + max_load_factor) / 2 of the array, it is
// rehashed at the same size (dropping the tombstones), so a probe always meets
// an empty bucket. `ReserveTotal` sizes the array once for a known count.
//
// Locks: finds take the map's lock shared, inserts / removes / imports /
// exports exclusively. Export copies the array (keys and values [buckets, 1],
// the markers in empty and deleted buckets, as DenseHashTable exports), and
// import rebuilds the map from such arrays.
#ifndef NPU_REC_KERNELS_KEY_MAP_H_
#define NPU_REC_KERNELS_KEY_MAP_H_

#include <cstdint>
#include <memory>
#include <string>

#include "tensorflow/core/framework/lookup_interface.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"

namespace npu_rec {

class NpuRecKeyMap : public ::tensorflow::lookup::LookupInterface {
 public:
#pragma pack(push, 4)
  struct Bucket {
    int64_t key;
    int32_t value;
  };
#pragma pack(pop)
  static_assert(sizeof(Bucket) == 12, "12-byte buckets");
  // Exact sizes: a key is multiplied by this odd constant before its home bucket
  // is taken from the high bits (see Home).
  static constexpr uint64_t kHomeMul = 0x9E3779B97F4A7C15ULL;

  // The creator of LookupTableOp: attributes and the empty/deleted keys of
  // `kernel`'s node; errors go to ctx->SetStatus.
  NpuRecKeyMap(::tensorflow::OpKernelContext* ctx, ::tensorflow::OpKernel* kernel);

  // LookupInterface (the stock ops).
  absl::Status Find(::tensorflow::OpKernelContext* ctx, const ::tensorflow::Tensor& keys,
                    ::tensorflow::Tensor* values,
                    const ::tensorflow::Tensor& default_value) override;
  absl::Status Insert(::tensorflow::OpKernelContext* ctx, const ::tensorflow::Tensor& keys,
                      const ::tensorflow::Tensor& values) override;
  absl::Status Remove(::tensorflow::OpKernelContext* ctx,
                      const ::tensorflow::Tensor& keys) override;
  size_t size() const override;
  absl::Status ExportValues(::tensorflow::OpKernelContext* ctx) override;
  absl::Status ImportValues(::tensorflow::OpKernelContext* ctx, const ::tensorflow::Tensor& keys,
                            const ::tensorflow::Tensor& values) override;
  absl::Status CheckKeyAndValueTensorsForImport(const ::tensorflow::Tensor& keys,
                                                const ::tensorflow::Tensor& values) override;
  ::tensorflow::DataType key_dtype() const override { return ::tensorflow::DT_INT64; }
  ::tensorflow::DataType value_dtype() const override { return ::tensorflow::DT_INT64; }
  ::tensorflow::TensorShape key_shape() const override { return {}; }
  ::tensorflow::TensorShape value_shape() const override { return {}; }
  int64_t MemoryUsed() const override;
  std::string DebugString() const override;

  // The kernels' direct path. out[i] = the value of keys[i], or `missing`;
  // keys must not be the reserved values. Takes the lock shared.
  void FindBatch(const int64_t* keys, int64_t n, int64_t* out, int64_t missing) const;
  // Grows or rehashes now, under the exclusive lock, so that `extra` more keys
  // fit without allocating (ResourceExhausted, the map unchanged, if they cannot).
  absl::Status Prepare(int64_t extra);
  // Grows the array (exactly, never shrinking) so that `keys` keys in all fit
  // below the load factor: one allocation before a bulk insert of known size.
  absl::Status ReserveTotal(int64_t keys);
  // {buckets, live keys, tombstones}, under the shared lock.
  void Counts(int64_t out[3]) const;
  // Inserts (or overwrites) keys[i] -> values[i] under the exclusive lock.
  absl::Status InsertBatch(const int64_t* keys, const int64_t* values, int64_t n);
  // The first reserved key among keys[0, n), as an error naming it, or OK.
  absl::Status CheckKeys(const int64_t* keys, int64_t n) const;
  // The first value among values[0, n) outside int32, as an error naming it, or OK.
  static absl::Status CheckValues(const int64_t* values, int64_t n);

 private:
  ~NpuRecKeyMap() override = default;

  void InsertLocked(int64_t key, int64_t value) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Room for `extra` more keys in new buckets: grow or rehash first if needed.
  // Each returns ResourceExhausted, leaving the map unchanged, when the new
  // bucket array cannot be allocated.
  absl::Status Reserve(int64_t extra) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The home bucket of `key` among `num_buckets_` (its low bits when the array is
  // a power of two, else the high half of h * buckets), and the bucket after `i`.
  inline uint64_t Home(int64_t key) const TF_SHARED_LOCKS_REQUIRED(mu_) {
    const uint64_t k = static_cast<uint64_t>(key);
    if (pow2_) return k & static_cast<uint64_t>(num_buckets_ - 1);
    // Multiplied by an odd constant first, so that keys crowded in a part of the
    // 64-bit range (e.g. only positive ones, unmixed) still spread over all buckets.
    const uint64_t h = k * kHomeMul;
    return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * num_buckets_) >> 64);
  }
  inline uint64_t Next(uint64_t i) const TF_SHARED_LOCKS_REQUIRED(mu_) {
    return i + 1 == static_cast<uint64_t>(num_buckets_) ? 0 : i + 1;
  }
  absl::Status Rehash(int64_t buckets) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Reset(int64_t buckets) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Buckets holding `keys` below the load factor (a power of two when growth is 2).
  int64_t BucketsFor(int64_t keys) const;

  mutable ::tensorflow::mutex mu_;
  std::unique_ptr<Bucket[]> buckets_ TF_GUARDED_BY(mu_);
  int64_t num_buckets_ TF_GUARDED_BY(mu_) = 0;
  int64_t live_ TF_GUARDED_BY(mu_) = 0;
  int64_t deleted_ TF_GUARDED_BY(mu_) = 0;
  int64_t empty_key_ = 0;
  int64_t deleted_key_ = 0;
  float max_load_ = 0.8f;
  float growth_ = 2.0f;
  bool pow2_ = true;  // growth 2: power-of-two sizes, home = the key's low bits
  int64_t initial_buckets_ = 8;
};

}  // namespace npu_rec

#endif  // NPU_REC_KERNELS_KEY_MAP_H_
