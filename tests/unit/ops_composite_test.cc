// Per-op tests of the composite ops (graph/ops/composite.cc, compiler/ops/composite_*.cc): _softmax,
// _log_softmax and native_layer_norm, against numbers worked out by hand:
// output dtypes (half_to_float, float32 statistics), shapes (mean/rstd are
// input.shape[:axis] + [1] * len(normalized_shape)) and values.
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing {
namespace {

[[maybe_unused]] ::testing::Environment* const kCoverage =
    RegisterCoverage("composite", CompositeSuiteOps());

// softmax([1, 2, 3]) = e^k / (e + e^2 + e^3).
constexpr double kS1 = 0.09003057317038046;
constexpr double kS2 = 0.24472847105479767;
constexpr double kS3 = 0.6652409557748219;
// log_softmax([1, 2, 3]) = k - log(e + e^2 + e^3), log(...) =
// 3.40760596444438.
constexpr double kL1 = -2.40760596444438;
constexpr double kL2 = -1.4076059644443801;
constexpr double kL3 = -0.40760596444438013;
// softmax([1, 3]) = [1 / (1 + e^2), e^2 / (1 + e^2)].
constexpr double kP1 = 0.11920292202211757;
constexpr double kP2 = 1 - kP1;

// ---- _softmax ----

TEST(CompositeSoftmax, LastDim) {
  CheckOp("aten._softmax.default", {F32({3}, {1, 2, 3})},
          {In(0), I(-1), B(false)}, kF32, {3}, {kS1, kS2, kS3});
  // Rows [1, 2, 3] and [5, 5, 5].
  CheckOp("aten._softmax.default", {F32({2, 3}, {1, 2, 3, 5, 5, 5})},
          {In(0), I(1), B(false)}, kF32, {2, 3},
          {kS1, kS2, kS3, 1.0 / 3, 1.0 / 3, 1.0 / 3});
  // Shift invariance: large inputs do not overflow.
  CheckOp("aten._softmax.default", {F32({3}, {1001, 1002, 1003})},
          {In(0), I(0), B(false)}, kF32, {3}, {kS1, kS2, kS3});
  // -inf gets probability 0.
  CheckOp("aten._softmax.default", {F32({2}, {0, -kInf})},
          {In(0), I(0), B(false)}, kF32, {2}, {1, 0});
  // A 0-d input: softmax of one element is 1.
  CheckOp("aten._softmax.default", {F32({}, {7})}, {In(0), I(-1), B(false)},
          kF32, {}, {1});
}

TEST(CompositeSoftmax, FirstDimAndNonContiguous) {
  // [[1, 2], [3, 4]] over dim 0: columns [1, 3] and [2, 4].
  CheckOp("aten._softmax.default", {F32({2, 2}, {1, 2, 3, 4})},
          {In(0), I(0), B(false)}, kF32, {2, 2}, {kP1, kP1, kP2, kP2});
  CheckOp("aten._softmax.default", {F32({2, 2}, {1, 2, 3, 4})},
          {In(0), I(-2), B(false)}, kF32, {2, 2}, {kP1, kP1, kP2, kP2});
  // TransposedView of [[1, 2, 3], [1, 3, 5]] is [[1, 1], [2, 3], [3, 5]];
  // over dim 0 the columns are [1, 2, 3] and [1, 3, 5] (= [1, 2, 3] * 2 - 1:
  // e^{1, 3, 5} / (e + e^3 + e^5)).
  const double d = 2.718281828459045 + 20.085536923187668 + 148.4131591025766;
  CheckOp("aten._softmax.default",
          {TransposedView(F32({2, 3}, {1, 2, 3, 1, 3, 5}))},
          {In(0), I(0), B(false)}, kF32, {3, 2},
          {kS1, 2.718281828459045 / d, kS2, 20.085536923187668 / d, kS3,
           148.4131591025766 / d});
}

TEST(CompositeSoftmax, HalfToFloat) {
  // float16 results round: 1475 * 2^-14, 2005 * 2^-13, 1362 * 2^-11.
  CheckOp("aten._softmax.default", {F16({3}, {1, 2, 3})},
          {In(0), I(0), B(false)}, kF16, {3},
          {0.09002685546875, 0.2447509765625, 0.6650390625}, 0);
  // half_to_float: a float16 input gives a float32 result.
  CheckOp("aten._softmax.default", {F16({3}, {1, 2, 3})},
          {In(0), I(0), B(true)}, kF32, {3}, {kS1, kS2, kS3});
  CheckOp("aten._softmax.default", {BF16({2}, {0, 0})}, {In(0), I(0), B(false)},
          kBF16, {2}, {0.5, 0.5}, 0);
  ExpectInvalid("aten._softmax.default", {F32({3}, {1, 2, 3})},
                {In(0), I(0), B(true)},
                {"node 0", "aten._softmax.default", "half_to_float"});
  // Only float16 converts (CUDA: "conversion is supported for Half type
  // only"), not bfloat16.
  ExpectInvalid("aten._softmax.default", {BF16({2}, {0, 0})},
                {In(0), I(0), B(true)}, {"half_to_float", "bfloat16"});
  ExpectInvalid("aten._softmax.default", {I32({3}, {1, 2, 3})},
                {In(0), I(0), B(false)}, {"int32"});
  ExpectInvalid("aten._softmax.default", {F32({3}, {1, 2, 3})},
                {In(0), I(1), B(false)});
}

// ---- _log_softmax ----

TEST(CompositeLogSoftmax, Values) {
  CheckOp("aten._log_softmax.default", {F32({3}, {1, 2, 3})},
          {In(0), I(-1), B(false)}, kF32, {3}, {kL1, kL2, kL3});
  CheckOp("aten._log_softmax.default", {F32({2, 3}, {1, 2, 3, 1, 2, 3})},
          {In(0), I(1), B(false)}, kF32, {2, 3},
          {kL1, kL2, kL3, kL1, kL2, kL3});
  // Over dim 0 of [[1, 2], [3, 4]]: log(1 / (1 + e^2)) = -2.1269280110429722
  // and log(e^2 / (1 + e^2)) = -0.12692801104297238.
  CheckOp("aten._log_softmax.default", {F32({2, 2}, {1, 2, 3, 4})},
          {In(0), I(0), B(false)}, kF32, {2, 2},
          {-2.1269280110429722, -2.1269280110429722, -0.12692801104297238,
           -0.12692801104297238});
  // Large inputs stay finite.
  CheckOp("aten._log_softmax.default", {F32({3}, {1001, 1002, 1003})},
          {In(0), I(0), B(false)}, kF32, {3}, {kL1, kL2, kL3}, 1e-5);
  CheckOp("aten._log_softmax.default", {F32({2}, {0, -kInf})},
          {In(0), I(0), B(false)}, kF32, {2}, {0, -kInf});
}

TEST(CompositeLogSoftmax, HalfToFloat) {
  // float16: spacing 2^-9 on [2, 4), 2^-10 on [1, 2), 2^-12 on [0.25, 0.5).
  CheckOp("aten._log_softmax.default", {F16({3}, {1, 2, 3})},
          {In(0), I(0), B(false)}, kF16, {3},
          {-2.408203125, -1.4072265625, -0.40771484375}, 0);
  CheckOp("aten._log_softmax.default", {F16({3}, {1, 2, 3})},
          {In(0), I(-1), B(true)}, kF32, {3}, {kL1, kL2, kL3});
  ExpectInvalid("aten._log_softmax.default", {F32({3}, {1, 2, 3})},
                {In(0), I(0), B(true)}, {"half_to_float"});
  ExpectInvalid("aten._log_softmax.default", {BF16({1}, {0})},
                {In(0), I(0), B(true)}, {"half_to_float"});
  ExpectInvalid("aten._log_softmax.default", {Bool({2}, {1, 0})},
                {In(0), I(0), B(false)});
}

// ---- native_layer_norm ----

// Row [1, 2, 3]: mean 2, biased variance 2/3; with eps 1e-5,
// rstd = 1 / sqrt(2/3 + 1e-5).
constexpr double kRstdRow = 1.2247356859083902;
// Row [4, 4, 4]: variance 0, rstd = 1 / sqrt(1e-5).
constexpr double kRstdFlat = 316.2277660168379;

TEST(CompositeLayerNorm, WithoutWeightAndBias) {
  auto r = RunTracked("aten.native_layer_norm.default",
                      {F32({2, 3}, {1, 2, 3, 4, 4, 4})},
                      {In(0), Ints({3}), NoneArg(), NoneArg(), F(1e-5)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {2, 3}, {-kRstdRow, 0, kRstdRow, 0, 0, 0});
  ExpectOutput(*r, 1, kF32, {2, 1}, {2, 4});
  ExpectOutput(*r, 2, kF32, {2, 1}, {kRstdRow, kRstdFlat});
}

TEST(CompositeLayerNorm, WithWeightAndBias) {
  // out = (x - mean) * rstd * weight + bias.
  auto r = RunTracked("aten.native_layer_norm.default",
                      {F32({2, 3}, {1, 2, 3, 4, 4, 4}), F32({3}, {1, 2, 0.5}),
                       F32({3}, {0, 1, -1})},
                      {In(0), Ints({3}), In(1), In(2), F(1e-5)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {2, 3},
               {-kRstdRow, 1, 0.5 * kRstdRow - 1, 0, 1, -1});
  ExpectOutput(*r, 1, kF32, {2, 1}, {2, 4});
  ExpectOutput(*r, 2, kF32, {2, 1}, {kRstdRow, kRstdFlat});
  // Weight only, and bias only.
  r = RunTracked("aten.native_layer_norm.default",
                 {F32({1, 3}, {1, 2, 3}), F32({3}, {2, 2, 2})},
                 {In(0), Ints({3}), In(1), NoneArg(), F(1e-5)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 3}, {-2 * kRstdRow, 0, 2 * kRstdRow});
  r = RunTracked("aten.native_layer_norm.default",
                 {F32({1, 3}, {1, 2, 3}), F32({3}, {10, 20, 30})},
                 {In(0), Ints({3}), NoneArg(), In(1), F(1e-5)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 3}, {10 - kRstdRow, 20, 30 + kRstdRow});
}

TEST(CompositeLayerNorm, SeveralNormalizedDims) {
  // [2, 2, 2] = 0..7 normalised over the last two dims with eps 0: groups
  // [0, 1, 2, 3] and [4, 5, 6, 7], means 1.5 and 5.5, variance 1.25, rstd
  // 1 / sqrt(1.25) = 0.8944271909999159; (x - mean) * rstd = +-1.5 * rstd
  // (1.3416407864998738) and +-0.5 * rstd (0.4472135954999579).
  constexpr double a = 1.3416407864998738, b = 0.4472135954999579;
  constexpr double rstd = 0.8944271909999159;
  auto r = RunTracked("aten.native_layer_norm.default",
                      {F32({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7})},
                      {In(0), Ints({2, 2}), NoneArg(), NoneArg(), F(0)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {2, 2, 2}, {-a, -b, b, a, -a, -b, b, a});
  // mean/rstd: input.shape[:1] + [1, 1].
  ExpectOutput(*r, 1, kF32, {2, 1, 1}, {1.5, 5.5});
  ExpectOutput(*r, 2, kF32, {2, 1, 1}, {rstd, rstd});
  // Over every dim: one group of 8, mean 3.5, variance 5.25.
  r = RunTracked("aten.native_layer_norm.default",
                 {F32({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7})},
                 {In(0), Ints({2, 2, 2}), NoneArg(), NoneArg(), I(0)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sizes(1), (std::vector<int64_t>{1, 1, 1}));
  ExpectOutput(*r, 1, kF32, {1, 1, 1}, {3.5});
  ExpectOutput(*r, 2, kF32, {1, 1, 1}, {0.4364357804719848});
}

TEST(CompositeLayerNorm, NonContiguousAndHalfInputs) {
  // TransposedView of [[1, 2, 3], [4, 5, 6]] is [[1, 4], [2, 5], [3, 6]]:
  // every row has variance 2.25, rstd 1 / 1.5 (eps 0), out [-1, 1].
  auto r = RunTracked("aten.native_layer_norm.default",
                      {TransposedView(F32({2, 3}, {1, 2, 3, 4, 5, 6}))},
                      {In(0), Ints({2}), NoneArg(), NoneArg(), F(0)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {3, 2}, {-1, 1, -1, 1, -1, 1});
  ExpectOutput(*r, 1, kF32, {3, 1}, {2.5, 3.5, 4.5});
  ExpectOutput(*r, 2, kF32, {3, 1}, {2.0 / 3, 2.0 / 3, 2.0 / 3});
  // float16 input: float16 output, float32 statistics.
  r = RunTracked("aten.native_layer_norm.default",
                 {F16({1, 2}, {1, 4}), F16({2}, {1, 1}), F16({2}, {0, 0.5})},
                 {In(0), Ints({2}), In(1), In(2), F(0)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF16, {1, 2}, {-1, 1.5}, 0);
  ExpectOutput(*r, 1, kF32, {1, 1}, {2.5});
  ExpectOutput(*r, 2, kF32, {1, 1}, {2.0 / 3});
}

TEST(CompositeLayerNorm, Errors) {
  const HostTensor x = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  ExpectInvalid(
      "aten.native_layer_norm.default", {x},
      {In(0), Ints({2}), NoneArg(), NoneArg(), F(1e-5)},
      {"node 0", "aten.native_layer_norm.default", "normalized_shape"});
  ExpectInvalid("aten.native_layer_norm.default", {x},
                {In(0), Ints({1, 2, 3}), NoneArg(), NoneArg(), F(1e-5)});
  ExpectInvalid("aten.native_layer_norm.default", {x, F32({2}, {1, 1})},
                {In(0), Ints({3}), In(1), NoneArg(), F(1e-5)}, {"weight"});
  ExpectInvalid("aten.native_layer_norm.default", {x, F16({3}, {1, 1, 1})},
                {In(0), Ints({3}), NoneArg(), In(1), F(1e-5)}, {"bias"});
  ExpectInvalid("aten.native_layer_norm.default", {I32({1, 2}, {1, 2})},
                {In(0), Ints({2}), NoneArg(), NoneArg(), F(1e-5)}, {"int32"});
}

}  // namespace
}  // namespace kiln::testing
