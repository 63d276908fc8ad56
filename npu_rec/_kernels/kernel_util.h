// Helpers shared by npu_rec's table kernels (table_ops.cc, lookup_op.cc).
#ifndef NPU_REC_KERNELS_KERNEL_UTIL_H_
#define NPU_REC_KERNELS_KERNEL_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

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

// Zeroes `n` bytes at `p` without making the pages resident: the whole pages
// inside the range are given back with madvise(MADV_DONTNEED), which on private
// anonymous memory (what malloc hands out) makes them read as zeros and take no
// memory until written; the partial pages at the ends, small ranges and a
// failed madvise are zeroed with memset. So a table's spare rows (past the
// high-water mark, or a grown variable's new half) cost no RSS until a row
// is handed out, and still read as zeros, whatever the allocator recycled.
inline void ZeroLazily(void* p, size_t n) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* begin = static_cast<char*>(p);
  char* end = begin + n;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t hi = reinterpret_cast<uintptr_t>(end) / page * page;
  if (n < (size_t{64} << 10) || hi <= lo ||
      madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) != 0) {
    std::memset(begin, 0, n);
    return;
  }
  std::memset(begin, 0, reinterpret_cast<char*>(lo) - begin);
  std::memset(reinterpret_cast<char*>(hi), 0, end - reinterpret_cast<char*>(hi));
}

// Copies `n` bytes of `src` into `dst`, which `ZeroLazily` has just zeroed,
// skipping the 4 KiB blocks of `src` that are all zeros (`dst` already reads
// zeros there): the copy keeps the source's untouched spare rows unresident.
inline void CopyIntoZeroed(void* dst, const void* src, size_t n) {
  constexpr size_t kBlock = 4096;
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  for (size_t off = 0; off < n; off += kBlock) {
    const size_t len = std::min(kBlock, n - off);
    const char* b = s + off;
    size_t i = 0;
    // Word-wise test; memcpy reads the words without alignment assumptions.
    for (; i + 8 <= len; i += 8) {
      uint64_t w;
      std::memcpy(&w, b + i, 8);
      if (w != 0) break;
    }
    if (i + 8 <= len) {
      std::memcpy(d + off, b, len);
      continue;
    }
    for (; i < len; ++i) {
      if (b[i] != 0) {
        std::memcpy(d + off, b, len);
        break;
      }
    }
  }
}

// A copy of `t` (`rows` rows, zeros appended when more than `t` has), allocated
// by `TableAllocator` (so the buffer it replaces, once freed, returns to the
// system). Zero rows and zero blocks of `t` are not made resident.
inline absl::Status GrownCopy(const Tensor& t, int64_t rows, Tensor* out) {
  ::tensorflow::TensorShape shape = t.shape();
  shape.set_dim(0, rows);
  TF_RETURN_IF_ERROR(AllocateTable(t.dtype(), shape, out));
  if (out->TotalBytes() == 0) return absl::OkStatus();
  ZeroLazily(out->data(), out->TotalBytes());
  CopyIntoZeroed(out->data(), t.data(), std::min(t.TotalBytes(), out->TotalBytes()));
  return absl::OkStatus();
}

// Under the variable's exclusive lock: make its buffer safe to write in place.
inline absl::Status PrepareWrite(OpKernelContext* ctx, Var* var) {
  Tensor* t = var->tensor();
  if (!t->RefCountIsOne()) {
    Tensor copy;
    if (t->dims() > 0) {
      TF_RETURN_IF_ERROR(GrownCopy(*t, t->dim_size(0), &copy));
    } else {
      TF_RETURN_IF_ERROR(AllocateTable(t->dtype(), t->shape(), &copy));
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

// Per-row metadata (npu_rec/table/_storage.py): `counts` and `saved_counts`
// int32, saturating at kCountMax; `last_seen` int32 seconds relative to
// kSeenBase (absolute times clamped to [0, kSeenMax]), INT32_MAX (FREE_ROW)
// on rows freed by eviction.
constexpr int64_t kCountMax = 2147483647;
constexpr int64_t kSeenBase = int64_t{1} << 31;
constexpr int64_t kSeenMax = (int64_t{1} << 32) - 2;

inline int32_t SaturatedCount(int32_t count, int64_t add) {
  const int64_t sum = static_cast<int64_t>(count) + add;
  return static_cast<int32_t>(sum > kCountMax ? kCountMax : sum);
}

inline int32_t EncodeSeen(int64_t t) {
  return static_cast<int32_t>(std::min(std::max<int64_t>(t, 0), kSeenMax) - kSeenBase);
}

// An error naming `what` unless `var` holds int32 metadata.
inline absl::Status CheckMeta(const Tensor& var, const char* what) {
  if (var.dtype() != ::tensorflow::DT_INT32) {
    return absl::InvalidArgumentError(std::string("npu_rec kernel: variable `") + what +
                                      "` must be int32 (the per-row metadata layout), got " +
                                      ::tensorflow::DataTypeString(var.dtype()));
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

// The top `bits` bits of element e's 32 random bits (step 1 of
// npu_rec/table/_rounding.py): noise[e] = splitmix64(row_hash + e) >> (64 - bits),
// for e in [0, n). One tight loop without branches per row.
inline void RoundingNoise(uint64_t row_hash, int64_t n, int bits, uint32_t* noise) {
  const int shift = 64 - bits;
  for (int64_t e = 0; e < n; ++e) {
    noise[e] = static_cast<uint32_t>(SplitMix64(row_hash + static_cast<uint64_t>(e)) >> shift);
  }
}

// The float32 bit pattern `b` with `noise` added below the `drop` mantissa bits
// the storage dtype drops, which are then cleared; Inf and NaN kept: step 3 of
// npu_rec/table/_rounding.py. (The sum never passes 32 bits: b <= 0xFF800000
// for every finite value, noise < 2**drop.)
inline uint32_t StochasticBits(uint32_t b, uint32_t noise, int drop) {
  const uint32_t rounded = (b + noise) & ~((1u << drop) - 1u);
  return (b & 0x7F800000u) == 0x7F800000u ? b : rounded;
}

// bfloat16 bits of the float32 bit pattern `b` whose low 16 bits are zero or
// which is Inf or NaN: what Eigen's round-to-nearest-even conversion gives for
// such values (exact, and a NaN becomes the quiet NaN 0x7FC0 of its sign).
inline uint16_t BFloat16OfClearedBits(uint32_t b) {
  const bool nan = (b & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(nan ? ((b >> 16) & 0x8000u) | 0x7FC0u : b >> 16);
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
      case ::tensorflow::DT_BFLOAT16: {  // exact: the bits shifted up
        const auto* src = reinterpret_cast<const uint16_t*>(data_) + off;
        for (int64_t d = 0; d < n; ++d) {
          const uint32_t b = static_cast<uint32_t>(src[d]) << 16;
          std::memcpy(dst + d, &b, sizeof b);
        }
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

  // Elements off..off+n = src rounded stochastically (float rows: exact); `noise` is
  // scratch space of n elements.
  void WriteRounded(int64_t off, int64_t n, const float* src, uint64_t row_hash,
                    uint32_t* noise) {
    switch (dtype_) {
      case ::tensorflow::DT_BFLOAT16: {
        RoundingNoise(row_hash, n, 16, noise);
        auto* dst = reinterpret_cast<uint16_t*>(data_) + off;
        for (int64_t d = 0; d < n; ++d) {
          uint32_t b;
          std::memcpy(&b, src + d, sizeof b);
          dst[d] = BFloat16OfClearedBits(StochasticBits(b, noise[d], 16));
        }
        return;
      }
      case ::tensorflow::DT_HALF: {
        RoundingNoise(row_hash, n, 13, noise);
        auto* dst = reinterpret_cast<Eigen::half*>(data_) + off;
        for (int64_t d = 0; d < n; ++d) {
          uint32_t b;
          std::memcpy(&b, src + d, sizeof b);
          b = StochasticBits(b, noise[d], 13);
          float x;
          std::memcpy(&x, &b, sizeof x);
          dst[d] = static_cast<Eigen::half>(x);
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
