// The compressed allreduce's codecs, fused (TensorFlow, CPU): what compression.py's Sparse and
// TwoBit do for one bucket in a dozen passes over memory, done in one pass to encode and one to
// decode. Built with fused_kernels.cc into toolkit/optimizers/fused_kernels.so by
// scripts/setup.sh; used by compression.py.
//
// A bucket is the concatenation of N gradients (never materialised: the kernels walk the parts).
// Per entry, in the order the plain TensorFlow path computes it (the tests check bit for bit):
//
//   u = m * v + g;  v = u             with momentum correction (V = N velocities), else u = g
//   f = u + r                         with error feedback (R = N residuals), else f = u
//   sent = the wire's value of f      where f is selected, else 0
//   r = f - sent;  v = 0 where sent   (the residual; masking clears the sent velocity)
//
// SparseEncode selects |f| >= threshold, or with `stride` > 0 (DGC's sampled top-k)
// |f| >= the k-th largest |f| of every stride-th entry; it writes (value, index) pairs in
// index order, values as float32 or float16 (finite values clipped to its range, as
// compression.Float16 casts). TwoBitEncode sends +t where f >= t and -t where f <= -t, as
// 2-bit codes in MXNet's layout (16 to a 32-bit word, byte j holding entries 4j..4j+3 from
// the high bits; 11 is +t, 10 is -t), zero-padded to a multiple of 16.
//
// The decoders take every worker's payload, concatenated in rank order, and write the mean
// straight into N outputs of the gradients' shapes: a sum in payload order (as
// unsorted_segment_sum and reduce_sum add), then a division by the number of workers.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace tensorflow {
namespace {

using CPUDevice = Eigen::ThreadPoolDevice;
constexpr Eigen::Index kChunk = 1 << 16;  // entries a thread takes at a time (multiple of 16)
constexpr Eigen::Index kBlock = 1 << 10;  // entries an encoder's rule sees at a time

absl::Status OutputsOfShapes(shape_inference::InferenceContext* c) {
  std::vector<PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
  for (size_t i = 0; i < shapes.size(); ++i) {
    shape_inference::ShapeHandle shape;
    TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &shape));
    c->set_output(static_cast<int>(i), shape);
  }
  return absl::OkStatus();
}

#define ENCODER_INPUTS                     \
  Input("grads: N * float")                \
      .Input("velocities: V * resource")   \
      .Input("residuals: R * resource")    \
      .Input("momentum: float")            \
      .Input("threshold: float")           \
      .Attr("N: int >= 1")                 \
      .Attr("V: int >= 0")                 \
      .Attr("R: int >= 0")                 \
      .Attr("masking: bool = false")

REGISTER_OP("SparseEncode")
    .ENCODER_INPUTS.Input("k: int32")
    .Output("values: value_dtype")
    .Output("indices: index_dtype")
    .Attr("stride: int >= 0 = 0")
    .Attr("value_dtype: {float, half} = DT_FLOAT")
    .Attr("index_dtype: {int32, int64} = DT_INT32")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

REGISTER_OP("TwoBitEncode")
    .ENCODER_INPUTS.Output("words: int32")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      std::vector<shape_inference::ShapeHandle> grads;
      TF_RETURN_IF_ERROR(c->input("grads", &grads));
      int64_t entries = 0;
      for (auto shape : grads) {
        const int64_t n = c->Value(c->NumElements(shape));
        if (n < 0) {
          c->set_output(0, c->Vector(c->UnknownDim()));
          return absl::OkStatus();
        }
        entries += n;
      }
      c->set_output(0, c->Vector((entries + 15) / 16));
      return absl::OkStatus();
    });

REGISTER_OP("SparseDecodeMean")
    .Input("values: value_dtype")
    .Input("indices: index_dtype")
    .Input("workers: int32")
    .Output("means: N * float")
    .Attr("N: int >= 1")
    .Attr("shapes: list(shape)")
    .Attr("value_dtype: {float, half} = DT_FLOAT")
    .Attr("index_dtype: {int32, int64} = DT_INT32")
    .SetShapeFn(OutputsOfShapes);

REGISTER_OP("TwoBitDecodeMean")
    .Input("words: int32")
    .Input("threshold: float")
    .Input("workers: int32")
    .Output("means: N * float")
    .Attr("N: int >= 1")
    .Attr("shapes: list(shape)")
    .SetShapeFn(OutputsOfShapes);

// One part of a bucket: a gradient and, where kept, its velocity and residual.
struct Part {
  const float* g;
  float* v;  // nullptr without momentum correction
  float* r;  // nullptr without error feedback
  Eigen::Index size;
};

// Entries [i, i + count) of a bucket, all in one part, as an encoder's rule sees them: their f,
// with the state already set for "nothing sent" (v = u, r = f). The rule corrects the entries it
// sends: r = f - sent, and v = 0 under masking.
struct Stretch {
  Eigen::Index i, count;
  const float* f;
  float* v;  // the velocities to clear (nullptr without masking)
  float* r;  // the residuals (nullptr without error feedback)
};

// The bucket an encoder walks (its state locked by the caller): its parts, and the rule at the
// top of this file.
class Bucket {
 public:
  // The inputs of the state variables, to lock (in order) before a Bucket is made.
  static std::vector<int> StateInputs(OpKernelContext* ctx) {
    int v_start, v_stop, r_start, r_stop;
    std::vector<int> inputs;
    if (ctx->op_kernel().InputRange("velocities", &v_start, &v_stop).ok() &&
        ctx->op_kernel().InputRange("residuals", &r_start, &r_stop).ok()) {
      for (int i = v_start; i < r_stop; ++i) inputs.push_back(i);
    }
    return inputs;
  }

  Bucket(OpKernelContext* ctx, bool masking) : masking_(masking) {
    OpInputList grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    int v_start, v_stop, r_start, r_stop;
    OP_REQUIRES_OK(ctx, ctx->op_kernel().InputRange("velocities", &v_start, &v_stop));
    OP_REQUIRES_OK(ctx, ctx->op_kernel().InputRange("residuals", &r_start, &r_stop));
    const int n = grads.size(), velocities = v_stop - v_start, residuals = r_stop - r_start;
    OP_REQUIRES(ctx, (velocities == 0 || velocities == n) && (residuals == 0 || residuals == n),
                errors::InvalidArgument("velocities and residuals: none, or one a gradient"));
    tensors_.resize(r_stop - v_start);
    for (int i = 0; i < n; ++i) {
      Part part{grads[i].flat<float>().data(), nullptr, nullptr, grads[i].NumElements()};
      if (velocities) OP_REQUIRES_OK(ctx, State(ctx, v_start + i, v_start, grads[i], &part.v));
      if (residuals) OP_REQUIRES_OK(ctx, State(ctx, r_start + i, v_start, grads[i], &part.r));
      offsets_.push_back(size_);
      size_ += part.size;
      parts_.push_back(part);
    }
    momentum_ = ctx->input(r_stop).scalar<float>()();
  }

  Eigen::Index size() const { return size_; }

  // f at entry i (0-based over the bucket), reading the state only.
  float Peek(Eigen::Index i) const {
    const auto p = PartOf(i);
    const Part& part = parts_[p];
    const Eigen::Index j = i - offsets_[p];
    const float u = part.v ? momentum_ * part.v[j] + part.g[j] : part.g[j];
    return part.r ? u + part.r[j] : u;
  }

  // Calls rule(stretch) over entries [begin, end), in order, in stretches of at most kBlock.
  template <typename Rule>
  void Walk(Eigen::Index begin, Eigen::Index end, Rule rule) const {
    float f[kBlock];
    for (Eigen::Index p = PartOf(begin), i = begin; i < end; ++p) {
      const Part& part = parts_[p];
      for (Eigen::Index j = i - offsets_[p]; j < part.size && i < end;) {
        const Eigen::Index count = std::min({kBlock, part.size - j, end - i});
        if (part.v && part.r) {
          Accumulate<true, true>(part, j, count, f);
        } else if (part.r) {
          Accumulate<false, true>(part, j, count, f);
        } else if (part.v) {
          Accumulate<true, false>(part, j, count, f);
        } else {
          Accumulate<false, false>(part, j, count, f);
        }
        rule(Stretch{i, count, f, masking_ && part.v ? part.v + j : nullptr,
                     part.r ? part.r + j : nullptr});
        i += count;
        j += count;
      }
    }
  }

 private:
  // f of `count` entries of `part` from its entry j, the state set for "nothing sent".
  template <bool kMomentum, bool kResidual>
  void Accumulate(const Part& part, Eigen::Index j, Eigen::Index count, float* f) const {
    const float* g = part.g + j;
    float* v = part.v + j;
    float* r = part.r + j;
    for (Eigen::Index k = 0; k < count; ++k) {
      float u = g[k];
      if constexpr (kMomentum) {
        u = momentum_ * v[k] + g[k];
        v[k] = u;
      }
      if constexpr (kResidual) {
        u = u + r[k];
        r[k] = u;
      }
      f[k] = u;
    }
  }

  Eigen::Index PartOf(Eigen::Index i) const {
    return std::upper_bound(offsets_.begin(), offsets_.end(), i) - offsets_.begin() - 1;
  }

  absl::Status State(OpKernelContext* ctx, int input, int first, const Tensor& grad,
                     float** data) {
    Tensor& tensor = tensors_[input - first];
    TF_RETURN_IF_ERROR(
        GetInputTensorFromVariable<CPUDevice, float>(ctx, input, true, false, &tensor));
    if (!tensor.IsInitialized() || tensor.dtype() != DT_FLOAT) {
      return errors::FailedPrecondition("a float32 state variable is needed");
    }
    if (!tensor.shape().IsSameSize(grad.shape())) {
      return errors::InvalidArgument("state ", tensor.shape().DebugString(),
                                     " does not match gradient ", grad.shape().DebugString());
    }
    *data = tensor.flat<float>().data();
    return absl::OkStatus();
  }

  bool masking_;
  float momentum_ = 0;
  Eigen::Index size_ = 0;
  std::vector<Part> parts_;
  std::vector<Eigen::Index> offsets_;
  std::vector<Tensor> tensors_;
};

// Runs work(chunk, begin, end) over [0, n) in chunks of kChunk entries, on the op's threads.
template <typename Work>
void InChunks(OpKernelContext* ctx, Eigen::Index n, double bytes_per_entry, Work work) {
  const Eigen::Index chunks = (n + kChunk - 1) / kChunk;
  const Eigen::TensorOpCost cost(bytes_per_entry * kChunk, bytes_per_entry * kChunk, 4 * kChunk);
  ctx->eigen_cpu_device().parallelFor(chunks, cost, [&](Eigen::Index first, Eigen::Index last) {
    for (Eigen::Index c = first; c < last; ++c) work(c, c * kChunk, std::min(n, (c + 1) * kChunk));
  });
}

template <typename Value, typename Index>
class SparseEncodeOp : public OpKernel {
 public:
  explicit SparseEncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("masking", &masking_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stride", &stride_));
  }

  void Compute(OpKernelContext* ctx) override {
    auto locks = MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(
        ctx, true, false, Bucket::StateInputs(ctx));
    Bucket bucket(ctx, masking_);
    if (!ctx->status().ok()) return;
    const Eigen::Index n = bucket.size();
    float bar = ctx->input(ctx->num_inputs() - 2).scalar<float>()();  // the threshold
    if (stride_ > 0) {  // the k-th largest magnitude of the sample, as top_k(...).values[-1]
      std::vector<float> sample;
      for (Eigen::Index i = 0; i < n; i += stride_) sample.push_back(std::abs(bucket.Peek(i)));
      const int64_t k = ctx->input(ctx->num_inputs() - 1).scalar<int32_t>()();
      OP_REQUIRES(ctx, 1 <= k && k <= static_cast<int64_t>(sample.size()),
                  errors::InvalidArgument("k must be in [1, ", sample.size(), "], got ", k));
      std::nth_element(sample.begin(), sample.begin() + (k - 1), sample.end(),
                       std::greater<float>());
      bar = sample[k - 1];
    }
    const Eigen::Index chunks = (n + kChunk - 1) / kChunk;
    std::vector<std::vector<Index>> indices(chunks);
    std::vector<std::vector<Value>> values(chunks);
    InChunks(ctx, n, 12, [&](Eigen::Index c, Eigen::Index begin, Eigen::Index end) {
      bucket.Walk(begin, end, [&](const Stretch& s) {
        for (Eigen::Index k = 0; k < s.count; ++k) {
          if (!(std::abs(s.f[k]) >= bar)) continue;
          const Value wire = ToWire(s.f[k]);
          indices[c].push_back(static_cast<Index>(s.i + k));
          values[c].push_back(wire);
          if (s.r) s.r[k] = s.f[k] - static_cast<float>(wire);
          if (s.v) s.v[k] = 0;
        }
      });
    });
    Eigen::Index total = 0;
    for (const auto& chunk : indices) total += chunk.size();
    Tensor *values_out, *indices_out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &values_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({total}), &indices_out));
    Value* value = values_out->flat<Value>().data();
    Index* index = indices_out->flat<Index>().data();
    for (Eigen::Index c = 0; c < chunks; ++c) {
      value = std::copy(values[c].begin(), values[c].end(), value);
      index = std::copy(indices[c].begin(), indices[c].end(), index);
    }
  }

 private:
  static Value ToWire(float f) {  // compression.Float16's clip and cast, for float16 values
    if constexpr (std::is_same_v<Value, Eigen::half>) {
      constexpr float kLargest = 65504.0f;
      return static_cast<Eigen::half>(std::isfinite(f) ? std::min(std::max(f, -kLargest), kLargest)
                                                        : f);
    } else {
      return f;
    }
  }

  bool masking_;
  int stride_;
};

// Where entry e (0..15) of a word's 16 puts its two bits: byte e / 4, the first of its four
// in the high bits (the word read as little-endian, as TwoBit.pack's bitcast reads it).
inline int BitOf(Eigen::Index e) { return 8 * (e / 4) + 6 - 2 * (e % 4); }

class TwoBitEncodeOp : public OpKernel {
 public:
  explicit TwoBitEncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("masking", &masking_));
  }

  void Compute(OpKernelContext* ctx) override {
    auto locks = MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(
        ctx, true, false, Bucket::StateInputs(ctx));
    Bucket bucket(ctx, masking_);
    if (!ctx->status().ok()) return;
    const Eigen::Index n = bucket.size();
    const float t = ctx->input(ctx->num_inputs() - 1).scalar<float>()();
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({(n + 15) / 16}), &out));
    uint32_t* words = reinterpret_cast<uint32_t*>(out->flat<int32_t>().data());
    std::fill_n(words, out->NumElements(), 0);
    InChunks(ctx, n, 12, [&](Eigen::Index, Eigen::Index begin, Eigen::Index end) {
      bucket.Walk(begin, end, [&](const Stretch& s) {
        uint32_t codes[kBlock];
        for (Eigen::Index k = 0; k < s.count; ++k) {  // without branches: the signs are random
          const float f = s.f[k];
          const bool up = f >= t, down = f <= -t;
          codes[k] = 3 * up | 2 * down;
          if (s.r) s.r[k] = f - (t * up - t * down);  // f - t, f + t or f - 0: exact
          if (s.v) s.v[k] = up || down ? 0.0f : s.v[k];
        }
        for (Eigen::Index k = 0, i = s.i; k < s.count;) {  // a word, or the part of one here
          const Eigen::Index first = i % 16, last = std::min<Eigen::Index>(16, first + s.count - k);
          uint32_t packed = 0;
          if (first == 0 && last == 16) {
            for (int e = 0; e < 16; ++e) packed |= codes[k + e] << BitOf(e);
          } else {
            for (Eigen::Index e = first; e < last; ++e) packed |= codes[k + e - first] << BitOf(e);
          }
          words[i / 16] |= packed;
          k += last - first;
          i += last - first;
        }
      });
    });
  }

 private:
  bool masking_;
};

// The decoders' outputs: N tensors of the attr's shapes, read as one bucket.
class Means {
 public:
  explicit Means(OpKernelContext* ctx) {
    OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("means", &outputs));
    std::vector<TensorShape> shapes;
    OP_REQUIRES_OK(ctx, GetNodeAttr(ctx->op_kernel().def(), "shapes", &shapes));
    OP_REQUIRES(ctx, static_cast<int>(shapes.size()) == outputs.size(),
                errors::InvalidArgument("N is ", outputs.size(), ", shapes has ", shapes.size()));
    for (int i = 0; i < outputs.size(); ++i) {
      Tensor* out;
      OP_REQUIRES_OK(ctx, outputs.allocate(i, shapes[i], &out));
      data_.push_back(out->flat<float>().data());
      offsets_.push_back(size_);
      size_ += out->NumElements();
    }
    offsets_.push_back(size_);
    workers_ = ctx->input(ctx->num_inputs() - 1).scalar<int32_t>()();
    OP_REQUIRES(ctx, workers_ >= 1, errors::InvalidArgument("workers must be >= 1"));
  }

  Eigen::Index size() const { return size_; }
  float workers() const { return static_cast<float>(workers_); }

  float& operator[](Eigen::Index i) {
    const auto p = std::upper_bound(offsets_.begin(), offsets_.end(), i) - offsets_.begin() - 1;
    return data_[p][i - offsets_[p]];
  }

  // Calls fill(i, out, count): entries [i, i + count) are at out, for [begin, end) in order.
  template <typename Fill>
  void Walk(Eigen::Index begin, Eigen::Index end, Fill fill) {
    auto p = std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin() - 1;
    for (Eigen::Index i = begin; i < end; ++p) {
      const Eigen::Index count = std::min(end, offsets_[p + 1]) - i;
      if (count > 0) fill(i, data_[p] + (i - offsets_[p]), count);
      i += std::max<Eigen::Index>(count, 0);
    }
  }

 private:
  std::vector<float*> data_;
  std::vector<Eigen::Index> offsets_;
  Eigen::Index size_ = 0;
  int workers_ = 1;
};

template <typename Value, typename Index>
class SparseDecodeMeanOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  // Each output chunk is zeroed, summed into and divided while it is in cache. A payload's
  // indices rise (each worker's selection is in index order), so the entries a chunk takes are
  // found by binary search in each rising run, and each index still takes its values in payload
  // order. A payload of many runs (an exact top-k's) is summed as one chunk, in order.
  void Compute(OpKernelContext* ctx) override {
    Means means(ctx);
    if (!ctx->status().ok()) return;
    const Tensor& values = ctx->input(0);
    const Tensor& indices = ctx->input(1);
    OP_REQUIRES(ctx, values.NumElements() == indices.NumElements(),
                errors::InvalidArgument("values and indices differ in length"));
    const Eigen::Index n = means.size(), m = values.NumElements();
    const Value* value = values.flat<Value>().data();
    const Index* index = indices.flat<Index>().data();
    std::vector<Eigen::Index> runs = {0};
    for (Eigen::Index j = 0; j < m; ++j) {
      OP_REQUIRES(ctx, 0 <= index[j] && index[j] < n,
                  errors::InvalidArgument("index ", index[j], " is outside [0, ", n, ")"));
      if (j > 0 && index[j] <= index[j - 1]) runs.push_back(j);
    }
    runs.push_back(m);
    using Ranges = std::vector<std::pair<Eigen::Index, Eigen::Index>>;  // entries [first, last)
    // Adds the entries of `ranges` in order into place(index), then divides each sum once;
    // their indices lie in [low, low + count).
    auto add_then_divide = [&](const Ranges& ranges, auto place, Eigen::Index low,
                               Eigen::Index count) {
      for (auto [first, last] : ranges) {
        for (Eigen::Index j = first; j < last; ++j) place(index[j]) += static_cast<float>(value[j]);
      }
      std::vector<bool> divided(count);
      for (auto [first, last] : ranges) {
        for (Eigen::Index j = first; j < last; ++j) {
          if (divided[index[j] - low]) continue;
          place(index[j]) /= means.workers();
          divided[index[j] - low] = true;
        }
      }
    };
    auto zero = [](Eigen::Index, float* out, Eigen::Index count) { std::fill_n(out, count, 0.0f); };
    if (runs.size() > 65) {  // not in rising runs: one pass in payload order
      means.Walk(0, n, zero);
      add_then_divide({{0, m}}, [&](Eigen::Index i) -> float& { return means[i]; }, 0, n);
      return;
    }
    InChunks(ctx, n, 4, [&](Eigen::Index, Eigen::Index begin, Eigen::Index end) {
      means.Walk(begin, end, [&](Eigen::Index at, float* out, Eigen::Index count) {
        zero(at, out, count);
        Ranges here;  // each run's entries that land here
        for (size_t r = 0; r + 1 < runs.size(); ++r) {
          const Index* low = std::lower_bound(index + runs[r], index + runs[r + 1], at);
          const Index* high = std::lower_bound(low, index + runs[r + 1], at + count);
          here.emplace_back(low - index, high - index);
        }
        add_then_divide(here, [&](Eigen::Index i) -> float& { return out[i - at]; }, at, count);
      });
    });
  }
};

class TwoBitDecodeMeanOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  // For up to 4 payloads, every combination of their codes is looked up in a table of means,
  // each computed as the sum below would compute it.
  void Compute(OpKernelContext* ctx) override {
    Means means(ctx);
    if (!ctx->status().ok()) return;
    const Eigen::Index n = means.size(), words_each = (n + 15) / 16;
    const Tensor& words = ctx->input(0);
    OP_REQUIRES(ctx, words.NumElements() % words_each == 0,
                errors::InvalidArgument(words.NumElements(), " words are not whole payloads of ",
                                        words_each));
    const Eigen::Index payloads = words.NumElements() / words_each;
    const uint32_t* word = reinterpret_cast<const uint32_t*>(words.flat<int32_t>().data());
    const float t = ctx->input(1).scalar<float>()();
    const float workers = means.workers();
    auto mean_of = [&](auto code_of) {  // code_of(w): payload w's code
      float sum = 0;
      for (Eigen::Index w = 0; w < payloads; ++w) {
        const uint32_t code = code_of(w);
        sum += code == 3 ? t : code == 2 ? -t : 0.0f;
      }
      return sum / workers;
    };
    std::vector<float> table;
    if (payloads <= 4) {
      table.resize(Eigen::Index{1} << (2 * payloads));
      for (size_t key = 0; key < table.size(); ++key) {
        table[key] = mean_of([&](Eigen::Index w) { return (key >> (2 * w)) & 3; });
      }
    }
    auto decode = [&](auto tabled) {  // tabled: the payload count, or 0 (summed per entry)
      constexpr int kPayloads = decltype(tabled)::value;
      InChunks(ctx, n, 4 + payloads / 4.0, [&](Eigen::Index, Eigen::Index begin, Eigen::Index end) {
        means.Walk(begin, end, [&](Eigen::Index i, float* out, Eigen::Index count) {
          auto mean_at = [&](const uint32_t* at, int e) {  // entry e of the words at `at`
            if constexpr (kPayloads == 0) {
              return mean_of([&](Eigen::Index w) { return (at[w * words_each] >> BitOf(e)) & 3; });
            } else {
              uint32_t key = 0;
              for (int w = 0; w < kPayloads; ++w) {
                key |= ((at[w * words_each] >> BitOf(e)) & 3) << (2 * w);
              }
              return table[key];
            }
          };
          for (Eigen::Index k = 0; k < count;) {  // a word of each payload at a time
            const uint32_t* at = word + i / 16;
            const Eigen::Index first = i % 16, last = std::min<Eigen::Index>(16, first + count - k);
            if (first == 0 && last == 16) {
              for (int e = 0; e < 16; ++e) out[k + e] = mean_at(at, e);
            } else {
              for (Eigen::Index e = first; e < last; ++e) out[k + e - first] = mean_at(at, e);
            }
            k += last - first;
            i += last - first;
          }
        });
      });
    };
    switch (payloads) {
      case 1: return decode(std::integral_constant<int, 1>{});
      case 2: return decode(std::integral_constant<int, 2>{});
      case 3: return decode(std::integral_constant<int, 3>{});
      case 4: return decode(std::integral_constant<int, 4>{});
      default: return decode(std::integral_constant<int, 0>{});
    }
  }
};

#define REGISTER_SPARSE(VALUE, INDEX)                                \
  REGISTER_KERNEL_BUILDER(Name("SparseEncode")                       \
                              .Device(DEVICE_CPU)                    \
                              .TypeConstraint<VALUE>("value_dtype")  \
                              .TypeConstraint<INDEX>("index_dtype"), \
                          SparseEncodeOp<VALUE, INDEX>);             \
  REGISTER_KERNEL_BUILDER(Name("SparseDecodeMean")                   \
                              .Device(DEVICE_CPU)                    \
                              .TypeConstraint<VALUE>("value_dtype")  \
                              .TypeConstraint<INDEX>("index_dtype"), \
                          SparseDecodeMeanOp<VALUE, INDEX>);
REGISTER_SPARSE(float, int32_t);
REGISTER_SPARSE(float, int64_t);
REGISTER_SPARSE(Eigen::half, int32_t);
REGISTER_SPARSE(Eigen::half, int64_t);
REGISTER_KERNEL_BUILDER(Name("TwoBitEncode").Device(DEVICE_CPU), TwoBitEncodeOp);
REGISTER_KERNEL_BUILDER(Name("TwoBitDecodeMean").Device(DEVICE_CPU), TwoBitDecodeMeanOp);

}  // namespace
}  // namespace tensorflow
