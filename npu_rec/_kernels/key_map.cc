// NpuRecKeyMap and its creating op (see key_map.h).

#include "key_map.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernel_util.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/lookup_table_op.h"

namespace npu_rec {

using ::tensorflow::mutex_lock;
using ::tensorflow::OpKernel;
using ::tensorflow::tf_shared_lock;
using ::tensorflow::TensorShape;

namespace {

// Live keys plus tombstones stay below this share of the buckets (above the
// growth load), so every probe chain ends at an empty bucket.
inline double FullLoad(double max_load) { return (1.0 + max_load) / 2.0; }

// The finds of a batch, with the array's shape in locals (stores to `out` cannot
// alias them) and the home rule fixed at compile time: the power-of-two probe is
// the mask's, unchanged; the exact-size one NpuRecKeyMap::Home's.
template <bool kPow2>
struct Probe {
  const NpuRecKeyMap::Bucket* b;
  uint64_t n;
  int64_t empty;

  uint64_t Home(int64_t key) const {
    const uint64_t k = static_cast<uint64_t>(key);
    if (kPow2) return k & (n - 1);
    return static_cast<uint64_t>(
        (static_cast<unsigned __int128>(k * NpuRecKeyMap::kHomeMul) * n) >> 64);
  }
  uint64_t Next(uint64_t i) const {
    if (kPow2) return (i + 1) & (n - 1);
    return i + 1 == n ? 0 : i + 1;
  }
  void FindAll(const int64_t* keys, int64_t count, int64_t* out, int64_t missing) const {
    for (int64_t i = 0; i < std::min(count, kAhead); ++i) __builtin_prefetch(b + Home(keys[i]));
    for (int64_t i = 0; i < count; ++i) {
      if (i + kAhead < count) __builtin_prefetch(b + Home(keys[i + kAhead]));
      const int64_t key = keys[i];
      uint64_t at = Home(key);
      int64_t found = missing;
      for (uint64_t step = 0; step < n; ++step) {
        const NpuRecKeyMap::Bucket& bucket = b[at];
        if (bucket.key == key) {
          found = bucket.value;
          break;
        }
        if (bucket.key == empty) break;
        at = Next(at);
      }
      out[i] = found;
    }
  }
};

}  // namespace

NpuRecKeyMap::NpuRecKeyMap(OpKernelContext* ctx, OpKernel* kernel) {
  ::tensorflow::DataType key_type, value_type;
  ::tensorflow::TensorShape value_shape;
  int64_t initial = 0;
  const auto& def = kernel->def();
  for (const absl::Status& s :
       {GetNodeAttr(def, "key_dtype", &key_type), GetNodeAttr(def, "value_dtype", &value_type),
        GetNodeAttr(def, "value_shape", &value_shape),
        GetNodeAttr(def, "initial_num_buckets", &initial),
        GetNodeAttr(def, "max_load_factor", &max_load_),
        GetNodeAttr(def, "growth_factor", &growth_)}) {
    if (!s.ok()) {
      ctx->SetStatus(s);
      return;
    }
  }
  if (key_type != ::tensorflow::DT_INT64 || value_type != ::tensorflow::DT_INT64 ||
      value_shape.dims() != 0) {
    ctx->SetStatus(absl::InvalidArgumentError(
        "NpuRecKeyMap maps int64 keys to int64 scalar values"));
    return;
  }
  if (!(max_load_ > 0.0f && max_load_ < 1.0f)) {
    ctx->SetStatus(absl::InvalidArgumentError(
        absl::StrCat("NpuRecKeyMap: `max_load_factor` must be in (0, 1). Received: ", max_load_)));
    return;
  }
  if (!(growth_ > 1.0f && growth_ <= 4.0f)) {
    ctx->SetStatus(absl::InvalidArgumentError(
        absl::StrCat("NpuRecKeyMap: `growth_factor` must be in (1, 4]. Received: ", growth_)));
    return;
  }
  if (initial < 1) {
    ctx->SetStatus(absl::InvalidArgumentError(absl::StrCat(
        "NpuRecKeyMap: `initial_num_buckets` must be >= 1. Received: ", initial)));
    return;
  }
  const Tensor& empty = ctx->input(0);
  const Tensor& deleted = ctx->input(1);
  if (empty.NumElements() != 1 || deleted.NumElements() != 1) {
    ctx->SetStatus(absl::InvalidArgumentError(
        "NpuRecKeyMap: `empty_key` and `deleted_key` must be scalars"));
    return;
  }
  empty_key_ = empty.flat<int64_t>()(0);
  deleted_key_ = deleted.flat<int64_t>()(0);
  if (empty_key_ == deleted_key_) {
    ctx->SetStatus(absl::InvalidArgumentError(absl::StrCat(
        "NpuRecKeyMap: `empty_key` and `deleted_key` must differ. Received: both ", empty_key_)));
    return;
  }
  pow2_ = growth_ == 2.0f;
  int64_t buckets = 8;
  if (pow2_) {
    while (buckets < initial) buckets *= 2;
  } else {
    buckets = std::max<int64_t>(buckets, initial);
  }
  initial_buckets_ = buckets;
  mutex_lock lock(mu_);
  const absl::Status status = Reset(buckets);
  if (!status.ok()) ctx->SetStatus(status);
}

int64_t NpuRecKeyMap::BucketsFor(int64_t keys) const {
  int64_t buckets = 8;
  if (pow2_) {
    while (static_cast<double>(keys) > max_load_ * static_cast<double>(buckets)) buckets *= 2;
    return buckets;
  }
  buckets = std::max<int64_t>(
      buckets, static_cast<int64_t>(std::ceil(static_cast<double>(keys) / max_load_)));
  while (static_cast<double>(keys) > max_load_ * static_cast<double>(buckets)) ++buckets;
  return buckets;
}

absl::Status NpuRecKeyMap::Reset(int64_t buckets) {
  // Allocated before anything changes: out of memory leaves the map as it was.
  std::unique_ptr<Bucket[]> fresh(new (std::nothrow) Bucket[buckets]);
  if (fresh == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "NpuRecKeyMap: cannot allocate ", buckets, " buckets (",
        buckets * static_cast<int64_t>(sizeof(Bucket)), " bytes) for the key index: out of memory"));
  }
  for (int64_t i = 0; i < buckets; ++i) fresh[i] = {empty_key_, 0};
  buckets_ = std::move(fresh);
  num_buckets_ = buckets;
  live_ = deleted_ = 0;
  return absl::OkStatus();
}

absl::Status NpuRecKeyMap::Rehash(int64_t buckets) {
  std::unique_ptr<Bucket[]> old = std::move(buckets_);
  const int64_t old_n = num_buckets_;
  const absl::Status status = Reset(buckets);
  if (!status.ok()) {
    buckets_ = std::move(old);  // Reset changed nothing else
    return status;
  }
  for (int64_t i = 0; i < old_n; ++i) {
    if (old[i].key != empty_key_ && old[i].key != deleted_key_) {
      InsertLocked(old[i].key, old[i].value);
    }
  }
  return absl::OkStatus();
}

absl::Status NpuRecKeyMap::Reserve(int64_t extra) {
  int64_t grown = std::max(num_buckets_, BucketsFor(live_ + extra));
  if (grown != num_buckets_ && !pow2_) {
    // Grown by the factor at least, so a stream of inserts rehashes O(log n) times.
    grown = std::max(grown, static_cast<int64_t>(std::ceil(growth_ * num_buckets_)));
  }
  if (grown != num_buckets_) return Rehash(grown);
  if (static_cast<double>(live_ + deleted_ + extra) >
      FullLoad(max_load_) * static_cast<double>(num_buckets_)) {
    return Rehash(num_buckets_);  // drop the tombstones
  }
  return absl::OkStatus();
}

void NpuRecKeyMap::InsertLocked(int64_t key, int64_t wide) {
  const int32_t value = static_cast<int32_t>(wide);  // CheckValues passed
  uint64_t i = Home(key);
  int64_t tomb = -1;
  for (int64_t step = 0; step < num_buckets_; ++step) {
    Bucket& b = buckets_[i];
    if (b.key == key) {
      b.value = value;
      return;
    }
    if (b.key == empty_key_) break;
    if (b.key == deleted_key_ && tomb < 0) tomb = static_cast<int64_t>(i);
    i = Next(i);
  }
  // Reserve() keeps an empty bucket on every chain, so the loop ended at one.
  if (tomb >= 0) {
    i = static_cast<uint64_t>(tomb);
    --deleted_;
  }
  buckets_[i] = {key, value};
  ++live_;
}

absl::Status NpuRecKeyMap::CheckValues(const int64_t* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (values[i] < INT32_MIN || values[i] > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NpuRecKeyMap: value ", values[i], " is outside int32 (the map holds row numbers ",
          "or record locations, below 2**31 per shard)"));
    }
  }
  return absl::OkStatus();
}

absl::Status NpuRecKeyMap::CheckKeys(const int64_t* keys, int64_t n) const {
  for (int64_t i = 0; i < n; ++i) {
    if (keys[i] == empty_key_ || keys[i] == deleted_key_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NpuRecKeyMap: key ", keys[i], " is reserved (the ",
          keys[i] == empty_key_ ? "empty" : "deleted", " bucket marker) and cannot be used"));
    }
  }
  return absl::OkStatus();
}

void NpuRecKeyMap::FindBatch(const int64_t* keys, int64_t n, int64_t* out,
                             int64_t missing) const {
  tf_shared_lock lock(mu_);
  const uint64_t buckets = static_cast<uint64_t>(num_buckets_);
  if (pow2_) {
    Probe<true>{buckets_.get(), buckets, empty_key_}.FindAll(keys, n, out, missing);
  } else {
    Probe<false>{buckets_.get(), buckets, empty_key_}.FindAll(keys, n, out, missing);
  }
}

absl::Status NpuRecKeyMap::Prepare(int64_t extra) {
  mutex_lock lock(mu_);
  return Reserve(extra);
}

absl::Status NpuRecKeyMap::ReserveTotal(int64_t keys) {
  mutex_lock lock(mu_);
  const int64_t grown = std::max(num_buckets_, BucketsFor(keys));
  return grown == num_buckets_ ? absl::OkStatus() : Rehash(grown);
}

void NpuRecKeyMap::Counts(int64_t out[3]) const {
  tf_shared_lock lock(mu_);
  out[0] = num_buckets_;
  out[1] = live_;
  out[2] = deleted_;
}

absl::Status NpuRecKeyMap::InsertBatch(const int64_t* keys, const int64_t* values, int64_t n) {
  TF_RETURN_IF_ERROR(CheckKeys(keys, n));
  TF_RETURN_IF_ERROR(CheckValues(values, n));
  mutex_lock lock(mu_);
  TF_RETURN_IF_ERROR(Reserve(n));
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(buckets_.get() + Home(keys[i + kAhead]), 1);
    InsertLocked(keys[i], values[i]);
  }
  return absl::OkStatus();
}

absl::Status NpuRecKeyMap::Find(OpKernelContext* ctx, const Tensor& keys, Tensor* values,
                                const Tensor& default_value) {
  const int64_t n = keys.NumElements();
  const int64_t* k = keys.flat<int64_t>().data();
  TF_RETURN_IF_ERROR(CheckKeys(k, n));
  FindBatch(k, n, values->flat<int64_t>().data(), default_value.flat<int64_t>()(0));
  return absl::OkStatus();
}

absl::Status NpuRecKeyMap::Insert(OpKernelContext* ctx, const Tensor& keys,
                                  const Tensor& values) {
  return InsertBatch(keys.flat<int64_t>().data(), values.flat<int64_t>().data(),
                     keys.NumElements());
}

absl::Status NpuRecKeyMap::Remove(OpKernelContext* ctx, const Tensor& keys) {
  const int64_t n = keys.NumElements();
  const int64_t* k = keys.flat<int64_t>().data();
  TF_RETURN_IF_ERROR(CheckKeys(k, n));
  mutex_lock lock(mu_);
  for (int64_t j = 0; j < n; ++j) {
    if (j + kAhead < n) __builtin_prefetch(buckets_.get() + Home(k[j + kAhead]), 1);
    uint64_t i = Home(k[j]);
    for (int64_t step = 0; step < num_buckets_; ++step) {
      Bucket& b = buckets_[i];
      if (b.key == empty_key_) break;
      if (b.key == k[j]) {
        b = {deleted_key_, 0};
        --live_;
        ++deleted_;
        // A tombstone followed by an empty bucket ends no chain: empty it, and
        // the tombstones just before it.
        uint64_t at = i;
        while (buckets_[Next(at)].key == empty_key_ && buckets_[at].key == deleted_key_) {
          buckets_[at].key = empty_key_;
          --deleted_;
          at = at == 0 ? static_cast<uint64_t>(num_buckets_) - 1 : at - 1;
        }
        break;
      }
      i = Next(i);
    }
  }
  return absl::OkStatus();
}

size_t NpuRecKeyMap::size() const {
  tf_shared_lock lock(mu_);
  return static_cast<size_t>(live_);
}

int64_t NpuRecKeyMap::MemoryUsed() const {
  tf_shared_lock lock(mu_);
  return static_cast<int64_t>(sizeof(*this)) + num_buckets_ * static_cast<int64_t>(sizeof(Bucket));
}

std::string NpuRecKeyMap::DebugString() const {
  tf_shared_lock lock(mu_);
  return absl::StrCat("NpuRecKeyMap of ", live_, " keys in ", num_buckets_, " buckets");
}

absl::Status NpuRecKeyMap::ExportValues(OpKernelContext* ctx) {
  mutex_lock lock(mu_);
  Tensor* keys = nullptr;
  Tensor* values = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output("keys", TensorShape({num_buckets_, 1}), &keys));
  TF_RETURN_IF_ERROR(ctx->allocate_output("values", TensorShape({num_buckets_, 1}), &values));
  int64_t* k = keys->flat<int64_t>().data();
  int64_t* v = values->flat<int64_t>().data();
  for (int64_t i = 0; i < num_buckets_; ++i) {
    k[i] = buckets_[i].key;
    v[i] = buckets_[i].value;
  }
  return absl::OkStatus();
}

absl::Status NpuRecKeyMap::CheckKeyAndValueTensorsForImport(const Tensor& keys,
                                                            const Tensor& values) {
  TF_RETURN_IF_ERROR(CheckKeyAndValueTypes(keys, values));
  const bool keys_ok = keys.dims() == 1 || (keys.dims() == 2 && keys.dim_size(1) == 1);
  if (!keys_ok || values.shape() != keys.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NpuRecKeyMap: import takes keys and values of one shape, [buckets] or [buckets, 1]. "
        "Received: keys ",
        keys.shape().DebugString(), ", values ", values.shape().DebugString()));
  }
  return absl::OkStatus();
}

absl::Status NpuRecKeyMap::ImportValues(OpKernelContext* ctx, const Tensor& keys,
                                        const Tensor& values) {
  const int64_t n = keys.dim_size(0);
  const int64_t* k = keys.flat<int64_t>().data();
  const int64_t* v = values.flat<int64_t>().data();
  int64_t held = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool live = k[i] != empty_key_ && k[i] != deleted_key_;
    held += live;
    if (live) TF_RETURN_IF_ERROR(CheckValues(v + i, 1));
  }
  int64_t buckets = 8;
  if (pow2_) {
    while (buckets < n) buckets *= 2;
  } else {
    buckets = std::max(buckets, n);
  }
  mutex_lock lock(mu_);
  TF_RETURN_IF_ERROR(Reset(std::max(buckets, BucketsFor(held))));
  for (int64_t i = 0; i < n; ++i) {
    if (k[i] != empty_key_ && k[i] != deleted_key_) InsertLocked(k[i], v[i]);
  }
  return absl::OkStatus();
}

namespace {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeAndType;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("NpuRecKeyMap")
    .Input("empty_key: key_dtype")
    .Input("deleted_key: key_dtype")
    .Output("table_handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("use_node_name_sharing: bool = false")
    .Attr("key_dtype: type")
    .Attr("value_dtype: type")
    .Attr("value_shape: shape = {}")
    .Attr("initial_num_buckets: int = 131072")
    .Attr("max_load_factor: float = 0.8")
    .Attr("growth_factor: float = 2.0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle key;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &key));
      ::tensorflow::DataType key_type, value_type;
      ::tensorflow::PartialTensorShape value_shape;
      TF_RETURN_IF_ERROR(c->GetAttr("key_dtype", &key_type));
      TF_RETURN_IF_ERROR(c->GetAttr("value_dtype", &value_type));
      TF_RETURN_IF_ERROR(c->GetAttr("value_shape", &value_shape));
      ShapeHandle value;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(value_shape, &value));
      c->set_output(0, c->Scalar());
      c->set_output_handle_shapes_and_types(
          0, std::vector<ShapeAndType>{{key, key_type}, {value, value_type}});
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("NpuRecKeyMap")
                            .Device(::tensorflow::DEVICE_CPU)
                            .TypeConstraint<int64_t>("key_dtype")
                            .TypeConstraint<int64_t>("value_dtype"),
                        ::tensorflow::LookupTableOp<NpuRecKeyMap, int64_t, int64_t>);

// NpuRecKeyMapReserve: grows the map so that `keys` keys in all fit without
// growing again (`NpuRecKeyMap::ReserveTotal`).
REGISTER_OP("NpuRecKeyMapReserve")
    .Input("table_handle: resource")
    .Input("keys: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

// NpuRecKeyMapCounts: int64 [3] {buckets, live keys, tombstones}.
REGISTER_OP("NpuRecKeyMapCounts")
    .Input("table_handle: resource")
    .Output("counts: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(3));
      return absl::OkStatus();
    });

// The map behind input 0, or an error naming the op when it is another map.
absl::Status OwnMap(OpKernelContext* ctx, NpuRecKeyMap** map) {
  ::tensorflow::lookup::LookupInterface* table = nullptr;
  TF_RETURN_IF_ERROR(
      ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), &table));
  *map = dynamic_cast<NpuRecKeyMap*>(table);
  if (*map == nullptr) {
    const std::string held = table->DebugString();
    table->Unref();
    return absl::InvalidArgumentError(absl::StrCat(
        ctx->op_kernel().type_string(), " takes an NpuRecKeyMap. Received: ", held));
  }
  return absl::OkStatus();
}

class KeyMapReserveOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    NpuRecKeyMap* map = nullptr;
    OP_REQUIRES_OK(ctx, OwnMap(ctx, &map));
    ::tensorflow::core::ScopedUnref unref(map);
    OP_REQUIRES_OK(ctx, map->ReserveTotal(ctx->input(1).scalar<int64_t>()()));
  }
};

class KeyMapCountsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    NpuRecKeyMap* map = nullptr;
    OP_REQUIRES_OK(ctx, OwnMap(ctx, &map));
    ::tensorflow::core::ScopedUnref unref(map);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({3}), &out));
    map->Counts(out->flat<int64_t>().data());
  }
};

REGISTER_KERNEL_BUILDER(Name("NpuRecKeyMapReserve").Device(::tensorflow::DEVICE_CPU),
                        KeyMapReserveOp);
REGISTER_KERNEL_BUILDER(Name("NpuRecKeyMapCounts").Device(::tensorflow::DEVICE_CPU),
                        KeyMapCountsOp);

}  // namespace
}  // namespace npu_rec
