// The per-step work of a tiered table's disk tier on the kernel path (see
// docs/design.md, "Tiered tables (memory + disk)", and npu_rec/table/_tier.py).
//
// The segment files and their bookkeeping stay with the Python
// `SegmentStore` (npu_rec/table/_tier_store.py: which segment is open, the
// live bits, one `pwrite` per demotion); these kernels take the work per row
// out of Python:
//
//   NpuRecTierRead     record locations -> the records' raw words, read with
//                      `pread` from the segment files' descriptors (no
//                      map: the page cache is not counted in the process's
//                      memory): sorted by file and offset, neighbours
//                      within 4 KiB coalesced into one `preadv`,
//                      and a large batch's calls split over as many threads
//                      as the intra-op pool has while they are served from
//                      the page cache (each call is CPU work then), over up
//                      to 16 threads once they wait on the disk (so reads
//                      reach it several at a time). Unverified:
//                      NpuRecTierUnpack checks every checksum.
//   NpuRecTierVictims  the table's rows -> the `k` rows to demote: live rows
//                      (count > 0) not held by this step, the lowest score
//                      `last_seen + 1 - 1 / (1 + count)` first (ties: the lower
//                      row), one O(n) scan keeping the rows under a bound
//                      taken from a sample, then nth_element; in row order.
//   NpuRecTierPack     rows of the table -> their disk records [k, words]:
//                      key, count, saved count, last-seen, period, the row's
//                      and the slots' bits as stored, zero padding, checksum
//                      (the layout of `_tier_store.record_dtype`).
//   NpuRecTierUnpack   records read back -> their rows, slots (bits as
//                      stored), counts, saved counts (as of `period`) and
//                      last-seen times; a record failing its checksum fails
//                      the op (DataLoss) naming its segment file.
//   NpuRecTierProbe    a batch's ids -> `tf.unique_with_counts` of them
//                      (unique keys in first-occurrence order, deduplicated
//                      as NpuRecTrainLookup deduplicates), the keys' rows
//                      in the table's key index (-1: none), how many have
//                      none, and those of them `cold_index` holds with their
//                      record locations (the keys `prepare` promotes), both
//                      indexes probed as NpuRecTrainLookup probes.
//
// The checksum is `_tier_store.SegmentStore._checksum`: the 64-bit wrapping
// sum of word[i] * weight[i] over all words but the last, s ^= s >> 29, plus
// 0x9E3779B97F4A7C15. Counts and last-seen times are read from the table's
// variables as int64 or int32 (the table's layout: int32 last-seen relative
// to kSeenBase) and always written to records as int64 absolute values.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/uio.h>
#include <unistd.h>

#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/threadpool.h"
#include "kernel_util.h"
#include "lookup_core.h"

namespace npu_rec {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::tstring;
using ::tensorflow::shape_inference::InferenceContext;

constexpr int64_t kHeaderWords = 5;  // key, count, saved, last_seen, period
constexpr uint64_t kCheckOffset = 0x9E3779B97F4A7C15ULL;

REGISTER_OP("NpuRecTierVictims")
    .Input("counts: resource")
    .Input("last_seen: resource")
    .Input("held_rows: int64")
    .Input("num_rows: int64")
    .Input("k: int64")
    .Input("hand: int64")
    .Output("victims: int64")
    .Output("next_hand: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_OP("NpuRecTierProbe")
    .Input("table: resource")
    .Input("reserved_rows: resource")
    .Input("cold_table: resource")
    .Input("cold_reserved_rows: resource")
    .Input("ids: int64")
    .Output("unique: int64")
    .Output("rows: int64")
    .Output("index: int64")
    .Output("counts: int64")
    .Output("misses: int64")
    .Output("cold_keys: int64")
    .Output("cold_locations: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      auto u = c->Vector(InferenceContext::kUnknownDim);
      c->set_output(0, u);
      c->set_output(1, u);
      c->set_output(2, c->Vector(c->Dim(c->input(4), 0)));
      c->set_output(3, u);
      c->set_output(4, c->Scalar());
      c->set_output(5, u);
      c->set_output(6, u);
      return absl::OkStatus();
    });

REGISTER_OP("NpuRecTierRead")
    .Input("locations: int64")
    .Input("segments: int64")
    .Input("fds: int64")
    .Input("paths: string")
    .Input("dirs: string")
    .Output("records: int64")
    .Attr("words: int >= 2")
    .Attr("per_segment: int >= 1")
    .Attr("table: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t words;
      TF_RETURN_IF_ERROR(c->GetAttr("words", &words));
      c->set_output(0, c->Matrix(c->Dim(c->input(0), 0), words));
      return absl::OkStatus();
    });

REGISTER_OP("NpuRecTierPack")
    .Input("row_keys: resource")
    .Input("values: resource")
    .Input("counts: resource")
    .Input("saved_counts: resource")
    .Input("last_seen: resource")
    .Input("slots: num_slots * resource")
    .Input("rows: int64")
    .Input("period: int64")
    .Input("weights: int64")
    .Output("records: int64")
    .Attr("num_slots: int >= 0")
    .Attr("dim: int >= 1")
    .Attr("slot_widths: list(int) >= 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Matrix(c->Dim(c->input(c->num_inputs() - 3), 0),
                                 InferenceContext::kUnknownDim));
      return absl::OkStatus();
    });

REGISTER_OP("NpuRecTierUnpack")
    .Input("records: int64")
    .Input("weights: int64")
    .Input("segment_of: int64")
    .Input("paths: string")
    .Input("period: int64")
    .Output("values: T")
    .Output("slots: S")
    .Output("counts: int64")
    .Output("saved_counts: int64")
    .Output("last_seen: int64")
    .Attr("T: {float, bfloat16, half}")
    .Attr("S: {float, bfloat16, half}")
    .Attr("dim: int >= 1")
    .Attr("slot_width: int >= 0")
    .Attr("table: string")
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim, width;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      TF_RETURN_IF_ERROR(c->GetAttr("slot_width", &width));
      auto n = c->Dim(c->input(0), 0);
      c->set_output(0, c->Matrix(n, dim));
      c->set_output(1, c->Matrix(n, width));
      for (int i = 2; i < 5; ++i) c->set_output(i, c->Vector(n));
      return absl::OkStatus();
    });

// Element i of an int64 or int32 vector variable, as int64. An int32 column
// stores its values less `narrow_offset` (`last_seen`: kSeenBase, so the
// records get absolute times; counts: 0).
class IntColumn {
 public:
  explicit IntColumn(const Tensor* t, int64_t narrow_offset = 0)
      : wide_(t->dtype() == ::tensorflow::DT_INT64), offset_(narrow_offset), data_(t->data()) {}
  static bool Supported(::tensorflow::DataType d) {
    return d == ::tensorflow::DT_INT64 || d == ::tensorflow::DT_INT32;
  }
  int64_t operator[](int64_t i) const {
    return wide_ ? static_cast<const int64_t*>(data_)[i]
                 : static_cast<const int32_t*>(data_)[i] + offset_;
  }

 private:
  bool wide_;
  int64_t offset_;
  const void* data_;
};

absl::Status CheckColumn(const Tensor& t, const char* what) {
  if (!IntColumn::Supported(t.dtype()) || t.dims() != 1) {
    return absl::InvalidArgumentError(std::string("npu_rec kernel: variable `") + what +
                                      "` must be an int64 or int32 vector; got " +
                                      ::tensorflow::DataTypeString(t.dtype()) + " " +
                                      t.shape().DebugString());
  }
  return absl::OkStatus();
}

// The record checksum of words[0, n) (the record's words but the last).
inline uint64_t Checksum(const uint64_t* words, const uint64_t* weights, int64_t n) {
  uint64_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += words[i] * weights[i];
  s ^= s >> 29;
  return s + kCheckOffset;
}

// Victim selection (`_tier.select_victims` is the NumPy reference: the same
// rows, tested equal). Small tables, or `k` a large part of the rows: the
// exact `k` lowest (score, row). Otherwise a CLOCK-like hand: a strided
// sample of the eligible rows' scores gives a bound that about
// kSpread * k rows pass, and the scan walks the rows from the hand (where
// the previous selection stopped), wrapping at `num_rows`, taking the first
// `k` rows at or under the bound; the hand moves past the last one taken.
// A step so reads about num_rows / kSpread rows, not all of them; if a whole
// turn finds fewer than `k`, the exact selection runs.
constexpr int64_t kSample = 4096;
constexpr int64_t kSpread = 16;

class TierVictimsOp : public OpKernel {
 public:
  explicit TierVictimsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<Var> counts, seen;
    OP_REQUIRES_OK(ctx, GetVar(ctx, 0, &counts));
    OP_REQUIRES_OK(ctx, GetVar(ctx, 1, &seen));
    const Tensor& held_t = ctx->input(2);
    const int64_t n = ctx->input(3).scalar<int64_t>()();
    const int64_t k_wanted = ctx->input(4).scalar<int64_t>()();
    int64_t hand = ctx->input(5).scalar<int64_t>()();
    std::vector<int64_t> picked;
    {
      VarLocks locks({counts.get(), seen.get()});
      const Tensor& c_t = *counts->tensor();
      const Tensor& s_t = *seen->tensor();
      OP_REQUIRES_OK(ctx, CheckColumn(c_t, "counts"));
      OP_REQUIRES_OK(ctx, CheckColumn(s_t, "last_seen"));
      OP_REQUIRES(ctx, n >= 0 && n <= c_t.dim_size(0) && n <= s_t.dim_size(0),
                  absl::InvalidArgumentError("npu_rec kernel: num_rows " + std::to_string(n) +
                                             " is outside the table's rows"));
      if (n > 0 && (hand < 0 || hand >= n)) hand = 0;
      std::vector<uint64_t> held((n + 63) / 64, 0);  // a bit per row
      const int64_t* h = held_t.flat<int64_t>().data();
      for (int64_t i = 0; i < held_t.NumElements(); ++i) {
        if (h[i] >= 0 && h[i] < n) held[h[i] >> 6] |= uint64_t{1} << (h[i] & 63);
      }
      const IntColumn cnt(&c_t), last(&s_t, kSeenBase);
      auto eligible = [&](int64_t r) {
        return cnt[r] > 0 && !((held[r >> 6] >> (r & 63)) & 1);
      };
      auto score = [&](int64_t r) {
        return static_cast<double>(last[r]) + 1.0 - 1.0 / (1.0 + static_cast<double>(cnt[r]));
      };
      bool exact = true;
      if (k_wanted > 0 && n > 4 * kSample && k_wanted < n / 4) {
        const int64_t stride = n / kSample;
        std::vector<double> sample;
        for (int64_t r = 0; r < n; r += stride) {
          if (eligible(r)) sample.push_back(score(r));
        }
        const int64_t j = (kSpread * k_wanted) / stride + 16;
        if (j < static_cast<int64_t>(sample.size())) {
          std::nth_element(sample.begin(), sample.begin() + j, sample.end());
          const double bound = sample[j];
          picked.reserve(k_wanted);
          int64_t r = hand;
          for (int64_t step = 0; step < n && static_cast<int64_t>(picked.size()) < k_wanted;
               ++step) {
            if (eligible(r) && score(r) <= bound) picked.push_back(r);
            if (++r == n) r = 0;
          }
          if (static_cast<int64_t>(picked.size()) == k_wanted) {
            exact = false;
            hand = picked.back() + 1 == n ? 0 : picked.back() + 1;
          }
        }
      }
      if (exact) {
        std::vector<std::pair<double, int64_t>> cand;
        for (int64_t r = 0; r < n; ++r) {
          if (eligible(r)) cand.emplace_back(score(r), r);
        }
        const int64_t k = std::max<int64_t>(0, std::min<int64_t>(k_wanted, cand.size()));
        if (k < static_cast<int64_t>(cand.size())) {
          std::nth_element(cand.begin(), cand.begin() + k, cand.end());
        }
        picked.resize(k);
        for (int64_t i = 0; i < k; ++i) picked[i] = cand[i].second;
      }
    }
    const int64_t k = picked.size();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k}), &out));
    int64_t* v = out->flat<int64_t>().data();
    std::copy(picked.begin(), picked.end(), v);
    std::sort(v, v + k);  // row order: the gathers that follow walk memory forward
    Tensor* hand_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &hand_out));
    hand_out->scalar<int64_t>()() = hand;
  }
};

// Reads of one batch of records (NpuRecTierRead). Records closer than
// kMaxGap bytes in one file are read by one `preadv` (the bytes between them
// into a scratch buffer); a batch of more than kThreadedRuns calls is split
// into contiguous ranges of calls. How they run follows the previous batch's
// reads: calls served from the page cache (under kDiskNanos each) are CPU
// work, kPartsPerThread ranges a thread of the intra-op pool (more threads
// than cores would only contend with the step's other ops); calls that
// waited on the disk get a range and a thread of their own each, up to
// kMaxThreads, so that they wait side by side.
constexpr int64_t kMaxGap = 4096;
constexpr int64_t kMaxRunRecords = 480;  // 2 iovecs a record, under IOV_MAX (1024)
constexpr int64_t kThreadedRuns = 64;
constexpr int64_t kRunsPerThread = 32;
constexpr int64_t kMaxThreads = 16;
constexpr int64_t kPartsPerThread = 8;
constexpr int64_t kDiskNanos = 20000;  // a call from the page cache takes 1-4 us

class TierReadOp : public OpKernel {
 public:
  explicit TierReadOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("words", &words_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("per_segment", &per_segment_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table", &table_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& locs_t = ctx->input(0);
    const Tensor& segs_t = ctx->input(1);
    const Tensor& fds_t = ctx->input(2);
    const Tensor& paths_t = ctx->input(3);
    const Tensor& dirs_t = ctx->input(4);
    const int64_t m = locs_t.NumElements(), ns = segs_t.NumElements();
    OP_REQUIRES(ctx, fds_t.NumElements() == ns && paths_t.NumElements() == ns,
                absl::InvalidArgumentError("npu_rec kernel: one descriptor and path per segment"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m, words_}), &out));
    if (m == 0) return;
    const int64_t rec_bytes = 8 * words_;
    char* base = reinterpret_cast<char*>(out->flat<int64_t>().data());
    const int64_t* locs = locs_t.flat<int64_t>().data();
    const int64_t* segs = segs_t.flat<int64_t>().data();
    const int64_t* fds = fds_t.flat<int64_t>().data();
    // (segment index, offset, output row), in file and offset order.
    struct Item {
      int64_t seg, offset, out;
    };
    std::vector<Item> items(m);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t seg = locs[i] >= 0 ? locs[i] / per_segment_ : -1;
      const int64_t* at = std::lower_bound(segs, segs + ns, seg);
      if (seg < 0 || at == segs + ns || *at != seg) {
        std::string name = "seg-?";
        if (seg >= 0 && dirs_t.NumElements() > 0) {
          char file[32];
          std::snprintf(file, sizeof file, "seg-%08lld.npr", static_cast<long long>(seg));
          name = std::string(dirs_t.flat<tstring>()(seg % dirs_t.NumElements())) + "/" + file;
        }
        ctx->SetStatus(absl::DataLossError("SegmentCorruptedError: Tiered table '" + table_ +
                                           "': segment file '" + name +
                                           "' is missing but holds live records."));
        return;
      }
      items[i] = {at - segs, (locs[i] - seg * per_segment_) * rec_bytes, i};
    }
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
      return a.seg != b.seg ? a.seg < b.seg : a.offset != b.offset ? a.offset < b.offset
                                                                  : a.out < b.out;
    });
    // One location asked for twice: read once, copied after.
    std::vector<std::pair<int64_t, int64_t>> copies;  // (to, from)
    std::vector<Item> uniq;
    uniq.reserve(m);
    for (const Item& it : items) {
      if (!uniq.empty() && uniq.back().seg == it.seg && uniq.back().offset == it.offset) {
        copies.emplace_back(it.out, uniq.back().out);
      } else {
        uniq.push_back(it);
      }
    }
    // Runs: [begin, end) of `uniq` read by one call.
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (int64_t i = 0; i < static_cast<int64_t>(uniq.size()); ++i) {
      if (!runs.empty()) {
        const Item& prev = uniq[i - 1];
        const auto& run = runs.back();
        if (uniq[i].seg == prev.seg && uniq[i].offset - (prev.offset + rec_bytes) <= kMaxGap &&
            i - run.first < kMaxRunRecords) {
          ++runs.back().second;
          continue;
        }
      }
      runs.emplace_back(i, i + 1);
    }
    const int64_t nruns = runs.size();
    // Page cache: ranges of calls (several a thread, so that a thread the
    // step's other ops keep busy leaves its share to the other) on the
    // intra-op threads. Disk: a range and a thread of its own each.
    const bool disk = disk_.load(std::memory_order_relaxed);
    const int64_t pool = std::max(1, ctx->device()->tensorflow_cpu_worker_threads()->num_threads);
    const int64_t width = disk ? kMaxThreads : pool;
    const int64_t nparts =
        nruns < kThreadedRuns
            ? 1
            : std::min<int64_t>(disk ? kMaxThreads : kPartsPerThread * pool, nruns / kRunsPerThread);
    const auto started = std::chrono::steady_clock::now();
    // The first failed run of each range: (run, message).
    std::vector<std::pair<int64_t, std::string>> errors(nparts, {-1, ""});
    auto work = [&](int64_t t) {
      std::vector<char> scratch(kMaxGap);
      std::vector<struct iovec> iov;
      const int64_t lo = nruns * t / nparts, hi = nruns * (t + 1) / nparts;
      for (int64_t r = lo; r < hi; ++r) {
        const auto [b, e] = runs[r];
        const int fd = static_cast<int>(fds[uniq[b].seg]);
        iov.clear();
        int64_t total = 0;
        for (int64_t i = b; i < e; ++i) {
          if (i > b) {
            const int64_t gap = uniq[i].offset - (uniq[i - 1].offset + rec_bytes);
            if (gap > 0) iov.push_back({scratch.data(), static_cast<size_t>(gap)});
            total += gap;
          }
          iov.push_back({base + uniq[i].out * rec_bytes, static_cast<size_t>(rec_bytes)});
          total += rec_bytes;
        }
        ssize_t got;
        do {  // one record: `pread` (no iovec array to copy in)
          got = e - b == 1 ? pread(fd, iov[0].iov_base, rec_bytes, uniq[b].offset)
                           : preadv(fd, iov.data(), static_cast<int>(iov.size()), uniq[b].offset);
        } while (got < 0 && errno == EINTR);
        if (got == total) continue;
        // A short or failed call: each record on its own, to the end of the file.
        for (int64_t i = b; i < e; ++i) {
          char* dst = base + uniq[i].out * rec_bytes;
          int64_t done = 0;
          while (done < rec_bytes) {
            const ssize_t n = pread(fd, dst + done, rec_bytes - done, uniq[i].offset + done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
              errors[t] = {r, n < 0 ? std::strerror(errno) : "end of file"};
              return;
            }
            done += n;
          }
        }
      }
    };
    if (nparts == 1) {
      work(0);
    } else if (!disk) {
      // CPU work: on the intra-op threads (idle ones spin, so threads of our
      // own would only take turns with them).
      ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
          nparts, 1 << 20, [&](int64_t begin, int64_t end) {
            for (int64_t t = begin; t < end; ++t) work(t);
          });
    } else {
      std::vector<std::thread> threads;
      for (int64_t t = 1; t < nparts; ++t) threads.emplace_back(work, t);
      work(0);
      for (auto& th : threads) th.join();
    }
    // The mean time of a call on one thread decides the next batch's way.
    const int64_t spent = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - started)
                              .count();
    if (nruns >= kThreadedRuns) {
      disk_.store(spent * std::min(width, nparts) / nruns > kDiskNanos,
                  std::memory_order_relaxed);
    }
    for (const auto& [run, why] : errors) {
      if (run < 0) continue;
      const std::string path(paths_t.flat<tstring>()(uniq[runs[run].first].seg));
      ctx->SetStatus(absl::DataLossError("SegmentCorruptedError: Tiered table '" + table_ +
                                         "': segment file '" + path + "' cannot be read (" +
                                         why + "). Restore the newest checkpoint."));
      return;
    }
    for (const auto& [to, from] : copies) {
      std::memcpy(base + to * rec_bytes, base + from * rec_bytes, rec_bytes);
    }
  }

 private:
  int64_t words_, per_segment_;
  std::string table_;
  std::atomic<bool> disk_{false};  // the last large batch's calls waited on the disk
};

class TierPackOp : public OpKernel {
 public:
  explicit TierPackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_widths", &widths_));
    OP_REQUIRES(ctx, static_cast<int>(widths_.size()) == num_slots_,
                absl::InvalidArgumentError("npu_rec kernel: one slot width per slot"));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<RefCountPtr<Var>> vars(5 + num_slots_);
    for (int i = 0; i < 5 + num_slots_; ++i) OP_REQUIRES_OK(ctx, GetVar(ctx, i, &vars[i]));
    const int base = 5 + num_slots_;
    const Tensor& rows_t = ctx->input(base);
    const int64_t period = ctx->input(base + 1).scalar<int64_t>()();
    const Tensor& weights_t = ctx->input(base + 2);
    const int64_t k = rows_t.NumElements();
    const int64_t* rows = rows_t.flat<int64_t>().data();
    const auto* weights = reinterpret_cast<const uint64_t*>(weights_t.flat<int64_t>().data());

    std::vector<Var*> raw;
    for (auto& v : vars) raw.push_back(v.get());
    VarLocks locks(raw);
    const Tensor& keys_t = *vars[0]->tensor();
    const Tensor& values_t = *vars[1]->tensor();
    OP_REQUIRES(ctx, keys_t.dtype() == ::tensorflow::DT_INT64,
                absl::InvalidArgumentError("npu_rec kernel: `row_keys` must be int64"));
    OP_REQUIRES_OK(ctx, CheckRowsDtype(values_t));
    OP_REQUIRES_OK(ctx, CheckRows(values_t, "values", rows, k, dim_));
    OP_REQUIRES_OK(ctx, CheckRows(keys_t, "row_keys", rows, k, 0));
    const char* names[3] = {"counts", "saved_counts", "last_seen"};
    for (int i = 0; i < 3; ++i) {
      OP_REQUIRES_OK(ctx, CheckColumn(*vars[2 + i]->tensor(), names[i]));
      OP_REQUIRES_OK(ctx, CheckRows(*vars[2 + i]->tensor(), names[i], rows, k, 0));
    }
    const int64_t row_bytes = dim_ * ::tensorflow::DataTypeSize(values_t.dtype());
    int64_t body = 8 * kHeaderWords + row_bytes;
    std::vector<int64_t> slot_bytes(num_slots_);
    for (int s = 0; s < num_slots_; ++s) {
      const Tensor& t = *vars[5 + s]->tensor();
      OP_REQUIRES_OK(ctx, CheckRows(t, "slot", rows, k, widths_[s]));
      slot_bytes[s] = widths_[s] * ::tensorflow::DataTypeSize(t.dtype());
      body += slot_bytes[s];
    }
    const int64_t words = (body + 7) / 8 + 1;
    OP_REQUIRES(ctx, weights_t.NumElements() == words - 1,
                absl::InvalidArgumentError("npu_rec kernel: " + std::to_string(words - 1) +
                                           " checksum weights expected, got " +
                                           std::to_string(weights_t.NumElements())));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k, words}), &out));
    auto* rec = reinterpret_cast<uint64_t*>(out->flat<int64_t>().data());
    const int64_t* keys = keys_t.flat<int64_t>().data();
    const char* values = static_cast<const char*>(values_t.data());
    const IntColumn cnt(vars[2]->tensor()), saved(vars[3]->tensor()),
        last(vars[4]->tensor(), kSeenBase);
    std::vector<const char*> slots(num_slots_);
    for (int s = 0; s < num_slots_; ++s) slots[s] = static_cast<const char*>(vars[5 + s]->tensor()->data());
    for (int64_t i = 0; i < k; ++i) {
      uint64_t* w = rec + i * words;
      const int64_t r = rows[i];
      const int64_t head[kHeaderWords] = {keys[r], cnt[r], saved[r], last[r], period};
      std::memcpy(w, head, sizeof head);
      char* at = reinterpret_cast<char*>(w) + 8 * kHeaderWords;
      std::memcpy(at, values + r * row_bytes, row_bytes);
      at += row_bytes;
      for (int s = 0; s < num_slots_; ++s) {
        std::memcpy(at, slots[s] + r * slot_bytes[s], slot_bytes[s]);
        at += slot_bytes[s];
      }
      std::memset(at, 0, reinterpret_cast<char*>(w + words - 1) - at);
      w[words - 1] = Checksum(w, weights, words - 1);
    }
  }

 private:
  int num_slots_;
  int64_t dim_;
  std::vector<int32_t> widths_;
};

class TierUnpackOp : public OpKernel {
 public:
  explicit TierUnpackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_width", &width_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table", &table_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &row_dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("S", &slot_dtype_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rec_t = ctx->input(0);
    const Tensor& weights_t = ctx->input(1);
    const Tensor& seg_t = ctx->input(2);
    const Tensor& paths_t = ctx->input(3);
    const int64_t period = ctx->input(4).scalar<int64_t>()();
    OP_REQUIRES(ctx, rec_t.dims() == 2,
                absl::InvalidArgumentError("npu_rec kernel: records must be [m, words]"));
    const int64_t m = rec_t.dim_size(0), words = rec_t.dim_size(1);
    const int64_t row_bytes = dim_ * ::tensorflow::DataTypeSize(row_dtype_);
    const int64_t slot_bytes = width_ * ::tensorflow::DataTypeSize(slot_dtype_);
    const int64_t body = 8 * kHeaderWords + row_bytes + slot_bytes;
    OP_REQUIRES(ctx, words == (body + 7) / 8 + 1 && weights_t.NumElements() == words - 1 &&
                         seg_t.NumElements() == m,
                absl::InvalidArgumentError("npu_rec kernel: records of " + std::to_string(words) +
                                           " words do not match the table's record layout"));
    const auto* rec = reinterpret_cast<const uint64_t*>(rec_t.flat<int64_t>().data());
    const auto* weights = reinterpret_cast<const uint64_t*>(weights_t.flat<int64_t>().data());
    const int64_t* seg = seg_t.flat<int64_t>().data();
    // Every checksum first: a corrupted batch changes nothing.
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < m; ++i) {
      const uint64_t* w = rec + i * words;
      if (Checksum(w, weights, words - 1) != w[words - 1]) {
        if (first < 0) first = i;
        ++bad;
      }
    }
    if (bad > 0) {
      const int64_t p = seg[first];
      const std::string path = p >= 0 && p < paths_t.NumElements()
                                   ? std::string(paths_t.flat<tstring>()(p))
                                   : std::string("?");
      int64_t key;
      std::memcpy(&key, rec + first * words, sizeof key);
      ctx->SetStatus(absl::DataLossError(
          "SegmentCorruptedError: Tiered table '" + table_ + "': segment file '" + path +
          "' is corrupted: " + std::to_string(bad) + " records fail their checksum (e.g. key " +
          std::to_string(key) +
          "). The table's cold rows cannot be read; restore the newest checkpoint."));
      return;
    }
    Tensor *values, *slots, *counts, *saved, *seen;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m, dim_}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({m, width_}), &slots));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({m}), &counts));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({m}), &saved));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({m}), &seen));
    char* vdst = static_cast<char*>(values->data());
    char* sdst = static_cast<char*>(slots->data());
    int64_t* c = counts->flat<int64_t>().data();
    int64_t* sv = saved->flat<int64_t>().data();
    int64_t* ls = seen->flat<int64_t>().data();
    for (int64_t i = 0; i < m; ++i) {
      const uint64_t* w = rec + i * words;
      int64_t head[kHeaderWords];
      std::memcpy(head, w, sizeof head);
      c[i] = head[1];
      // A record written in an earlier period: its count was saved since.
      sv[i] = head[4] < period ? head[1] : head[2];
      ls[i] = head[3];
      const char* at = reinterpret_cast<const char*>(w) + 8 * kHeaderWords;
      std::memcpy(vdst + i * row_bytes, at, row_bytes);
      if (slot_bytes) std::memcpy(sdst + i * slot_bytes, at + row_bytes, slot_bytes);
    }
  }

 private:
  int64_t dim_, width_;
  std::string table_;
  ::tensorflow::DataType row_dtype_, slot_dtype_;
};

void OutputVector(OpKernelContext* ctx, int index, const std::vector<int64_t>& v) {
  Tensor* out = nullptr;
  const int64_t u = static_cast<int64_t>(v.size());
  OP_REQUIRES_OK(ctx, ctx->allocate_output(index, TensorShape({u}), &out));
  if (u > 0) std::memcpy(out->flat<int64_t>().data(), v.data(), sizeof(int64_t) * u);
}

class TierProbeOp : public OpKernel {
 public:
  explicit TierProbeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids_t = ctx->input(4);
    const int64_t n = ids_t.NumElements();
    Tensor* index = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &index));
    // The batch deduplicated as NpuRecTrainLookup does it (keys mixed as KeyIndex mixes them).
    Unique uniq;
    Deduplicate(ids_t.flat<int64_t>().data(), n, nullptr, nullptr, index->flat<int64_t>().data(),
                &uniq);
    const std::vector<int64_t>& keys = uniq.keys;
    const int64_t u = static_cast<int64_t>(keys.size());
    std::vector<int64_t> rows(u, -1);
    OP_REQUIRES_OK(ctx, ProbeKeyIndex(ctx, uniq.mixed, rows.data(), 0, 1));
    // The keys without a memory row, then those of them the cold index holds.
    std::vector<int64_t> miss_mixed, locs;
    for (int64_t i = 0; i < u; ++i) {
      if (rows[i] < 0) miss_mixed.push_back(uniq.mixed[i]);
    }
    const int64_t m = static_cast<int64_t>(miss_mixed.size());
    locs.assign(m, -1);
    OP_REQUIRES_OK(ctx, ProbeKeyIndex(ctx, miss_mixed, locs.data(), 2, 3));
    std::vector<int64_t> cold_keys, cold_locs;
    for (int64_t i = 0, j = 0; i < u; ++i) {
      if (rows[i] >= 0) continue;
      if (locs[j] >= 0) {
        cold_keys.push_back(keys[i]);
        cold_locs.push_back(locs[j]);
      }
      ++j;
    }
    OutputVector(ctx, 0, keys);
    OutputVector(ctx, 1, rows);
    OutputVector(ctx, 3, uniq.sightings);
    Tensor* misses = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({}), &misses));
    misses->scalar<int64_t>()() = m;
    OutputVector(ctx, 5, cold_keys);
    OutputVector(ctx, 6, cold_locs);
  }
};

REGISTER_KERNEL_BUILDER(Name("NpuRecTierProbe").Device(DEVICE_CPU), TierProbeOp);
REGISTER_KERNEL_BUILDER(Name("NpuRecTierVictims").Device(DEVICE_CPU), TierVictimsOp);
REGISTER_KERNEL_BUILDER(Name("NpuRecTierRead").Device(DEVICE_CPU), TierReadOp);
REGISTER_KERNEL_BUILDER(Name("NpuRecTierPack").Device(DEVICE_CPU), TierPackOp);
REGISTER_KERNEL_BUILDER(Name("NpuRecTierUnpack").Device(DEVICE_CPU), TierUnpackOp);

}  // namespace
}  // namespace npu_rec
