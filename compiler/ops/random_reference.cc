// Reference semantics of the random ops (signatures in graph/ops/random.cc):
// element i of the output (row-major) draws its words of Philox4x32-10(
// seed, offset, PhiloxCall(i)) (graph/ops/random.h, support/philox.h) and
// turns them into a value with the arithmetic of
// graph/ops/random.h, the same integers and float32 steps as the compiled
// kernels, so uniforms, bernoulli draws and dropout masks match them bit for
// bit; normals use double math (within float rounding of the kernels').
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"
#include "graph/ops/random.h"
#include "support/philox.h"

namespace kiln {
namespace {

// The seed and stream of a random op.
struct Stream {
  uint64_t seed = 0;
  uint64_t offset = 0;
  // Word `which` (< words) of element `index` of an op drawing `words`
  // words per element.
  uint32_t Word(int64_t index, int words, int which) const {
    return Philox4x32(seed, offset,
                      static_cast<uint64_t>(ops::PhiloxCall(
                          index, words)))[ops::PhiloxWord(index, words, which)];
  }
};

Stream StreamOf(const RefContext& ctx) {
  const ops::RandomArgs at = ops::RandomArgsOf(ctx.node);
  return {static_cast<uint64_t>(ctx.tensors[at.seed].GetIntAt(0)),
          static_cast<uint64_t>(ctx.arg(at.offset).i)};
}

// A uniform [0, 1) of `bits` bits from `word` (exact in float32).
double Uniform(uint32_t word, int bits) {
  const uint32_t mask = (uint32_t{1} << bits) - 1;
  return std::ldexp(static_cast<double>(word & mask), -bits);
}

// Bernoulli draw of a word against a threshold (graph/ops/random.h).
bool Draw(uint32_t word, int64_t threshold) {
  constexpr uint32_t kMask = (uint32_t{1} << ops::kBernoulliBits) - 1;
  return static_cast<int64_t>(word & kMask) < threshold;
}

// float32 multiply, as the kernels (and eager's float opmath) compute it.
double MulF(double a, double b) {
  return static_cast<float>(static_cast<float>(a) * static_cast<float>(b));
}

absl::StatusOr<std::vector<HostTensor>> RandReference(const RefContext& ctx) {
  const Stream s = StreamOf(ctx);
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  const int bits = ops::UniformBits(out.dtype());
  for (int64_t i = 0; i < out.numel(); ++i) {
    out.SetDoubleAt(i, Uniform(s.Word(i, 1, 0), bits));
  }
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> RandnReference(const RefContext& ctx) {
  const Stream s = StreamOf(ctx);
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double u1 = Uniform(s.Word(i, 2, 0), ops::kBernoulliBits);
    const double u2 = Uniform(s.Word(i, 2, 1), ops::kBernoulliBits);
    out.SetDoubleAt(i, std::sqrt(-2.0 * std::log(1.0 - u1)) *
                           std::cos(ops::kTwoPi * u2));
  }
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> BernoulliPReference(
    const RefContext& ctx) {
  const Stream s = StreamOf(ctx);
  const int64_t threshold = ops::BernoulliThreshold(ctx.arg(1).ScalarAsDouble());
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  for (int64_t i = 0; i < out.numel(); ++i) {
    out.SetIntAt(i, Draw(s.Word(i, 1, 0), threshold) ? 1 : 0);
  }
  return std::vector<HostTensor>{std::move(out)};
}

// bernoulli.default: 1 iff a 24-bit uniform < p (p as float32).
absl::StatusOr<std::vector<HostTensor>> BernoulliReference(
    const RefContext& ctx) {
  const Stream s = StreamOf(ctx);
  const HostTensor& p = ctx.tensors[0];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double u = Uniform(s.Word(i, 1, 0), ops::kBernoulliBits);
    const double pi = static_cast<float>(p.GetDoubleAt(i));
    out.SetIntAt(i, u < pi ? 1 : 0);
  }
  return std::vector<HostTensor>{std::move(out)};
}

// native_dropout: mask = bernoulli(1 - p); output = input * mask * scale in
// float32 (ATen: input.mul(mask).mul_(scale)); not training: (input, ones).
absl::StatusOr<std::vector<HostTensor>> NativeDropoutReference(
    const RefContext& ctx) {
  const HostTensor& x = ctx.tensors[0];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  HostTensor mask = HostTensor::Empty(DType::kBool, ctx.out_sizes[1]);
  const double p = ctx.arg(1).ScalarAsDouble();
  const bool train = ops::DropoutTrains(ctx.node);
  const Stream s = train ? StreamOf(ctx) : Stream{};
  const int64_t threshold = ops::BernoulliThreshold(1.0 - p);
  const double scale = ops::DropoutScale(p);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const bool keep = !train || Draw(s.Word(i, 1, 0), threshold);
    mask.SetIntAt(i, keep ? 1 : 0);
    const double xi = static_cast<float>(x.GetDoubleAt(i));
    out.SetDoubleAt(i, train ? MulF(MulF(xi, keep ? 1 : 0), scale) : xi);
  }
  return std::vector<HostTensor>{std::move(out), std::move(mask)};
}

// native_dropout_backward: grad_output * mask * scale, in float32.
absl::StatusOr<std::vector<HostTensor>> NativeDropoutBackwardReference(
    const RefContext& ctx) {
  const std::vector<int64_t>& sizes = ctx.out_sizes[0];
  const HostTensor g = ops::BroadcastTo(ctx.tensors[0], sizes);
  const HostTensor m = ops::BroadcastTo(ctx.tensors[1], sizes);
  const double scale = ctx.arg(2).ScalarAsDouble();
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], sizes);
  for (int64_t i = 0; i < out.numel(); ++i) {
    out.SetDoubleAt(i, MulF(MulF(g.GetDoubleAt(i), m.GetIntAt(i) != 0 ? 1 : 0),
                            scale));
  }
  return std::vector<HostTensor>{std::move(out)};
}

}  // namespace

void RegisterRandomReferences(OpReferences& table) {
  table.Add("aten.native_dropout.default", NativeDropoutReference);
  table.Add("aten.native_dropout_backward.default",
            NativeDropoutBackwardReference);
  table.Add("aten.rand.default", RandReference);
  table.Add("aten.rand_like.default", RandReference);
  table.Add("aten.randn.default", RandnReference);
  table.Add("aten.randn_like.default", RandnReference);
  table.Add("aten.bernoulli.p", BernoulliPReference);
  table.Add("aten.bernoulli.default", BernoulliReference);
}

}  // namespace kiln
