// Fused kernels of npu_rec's sparse tables (see docs/design.md, "Compiled kernels").
//
// They work on the table's existing resource variables (rows, optimizer
// slots, counts, last-seen), in place, under the variables' own mutexes,
// taken in increasing address order as TensorFlow's training kernels do, so
// they run safely beside each other and beside stock variable ops on the
// inter-op threads.
//
//   NpuRecGatherTouch  rows [u] -> their values [u, dim] (zeros for rows < 0);
//                      with touch=true also counts[row] += add (saturating)
//                      and last_seen[row] = max(last_seen[row], time) (int32
//                      metadata, see kernel_util.h).
//   NpuRecSparseApply  per-id gradients [n, dim] with their unique-row index
//                      [n] -> summed per unique row, then one row-wise
//                      optimizer step (SGD, Adagrad, RowWiseAdagrad, lazy
//                      Adam, FTRL) on the rows and their slots, with the
//                      Python path's formulas evaluated in the same order; rows
//                      stored as bfloat16 or float16 are read as float32 and
//                      written back rounded stochastically for (seed, the
//                      row's key, step) (npu_rec/table/_rounding.py).
//
// Rows are float32, bfloat16 or float16 (`RowsView`); slots are float32.
//   NpuRecExpand       unique rows [u, dim] and an index [n] -> [n, dim], row
//                      index[i] of the unique rows at i: `tf.gather` on axis
//                      0, without its sharding for the few thousand ids of a
//                      feature (its gradient is GatherV2's, see _ops.py).
//   NpuRecPadRows      a tensor [r, ...] -> [rows, ...], zero rows appended,
//                      in a table buffer whose zero pages are not resident
//                      until written (`ZeroLazily`): a table's per-row
//                      variables are created and grown with it, so spare
//                      capacity costs no memory until rows are handed out.
//
// Writing in place follows TensorFlow's rule for sparse access: the variable
// is put in copy-on-read mode, and a buffer still shared with a reader is
// copied before the first write.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/threadpool.h"
#include "kernel_util.h"

namespace npu_rec {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::Var;
using ::tensorflow::core::RefCountPtr;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("NpuRecGatherTouch")
    .Input("values: resource")
    .Input("counts: resource")
    .Input("last_seen: resource")
    .Input("rows: int64")
    .Input("add: int64")
    .Input("times: int64")
    .Output("embeddings: float")
    .Attr("touch: bool")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->Dim(c->input(3), 0), dim));
      return absl::OkStatus();
    });

REGISTER_OP("NpuRecSparseApply")
    .Input("values: resource")
    .Input("slots: num_slots * resource")
    .Input("rows: int64")
    .Input("grads: float")
    .Input("grad_index: int64")
    .Input("lr: float")
    .Input("row_keys: resource")
    .Input("step: int64")
    .Attr("num_slots: int >= 0")
    .Attr("optimizer: {'sgd', 'adagrad', 'rowwise_adagrad', 'adam', 'ftrl'}")
    .Attr("seed: int = 0")
    .Attr("epsilon: float = 0.0")
    .Attr("beta_1: float = 0.0")
    .Attr("one_minus_beta_1: float = 0.0")
    .Attr("beta_2: float = 0.0")
    .Attr("one_minus_beta_2: float = 0.0")
    .Attr("power: float = 0.0")
    .Attr("l1: float = 0.0")
    .Attr("two_l2: float = 0.0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return absl::OkStatus(); });

REGISTER_OP("NpuRecExpand")
    .Input("params: float")
    .Input("index: int64")
    .Output("output: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle params, index;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &params));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &index));
      c->set_output(0, c->Matrix(c->Dim(index, 0), c->Dim(params, 1)));
      return absl::OkStatus();
    });

REGISTER_OP("NpuRecPadRows")
    .Input("input: T")
    .Input("rows: int64")
    .Output("output: T")
    .Attr("T: {float, bfloat16, half, int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle in, out;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &in));
      TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
      c->set_output(0, out);
      return absl::OkStatus();
    });

class PadRowsOp : public OpKernel {
 public:
  explicit PadRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& rows_t = ctx->input(1);
    OP_REQUIRES(ctx, input.dims() >= 1 && rows_t.dims() == 0,
                absl::InvalidArgumentError(
                    "npu_rec kernel: NpuRecPadRows takes a tensor of rank >= 1 and a scalar "
                    "row count; got " + input.shape().DebugString() + " and " +
                    rows_t.shape().DebugString()));
    const int64_t rows = rows_t.scalar<int64_t>()();
    OP_REQUIRES(ctx, rows >= input.dim_size(0),
                absl::InvalidArgumentError(
                    "npu_rec kernel: NpuRecPadRows cannot shrink " +
                    input.shape().DebugString() + " to " + std::to_string(rows) + " rows"));
    Tensor out;
    OP_REQUIRES_OK(ctx, GrownCopy(input, rows, &out));
    ctx->set_output(0, out);
  }
};

// Below this many output floats the expansion runs inline: handing a few
// thousand rows to the intra-op pool, busy with the other tables' kernels,
// costs more than copying them.
constexpr int64_t kInlineExpand = 1 << 17;

class ExpandOp : public OpKernel {
 public:
  explicit ExpandOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& params_t = ctx->input(0);
    const Tensor& index_t = ctx->input(1);
    OP_REQUIRES(ctx, params_t.dims() == 2 && index_t.dims() == 1,
                absl::InvalidArgumentError(
                    "npu_rec kernel: NpuRecExpand takes params [u, dim] and index [n]; got " +
                    params_t.shape().DebugString() + " and " + index_t.shape().DebugString()));
    const int64_t u = params_t.dim_size(0), dim = params_t.dim_size(1);
    const int64_t n = index_t.NumElements();
    const int64_t* index = index_t.flat<int64_t>().data();
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, static_cast<uint64_t>(index[i]) < static_cast<uint64_t>(u),
                  absl::InvalidArgumentError(
                      "npu_rec kernel: index[" + std::to_string(i) + "] = " +
                      std::to_string(index[i]) + " is not in [0, " + std::to_string(u) + ")"));
    }
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim}), &out_t));
    const float* src = params_t.flat<float>().data();
    float* dst = out_t->flat<float>().data();
    auto copy = [&](int64_t begin, int64_t end) {
      if (dim == 16) {  // the common width: a fixed-size copy the compiler unrolls
        for (int64_t i = begin; i < end; ++i) {
          std::memcpy(dst + i * 16, src + index[i] * 16, 16 * sizeof(float));
        }
        return;
      }
      for (int64_t i = begin; i < end; ++i) {
        std::memcpy(dst + i * dim, src + index[i] * dim, dim * sizeof(float));
      }
    };
    if (n * dim < kInlineExpand) {
      copy(0, n);
    } else {
      ParallelRows(ctx, n, 8 * dim + 8, copy);
    }
  }
};

class GatherTouchOp : public OpKernel {
 public:
  explicit GatherTouchOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("touch", &touch_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows_t = ctx->input(3);
    const Tensor& add_t = ctx->input(4);
    const Tensor& times_t = ctx->input(5);
    const int64_t u = rows_t.NumElements();
    OP_REQUIRES(ctx, !touch_ || add_t.NumElements() == u,
                absl::InvalidArgumentError("npu_rec kernel: `add` must have one entry per row"));
    OP_REQUIRES(ctx, !touch_ || times_t.NumElements() == u || times_t.NumElements() == 1,
                absl::InvalidArgumentError(
                    "npu_rec kernel: `times` must have one entry per row, or one in all"));
    RefCountPtr<Var> values, counts, seen;
    OP_REQUIRES_OK(ctx, GetVar(ctx, 0, &values));
    OP_REQUIRES_OK(ctx, GetVar(ctx, 1, &counts));
    OP_REQUIRES_OK(ctx, GetVar(ctx, 2, &seen));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u, dim_}), &out));
    const int64_t* rows = rows_t.flat<int64_t>().data();
    float* dst = out->flat<float>().data();

    std::vector<Var*> vars = {values.get()};
    if (touch_) {
      vars.push_back(counts.get());
      vars.push_back(seen.get());
    }
    VarLocks locks(vars);
    OP_REQUIRES_OK(ctx, CheckRowsDtype(*values->tensor()));
    OP_REQUIRES_OK(ctx, CheckRows(*values->tensor(), "values", rows, u, dim_));
    const RowsView src(values->tensor());
    const int64_t dim = dim_;
    int32_t* cnt = nullptr;
    int32_t* last = nullptr;
    if (touch_) {
      OP_REQUIRES_OK(ctx, PrepareWrite(ctx, counts.get()));
      OP_REQUIRES_OK(ctx, PrepareWrite(ctx, seen.get()));
      OP_REQUIRES_OK(ctx, CheckRows(*counts->tensor(), "counts", rows, u, 0));
      OP_REQUIRES_OK(ctx, CheckRows(*seen->tensor(), "last_seen", rows, u, 0));
      OP_REQUIRES_OK(ctx, CheckMeta(*counts->tensor(), "counts"));
      OP_REQUIRES_OK(ctx, CheckMeta(*seen->tensor(), "last_seen"));
      cnt = counts->tensor()->flat<int32_t>().data();
      last = seen->tensor()->flat<int32_t>().data();
    }
    const int64_t* add = touch_ ? add_t.flat<int64_t>().data() : nullptr;
    const int64_t* times = touch_ ? times_t.flat<int64_t>().data() : nullptr;
    const bool one_time = touch_ && times_t.NumElements() == 1;
    // Rows are unique (one per unique key, or -1), so the ranges write disjoint rows.
    ParallelRows(ctx, u, 4 * dim + 40, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (i + kAhead < end && rows[i + kAhead] >= 0) {  // scattered rows: prefetch
          __builtin_prefetch(src.Address(rows[i + kAhead] * dim));
        }
        const int64_t r = rows[i];
        if (r < 0) {
          std::memset(dst + i * dim, 0, sizeof(float) * dim);
          continue;
        }
        src.Read(r * dim, dim, dst + i * dim);
        if (cnt == nullptr) continue;
        cnt[r] = SaturatedCount(cnt[r], add[i]);
        const int32_t t = EncodeSeen(one_time ? times[0] : times[i]);
        if (t > last[r]) last[r] = t;
      }
    });
  }

 private:
  bool touch_;
  int64_t dim_;
};

enum class Kind { kSgd, kAdagrad, kRowWiseAdagrad, kAdam, kFtrl };

class SparseApplyOp : public OpKernel {
 public:
  explicit SparseApplyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string kind;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("optimizer", &kind));
    kind_ = kind == "sgd" ? Kind::kSgd
            : kind == "adagrad" ? Kind::kAdagrad
            : kind == "rowwise_adagrad" ? Kind::kRowWiseAdagrad
            : kind == "adam" ? Kind::kAdam : Kind::kFtrl;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed_));
    const int want = kind_ == Kind::kSgd                                        ? 0
                     : kind_ == Kind::kAdagrad || kind_ == Kind::kRowWiseAdagrad ? 1
                                                                                  : 2;
    OP_REQUIRES(ctx, num_slots_ == want,
                absl::InvalidArgumentError("npu_rec kernel: optimizer " + kind + " needs " +
                                           std::to_string(want) + " slots"));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &eps_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta_1", &b1_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("one_minus_beta_1", &c1_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("beta_2", &b2_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("one_minus_beta_2", &c2_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("power", &power_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("l1", &l1_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("two_l2", &two_l2_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int k = num_slots_;
    const Tensor& rows_t = ctx->input(1 + k);
    const Tensor& grads_t = ctx->input(2 + k);
    const Tensor& index_t = ctx->input(3 + k);
    const Tensor& lr_t = ctx->input(4 + k);
    const int64_t step = ctx->input(6 + k).scalar<int64_t>()();
    OP_REQUIRES(ctx, grads_t.dims() == 2 && index_t.dims() == 1 &&
                         index_t.dim_size(0) == grads_t.dim_size(0),
                absl::InvalidArgumentError(
                    "npu_rec kernel: `grads` must be [n, dim] and `grad_index` [n]; got " +
                    grads_t.shape().DebugString() + " and " + index_t.shape().DebugString()));
    OP_REQUIRES(ctx, lr_t.NumElements() == 1,
                absl::InvalidArgumentError("npu_rec kernel: `lr` must be a scalar"));
    const int64_t u = rows_t.NumElements();
    const int64_t n = grads_t.dim_size(0);
    const int64_t dim = grads_t.dim_size(1);
    const int64_t* rows = rows_t.flat<int64_t>().data();
    const int64_t* index = index_t.flat<int64_t>().data();
    const float* grads = grads_t.flat<float>().data();
    const float lr = lr_t.flat<float>()(0);

    // Per-id gradients grouped by unique row: a counting sort of the index (CSR).
    std::vector<int64_t> start(u + 1, 0), order(n);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t s = index[j];
      OP_REQUIRES(ctx, s >= 0 && s < u,
                  absl::InvalidArgumentError("npu_rec kernel: grad_index " + std::to_string(s) +
                                             " is outside [0, " + std::to_string(u) + ")"));
      ++start[s + 1];
    }
    for (int64_t i = 0; i < u; ++i) start[i + 1] += start[i];
    {
      std::vector<int64_t> fill(start.begin(), start.end() - 1);
      for (int64_t j = 0; j < n; ++j) order[fill[index[j]]++] = j;
    }

    RefCountPtr<Var> values;
    OP_REQUIRES_OK(ctx, GetVar(ctx, 0, &values));
    std::vector<RefCountPtr<Var>> slots(k);
    std::vector<Var*> vars = {values.get()};
    for (int s = 0; s < k; ++s) {
      OP_REQUIRES_OK(ctx, GetVar(ctx, 1 + s, &slots[s]));
      vars.push_back(slots[s].get());
    }
    RefCountPtr<Var> keys_var;
    OP_REQUIRES_OK(ctx, GetVar(ctx, 5 + k, &keys_var));
    std::vector<Var*> locked = vars;
    locked.push_back(keys_var.get());
    VarLocks locks(locked);
    OP_REQUIRES_OK(ctx, CheckRowsDtype(*values->tensor()));
    for (size_t i = 0; i < vars.size(); ++i) {
      Var* v = vars[i];
      // RowWiseAdagrad's accumulator holds one value per row.
      const int64_t width = i == 1 && kind_ == Kind::kRowWiseAdagrad ? 1 : dim;
      OP_REQUIRES_OK(ctx, PrepareWrite(ctx, v));
      OP_REQUIRES_OK(ctx, CheckRows(*v->tensor(), "values or slot", rows, u, width));
    }
    RowsView w(values->tensor());
    const int64_t* row_keys = nullptr;
    if (w.compact()) {  // the rounding hash needs each row's key
      OP_REQUIRES_OK(ctx, CheckRows(*keys_var->tensor(), "row_keys", rows, u, 0));
      row_keys = keys_var->tensor()->flat<int64_t>().data();
    }
    float* s0 = k > 0 ? slots[0]->tensor()->flat<float>().data() : nullptr;
    float* s1 = k > 1 ? slots[1]->tensor()->flat<float>().data() : nullptr;
    // Rows are unique, so the ranges update disjoint rows and slots.
    const int64_t ids_per_row = n / std::max<int64_t>(u, 1);
    const int64_t cost = (kind_ == Kind::kFtrl ? 60 : 20) * dim + 8 * dim * ids_per_row;
    const int64_t s0_width = kind_ == Kind::kRowWiseAdagrad ? 1 : dim;
    ParallelRows(ctx, u, cost, [&](int64_t begin, int64_t end) {
      std::vector<float> g(dim), row(dim);
      std::vector<uint32_t> noise(dim);
      for (int64_t i = begin; i < end; ++i) {
        if (i + kAhead < end && rows[i + kAhead] >= 0) {  // scattered rows: prefetch
          const int64_t p = rows[i + kAhead] * dim;
          __builtin_prefetch(w.Address(p), 1);
          if (row_keys != nullptr) __builtin_prefetch(row_keys + rows[i + kAhead]);
          // the row's first gradient (the ids' gradients are scattered over `grads`)
          if (start[i + kAhead] < start[i + kAhead + 1]) {
            __builtin_prefetch(grads + order[start[i + kAhead]] * dim);
          }
          if (s0 != nullptr) __builtin_prefetch(s0 + rows[i + kAhead] * s0_width, 1);
          if (s1 != nullptr) __builtin_prefetch(s1 + p, 1);
        }
        const int64_t r = rows[i];
        if (r < 0) continue;
        std::fill(g.begin(), g.end(), 0.0f);
        for (int64_t p = start[i]; p < start[i + 1]; ++p) {
          const float* src = grads + order[p] * dim;
          for (int64_t d = 0; d < dim; ++d) g[d] += src[d];
        }
        w.Read(r * dim, dim, row.data());
        ApplyRow(r, dim, g.data(), lr, row.data(), s0, s1);
        if (row_keys == nullptr) {
          w.WriteNearest(r * dim, dim, row.data());  // float32 rows: a copy
        } else {
          w.WriteRounded(r * dim, dim, row.data(),
                         RoundingRowHash(row_keys[r], static_cast<uint64_t>(seed_), step),
                         noise.data());
        }
      }
    });
  }

 private:
  // One optimizer step of row `r` (its float32 values in `row`, and its slots)
  // from its summed gradient.
  void ApplyRow(int64_t r, int64_t dim, const float* g, float lr, float* row, float* s0,
                float* s1) const {
    const int64_t off = r * dim;
    switch (kind_) {
      case Kind::kSgd:
        for (int64_t d = 0; d < dim; ++d) row[d] = row[d] - lr * g[d];
        break;
      case Kind::kAdagrad: {
        float* acc = s0 + off;
        for (int64_t d = 0; d < dim; ++d) {
          const float a = acc[d] + g[d] * g[d];
          acc[d] = a;
          row[d] = row[d] - (lr * g[d]) / (std::sqrt(a) + eps_);
        }
        break;
      }
      case Kind::kRowWiseAdagrad: {
        // acc += mean(g*g): the squares summed in element order, then divided by dim
        // (RowWiseAdagrad.apply_sparse's order).
        float sum = g[0] * g[0];
        for (int64_t d = 1; d < dim; ++d) sum = sum + g[d] * g[d];
        const float a = s0[r] + sum / static_cast<float>(dim);
        s0[r] = a;
        for (int64_t d = 0; d < dim; ++d) {
          row[d] = row[d] - (lr * g[d]) / (std::sqrt(a) + eps_);
        }
        break;
      }
      case Kind::kAdam: {
        float* m = s0 + off;
        float* v = s1 + off;
        for (int64_t d = 0; d < dim; ++d) {
          const float mm = b1_ * m[d] + c1_ * g[d];
          const float vv = b2_ * v[d] + c2_ * (g[d] * g[d]);
          m[d] = mm;
          v[d] = vv;
          row[d] = row[d] - (lr * mm) / (std::sqrt(vv) + eps_);
        }
        break;
      }
      case Kind::kFtrl: {
        float* acc = s0 + off;
        float* lin = s1 + off;
        for (int64_t d = 0; d < dim; ++d) {
          const float a_new = acc[d] + g[d] * g[d];
          const float p_new = std::pow(a_new, power_);
          const float l = (lin[d] + g[d]) - ((p_new - std::pow(acc[d], power_)) / lr) * row[d];
          const float quad = p_new / lr + two_l2_;
          const float clipped = std::min(std::max(l, -l1_), l1_);
          acc[d] = a_new;
          lin[d] = l;
          row[d] = (clipped - l) / quad;
        }
        break;
      }
    }
  }

  Kind kind_;
  int num_slots_;
  int64_t seed_;
  float eps_, b1_, c1_, b2_, c2_, power_, l1_, two_l2_;
};

REGISTER_KERNEL_BUILDER(Name("NpuRecGatherTouch").Device(DEVICE_CPU), GatherTouchOp);
REGISTER_KERNEL_BUILDER(Name("NpuRecSparseApply").Device(DEVICE_CPU), SparseApplyOp);
REGISTER_KERNEL_BUILDER(Name("NpuRecExpand").Device(DEVICE_CPU), ExpandOp);
REGISTER_KERNEL_BUILDER(Name("NpuRecPadRows").Device(DEVICE_CPU), PadRowsOp);

}  // namespace
}  // namespace npu_rec
