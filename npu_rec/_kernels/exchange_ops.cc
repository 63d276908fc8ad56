// Kernels of the multi-worker exchange (npu_rec/distribute/_step_exchange.py).
//
//   NpuRecSumSlices  the per-id gradients of N lookups (`tf.IndexedSlices`:
//                    values [n_i, d_i], indices [n_i] into the lookup's u_i
//                    unique rows) -> one float32 [sum u_i, width] buffer:
//                    lookup i's rows summed per unique row (in index order,
//                    as `tf.scatter_nd` sums them) at rows [sum_{j<i} u_j,
//                    sum_{j<=i} u_j), columns [0, d_i), zeros elsewhere. It
//                    replaces a `ScatterNd`, a pad and a concat per lookup
//                    (a worker's ops run one after another on its thread).
//   NpuRecTake       rows index[i] of params [u, ...] at i (`tf.gather` on
//                    axis 0) for the exchange's buffers, copied inline on the
//                    op's thread: TensorFlow's `GatherV2` hands even a few
//                    thousand rows to the intra-op pool, and on a worker's
//                    busy cores the hand-off waits longer than the copy.

#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace npu_rec {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpInputList;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;

REGISTER_OP("NpuRecSumSlices")
    .Input("values: N * float")
    .Input("indices: N * int64")
    .Input("sizes: int64")
    .Output("output: float")
    .Attr("N: int >= 1")
    .Attr("width: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int64_t width;
      TF_RETURN_IF_ERROR(c->GetAttr("width", &width));
      c->set_output(0, c->Matrix(c->UnknownDim(), width));
      return absl::OkStatus();
    });

class SumSlicesOp : public OpKernel {
 public:
  explicit SumSlicesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("width", &width_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList values, indices;
    OP_REQUIRES_OK(ctx, ctx->input_list("values", &values));
    OP_REQUIRES_OK(ctx, ctx->input_list("indices", &indices));
    const Tensor& sizes_t = ctx->input(2 * values.size());
    const int parts = values.size();
    OP_REQUIRES(ctx, sizes_t.dims() == 1 && sizes_t.NumElements() == parts,
                absl::InvalidArgumentError(
                    "npu_rec kernel: NpuRecSumSlices takes one size per part (" +
                    std::to_string(parts) + "); got sizes " + sizes_t.shape().DebugString()));
    const int64_t* sizes = sizes_t.flat<int64_t>().data();
    std::vector<int64_t> offset(parts + 1, 0);
    for (int i = 0; i < parts; ++i) {
      const Tensor& v = values[i];
      const Tensor& x = indices[i];
      OP_REQUIRES(ctx, sizes[i] >= 0, absl::InvalidArgumentError(
                                          "npu_rec kernel: NpuRecSumSlices: sizes[" +
                                          std::to_string(i) + "] = " +
                                          std::to_string(sizes[i]) + " is negative"));
      OP_REQUIRES(ctx,
                  v.dims() == 2 && x.dims() == 1 && v.dim_size(0) == x.dim_size(0) &&
                      v.dim_size(1) <= width_,
                  absl::InvalidArgumentError(
                      "npu_rec kernel: NpuRecSumSlices part " + std::to_string(i) +
                      " takes values [n, dim <= " + std::to_string(width_) +
                      "] and indices [n]; got " + v.shape().DebugString() + " and " +
                      x.shape().DebugString()));
      const int64_t* at = x.flat<int64_t>().data();
      for (int64_t k = 0; k < x.NumElements(); ++k) {
        OP_REQUIRES(ctx, static_cast<uint64_t>(at[k]) < static_cast<uint64_t>(sizes[i]),
                    absl::InvalidArgumentError(
                        "npu_rec kernel: NpuRecSumSlices part " + std::to_string(i) +
                        ": indices[" + std::to_string(k) + "] = " + std::to_string(at[k]) +
                        " is not in [0, " + std::to_string(sizes[i]) + ")"));
      }
      offset[i + 1] = offset[i] + sizes[i];
    }
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({offset[parts], width_}), &out_t));
    float* out = out_t->flat<float>().data();
    std::memset(out, 0, sizeof(float) * offset[parts] * width_);
    for (int i = 0; i < parts; ++i) {
      const int64_t dim = values[i].dim_size(1);
      const float* v = values[i].flat<float>().data();
      const int64_t* at = indices[i].flat<int64_t>().data();
      float* base = out + offset[i] * width_;
      for (int64_t k = 0; k < indices[i].NumElements(); ++k) {
        float* row = base + at[k] * width_;
        const float* src = v + k * dim;
        for (int64_t d = 0; d < dim; ++d) row[d] += src[d];
      }
    }
  }

 private:
  int64_t width_;
};

REGISTER_KERNEL_BUILDER(Name("NpuRecSumSlices").Device(DEVICE_CPU), SumSlicesOp);

REGISTER_OP("NpuRecTake")
    .Input("params: T")
    .Input("index: Tindex")
    .Output("output: T")
    .Attr("T: {float, int32, int64}")
    .Attr("Tindex: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle params, index, out;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &params));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &index));
      TF_RETURN_IF_ERROR(c->ReplaceDim(params, 0, c->Dim(index, 0), &out));
      c->set_output(0, out);
      return absl::OkStatus();
    });

template <typename Index>
class TakeOp : public OpKernel {
 public:
  explicit TakeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& params = ctx->input(0);
    const Tensor& index_t = ctx->input(1);
    OP_REQUIRES(ctx, params.dims() >= 1 && index_t.dims() == 1,
                absl::InvalidArgumentError(
                    "npu_rec kernel: NpuRecTake takes params [u, ...] and index [n]; got " +
                    params.shape().DebugString() + " and " + index_t.shape().DebugString()));
    const int64_t u = params.dim_size(0);
    const int64_t n = index_t.NumElements();
    const Index* index = index_t.flat<Index>().data();
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, static_cast<uint64_t>(index[i]) < static_cast<uint64_t>(u),
                  absl::InvalidArgumentError(
                      "npu_rec kernel: NpuRecTake: index[" + std::to_string(i) + "] = " +
                      std::to_string(index[i]) + " is not in [0, " + std::to_string(u) + ")"));
    }
    TensorShape shape = params.shape();
    shape.set_dim(0, n);
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out_t));
    if (n == 0 || out_t->NumElements() == 0) return;
    const int64_t row = (params.NumElements() / u) * ::tensorflow::DataTypeSize(params.dtype());
    const char* src = static_cast<const char*>(params.data());
    char* dst = static_cast<char*>(out_t->data());
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * row, src + index[i] * row, row);
  }
};

REGISTER_KERNEL_BUILDER(
    Name("NpuRecTake").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tindex"), TakeOp<int32_t>);
REGISTER_KERNEL_BUILDER(
    Name("NpuRecTake").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tindex"), TakeOp<int64_t>);

}  // namespace
}  // namespace npu_rec
