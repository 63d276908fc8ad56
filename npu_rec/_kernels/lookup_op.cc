// The fused training lookup of one table of npu_rec's sparse tables (see
// docs/design.md, "Compiled kernels").
//
//   NpuRecTrainLookup  a batch's ids [n] -> in one pass: deduplicated (first
//                      occurrence order, as tf.unique_with_counts), sightings
//                      per unique key, newest timestamp per unique key
//                      (optionally clamped as SingleShardTable._clamp_times
//                      does), the keys probed in the table's key index, the
//                      rows of the keys found gathered and their counts /
//                      last-seen updated in place (lookup_core.h). Tables that
//                      admit at once admit here; for the others keys without
//                      a row are returned (positions, keys, sightings, times)
//                      for admission in stock ops. Ids given with
//                      `known_rows` are unique keys (one time for the
//                      batch): not deduplicated again, and those with a
//                      known row (>= 0) not probed.

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "lookup_core.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace npu_rec {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;

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
    .Input("known_rows: int64")
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
    int num_slots;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &attrs_.dim));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("batch_time", &batch_time_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("clamp", &clamp_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admit", &attrs_.admit));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_init", &attrs_.slot_init));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &attrs_.seed));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dynamic", &attrs_.dynamic));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("full_head", &attrs_.full_head));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("full_tail", &attrs_.full_tail));
    OP_REQUIRES(ctx, static_cast<int>(attrs_.slot_init.size()) == num_slots,
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
    const Tensor& known_t = ctx->input(kKnownRows);
    const int64_t* known = known_t.NumElements() ? known_t.flat<int64_t>().data() : nullptr;
    OP_REQUIRES(ctx, known == nullptr || (known_t.NumElements() == n && batch_time_),
                absl::InvalidArgumentError(
                    "npu_rec kernel: `known_rows` (ids already unique) must be empty or have one "
                    "entry per id, with one time for the batch"));
    const int64_t* weights = weights_t.NumElements() ? weights_t.flat<int64_t>().data() : nullptr;
    const int64_t* times = times_t.flat<int64_t>().data();

    // 1. Deduplicate (ids given with their known rows are unique already).
    Tensor* index_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &index_t));
    Unique uq;
    if (known != nullptr) {
      AsUnique(ids_t.flat<int64_t>().data(), n, weights, &uq);
      int64_t* index = index_t->flat<int64_t>().data();
      for (int64_t i = 0; i < n; ++i) index[i] = i;
    } else {
      Deduplicate(ids_t.flat<int64_t>().data(), n, weights, batch_time_ ? nullptr : times,
                  index_t->flat<int64_t>().data(), &uq);
    }
    const int64_t u = static_cast<int64_t>(uq.keys.size());

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
        for (int64_t& t : uq.newest) {
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
      for (int64_t t : uq.newest) newest = std::max(newest, t);
    }

    Tensor* unique_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u}), &unique_t));
    if (u > 0) std::memcpy(unique_t->flat<int64_t>().data(), uq.keys.data(), sizeof(int64_t) * u);

    // 3. Probe, admit (when the table admits at once), gather and touch.
    Tensor* rows_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({u}), &rows_t));
    Tensor* emb_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({u, attrs_.dim}), &emb_t));
    int64_t* rows = rows_t->flat<int64_t>().data();
    std::vector<int64_t> miss;
    OP_REQUIRES_OK(ctx,
                   LookupRows(ctx, attrs_, uq, batch, rows, emb_t->flat<float>().data(),
                              &miss, known));

    // 4. The keys left without a row, for the stock admission ops.
    const int64_t m = static_cast<int64_t>(miss.size());
    Tensor* out[4];
    for (int k = 0; k < 4; ++k) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(4 + k, TensorShape({m}), &out[k]));
    }
    for (int64_t j = 0; j < m; ++j) {
      const int64_t i = miss[j];
      out[0]->flat<int64_t>()(j) = i;
      out[1]->flat<int64_t>()(j) = uq.keys[i];
      out[2]->flat<int64_t>()(j) = uq.sightings[i];
      out[3]->flat<int64_t>()(j) = batch_time_ ? batch : uq.newest[i];
    }
    Tensor* newest_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(8, TensorShape({}), &newest_out));
    newest_out->scalar<int64_t>()() = newest;
    Tensor* late_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(9, TensorShape({2}), &late_out));
    late_out->flat<int64_t>()(0) = late_count;
    late_out->flat<int64_t>()(1) = late_newest;
  }

 private:
  TableAttrs attrs_;
  bool batch_time_;
  bool clamp_;
};

REGISTER_KERNEL_BUILDER(Name("NpuRecTrainLookup").Device(DEVICE_CPU), TrainLookupOp);

}  // namespace
}  // namespace npu_rec
