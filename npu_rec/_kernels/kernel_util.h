// Helpers shared by npu_rec's table kernels (table_ops.cc, lookup_op.cc).
#ifndef NPU_REC_KERNELS_KERNEL_UTIL_H_
#define NPU_REC_KERNELS_KERNEL_UTIL_H_

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/numeric_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/threadpool.h"

namespace npu_rec {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::Var;
using ::tensorflow::core::RefCountPtr;

// Rows prefetched ahead of a loop over scattered rows of a table larger than the caches.
constexpr int64_t kAhead = 8;

// Locks a set of variables in increasing mutex address order (the order
// TensorFlow's own kernels use), exclusively, for the kernel's lifetime.
class VarLocks {
 public:
  explicit VarLocks(std::vector<Var*> vars) {
    std::sort(vars.begin(), vars.end(),
              [](Var* a, Var* b) { return a->mu() < b->mu(); });
    vars.erase(std::unique(vars.begin(), vars.end()), vars.end());
    for (Var* v : vars) v->mu()->lock();
    locked_ = std::move(vars);
  }
  ~VarLocks() {
    for (auto it = locked_.rbegin(); it != locked_.rend(); ++it) (*it)->mu()->unlock();
  }

 private:
  std::vector<Var*> locked_;
};

// The allocator of table-sized buffers (a variable grown or copied by a kernel):
// plain aligned malloc/free. TensorFlow's CPU allocator with oneDNN on (the
// default on x86) keeps large freed blocks in a pool that never shrinks, so the
// buffers a table outgrows would stay resident beside the new ones (measured:
// ~100 B per key at 5M keys grown from 100k); freed here, they go back to the
// system (glibc maps blocks this large separately). Never destroyed: tensors
// allocated by it may outlive any kernel.
class HostAllocator : public ::tensorflow::Allocator {
 public:
  std::string Name() override { return "npu_rec_host"; }
  void* AllocateRaw(size_t alignment, size_t num_bytes) override {
    alignment = std::max<size_t>(alignment, 64);
    void* ptr = nullptr;
    if (posix_memalign(&ptr, alignment, std::max<size_t>(num_bytes, 1)) != 0) return nullptr;
    return ptr;
  }
  void DeallocateRaw(void* ptr) override { std::free(ptr); }
};

inline ::tensorflow::Allocator* TableAllocator() {
  static ::tensorflow::Allocator* allocator = new HostAllocator;
  return allocator;
}

// A [shape] tensor of `dtype` from `TableAllocator`, or an error naming its size.
inline absl::Status AllocateTable(::tensorflow::DataType dtype,
                                  const ::tensorflow::TensorShape& shape, Tensor* out) {
  Tensor t(TableAllocator(), dtype, shape);
  if (!t.IsInitialized()) {
    return absl::ResourceExhaustedError(
        "npu_rec kernel: cannot allocate a table buffer of shape " + shape.DebugString() +
        " (" + std::to_string(shape.num_elements() * ::tensorflow::DataTypeSize(dtype)) +
        " bytes): out of memory");
  }
  *out = std::move(t);
  return absl::OkStatus();
}

// Under the variable's exclusive lock: make its buffer safe to write in place.
inline absl::Status PrepareWrite(OpKernelContext* ctx, Var* var) {
  Tensor* t = var->tensor();
  if (!t->RefCountIsOne()) {
    Tensor copy;
    TF_RETURN_IF_ERROR(AllocateTable(t->dtype(), t->shape(), &copy));
    if (t->TotalBytes() > 0) {
      std::memcpy(copy.data(), t->data(), t->TotalBytes());
    }
    *t = copy;
  }
  var->copy_on_read_mode.store(true);
  return absl::OkStatus();
}

// Runs fn(begin, end) over [0, n) on the device's intra-op threads (the kernels
// touch unique rows, so ranges never write the same row).
template <typename Fn>
inline void ParallelRows(OpKernelContext* ctx, int64_t n, int64_t cost_per_row, Fn fn) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  workers->ParallelFor(n, cost_per_row, fn);
}

inline absl::Status GetVar(OpKernelContext* ctx, int input, RefCountPtr<Var>* var) {
  return ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, input), var);
}

inline absl::Status CheckRows(const Tensor& var, const char* what, const int64_t* rows, int64_t n,
                       int64_t dim) {
  if (var.dims() < 1 || (dim > 0 && (var.dims() != 2 || var.dim_size(1) != dim))) {
    return absl::InvalidArgumentError(std::string("npu_rec kernel: variable `") + what +
                                      "` has shape " + var.shape().DebugString() +
                                      ", expected [capacity, " + std::to_string(dim) + "]");
  }
  const int64_t cap = var.dim_size(0);
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] >= cap) {
      return absl::InvalidArgumentError(
          std::string("npu_rec kernel: row ") + std::to_string(rows[i]) + " of `" + what +
          "` is outside the capacity " + std::to_string(cap));
    }
  }
  return absl::OkStatus();
}

// SplitMix64's output function (npu_rec/table/_keyed_init.py, _rounding.py).
inline uint64_t SplitMix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The per-row part of the stochastic rounding hash of npu_rec/table/_rounding.py:
// splitmix64(splitmix64(key ^ seed ^ SALT) + step).
inline uint64_t RoundingRowHash(int64_t key, uint64_t seed, int64_t step) {
  constexpr uint64_t kSalt = 0xD1B54A32D192ED03ULL;
  return SplitMix64(SplitMix64(static_cast<uint64_t>(key) ^ (seed ^ kSalt)) +
                    static_cast<uint64_t>(step));
}

// float32 `x` (element `e` of a row whose hash is `row_hash`) with random bits
// added below the `drop` mantissa bits the storage dtype drops, which are then
// cleared (Inf and NaN kept): the float32 of step 3 of npu_rec/table/_rounding.py.
inline float StochasticBits(float x, uint64_t row_hash, int64_t e, int drop) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7F800000u) != 0x7F800000u) {
    const uint64_t u = SplitMix64(row_hash + static_cast<uint64_t>(e)) >> 32;
    const uint64_t sum = static_cast<uint64_t>(bits) + (u >> (32 - drop));
    bits = static_cast<uint32_t>(sum & (0xFFFFFFFFull ^ ((1ull << drop) - 1)));
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// A table's rows variable as float32 values: stored as float, bfloat16 or half.
// Conversions to the storage type round to nearest even (as TensorFlow's Cast);
// `WriteRounded` rounds stochastically (npu_rec/table/_rounding.py).
class RowsView {
 public:
  explicit RowsView(Tensor* t) : dtype_(t->dtype()), data_(static_cast<char*>(t->data())) {}

  static bool Supported(::tensorflow::DataType d) {
    return d == ::tensorflow::DT_FLOAT || d == ::tensorflow::DT_BFLOAT16 ||
           d == ::tensorflow::DT_HALF;
  }
  const char* Address(int64_t off) const {
    return data_ + off * ::tensorflow::DataTypeSize(dtype_);
  }

  // dst[0..n) = elements off..off+n as float32.
  void Read(int64_t off, int64_t n, float* dst) const {
    switch (dtype_) {
      case ::tensorflow::DT_BFLOAT16: {
        const auto* src = reinterpret_cast<const Eigen::bfloat16*>(data_) + off;
        for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<float>(src[d]);
        return;
      }
      case ::tensorflow::DT_HALF: {
        const auto* src = reinterpret_cast<const Eigen::half*>(data_) + off;
        for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<float>(src[d]);
        return;
      }
      default:
        std::memcpy(dst, reinterpret_cast<const float*>(data_) + off, sizeof(float) * n);
    }
  }

  // Elements off..off+n = src, rounded to nearest.
  void WriteNearest(int64_t off, int64_t n, const float* src) {
    switch (dtype_) {
      case ::tensorflow::DT_BFLOAT16: {
        auto* dst = reinterpret_cast<Eigen::bfloat16*>(data_) + off;
        for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<Eigen::bfloat16>(src[d]);
        return;
      }
      case ::tensorflow::DT_HALF: {
        auto* dst = reinterpret_cast<Eigen::half*>(data_) + off;
        for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<Eigen::half>(src[d]);
        return;
      }
      default:
        std::memcpy(reinterpret_cast<float*>(data_) + off, src, sizeof(float) * n);
    }
  }

  // Elements off..off+n = src rounded stochastically (float rows: exact).
  void WriteRounded(int64_t off, int64_t n, const float* src, uint64_t row_hash) {
    switch (dtype_) {
      case ::tensorflow::DT_BFLOAT16: {
        auto* dst = reinterpret_cast<Eigen::bfloat16*>(data_) + off;
        for (int64_t d = 0; d < n; ++d) {
          dst[d] = static_cast<Eigen::bfloat16>(StochasticBits(src[d], row_hash, d, 16));
        }
        return;
      }
      case ::tensorflow::DT_HALF: {
        auto* dst = reinterpret_cast<Eigen::half*>(data_) + off;
        for (int64_t d = 0; d < n; ++d) {
          dst[d] = static_cast<Eigen::half>(StochasticBits(src[d], row_hash, d, 13));
        }
        return;
      }
      default:
        std::memcpy(reinterpret_cast<float*>(data_) + off, src, sizeof(float) * n);
    }
  }

  bool compact() const { return dtype_ != ::tensorflow::DT_FLOAT; }

 private:
  ::tensorflow::DataType dtype_;
  char* data_;
};

inline absl::Status CheckRowsDtype(const Tensor& values) {
  if (!RowsView::Supported(values.dtype())) {
    return absl::InvalidArgumentError(
        "npu_rec kernel: the rows variable must be float32, bfloat16 or float16; it is " +
        ::tensorflow::DataTypeString(values.dtype()));
  }
  return absl::OkStatus();
}

}  // namespace npu_rec

#endif  // NPU_REC_KERNELS_KERNEL_UTIL_H_
