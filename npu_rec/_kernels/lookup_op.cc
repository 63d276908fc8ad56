// The fused training lookup of npu_rec's sparse tables (see docs/design.md,
// "Compiled kernels").
//
//   NpuRecTrainLookup  a batch's ids [n] -> in one pass: deduplicated (first
//                      occurrence order, as tf.unique_with_counts), sightings
//                      per unique key, newest timestamp per unique key
//                      (optionally clamped as SingleShardTable._clamp_times
//                      does), the keys mixed and probed in the table's
//                      key map: npu_rec's own NpuRecKeyMap directly
//                      (key_map.h), or a DenseHashTable (the stock path's,
//                      or one made before) through TensorFlow's
//                      LookupInterface; the two reserved mixed values routed
//                      to the `reserved_rows` variable), the rows of the keys found
//                      gathered and their counts / last-seen updated in place.
//                      Tables that admit at once admit here; for the others
//                      keys without a row are returned (positions, keys,
//                      sightings, times) for admission in stock ops.
//
// Locks: the hash map's own (shared) lock for the probe, then the variables'
// locks (exclusive, increasing address order); the in-kernel admission inserts
// into the map (its exclusive lock) under the variables' locks. No other op
// takes a variable's lock while holding the map's.

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "key_map.h"
#include "kernel_util.h"
#include "tensorflow/core/framework/lookup_interface.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/kernels/lookup_util.h"

namespace npu_rec {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;

// The key mixing of npu_rec/table/_key_index.py: multiply by an odd constant,
// then fold the high half into the low half (a bijection of the 64-bit ints).
constexpr uint64_t kMul = 0x9E3779B97F4A7C15ULL;
constexpr int64_t kEmptyKey = INT64_MIN;
constexpr int64_t kDeletedKey = INT64_MIN + 1;

// Unique keys probed inline below this count; above, in chunks of at least kProbeChunk.
constexpr int64_t kInlineProbe = 16384;
constexpr int64_t kProbeChunk = 8192;

// Input positions (the slots list comes last).
enum Input {
  kTable, kReserved, kValues, kCounts, kLastSeen, kSavedCounts, kRowKeys, kFree, kNextRow,
  kNumFree, kIds, kIdCounts, kTimes, kLimit, kClock, kSlots
};

// npu_rec/table/_keyed_init.py: SplitMix64 and the keyed uniform initial values.
inline uint64_t SplitMix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

inline void KeyedUniform(int64_t key, uint64_t seed, int64_t dim, float* out) {
  const uint64_t base = SplitMix(static_cast<uint64_t>(key) ^ seed);
  for (int64_t j = 0; j < dim; ++j) {
    const uint64_t h = SplitMix(base + static_cast<uint64_t>(j));
    const float unit = static_cast<float>(h >> 40) * static_cast<float>(1.0 / (1 << 24));
    out[j] = (unit * 2.0f - 1.0f) * 0.05f;
  }
}

inline int64_t Mix(int64_t key) {
  uint64_t u = static_cast<uint64_t>(key) * kMul;
  u ^= u >> 32;
  return static_cast<int64_t>(u);
}

REGISTER_OP("NpuRecTrainLookup")
    .Input("table_handle: resource")
    .Input("reserved_rows: resource")
    .Input("values: resource")
    .Input("counts: resource")
    .Input("last_seen: resource")
    .Input("saved_counts: resource")
    .Input("row_keys: resource")
    .Input("free_rows: resource")
    .Input("next_row: resource")
    .Input("num_free: resource")
    .Input("ids: int64")
    .Input("id_counts: int64")
    .Input("times: int64")
    .Input("limit: int64")
    .Input("clock: int64")
    .Input("slots: num_slots * resource")
    .Output("unique: int64")
    .Output("index: int64")
    .Output("rows: int64")
    .Output("embeddings: float")
    .Output("miss_pos: int64")
    .Output("miss_keys: int64")
    .Output("miss_counts: int64")
    .Output("miss_times: int64")
    .Output("newest: int64")
    .Output("late: int64")
    .Attr("dim: int >= 1")
    .Attr("batch_time: bool")
    .Attr("clamp: bool")
    .Attr("admit: bool")
    .Attr("num_slots: int >= 0")
    .Attr("slot_init: list(float)")
    .Attr("seed: int")
    .Attr("dynamic: bool")
    .Attr("full_head: string")
    .Attr("full_tail: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      auto u = c->UnknownDim();
      c->set_output(0, c->Vector(u));
      c->set_output(1, c->Vector(c->Dim(c->input(kIds), 0)));
      c->set_output(2, c->Vector(u));
      c->set_output(3, c->Matrix(u, dim));
      for (int i = 4; i < 8; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
      c->set_output(8, c->Scalar());
      c->set_output(9, c->Vector(2));
      return absl::OkStatus();
    });

class TrainLookupOp : public OpKernel {
 public:
  explicit TrainLookupOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("batch_time", &batch_time_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("clamp", &clamp_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admit", &admit_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_init", &slot_init_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dynamic", &dynamic_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("full_head", &full_head_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("full_tail", &full_tail_));
    OP_REQUIRES(ctx, static_cast<int>(slot_init_.size()) == num_slots_,
                absl::InvalidArgumentError("npu_rec kernel: one slot_init per slot"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_t = ctx->input(kIds);
    const Tensor& weights_t = ctx->input(kIdCounts);
    const Tensor& times_t = ctx->input(kTimes);
    const int64_t n = ids_t.NumElements();
    OP_REQUIRES(ctx, weights_t.NumElements() == 0 || weights_t.NumElements() == n,
                absl::InvalidArgumentError(
                    "npu_rec kernel: `id_counts` must be empty or have one entry per id"));
    OP_REQUIRES(ctx, batch_time_ ? times_t.NumElements() == 1 : times_t.NumElements() == n,
                absl::InvalidArgumentError(
                    "npu_rec kernel: `times` must hold one entry per id, or one (batch_time)"));
    const int64_t* ids = ids_t.flat<int64_t>().data();
    const int64_t* weights = weights_t.NumElements() ? weights_t.flat<int64_t>().data() : nullptr;
    const int64_t* times = times_t.flat<int64_t>().data();

    // 1. Deduplicate (open addressing on the mixed key, linear probing).
    Tensor* index_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &index_t));
    int64_t* index = index_t->flat<int64_t>().data();
    std::vector<int64_t> keys, mixed, sightings, newest_t;
    keys.reserve(n);
    mixed.reserve(n);
    sightings.reserve(n);
    if (!batch_time_) newest_t.reserve(n);
    {
      uint64_t buckets = 16;
      while (buckets < 2 * static_cast<uint64_t>(n)) buckets *= 2;
      const uint64_t mask = buckets - 1;
      std::vector<int32_t> slot(buckets, -1);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t m = Mix(ids[i]);
        uint64_t h = static_cast<uint64_t>(m) & mask;
        while (slot[h] >= 0 && keys[slot[h]] != ids[i]) h = (h + 1) & mask;
        int64_t pos = slot[h];
        if (pos < 0) {
          pos = static_cast<int64_t>(keys.size());
          slot[h] = static_cast<int32_t>(pos);
          keys.push_back(ids[i]);
          mixed.push_back(m);
          sightings.push_back(0);
          if (!batch_time_) newest_t.push_back(times[i]);
        } else if (!batch_time_ && times[i] > newest_t[pos]) {
          newest_t[pos] = times[i];
        }
        sightings[pos] += weights ? weights[i] : 1;
        index[i] = pos;
      }
    }
    const int64_t u = static_cast<int64_t>(keys.size());

    // 2. Timestamps: clamp those too far ahead (to `clock`), count them.
    int64_t late_count = 0, late_newest = 0, newest = 0;
    int64_t batch = batch_time_ ? times[0] : 0;
    if (clamp_) {
      const int64_t limit = ctx->input(kLimit).scalar<int64_t>()();
      const int64_t clock = ctx->input(kClock).scalar<int64_t>()();
      if (batch_time_) {
        if (batch > limit) {
          if (u > 0) late_newest = batch;
          late_count = u;
          batch = clock;
        }
      } else {
        for (int64_t& t : newest_t) {
          if (t > limit) {
            ++late_count;
            late_newest = std::max(late_newest, t);
            t = clock;
          }
        }
      }
    }
    if (batch_time_) {
      newest = std::max<int64_t>(batch, 0);
    } else {
      for (int64_t t : newest_t) newest = std::max(newest, t);
    }

    Tensor* unique_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u}), &unique_t));
    if (u > 0) std::memcpy(unique_t->flat<int64_t>().data(), keys.data(), sizeof(int64_t) * u);

    // 3. Probe the key index (reserved mixed values go to `reserved_rows`).
    Tensor* rows_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({u}), &rows_t));
    int64_t* rows = rows_t->flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, Probe(ctx, mixed, rows_t));

    // 4. The misses: admitted here (`admit`, every key gets a row now), or
    // returned for the stock admission ops.
    std::vector<int64_t> miss;
    for (int64_t i = 0; i < u; ++i) {
      if (rows[i] < 0) miss.push_back(i);
    }
    RefCountPtr<Var> values, counts, seen;
    OP_REQUIRES_OK(ctx, GetVar(ctx, kValues, &values));
    OP_REQUIRES_OK(ctx, GetVar(ctx, kCounts, &counts));
    OP_REQUIRES_OK(ctx, GetVar(ctx, kLastSeen, &seen));
    std::vector<RefCountPtr<Var>> more;  // the admission's variables
    std::vector<Var*> vars = {values.get(), counts.get(), seen.get()};
    const bool admit = admit_ && !miss.empty();
    if (admit) {
      for (int input = kSavedCounts; input <= kNumFree; ++input) {
        more.emplace_back();
        OP_REQUIRES_OK(ctx, GetVar(ctx, input, &more.back()));
      }
      more.emplace_back();
      OP_REQUIRES_OK(ctx, GetVar(ctx, kReserved, &more.back()));
      for (int k = 0; k < num_slots_; ++k) {
        more.emplace_back();
        OP_REQUIRES_OK(ctx, GetVar(ctx, kSlots + k, &more.back()));
      }
      for (auto& v : more) vars.push_back(v.get());
    }
    VarLocks locks(vars);
    if (admit) {
      OP_REQUIRES_OK(ctx, Admit(ctx, keys, mixed, miss, values.get(), counts.get(), seen.get(),
                                more, rows));
      miss.clear();
    }
    const int64_t m = static_cast<int64_t>(miss.size());
    Tensor* out[4];
    for (int k = 0; k < 4; ++k) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(4 + k, TensorShape({m}), &out[k]));
    }
    for (int64_t j = 0; j < m; ++j) {
      const int64_t i = miss[j];
      out[0]->flat<int64_t>()(j) = i;
      out[1]->flat<int64_t>()(j) = keys[i];
      out[2]->flat<int64_t>()(j) = sightings[i];
      out[3]->flat<int64_t>()(j) = batch_time_ ? batch : newest_t[i];
    }
    Tensor* newest_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(8, TensorShape({}), &newest_out));
    newest_out->scalar<int64_t>()() = newest;
    Tensor* late_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(9, TensorShape({2}), &late_out));
    late_out->flat<int64_t>()(0) = late_count;
    late_out->flat<int64_t>()(1) = late_newest;

    // 5. Gather the rows; add the sightings, raise last-seen.
    Tensor* emb_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({u, dim_}), &emb_t));
    OP_REQUIRES_OK(ctx, CheckRows(*values->tensor(), "values", rows, u, dim_));
    OP_REQUIRES_OK(ctx, PrepareWrite(ctx, counts.get()));
    OP_REQUIRES_OK(ctx, PrepareWrite(ctx, seen.get()));
    OP_REQUIRES_OK(ctx, CheckRows(*counts->tensor(), "counts", rows, u, 0));
    OP_REQUIRES_OK(ctx, CheckRows(*seen->tensor(), "last_seen", rows, u, 0));
    const float* src = values->tensor()->flat<float>().data();
    int64_t* cnt = counts->tensor()->flat<int64_t>().data();
    int64_t* last = seen->tensor()->flat<int64_t>().data();
    float* dst = emb_t->flat<float>().data();
    const int64_t dim = dim_;
    const int64_t* add = sightings.data();
    const int64_t* when = batch_time_ ? nullptr : newest_t.data();
    // Rows are unique (one per unique key, or -1), so the ranges write disjoint rows.
    ParallelRows(ctx, u, 4 * dim + 40, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (i + kAhead < end && rows[i + kAhead] >= 0) {  // rows are scattered: prefetch
          const int64_t p = rows[i + kAhead];
          __builtin_prefetch(src + p * dim);
          __builtin_prefetch(cnt + p, 1);
          __builtin_prefetch(last + p, 1);
        }
        const int64_t r = rows[i];
        if (r < 0) {
          std::memset(dst + i * dim, 0, sizeof(float) * dim);
          continue;
        }
        std::memcpy(dst + i * dim, src + r * dim, sizeof(float) * dim);
        cnt[r] += add[i];
        const int64_t t = when ? when[i] : batch;
        if (t > last[r]) last[r] = t;
      }
    });
  }

 private:
  // Under the variables' locks: rows for the keys at `miss` (free list first,
  // then the high-water mark; the storage grown by doubling, or an error when
  // it is fixed and full, before anything changes), initialised as
  // RowStorage.init_rows does (keyed uniform values, slot constants, zero
  // metadata), and inserted into the index. `more` holds the variables of
  // inputs kSavedCounts..kNumFree, kReserved and the slots, in that order.
  absl::Status Admit(OpKernelContext* ctx, const std::vector<int64_t>& keys,
                     const std::vector<int64_t>& mixed, const std::vector<int64_t>& miss,
                     Var* values, Var* counts, Var* seen,
                     std::vector<RefCountPtr<Var>>& more, int64_t* rows) {
    Var* saved = more[0].get();
    Var* row_keys = more[1].get();
    Var* free_rows = more[2].get();
    Var* next_var = more[3].get();
    Var* nfree_var = more[4].get();
    Var* reserved = more[5].get();
    std::vector<Var*> per_row = {values, counts, saved, seen, row_keys, free_rows};
    for (int k = 0; k < num_slots_; ++k) per_row.push_back(more[6 + k].get());
    for (Var* v : {next_var, nfree_var, reserved}) {
      TF_RETURN_IF_ERROR(PrepareWrite(ctx, v));
    }
    const int64_t n = static_cast<int64_t>(miss.size());
    {  // Room in an owned key map first, so its insert below cannot run out of memory.
      ::tensorflow::lookup::LookupInterface* table = nullptr;
      TF_RETURN_IF_ERROR(::tensorflow::lookup::GetLookupTable("table_handle", ctx, &table));
      ::tensorflow::core::ScopedUnref unref(table);
      if (auto* own = dynamic_cast<NpuRecKeyMap*>(table)) TF_RETURN_IF_ERROR(own->Prepare(n));
    }
    int64_t& num_free = nfree_var->tensor()->scalar<int64_t>()();
    int64_t& next_row = next_var->tensor()->scalar<int64_t>()();
    const int64_t take = std::min(n, num_free);
    const int64_t needed = next_row + (n - take);
    const int64_t cap = values->tensor()->dim_size(0);
    if (needed > cap) {
      if (!dynamic_) {
        return absl::InvalidArgumentError(full_head_ + std::to_string(needed) + full_tail_);
      }
      const int64_t new_cap = std::max(needed, 2 * cap);
      // Every grown buffer is allocated before any variable changes: out of memory
      // leaves the table as it was.
      std::vector<Tensor> grown(per_row.size());
      for (size_t i = 0; i < per_row.size(); ++i) {
        TF_RETURN_IF_ERROR(GrownCopy(*per_row[i]->tensor(), new_cap, &grown[i]));
      }
      for (size_t i = 0; i < per_row.size(); ++i) {
        *per_row[i]->tensor() = grown[i];
        per_row[i]->copy_on_read_mode.store(true);
      }
    }
    for (Var* v : per_row) TF_RETURN_IF_ERROR(PrepareWrite(ctx, v));
    const int32_t* free_list = free_rows->tensor()->flat<int32_t>().data();
    std::vector<int64_t> new_rows(n);
    for (int64_t j = 0; j < take; ++j) new_rows[j] = free_list[num_free - take + j];
    for (int64_t j = take; j < n; ++j) new_rows[j] = next_row + (j - take);
    num_free -= take;
    next_row = needed;
    // Initial rows and metadata.
    const int64_t dim = dim_;
    float* w = values->tensor()->flat<float>().data();
    int64_t* kk = row_keys->tensor()->flat<int64_t>().data();
    int64_t* cnt = counts->tensor()->flat<int64_t>().data();
    int64_t* sav = saved->tensor()->flat<int64_t>().data();
    int64_t* last = seen->tensor()->flat<int64_t>().data();
    for (int64_t j = 0; j < n; ++j) {
      const int64_t r = new_rows[j];
      const int64_t key = keys[miss[j]];
      KeyedUniform(key, static_cast<uint64_t>(seed_), dim, w + r * dim);
      kk[r] = key;
      cnt[r] = sav[r] = last[r] = 0;
      for (int k = 0; k < num_slots_; ++k) {
        float* slot = more[6 + k]->tensor()->flat<float>().data() + r * dim;
        std::fill(slot, slot + dim, slot_init_[k]);
      }
      rows[miss[j]] = r;
    }
    // The index: reserved mixed values in `reserved_rows`, the others in the map.
    std::vector<int64_t> ins_keys, ins_rows;
    int64_t* special = reserved->tensor()->flat<int64_t>().data();
    for (int64_t j = 0; j < n; ++j) {
      const int64_t mk = mixed[miss[j]];
      if (mk <= kDeletedKey) {
        special[mk - kEmptyKey] = new_rows[j];
      } else {
        ins_keys.push_back(mk);
        ins_rows.push_back(new_rows[j]);
      }
    }
    if (ins_keys.empty()) return absl::OkStatus();
    const int64_t k = static_cast<int64_t>(ins_keys.size());
    ::tensorflow::lookup::LookupInterface* table = nullptr;
    TF_RETURN_IF_ERROR(::tensorflow::lookup::GetLookupTable("table_handle", ctx, &table));
    ::tensorflow::core::ScopedUnref unref(table);
    if (auto* own = dynamic_cast<NpuRecKeyMap*>(table)) {
      return own->InsertBatch(ins_keys.data(), ins_rows.data(), k);
    }
    Tensor kt, rt;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({k}), &kt));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({k}), &rt));
    std::memcpy(kt.flat<int64_t>().data(), ins_keys.data(), sizeof(int64_t) * k);
    std::memcpy(rt.flat<int64_t>().data(), ins_rows.data(), sizeof(int64_t) * k);
    return table->Insert(ctx, kt, rt);
  }

  // A copy of `t` grown to `rows` rows (zeros appended), allocated by
  // `TableAllocator` (so the outgrown buffer, once replaced, returns to the system).
  static absl::Status GrownCopy(const Tensor& t, int64_t rows, Tensor* out) {
    TensorShape shape = t.shape();
    shape.set_dim(0, rows);
    TF_RETURN_IF_ERROR(AllocateTable(t.dtype(), shape, out));
    char* dst = static_cast<char*>(out->data());
    if (t.TotalBytes() > 0) std::memcpy(dst, t.data(), t.TotalBytes());
    std::memset(dst + t.TotalBytes(), 0, out->TotalBytes() - t.TotalBytes());
    return absl::OkStatus();
  }

  // rows[i] = the index's row of mixed[i], or -1.
  absl::Status Probe(OpKernelContext* ctx, const std::vector<int64_t>& mixed, Tensor* rows_t) {
    const int64_t u = static_cast<int64_t>(mixed.size());
    int64_t* rows = rows_t->flat<int64_t>().data();
    if (u == 0) return absl::OkStatus();
    ::tensorflow::lookup::LookupInterface* table = nullptr;
    TF_RETURN_IF_ERROR(::tensorflow::lookup::GetLookupTable("table_handle", ctx, &table));
    ::tensorflow::core::ScopedUnref unref(table);
    if (table->key_dtype() != ::tensorflow::DT_INT64 ||
        table->value_dtype() != ::tensorflow::DT_INT64) {
      return absl::InvalidArgumentError("npu_rec kernel: the key index must map int64 to int64");
    }
    bool any_reserved = false;
    for (int64_t i = 0; i < u; ++i) any_reserved |= mixed[i] <= kDeletedKey;
    if (auto* own = dynamic_cast<NpuRecKeyMap*>(table)) {
      ProbeOwn(ctx, *own, mixed, any_reserved, rows);
    } else {
      TF_RETURN_IF_ERROR(ProbeStock(ctx, table, mixed, rows));
    }
    if (!any_reserved) return absl::OkStatus();
    RefCountPtr<Var> reserved;
    TF_RETURN_IF_ERROR(GetVar(ctx, kReserved, &reserved));
    VarLocks lock({reserved.get()});
    const Tensor& r = *reserved->tensor();
    if (r.NumElements() != 2) {
      return absl::InvalidArgumentError("npu_rec kernel: `reserved_rows` must hold 2 rows");
    }
    for (int64_t i = 0; i < u; ++i) {
      if (mixed[i] <= kDeletedKey) rows[i] = r.flat<int64_t>()(mixed[i] - kEmptyKey);
    }
    return absl::OkStatus();
  }

  // The probe of npu_rec's own map: one cache line per key, the bucket of the
  // key kAhead positions on prefetched. Inline for small batches (a ParallelFor
  // from a kernel whose pool is busy with other tables' kernels only waits),
  // else in chunks on the intra-op threads, each under the map's shared lock.
  static void ProbeOwn(OpKernelContext* ctx, const NpuRecKeyMap& map,
                       const std::vector<int64_t>& mixed, bool any_reserved, int64_t* rows) {
    const int64_t u = static_cast<int64_t>(mixed.size());
    std::vector<int64_t> routed;
    const int64_t* q = mixed.data();
    if (any_reserved) {  // the reserved values are looked up in `reserved_rows`
      routed = mixed;
      for (int64_t& k : routed) k = k <= kDeletedKey ? 0 : k;
      q = routed.data();
    }
    if (u < kInlineProbe) {
      map.FindBatch(q, u, rows, -1);
      return;
    }
    const int64_t chunks = std::min<int64_t>(
        (u + kProbeChunk - 1) / kProbeChunk,
        ctx->device()->tensorflow_cpu_worker_threads()->num_threads);
    const int64_t per = (u + chunks - 1) / chunks;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    workers->ParallelFor(chunks, 1 << 20, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t lo = c * per, hi = std::min(u, lo + per);
        if (lo < hi) map.FindBatch(q + lo, hi - lo, rows + lo, -1);
      }
    });
  }

  // The probe of a DenseHashTable index through LookupInterface::Find.
  static absl::Status ProbeStock(OpKernelContext* ctx,
                                 ::tensorflow::lookup::LookupInterface* table,
                                 const std::vector<int64_t>& mixed, int64_t* rows) {
    const int64_t u = static_cast<int64_t>(mixed.size());
    Tensor missing;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({}), &missing));
    missing.scalar<int64_t>()() = -1;
    // The map's Find takes a shared lock: probe in parallel chunks (each probe is one
    // or two cache misses in a bucket array larger than the caches). Chunks get
    // their own (aligned) tensors.
    const int64_t chunks = std::min<int64_t>(
        (u + 2047) / 2048, ctx->device()->tensorflow_cpu_worker_threads()->num_threads);
    const int64_t per = (u + chunks - 1) / chunks;
    std::vector<Tensor> queries(chunks), found(chunks);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t len = std::min(u, (c + 1) * per) - c * per;
      TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({len}), &queries[c]));
      TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({len}), &found[c]));
      int64_t* q = queries[c].flat<int64_t>().data();
      for (int64_t j = 0; j < len; ++j) {
        const int64_t k = mixed[c * per + j];
        q[j] = k <= kDeletedKey ? 0 : k;
      }
    }
    std::vector<absl::Status> status(chunks);
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    workers->ParallelFor(chunks, 1 << 20, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        status[c] = table->Find(ctx, queries[c], &found[c], missing);
      }
    });
    for (int64_t c = 0; c < chunks; ++c) {
      TF_RETURN_IF_ERROR(status[c]);
      std::memcpy(rows + c * per, found[c].flat<int64_t>().data(),
                  sizeof(int64_t) * found[c].NumElements());
    }
    return absl::OkStatus();
  }

  int64_t dim_;
  bool batch_time_;
  bool clamp_;
  bool admit_;
  int num_slots_;
  std::vector<float> slot_init_;
  int64_t seed_;
  bool dynamic_;
  std::string full_head_, full_tail_;
};

REGISTER_KERNEL_BUILDER(Name("NpuRecTrainLookup").Device(DEVICE_CPU), TrainLookupOp);

}  // namespace
}  // namespace npu_rec
