// The random ops (graph/ops/random.cc): Philox4x32-10 against Random123's
// known answers, hand-worked values, the reference against compiled CPU
// kernels bit for bit (normals within float rounding), statistics over 2^20
// draws, reproducibility and independence of seeds and streams, empty and
// non-contiguous inputs, every dtype, and the errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "compiler/reference.h"
#include "graph/import.h"
#include "graph/ops/random.h"
#include "gtest/gtest.h"
#include "runtime/cpu_executable.h"
#include "runtime/thread_pool.h"
#include "support/philox.h"
#include "tests/unit/numerics.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing {
namespace {

[[maybe_unused]] ::testing::Environment* const kCoverage =
    RegisterCoverage("random", RandomSuiteOps());

constexpr DType kFloatDTypes[] = {DType::kFloat32, DType::kFloat16,
                                  DType::kBFloat16};

// The seed input: an int64 0-dim tensor.
HostTensor Seed(int64_t s) { return I64({}, {static_cast<double>(s)}); }

// Kiln's keywords: seed = input `i`, offset.
std::vector<v1::Argument> Seeded(std::vector<v1::Argument> args, int i,
                                 int64_t offset = 0) {
  args.push_back(Kw("seed", In(i)));
  args.push_back(Kw("offset", I(offset)));
  return args;
}

// The word of Philox for element `index` as a float32 uniform of 24 bits.
// The 24-bit uniform of word `which` of element `index` of an op drawing
// `words` words per element: 4 / words consecutive elements share one
// Philox call, element index taking words (index % n) * words + which of
// call index / n (graph/ops/random.h).
double Uniform24(uint64_t seed, uint64_t offset, uint64_t index, int words = 1,
                 int which = 0) {
  const uint64_t n = 4 / words;
  const uint32_t w =
      Philox4x32(seed, offset, index / n)[(index % n) * words + which];
  return std::ldexp(w & 0xFFFFFF, -24);
}

struct Compiled {
  std::vector<HostTensor> got;   // compiled CPU kernels
  std::vector<HostTensor> want;  // reference
};

// Compiles the one-op graph for this machine's CPU (non-contiguous inputs
// declared with their strides), runs it and the reference.
absl::StatusOr<Compiled> CompileAndRun(const std::string& op,
                                       const std::vector<HostTensor>& inputs,
                                       const std::vector<v1::Argument>& args) {
  v1::CompileRequest req;
  *req.mutable_graph() = OneOpGraph(op, inputs, args);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].IsContiguous()) continue;
    v1::TensorMeta* m = req.mutable_graph()->mutable_inputs(i)->mutable_meta();
    for (int64_t s : inputs[i].strides()) m->add_strides()->set_value(s);
  }
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto artifact = Compile(req);
  if (!artifact.ok()) return artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
  if (!exe.ok()) return exe.status();
  auto graph = ImportGraph(req.graph());
  if (!graph.ok()) return graph.status();
  auto want = EvaluateReference(*graph, inputs);
  if (!want.ok()) return want.status();
  ThreadPool pool(2);
  auto got = (*exe)->Run(inputs, &pool);
  if (!got.ok()) return got.status();
  ExercisedOps().insert(op);
  return Compiled{*std::move(got), *std::move(want)};
}

// Empty when `got` has exactly `want`'s dtype, sizes and bits (values
// compared as doubles: every dtype's values are exact in a double; NaN
// matches NaN).
std::string SameBits(const HostTensor& got, const HostTensor& want) {
  if (got.dtype() != want.dtype() || got.sizes() != want.sizes())
    return absl::StrCat("got ", got.ToString(0), ", want ", want.ToString(0));
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.GetDoubleAt(i), w = want.GetDoubleAt(i);
    if (g == w && std::signbit(g) == std::signbit(w)) continue;
    if (std::isnan(g) && std::isnan(w)) continue;
    return absl::StrCat("element ", i, ": got ", g, ", want ", w);
  }
  return "";
}

// Compiled and reference outputs are the same bits.
void ExpectCompiledExact(const std::string& op,
                         const std::vector<HostTensor>& inputs,
                         const std::vector<v1::Argument>& args) {
  SCOPED_TRACE(op);
  auto r = CompileAndRun(op, inputs, args);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->got.size(), r->want.size());
  for (size_t o = 0; o < r->want.size(); ++o) {
    EXPECT_EQ(SameBits(r->got[o], r->want[o]), "") << "output " << o;
  }
}

// The compiled op's first output.
HostTensor CompiledOutput(const std::string& op,
                          const std::vector<HostTensor>& inputs,
                          const std::vector<v1::Argument>& args, int o = 0) {
  auto r = CompileAndRun(op, inputs, args);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->got[o] : HostTensor();
}

struct Moments {
  double mean = 0, var = 0;
};
Moments MomentsOf(const HostTensor& t) {
  double s = 0, s2 = 0;
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) s += t.GetDoubleAt(i);
  const double mean = s / n;
  for (int64_t i = 0; i < n; ++i) {
    const double d = t.GetDoubleAt(i) - mean;
    s2 += d * d;
  }
  return {mean, s2 / (n - 1)};
}

std::vector<double> Repeat(double v, int n) { return std::vector<double>(n, v); }

// ---- the generator ----

// Random123's known-answer vectors for philox4x32-10 (kat_vectors): counter
// (c0, c1, c2, c3) is Kiln's (index, offset) and key (k0, k1) its seed.
TEST(Philox, KnownAnswers) {
  EXPECT_EQ(Philox4x32(0, 0, 0),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c,
                                     0x9b00dbd8}));
  EXPECT_EQ(Philox4x32(~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6,
                                     0x6d5451fd}));
  EXPECT_EQ(Philox4x32(0x299f31d0a4093822ull, 0x0370734413198a2eull,
                       0x85a308d3243f6a88ull),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420,
                                     0x24126ea1}));
}

TEST(Philox, BernoulliThresholdAndScale) {
  EXPECT_EQ(ops::BernoulliThreshold(0), 0);
  EXPECT_EQ(ops::BernoulliThreshold(-1), 0);
  EXPECT_EQ(ops::BernoulliThreshold(1), 1 << 24);
  EXPECT_EQ(ops::BernoulliThreshold(0.5), 1 << 23);
  // ceil: any p > 0 keeps some draws.
  EXPECT_EQ(ops::BernoulliThreshold(1e-9), 1);
  EXPECT_EQ(ops::DropoutScale(0.2), 1.25);
  EXPECT_EQ(ops::DropoutScale(1), 0);
}

// ---- hand-worked values (the reference) ----

TEST(Rand, HandWorkedValues) {
  // Element i is the low 24 bits of word i % 4 of Philox(seed, offset,
  // i / 4) times 2^-24: for seed 0, offset 0, element 0 that is 0x27e8d5 /
  // 2^24; elements 1 to 3 are the same call's other words.
  auto r = RunTracked("aten.rand.default", {Seed(0)},
                      Seeded({Ints({2, 2})}, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, kF32, {2, 2},
               {0x27e8d5 / 16777216.0, Uniform24(0, 0, 1), Uniform24(0, 0, 2),
                Uniform24(0, 0, 3)},
               0);
  // float16: 11 bits (0x0d5 of 0x6627e8d5), bfloat16: 8 bits (0xd5).
  r = RunTracked("aten.rand.default", {Seed(0)},
                 Seeded({Ints({1}), Kw("dtype", DT(v1::FLOAT16))}, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, kF16, {1}, {0x0d5 / 2048.0}, 0);
  r = RunTracked("aten.rand.default", {Seed(0)},
                 Seeded({Ints({1}), Kw("dtype", DT(v1::BFLOAT16))}, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, kBF16, {1}, {0xd5 / 256.0}, 0);
  // rand_like: self's sizes and dtype, or the dtype given.
  r = RunTracked("aten.rand_like.default", {F16({3}, {}), Seed(7)},
                 Seeded({In(0)}, 1, 2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type().dtype, kF16);
  r = RunTracked("aten.rand_like.default", {F16({3}, {}), Seed(7)},
                 Seeded({In(0), Kw("dtype", DT(v1::FLOAT32))}, 1, 2));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, kF32, {3},
               {Uniform24(7, 2, 0), Uniform24(7, 2, 1), Uniform24(7, 2, 2)}, 0);
  // Empty.
  CheckOp("aten.rand.default", {Seed(0)}, Seeded({Ints({2, 0})}, 0), kF32,
          {2, 0}, {});
}

TEST(Randn, HandWorkedValues) {
  // Box-Muller: sqrt(-2 log(1 - u1)) cos(2 pi u2), u1 and u2 the element's
  // two words (elements 0 and 1 share call 0: words 0, 1 and 2, 3).
  std::vector<double> want;
  for (int i = 0; i < 3; ++i) {
    const double u1 = Uniform24(5, 1, i, 2, 0), u2 = Uniform24(5, 1, i, 2, 1);
    want.push_back(std::sqrt(-2 * std::log(1 - u1)) * std::cos(2 * M_PI * u2));
  }
  auto r = RunTracked("aten.randn.default", {Seed(5)}, Seeded({Ints({3})}, 0, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, kF32, {3}, want);
  r = RunTracked("aten.randn_like.default", {BF16({3}, {}), Seed(5)},
                 Seeded({In(0)}, 1, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, kBF16, {3}, want);
  CheckOp("aten.randn_like.default", {F32({0}, {}), Seed(5)},
          Seeded({In(0)}, 1), kF32, {0}, {});
}

TEST(Bernoulli, HandWorkedValues) {
  // bernoulli.p: 1 iff the low 24 bits < ceil(p 2^24); any dtype.
  std::vector<double> want;
  for (int i = 0; i < 6; ++i) want.push_back(Uniform24(3, 0, i) < 0.5 ? 1 : 0);
  for (DType d : {kF32, kF16, kBF16, kI32, kI64, kBool}) {
    SCOPED_TRACE(DTypeName(d));
    auto r = RunTracked("aten.bernoulli.p",
                        {MakeTensor(d, {2, 3}, {}), Seed(3)},
                        Seeded({In(0), F(0.5)}, 1));
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectOutput(*r, d, {2, 3}, want, 0);
  }
  // p = 0 and p = 1; p's default is 0.5.
  CheckOp("aten.bernoulli.p", {F32({4}, {}), Seed(3)},
          Seeded({In(0), F(0.0)}, 1), kF32, {4}, Repeat(0, 4), 0);
  CheckOp("aten.bernoulli.p", {F32({4}, {}), Seed(3)},
          Seeded({In(0), F(1.0)}, 1), kF32, {4}, Repeat(1, 4), 0);
  CheckOp("aten.bernoulli.p", {F32({2, 3}, {}), Seed(3)}, Seeded({In(0)}, 1),
          kF32, {2, 3}, want, 0);
  // bernoulli.default: self holds the probabilities (0 and 1 are certain).
  std::vector<double> p = {0, 1, 0.25, 0.5, 0.75, 1};
  want.clear();
  for (int i = 0; i < 6; ++i) want.push_back(Uniform24(9, 4, i) < p[i] ? 1 : 0);
  CheckOp("aten.bernoulli.default", {F32({6}, p), Seed(9)},
          Seeded({In(0)}, 1, 4), kF32, {6}, want, 0);
  CheckOp("aten.bernoulli.default", {F16({0}, {}), Seed(9)},
          Seeded({In(0)}, 1), kF16, {0}, {}, 0);
}

TEST(NativeDropout, HandWorkedValues) {
  // mask = bernoulli(1 - p); output = input * mask / (1 - p).
  const std::vector<double> x = {1, -2, 3, 4, 5, 6, 7, 8};
  std::vector<double> out, mask;
  for (int i = 0; i < 8; ++i) {
    const bool keep = Uniform24(11, 0, i) < 0.75;
    mask.push_back(keep);
    out.push_back(keep ? x[i] / 0.75 : 0);
  }
  auto r = RunTracked("aten.native_dropout.default", {F32({2, 4}, x), Seed(11)},
                      Seeded({In(0), F(0.25), B(true)}, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {2, 4}, out);
  ExpectOutput(*r, 1, kBool, {2, 4}, mask, 0);
  // train None drops too; train false gives (input, ones).
  r = RunTracked("aten.native_dropout.default", {F32({2, 4}, x), Seed(11)},
                 Seeded({In(0), F(0.25), NoneArg()}, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 1, kBool, {2, 4}, mask, 0);
  r = RunTracked("aten.native_dropout.default", {BF16({2, 4}, x), Seed(11)},
                 Seeded({In(0), F(0.25), B(false)}, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kBF16, {2, 4}, x, 0);
  ExpectOutput(*r, 1, kBool, {2, 4}, Repeat(1, 8), 0);
  // p = 1 drops everything with scale 0 (ATen); p = 0 keeps everything.
  r = RunTracked("aten.native_dropout.default", {F32({3}, {1, 2, 3}), Seed(1)},
                 Seeded({In(0), F(1.0), B(true)}, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {3}, {0, 0, 0}, 0);
  ExpectOutput(*r, 1, kBool, {3}, {0, 0, 0}, 0);
  r = RunTracked("aten.native_dropout.default", {F16({3}, {1, 2, 3}), Seed(1)},
                 Seeded({In(0), F(0.0), B(true)}, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF16, {3}, {1, 2, 3}, 0);
  // Empty input.
  r = RunTracked("aten.native_dropout.default", {F32({0, 3}, {}), Seed(1)},
                 Seeded({In(0), F(0.5), B(true)}, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 1, kBool, {0, 3}, {}, 0);
}

TEST(NativeDropoutBackward, HandWorkedValues) {
  CheckOp("aten.native_dropout_backward.default",
          {F32({4}, {1, 2, 3, 4}), Bool({4}, {1, 0, 1, 0})},
          {In(0), In(1), F(2.0)}, kF32, {4}, {2, 0, 6, 0});
  // Broadcasting of grad and mask; float16 rounds once; empty.
  CheckOp("aten.native_dropout_backward.default",
          {F16({2, 1}, {1, 3}), Bool({2}, {1, 0})}, {In(0), In(1), F(1.25)},
          kF16, {2, 2}, {1.25, 0, 3.75, 0}, 0);
  CheckOp("aten.native_dropout_backward.default",
          {BF16({0}, {}), Bool({0}, {})}, {In(0), In(1), F(1.25)}, kBF16, {0},
          {});
  ExpectInvalid("aten.native_dropout_backward.default",
                {F32({2}, {1, 2}), F32({2}, {1, 0})}, {In(0), In(1), F(2.0)},
                {"mask should be bool"});
}

TEST(Random, Errors) {
  ExpectInvalid("aten.rand.default", {}, {Ints({2})}, {"seed"});
  ExpectInvalid("aten.rand.default", {I32({}, {1})}, Seeded({Ints({2})}, 0),
                {"seed must be an int64 0-dim tensor"});
  ExpectInvalid("aten.rand.default", {I64({1}, {1})}, Seeded({Ints({2})}, 0),
                {"seed must be an int64 0-dim tensor"});
  ExpectInvalid("aten.rand.default", {Seed(1)}, Seeded({Ints({2})}, 0, -1),
                {"offset must be non-negative"});
  ExpectInvalid("aten.rand.default", {Seed(1)}, Seeded({Ints({-1})}, 0),
                {"negative size"});
  ExpectInvalid("aten.randn.default", {Seed(1)},
                Seeded({Ints({2}), Kw("dtype", DT(v1::INT64))}, 0),
                {"must be floating"});
  ExpectInvalid("aten.rand_like.default", {I32({2}, {}), Seed(1)},
                Seeded({In(0)}, 1), {"must be floating"});
  ExpectInvalid("aten.bernoulli.p", {F32({2}, {}), Seed(1)},
                Seeded({In(0), F(1.5)}, 1), {"between 0 and 1"});
  ExpectInvalid("aten.bernoulli.default", {I64({2}, {}), Seed(1)},
                Seeded({In(0)}, 1), {"must be floating"});
  ExpectInvalid("aten.native_dropout.default", {F32({2}, {}), Seed(1)},
                Seeded({In(0), F(-0.5), B(true)}, 1), {"between 0 and 1"});
  ExpectInvalid("aten.native_dropout.default", {I32({2}, {}), Seed(1)},
                Seeded({In(0), F(0.5), B(true)}, 1), {"must be floating"});
}

// ---- compiled kernels against the reference ----

TEST(Random, CompiledMatchesReferenceExactly) {
  std::mt19937_64 rng(17);
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {1}, {7}, {3, 5}, {2, 3, 4}, {1031}, {0, 4}};
  const std::vector<std::pair<int64_t, int64_t>> streams = {
      {0, 0}, {-5, 3}, {0x123456789abcdefll, 1ll << 40}};
  // Each shape with one stream and one dtype, all of them covered over the
  // shapes (each compile costs time).
  for (size_t combination = 0; combination < shapes.size(); ++combination) {
    const std::vector<int64_t>& shape = shapes[combination];
    {
      const auto [seed, offset] = streams[combination % streams.size()];
      const DType d = kFloatDTypes[(combination / 2) % 3];
      SCOPED_TRACE(absl::StrCat("shape of rank ", shape.size(), " seed ", seed,
                                " offset ", offset, " ", DTypeName(d)));
      HostTensor x = HostTensor::Empty(d, shape);
      FillRandom(x, rng);
      const v1::DType wire = static_cast<v1::DType>(d);
      ExpectCompiledExact(
          "aten.rand.default", {Seed(seed)},
          Seeded({Ints(shape), Kw("dtype", DT(wire))}, 0, offset));
      ExpectCompiledExact("aten.rand_like.default", {x, Seed(seed)},
                          Seeded({In(0)}, 1, offset));
      ExpectCompiledExact("aten.bernoulli.p", {x, Seed(seed)},
                          Seeded({In(0), F(0.3)}, 1, offset));
      HostTensor p = HostTensor::Empty(d, shape);
      FillRandom(p, rng, 0, 1);
      ExpectCompiledExact("aten.bernoulli.default", {p, Seed(seed)},
                          Seeded({In(0)}, 1, offset));
      ExpectCompiledExact("aten.native_dropout.default", {x, Seed(seed)},
                          Seeded({In(0), F(0.1), B(true)}, 1, offset));
      HostTensor mask = HostTensor::Empty(kBool, shape);
      FillRandom(mask, rng);
      ExpectCompiledExact("aten.native_dropout_backward.default", {x, mask},
                          {In(0), In(1), F(1 / 0.9)});
      // Normals: the kernels' float32 log/cos against the reference's
      // double math, within float rounding.
      for (const auto& [op, args] :
           {std::pair{"aten.randn_like.default", Seeded({In(0)}, 1, offset)},
            std::pair{"aten.randn.default",
                      Seeded({Ints(shape)}, 1, offset)}}) {
        auto r = CompileAndRun(op, {x, Seed(seed)}, args);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(Compare(r->got[0], r->want[0]), "") << op;
      }
    }
  }
}

TEST(Random, NonContiguousInputs) {
  std::mt19937_64 rng(3);
  HostTensor x = HostTensor::Empty(kF32, {5, 7});
  FillRandom(x, rng);
  const HostTensor xt = TransposedView(x);  // [7, 5], not contiguous
  ExpectCompiledExact("aten.native_dropout.default", {xt, Seed(2)},
                      Seeded({In(0), F(0.5), B(true)}, 1));
  HostTensor p = HostTensor::Empty(kF32, {5, 7});
  FillRandom(p, rng, 0, 1);
  ExpectCompiledExact("aten.bernoulli.default", {TransposedView(p), Seed(2)},
                      Seeded({In(0)}, 1));
  HostTensor mask = HostTensor::Empty(kBool, {5, 7});
  FillRandom(mask, rng);
  ExpectCompiledExact("aten.native_dropout_backward.default",
                      {xt, TransposedView(mask)}, {In(0), In(1), F(2.0)});
  // The draw depends on the output position only: the transposed input's
  // mask is the contiguous input's (same sizes, same stream).
  auto a = RunOp("aten.native_dropout.default", {xt, Seed(2)},
                 Seeded({In(0), F(0.5), B(true)}, 1));
  auto b = RunOp("aten.native_dropout.default", {xt.Contiguous(), Seed(2)},
                 Seeded({In(0), F(0.5), B(true)}, 1));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(SameBits(a->outputs[1], b->outputs[1]), "");
  EXPECT_EQ(SameBits(a->outputs[0], b->outputs[0]), "");
}

// ---- statistics of the compiled kernels over 2^20 draws ----

constexpr int64_t kDraws = int64_t{1} << 20;

TEST(RandomStatistics, UniformMomentsAndHistogram) {
  const HostTensor u = CompiledOutput("aten.rand.default", {Seed(123)},
                                      Seeded({Ints({kDraws})}, 0));
  ASSERT_EQ(u.numel(), kDraws);
  double lo = 1, hi = 0;
  std::vector<int64_t> bins(16, 0);
  for (int64_t i = 0; i < kDraws; ++i) {
    const double v = u.GetDoubleAt(i);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    ++bins[static_cast<int>(v * 16)];
  }
  EXPECT_GE(lo, 0);
  EXPECT_LT(hi, 1);
  const Moments m = MomentsOf(u);
  // Standard errors: sqrt(1/12 / n) = 2.8e-4 for the mean, about 1.1e-4
  // for the variance; bounds at 5 of them.
  EXPECT_NEAR(m.mean, 0.5, 1.5e-3);
  EXPECT_NEAR(m.var, 1.0 / 12, 6e-4);
  // Each of 16 bins holds n/16 = 65536 +- 242 (one standard deviation).
  for (int64_t b : bins) EXPECT_NEAR(static_cast<double>(b), 65536, 5 * 242);
}

TEST(RandomStatistics, NormalMomentsAndTails) {
  const HostTensor z = CompiledOutput("aten.randn.default", {Seed(99)},
                                      Seeded({Ints({1024, 1024})}, 0, 3));
  ASSERT_EQ(z.numel(), kDraws);
  const Moments m = MomentsOf(z);
  EXPECT_NEAR(m.mean, 0, 5e-3);  // standard error 1e-3
  EXPECT_NEAR(m.var, 1, 7e-3);   // standard error sqrt(2/n) = 1.4e-3
  int64_t beyond = 0;  // P(|z| > 1.96) = 0.05, standard error 2.1e-4
  for (int64_t i = 0; i < kDraws; ++i) beyond += std::fabs(z.GetDoubleAt(i)) > 1.96;
  EXPECT_NEAR(static_cast<double>(beyond) / kDraws, 0.05, 1.1e-3);
}

TEST(RandomStatistics, DropoutKeepsOneMinusPAndTheMean) {
  HostTensor x = HostTensor::Empty(kF32, {kDraws});
  for (int64_t i = 0; i < kDraws; ++i) x.SetDoubleAt(i, 1.0);
  for (double p : {0.1, 0.5}) {
    SCOPED_TRACE(p);
    auto r = CompileAndRun("aten.native_dropout.default", {x, Seed(42)},
                           Seeded({In(0), F(p), B(true)}, 1));
    ASSERT_TRUE(r.ok()) << r.status();
    const Moments mask = MomentsOf(r->got[1]);
    const double se = std::sqrt(p * (1 - p) / kDraws);  // <= 4.9e-4
    EXPECT_NEAR(mask.mean, 1 - p, 5 * se);
    // Kept elements are scaled by 1 / (1 - p): the mean stays 1.
    EXPECT_NEAR(MomentsOf(r->got[0]).mean, 1, 5 * se / (1 - p));
    for (int64_t i = 0; i < kDraws; i += 4099) {
      EXPECT_EQ(r->got[0].GetDoubleAt(i),
                r->got[1].GetIntAt(i) ? static_cast<float>(1 / (1 - p)) : 0.0);
    }
  }
  // bernoulli.p and bernoulli.default at p = 0.3.
  const HostTensor b = CompiledOutput("aten.bernoulli.p", {x, Seed(7)},
                                      Seeded({In(0), F(0.3)}, 1));
  EXPECT_NEAR(MomentsOf(b).mean, 0.3, 5 * std::sqrt(0.21 / kDraws));
  HostTensor p = HostTensor::Empty(kF32, {kDraws});
  for (int64_t i = 0; i < kDraws; ++i) p.SetDoubleAt(i, 0.3);
  const HostTensor bp = CompiledOutput("aten.bernoulli.default", {p, Seed(7)},
                                       Seeded({In(0)}, 1));
  EXPECT_NEAR(MomentsOf(bp).mean, 0.3, 5 * std::sqrt(0.21 / kDraws));
}

// ---- seeds and streams ----

TEST(Random, SeedsAndStreamsAreReproducibleAndIndependent) {
  auto draw = [](int64_t seed, int64_t offset) {
    return CompiledOutput("aten.rand.default", {Seed(seed)},
                          Seeded({Ints({4096})}, 0, offset));
  };
  const HostTensor a = draw(1, 0);
  EXPECT_EQ(SameBits(draw(1, 0), a), "");  // reproducible
  for (const HostTensor& other : {draw(2, 0), draw(1, 1), draw(1ll << 32, 0)}) {
    int64_t same = 0;
    for (int64_t i = 0; i < 4096; ++i)
      same += other.GetDoubleAt(i) == a.GetDoubleAt(i);
    EXPECT_LT(same, 8);  // 2^-24 chance per element
    // Uncorrelated: |corr| < 5 / sqrt(n).
    double sab = 0;
    for (int64_t i = 0; i < 4096; ++i)
      sab += (other.GetDoubleAt(i) - 0.5) * (a.GetDoubleAt(i) - 0.5);
    EXPECT_LT(std::fabs(sab / 4096 * 12), 5 / 64.0);
  }
  // Neighbouring elements are uncorrelated as well.
  double lag = 0;
  for (int64_t i = 0; i + 1 < 4096; ++i)
    lag += (a.GetDoubleAt(i) - 0.5) * (a.GetDoubleAt(i + 1) - 0.5);
  EXPECT_LT(std::fabs(lag / 4095 * 12), 5 / 64.0);
}

// Two random ops of one graph with different offsets draw different numbers,
// and the dropout fuses with its neighbours (one kernel).
TEST(Random, FusesWithNeighbours) {
  v1::CompileRequest req;
  v1::Graph& g = *req.mutable_graph();
  auto input = [&](const char* name, v1::TensorMeta meta) {
    v1::Input* in = g.add_inputs();
    in->set_name(name);
    *in->mutable_meta() = meta;
  };
  input("x0", MetaOf(F32({64, 32}, {})));
  input("x1", MetaOf(Seed(0)));
  auto node = [&](const char* op, std::vector<v1::Argument> args,
                  std::vector<std::string> outs) {
    v1::Node* n = g.add_nodes();
    n->set_op(op);
    for (const v1::Argument& a : args) *n->add_args() = a;
    for (const std::string& o : outs) n->add_outputs(o);
  };
  v1::Argument y;
  y.set_ref("y");
  node("aten.relu.default", {In(0)}, {"y"});
  node("aten.native_dropout.default", Seeded({y, F(0.5), B(true)}, 1, 0),
       {"d", "m"});
  v1::Argument d;
  d.set_ref("d");
  node("aten.rand_like.default", Seeded({d}, 1, 1), {"u"});
  v1::Argument u;
  u.set_ref("u");
  node("aten.add.Tensor", {d, u}, {"z"});
  g.add_outputs("z");
  g.add_outputs("m");
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  int launches = 0;
  for (const v1::Step& s : artifact->program().steps()) launches += s.has_launch();
  EXPECT_EQ(launches, 1);
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::mt19937_64 rng(5);
  HostTensor x = HostTensor::Empty(kF32, {64, 32});
  FillRandom(x, rng);
  ThreadPool pool(2);
  auto got = (*exe)->Run({x, Seed(77)}, &pool);
  ASSERT_TRUE(got.ok()) << got.status();
  auto graph = ImportGraph(g);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto want = EvaluateReference(*graph, {x, Seed(77)});
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(SameBits((*got)[0], (*want)[0]), "");
  EXPECT_EQ(SameBits((*got)[1], (*want)[1]), "");
}

}  // namespace
}  // namespace kiln::testing
