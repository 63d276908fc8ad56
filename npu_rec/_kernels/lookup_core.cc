// The per-table steps of the fused training lookup (see lookup_core.h).

#include "lookup_core.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "key_map.h"
#include "kernel_util.h"
#include "tensorflow/core/framework/lookup_interface.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace npu_rec {
namespace {

using ::tensorflow::TensorShape;
using ::tensorflow::lookup::LookupInterface;

// The key mixing of npu_rec/table/_key_index.py: multiply by an odd constant,
// then fold the high half into the low half (a bijection of the 64-bit ints).
constexpr uint64_t kMul = 0x9E3779B97F4A7C15ULL;
constexpr int64_t kEmptyKey = INT64_MIN;
constexpr int64_t kDeletedKey = INT64_MIN + 1;

// Unique keys probed inline below this count; above, in chunks of at least kProbeChunk.
constexpr int64_t kInlineProbe = 16384;
constexpr int64_t kProbeChunk = 8192;

// npu_rec/table/_keyed_init.py: the keyed uniform initial values.
inline uint64_t SplitMix(uint64_t z) { return SplitMix64(z); }

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

// The key index resource at input `input` (a new reference in `*table`).
absl::Status GetKeyIndex(OpKernelContext* ctx, int input, LookupInterface** table) {
  TF_RETURN_IF_ERROR(
      ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, input), table));
  if ((*table)->key_dtype() != ::tensorflow::DT_INT64 ||
      (*table)->value_dtype() != ::tensorflow::DT_INT64) {
    (*table)->Unref();
    return absl::InvalidArgumentError("npu_rec kernel: the key index must map int64 to int64");
  }
  return absl::OkStatus();
}

// The probe of npu_rec's own map: one cache line per key, the bucket of the
// key kAhead positions on prefetched. Inline for small batches (a ParallelFor
// from a kernel whose pool is busy with other tables' kernels only waits),
// else in chunks on the intra-op threads, each under the map's shared lock.
void ProbeOwn(OpKernelContext* ctx, const NpuRecKeyMap& map, const std::vector<int64_t>& mixed,
              bool any_reserved, int64_t* rows) {
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
absl::Status ProbeStock(OpKernelContext* ctx, LookupInterface* table,
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

// rows[i] = the index's row of mixed[i], or -1: the index at input `index`,
// its reserved rows at input `reserved`.
absl::Status Probe(OpKernelContext* ctx, const std::vector<int64_t>& mixed, int64_t* rows,
                   int index = kTable, int reserved_input = kReserved) {
  const int64_t u = static_cast<int64_t>(mixed.size());
  if (u == 0) return absl::OkStatus();
  LookupInterface* table = nullptr;
  TF_RETURN_IF_ERROR(GetKeyIndex(ctx, index, &table));
  ::tensorflow::core::ScopedUnref unref(table);
  bool any_reserved = false;
  for (int64_t i = 0; i < u; ++i) any_reserved |= mixed[i] <= kDeletedKey;
  if (auto* own = dynamic_cast<NpuRecKeyMap*>(table)) {
    ProbeOwn(ctx, *own, mixed, any_reserved, rows);
  } else {
    TF_RETURN_IF_ERROR(ProbeStock(ctx, table, mixed, rows));
  }
  if (!any_reserved) return absl::OkStatus();
  RefCountPtr<Var> reserved;
  TF_RETURN_IF_ERROR(GetVar(ctx, reserved_input, &reserved));
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

// The variables of an admission (besides values, counts and last-seen).
struct AdmitVars {
  Var* saved;
  Var* row_keys;
  Var* free_rows;
  Var* next_row;
  Var* num_free;
  Var* reserved;
  std::vector<Var*> slots;
};

// Under the variables' locks: rows for the keys at `miss` (free list first,
// then the high-water mark; the storage grown by doubling, or an error when
// it is fixed and full, before anything changes), initialised as
// RowStorage.init_rows does (keyed uniform values, slot constants, zero
// metadata), and inserted into the index.
absl::Status Admit(OpKernelContext* ctx, const TableAttrs& attrs,
                   const Unique& u, const std::vector<int64_t>& miss, Var* values, Var* counts,
                   Var* seen, const AdmitVars& more, int64_t* rows) {
  // Checked before anything changes.
  TF_RETURN_IF_ERROR(CheckMeta(*counts->tensor(), "counts"));
  TF_RETURN_IF_ERROR(CheckMeta(*more.saved->tensor(), "saved_counts"));
  TF_RETURN_IF_ERROR(CheckMeta(*seen->tensor(), "last_seen"));
  // The free list is not per row: it holds the freed rows only (RowStorage.release grows it).
  std::vector<Var*> per_row = {values, counts, more.saved, seen, more.row_keys};
  for (Var* s : more.slots) per_row.push_back(s);
  for (Var* v : {more.next_row, more.num_free, more.reserved}) {
    TF_RETURN_IF_ERROR(PrepareWrite(ctx, v));
  }
  const int64_t n = static_cast<int64_t>(miss.size());
  LookupInterface* table = nullptr;
  TF_RETURN_IF_ERROR(GetKeyIndex(ctx, kTable, &table));
  ::tensorflow::core::ScopedUnref unref(table);
  auto* own = dynamic_cast<NpuRecKeyMap*>(table);
  // Room in an owned key map first, so its insert below cannot run out of memory.
  if (own != nullptr) TF_RETURN_IF_ERROR(own->Prepare(n));
  int64_t& num_free = more.num_free->tensor()->scalar<int64_t>()();
  int64_t& next_row = more.next_row->tensor()->scalar<int64_t>()();
  const int64_t take = std::min(n, num_free);
  const int64_t needed = next_row + (n - take);
  const int64_t cap = values->tensor()->dim_size(0);
  if (needed > cap) {
    if (!attrs.dynamic) {
      return absl::InvalidArgumentError(attrs.full_head + std::to_string(needed) +
                                        attrs.full_tail);
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
  if (take > 0 && more.free_rows->tensor()->NumElements() < num_free) {
    return absl::InternalError("npu_rec kernel: the free list is shorter than `num_free`");
  }
  const int32_t* free_list = more.free_rows->tensor()->flat<int32_t>().data();
  std::vector<int64_t> new_rows(n);
  for (int64_t j = 0; j < take; ++j) new_rows[j] = free_list[num_free - take + j];
  for (int64_t j = take; j < n; ++j) new_rows[j] = next_row + (j - take);
  num_free -= take;
  next_row = needed;
  // Initial rows and metadata.
  const int64_t dim = attrs.dim;
  RowsView w(values->tensor());
  std::vector<float> init(dim);
  int64_t* kk = more.row_keys->tensor()->flat<int64_t>().data();
  int32_t* cnt = counts->tensor()->flat<int32_t>().data();
  int32_t* sav = more.saved->tensor()->flat<int32_t>().data();
  int32_t* last = seen->tensor()->flat<int32_t>().data();
  const int32_t never = EncodeSeen(0);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t r = new_rows[j];
    const int64_t key = u.keys[miss[j]];
    KeyedUniform(key, static_cast<uint64_t>(attrs.seed), dim, init.data());
    w.WriteNearest(r * dim, dim, init.data());
    kk[r] = key;
    cnt[r] = sav[r] = 0;
    last[r] = never;
    for (size_t k = 0; k < more.slots.size(); ++k) {
      // A slot holds `dim` values per row, or one (kept per row, e.g. RowWiseAdagrad's).
      const int64_t width = more.slots[k]->tensor()->dim_size(1);
      float* slot = more.slots[k]->tensor()->flat<float>().data() + r * width;
      std::fill(slot, slot + width, attrs.slot_init[k]);
    }
    rows[miss[j]] = r;
  }
  // The index: reserved mixed values in `reserved_rows`, the others in the map.
  std::vector<int64_t> ins_keys, ins_rows;
  int64_t* special = more.reserved->tensor()->flat<int64_t>().data();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t mk = u.mixed[miss[j]];
    if (mk <= kDeletedKey) {
      special[mk - kEmptyKey] = new_rows[j];
    } else {
      ins_keys.push_back(mk);
      ins_rows.push_back(new_rows[j]);
    }
  }
  if (ins_keys.empty()) return absl::OkStatus();
  const int64_t k = static_cast<int64_t>(ins_keys.size());
  if (own != nullptr) return own->InsertBatch(ins_keys.data(), ins_rows.data(), k);
  Tensor kt, rt;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({k}), &kt));
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({k}), &rt));
  std::memcpy(kt.flat<int64_t>().data(), ins_keys.data(), sizeof(int64_t) * k);
  std::memcpy(rt.flat<int64_t>().data(), ins_rows.data(), sizeof(int64_t) * k);
  return table->Insert(ctx, kt, rt);
}

}  // namespace

void Deduplicate(const int64_t* ids, int64_t n, const int64_t* weights, const int64_t* times,
                 int64_t* index, Unique* out) {
  out->keys.reserve(n);
  out->mixed.reserve(n);
  out->sightings.reserve(n);
  if (times != nullptr) out->newest.reserve(n);
  uint64_t buckets = 16;
  while (buckets < 2 * static_cast<uint64_t>(n)) buckets *= 2;
  const uint64_t mask = buckets - 1;
  std::vector<int32_t> slot(buckets, -1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    const int64_t m = Mix(id);
    uint64_t h = static_cast<uint64_t>(m) & mask;
    while (slot[h] >= 0 && out->keys[slot[h]] != id) h = (h + 1) & mask;
    int64_t pos = slot[h];
    if (pos < 0) {
      pos = static_cast<int64_t>(out->keys.size());
      slot[h] = static_cast<int32_t>(pos);
      out->keys.push_back(id);
      out->mixed.push_back(m);
      out->sightings.push_back(0);
      if (times != nullptr) out->newest.push_back(times[i]);
    } else if (times != nullptr && times[i] > out->newest[pos]) {
      out->newest[pos] = times[i];
    }
    out->sightings[pos] += weights ? weights[i] : 1;
    index[i] = pos;
  }
}

void AsUnique(const int64_t* keys, int64_t n, const int64_t* weights, Unique* out) {
  out->keys.assign(keys, keys + n);
  out->mixed.resize(n);
  for (int64_t i = 0; i < n; ++i) out->mixed[i] = Mix(keys[i]);
  if (weights != nullptr) {
    out->sightings.assign(weights, weights + n);
  } else {
    out->sightings.assign(n, 1);
  }
}

absl::Status LookupRows(OpKernelContext* ctx, const TableAttrs& attrs, const Unique& u,
                        int64_t batch, int64_t* rows, float* emb, std::vector<int64_t>* miss,
                        const int64_t* known) {
  const int64_t n = static_cast<int64_t>(u.keys.size());
  if (known == nullptr) {
    TF_RETURN_IF_ERROR(Probe(ctx, u.mixed, rows));
  } else {  // only the keys without a known row are probed
    std::vector<int64_t> ask, at;
    for (int64_t i = 0; i < n; ++i) {
      rows[i] = known[i];
      if (known[i] < 0) ask.push_back(u.mixed[i]), at.push_back(i);
    }
    std::vector<int64_t> found(ask.size(), -1);
    TF_RETURN_IF_ERROR(Probe(ctx, ask, found.data()));
    for (size_t j = 0; j < at.size(); ++j) rows[at[j]] = found[j];
  }
  miss->clear();
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0) miss->push_back(i);
  }
  RefCountPtr<Var> values, counts, seen;
  TF_RETURN_IF_ERROR(GetVar(ctx, kValues, &values));
  TF_RETURN_IF_ERROR(GetVar(ctx, kCounts, &counts));
  TF_RETURN_IF_ERROR(GetVar(ctx, kLastSeen, &seen));
  std::vector<RefCountPtr<Var>> held;  // the admission's variables
  std::vector<Var*> vars = {values.get(), counts.get(), seen.get()};
  const bool admit = attrs.admit && !miss->empty();
  AdmitVars more{};
  if (admit) {
    std::vector<int> inputs = {kSavedCounts, kRowKeys, kFree, kNextRow, kNumFree, kReserved};
    const int num_slots = static_cast<int>(attrs.slot_init.size());
    for (int k = 0; k < num_slots; ++k) inputs.push_back(kSlots + k);
    for (int input : inputs) {
      held.emplace_back();
      TF_RETURN_IF_ERROR(GetVar(ctx, input, &held.back()));
    }
    more = {held[0].get(), held[1].get(), held[2].get(), held[3].get(), held[4].get(),
            held[5].get(), {}};
    for (size_t k = 6; k < held.size(); ++k) more.slots.push_back(held[k].get());
    for (auto& v : held) vars.push_back(v.get());
  }
  VarLocks locks(vars);
  TF_RETURN_IF_ERROR(CheckRowsDtype(*values->tensor()));
  if (admit) {
    TF_RETURN_IF_ERROR(
        Admit(ctx, attrs, u, *miss, values.get(), counts.get(), seen.get(), more, rows));
    miss->clear();
  }
  // Gather the rows; add the sightings, raise last-seen.
  TF_RETURN_IF_ERROR(CheckRows(*values->tensor(), "values", rows, n, attrs.dim));
  TF_RETURN_IF_ERROR(PrepareWrite(ctx, counts.get()));
  TF_RETURN_IF_ERROR(PrepareWrite(ctx, seen.get()));
  TF_RETURN_IF_ERROR(CheckRows(*counts->tensor(), "counts", rows, n, 0));
  TF_RETURN_IF_ERROR(CheckRows(*seen->tensor(), "last_seen", rows, n, 0));
  TF_RETURN_IF_ERROR(CheckMeta(*counts->tensor(), "counts"));
  TF_RETURN_IF_ERROR(CheckMeta(*seen->tensor(), "last_seen"));
  const RowsView src(values->tensor());
  int32_t* cnt = counts->tensor()->flat<int32_t>().data();
  int32_t* last = seen->tensor()->flat<int32_t>().data();
  const int64_t dim = attrs.dim;
  const int64_t* add = u.sightings.data();
  const int64_t* when = u.newest.empty() ? nullptr : u.newest.data();
  // Rows are unique (one per unique key, or -1), so the ranges write disjoint rows.
  ParallelRows(ctx, n, 4 * dim + 40, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kAhead < end && rows[i + kAhead] >= 0) {  // rows are scattered: prefetch
        const int64_t p = rows[i + kAhead];
        __builtin_prefetch(src.Address(p * dim));
        __builtin_prefetch(cnt + p, 1);
        __builtin_prefetch(last + p, 1);
      }
      const int64_t r = rows[i];
      if (r < 0) {
        std::memset(emb + i * dim, 0, sizeof(float) * dim);
        continue;
      }
      src.Read(r * dim, dim, emb + i * dim);
      cnt[r] = SaturatedCount(cnt[r], add[i]);
      const int32_t t = EncodeSeen(when ? when[i] : batch);
      if (t > last[r]) last[r] = t;
    }
  });
  return absl::OkStatus();
}

absl::Status ProbeKeyIndex(OpKernelContext* ctx, const std::vector<int64_t>& mixed,
                           int64_t* rows, int index, int reserved) {
  return Probe(ctx, mixed, rows, index, reserved);
}

}  // namespace npu_rec
