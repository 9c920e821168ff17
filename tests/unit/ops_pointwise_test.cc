// Per-op tests of the pointwise ops (graph/ops/pointwise.cc, compiler/ops/pointwise_*.cc): output
// dtype (PyTorch type promotion, incl. Scalar overloads and 0-d tensors),
// output shape (broadcasting) and reference values against numbers worked
// out by hand. Also home of the registry coverage check.
#include <cmath>
#include <set>
#include <string>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing {
namespace {

[[maybe_unused]] ::testing::Environment* const kCoverage =
    RegisterCoverage("pointwise", PointwiseSuiteOps());

// Hand-worked constants.
constexpr double kE = 2.718281828459045;
constexpr double kLn2 = 0.6931471805599453;
constexpr double kSqrt2 = 1.4142135623730951;
constexpr double kPi = 3.141592653589793;

// ---- registry coverage (the one check over all suites' lists) ----

TEST(OpCoverage, EveryRegisteredOpIsCovered) {
  std::set<std::string> covered;
  for (const auto* list :
       {&PointwiseSuiteOps(), &ReductionSuiteOps(), &ShapeSuiteOps(),
        &CompositeSuiteOps(), &NormSuiteOps(), &IndexingSuiteOps(),
        &MatmulSuiteOps(), &ConvSuiteOps(), &AttentionSuiteOps(),
        &RandomSuiteOps(), &SortSuiteOps()}) {
    for (const std::string& op : *list) {
      EXPECT_TRUE(covered.insert(op).second) << op << " is listed twice";
    }
  }
  const std::vector<std::string> names = OpSignatures::Get().Names();
  for (const std::string& name : names) {
    EXPECT_TRUE(covered.count(name))
        << name << " is registered but no ops_*_test.cc suite lists it "
        << "(tests/unit/ops_test_util.h)";
  }
  const std::set<std::string> registered(names.begin(), names.end());
  for (const std::string& op : covered) {
    EXPECT_TRUE(registered.count(op)) << op << " is listed but not registered";
  }
}

// ---- unary ops with floating results ----

TEST(PointwiseUnary, Exp) {
  CheckOp("aten.exp.default", {F32({3}, {0, 1, -1})}, {In(0)}, kF32, {3},
          {1, kE, 0.36787944117144233});
  // Integral inputs compute in the default float dtype.
  CheckOp("aten.exp.default", {I32({2}, {0, 1})}, {In(0)}, kF32, {2}, {1, kE});
  CheckOp("aten.exp.default", {Bool({2}, {1, 0})}, {In(0)}, kF32, {2}, {kE, 1});
  // e rounds to 2.71875 in float16 (spacing 2^-9 on [2, 4)) and in
  // bfloat16 (spacing 2^-6).
  CheckOp("aten.exp.default", {F16({1}, {1})}, {In(0)}, kF16, {1}, {2.71875},
          0);
  CheckOp("aten.exp.default", {BF16({1}, {1})}, {In(0)}, kBF16, {1}, {2.71875},
          0);
}

TEST(PointwiseUnary, ExpOverNonContiguousInput) {
  HostTensor base = F32({2, 3}, {0, 1, 2, -1, 0, 1});
  // [[0, -1], [1, 0], [2, 1]]
  CheckOp("aten.exp.default", {TransposedView(base)}, {In(0)}, kF32, {3, 2},
          {1, 0.36787944117144233, kE, 1, 7.38905609893065, kE});
}

TEST(PointwiseUnary, EmptyInputs) {
  CheckOp("aten.exp.default", {F32({0, 2}, {})}, {In(0)}, kF32, {0, 2}, {});
  CheckOp("aten.neg.default", {I64({0}, {})}, {In(0)}, kI64, {0}, {});
  CheckOp("aten.add.Tensor", {F32({0}, {}), F32({}, {1})}, {In(0), In(1)}, kF32,
          {0}, {});
  CheckOp("aten.lt.Scalar", {I32({2, 0}, {})}, {In(0), F(0.5)}, kBool, {2, 0},
          {});
}

TEST(PointwiseUnary, Exp2Expm1) {
  CheckOp("aten.exp2.default", {F32({3}, {0, 3, -1})}, {In(0)}, kF32, {3},
          {1, 8, 0.5});
  CheckOp("aten.exp2.default", {I64({1}, {10})}, {In(0)}, kF32, {1}, {1024});
  CheckOp("aten.expm1.default", {F32({3}, {0, 1, -1})}, {In(0)}, kF32, {3},
          {0, kE - 1, 0.36787944117144233 - 1});
}

TEST(PointwiseUnary, Logs) {
  CheckOp("aten.log.default", {F32({4}, {1, 0.5, 0, -1})}, {In(0)}, kF32, {4},
          {0, -kLn2, -kInf, kNaN});
  CheckOp("aten.log.default", {I32({1}, {1})}, {In(0)}, kF32, {1}, {0});
  CheckOp("aten.log2.default", {F32({4}, {1, 8, 0.5, 0})}, {In(0)}, kF32, {4},
          {0, 3, -1, -kInf});
  CheckOp("aten.log1p.default", {F32({3}, {0, 1, -1})}, {In(0)}, kF32, {3},
          {0, kLn2, -kInf});
}

TEST(PointwiseUnary, SqrtRsqrtReciprocal) {
  CheckOp("aten.sqrt.default", {F32({4}, {4, 2, 0, -1})}, {In(0)}, kF32, {4},
          {2, kSqrt2, 0, kNaN});
  // sqrt(2) = 1.41421356...: float16 has spacing 2^-10 on [1, 2), so
  // 1448 * 2^-10 = 1.4140625; bfloat16 (spacing 2^-7) 181 * 2^-7, the same.
  CheckOp("aten.sqrt.default", {F16({1}, {2})}, {In(0)}, kF16, {1}, {1.4140625},
          0);
  CheckOp("aten.sqrt.default", {BF16({1}, {2})}, {In(0)}, kBF16, {1},
          {1.4140625}, 0);
  CheckOp("aten.sqrt.default", {I64({2}, {9, 16})}, {In(0)}, kF32, {2}, {3, 4});
  CheckOp("aten.rsqrt.default", {F32({3}, {4, 0.25, 0})}, {In(0)}, kF32, {3},
          {0.5, 2, kInf});
  CheckOp("aten.reciprocal.default", {F32({4}, {2, -4, 0, 0.5})}, {In(0)}, kF32,
          {4}, {0.5, -0.25, kInf, 2});
  CheckOp("aten.reciprocal.default", {I32({2}, {4, -2})}, {In(0)}, kF32, {2},
          {0.25, -0.5});
}

TEST(PointwiseUnary, Trig) {
  CheckOp("aten.sin.default", {F32({3}, {0, 0.5, -0.5})}, {In(0)}, kF32, {3},
          {0, 0.479425538604203, -0.479425538604203});
  CheckOp("aten.cos.default", {F32({2}, {0, 0.5})}, {In(0)}, kF32, {2},
          {1, 0.8775825618903728});
  CheckOp("aten.tan.default", {F32({2}, {0, 0.5})}, {In(0)}, kF32, {2},
          {0, 0.5463024898437905});
  CheckOp("aten.tanh.default", {F32({3}, {0, 0.5, -1})}, {In(0)}, kF32, {3},
          {0, 0.46211715726000974, -0.7615941559557649});
  CheckOp("aten.sin.default", {I32({1}, {0})}, {In(0)}, kF32, {1}, {0});
}

TEST(PointwiseUnary, SigmoidErf) {
  CheckOp("aten.sigmoid.default", {F32({3}, {0, 1, -1})}, {In(0)}, kF32, {3},
          {0.5, 0.7310585786300049, 0.2689414213699951});
  CheckOp("aten.erf.default", {F32({4}, {0, 0.5, -1, kInf})}, {In(0)}, kF32,
          {4}, {0, 0.5204998778130465, -0.8427007929497149, 1});
}

// ---- unary ops keeping the dtype ----

TEST(PointwiseUnary, AbsNeg) {
  CheckOp("aten.abs.default", {F32({3}, {-1.5, 2, -0.0})}, {In(0)}, kF32, {3},
          {1.5, 2, 0});
  CheckOp("aten.abs.default", {I32({2}, {-3, 4})}, {In(0)}, kI32, {2}, {3, 4});
  CheckOp("aten.neg.default", {F32({2}, {1.5, -2})}, {In(0)}, kF32, {2},
          {-1.5, 2});
  CheckOp("aten.neg.default", {I64({2}, {3, 0})}, {In(0)}, kI64, {2}, {-3, 0});
  // PyTorch: "Negation, the `-` operator, on a bool tensor is not supported."
  ExpectInvalid("aten.neg.default", {Bool({1}, {1})}, {In(0)}, {"bool"});
  ExpectInvalid("aten.abs.default", {Bool({1}, {1})}, {In(0)}, {"bool"});
}

TEST(PointwiseUnary, Relu) {
  CheckOp("aten.relu.default", {F32({4}, {-1, 0, 2.5, kNaN})}, {In(0)}, kF32,
          {4}, {0, 0, 2.5, kNaN});
  CheckOp("aten.relu.default", {I32({2}, {-2, 3})}, {In(0)}, kI32, {2}, {0, 3});
}

TEST(PointwiseUnary, Rounding) {
  CheckOp("aten.floor.default", {F32({3}, {1.5, -1.5, 2})}, {In(0)}, kF32, {3},
          {1, -2, 2});
  CheckOp("aten.floor.default", {I32({1}, {-7})}, {In(0)}, kI32, {1}, {-7});
  CheckOp("aten.ceil.default", {F32({3}, {1.5, -1.5, 2})}, {In(0)}, kF32, {3},
          {2, -1, 2});
  CheckOp("aten.ceil.default", {I64({1}, {5})}, {In(0)}, kI64, {1}, {5});
  // Half to even.
  CheckOp("aten.round.default", {F32({5}, {0.5, 1.5, 2.5, -0.5, -1.75})},
          {In(0)}, kF32, {5}, {0, 2, 2, 0, -2});
  CheckOp("aten.round.default", {I32({1}, {3})}, {In(0)}, kI32, {1}, {3});
  CheckOp("aten.trunc.default", {F32({2}, {1.75, -1.75})}, {In(0)}, kF32, {2},
          {1, -1});
  CheckOp("aten.trunc.default", {I64({1}, {-3})}, {In(0)}, kI64, {1}, {-3});
}

TEST(PointwiseUnary, Sign) {
  CheckOp("aten.sign.default", {F32({4}, {-2, 0, 3.5, kNaN})}, {In(0)}, kF32,
          {4}, {-1, 0, 1, 0});
  CheckOp("aten.sign.default", {I32({3}, {-5, 0, 7})}, {In(0)}, kI32, {3},
          {-1, 0, 1});
  CheckOp("aten.sign.default", {Bool({2}, {1, 0})}, {In(0)}, kBool, {2},
          {1, 0});
}

TEST(PointwiseUnary, LogicalNotIsnanBitwiseNot) {
  // NaN is truthy: logical_not(NaN) is false.
  CheckOp("aten.logical_not.default", {F32({3}, {0, 2, kNaN})}, {In(0)}, kBool,
          {3}, {1, 0, 0});
  CheckOp("aten.logical_not.default", {I32({2}, {0, -3})}, {In(0)}, kBool, {2},
          {1, 0});
  CheckOp("aten.logical_not.default", {Bool({2}, {1, 0})}, {In(0)}, kBool, {2},
          {0, 1});
  CheckOp("aten.isnan.default", {F32({3}, {kNaN, 1, kInf})}, {In(0)}, kBool,
          {3}, {1, 0, 0});
  CheckOp("aten.isnan.default", {I64({2}, {0, 1})}, {In(0)}, kBool, {2},
          {0, 0});
  CheckOp("aten.bitwise_not.default", {I32({3}, {0, 5, -1})}, {In(0)}, kI32,
          {3}, {-1, -6, 0});
  CheckOp("aten.bitwise_not.default", {Bool({2}, {1, 0})}, {In(0)}, kBool, {2},
          {0, 1});
  ExpectInvalid("aten.bitwise_not.default", {F32({1}, {1})}, {In(0)});
}

// ---- add / sub ----

TEST(PointwiseAdd, TensorWithAlpha) {
  CheckOp("aten.add.Tensor", {F32({3}, {1, 2, 3}), F32({3}, {10, 20, 30})},
          {In(0), In(1)}, kF32, {3}, {11, 22, 33});
  CheckOp("aten.add.Tensor", {F32({2}, {1, 2}), F32({2}, {0.5, -1})},
          {In(0), In(1), Kw("alpha", F(2.5))}, kF32, {2}, {2.25, -0.5});
  CheckOp("aten.add.Tensor", {I64({2}, {1, 2}), I64({2}, {3, 4})},
          {In(0), In(1), Kw("alpha", I(-2))}, kI64, {2}, {-5, -6});
  // bool tensors take an int or a bool alpha; only bool results take a bool
  // alpha (PyTorch's alpha_check).
  CheckOp("aten.add.Tensor", {Bool({2}, {0, 0}), Bool({2}, {1, 0})},
          {In(0), In(1), Kw("alpha", B(true))}, kBool, {2}, {1, 0});
  CheckOp("aten.add.Tensor", {Bool({2}, {0, 1}), Bool({2}, {1, 0})},
          {In(0), In(1), Kw("alpha", I(2))}, kBool, {2}, {1, 1});
  ExpectInvalid("aten.add.Tensor", {F32({1}, {1}), F32({1}, {1})},
                {In(0), In(1), Kw("alpha", B(true))}, {"bool alpha"});
  // Integral tensors take no float alpha.
  ExpectInvalid("aten.add.Tensor", {I32({1}, {1}), I32({1}, {1})},
                {In(0), In(1), Kw("alpha", F(0.5))}, {"alpha"});
}

TEST(PointwiseAdd, Broadcasting) {
  // [3, 1] with [1, 4] -> [3, 4].
  CheckOp("aten.add.Tensor",
          {F32({3, 1}, {0, 10, 20}), F32({1, 4}, {1, 2, 3, 4})}, {In(0), In(1)},
          kF32, {3, 4}, {1, 2, 3, 4, 11, 12, 13, 14, 21, 22, 23, 24});
  // Rank mismatch: [2, 3] with [3] -> [2, 3]; [3] with [2, 1, 1] ->
  // [2, 1, 3].
  CheckOp("aten.add.Tensor",
          {F32({2, 3}, {1, 2, 3, 4, 5, 6}), F32({3}, {10, 20, 30})},
          {In(0), In(1)}, kF32, {2, 3}, {11, 22, 33, 14, 25, 36});
  CheckOp("aten.add.Tensor", {F32({3}, {1, 2, 3}), F32({2, 1, 1}, {0, 100})},
          {In(0), In(1)}, kF32, {2, 1, 3}, {1, 2, 3, 101, 102, 103});
  // A 0-d tensor broadcasts to anything.
  CheckOp("aten.add.Tensor", {F32({2}, {1, 2}), F32({}, {5})}, {In(0), In(1)},
          kF32, {2}, {6, 7});
  // Size-0 dims broadcast with 1 and give empty results.
  CheckOp("aten.add.Tensor", {F32({0, 3}, {}), F32({1, 3}, {1, 2, 3})},
          {In(0), In(1)}, kF32, {0, 3}, {});
  ExpectInvalid("aten.add.Tensor", {F32({3}, {1, 2, 3}), F32({4}, {})},
                {In(0), In(1)}, {"node 0", "aten.add.Tensor", "broadcast"});
  ExpectInvalid("aten.add.Tensor", {F32({2, 3}, {}), F32({3, 2}, {})},
                {In(0), In(1)}, {"node 0", "aten.add.Tensor", "broadcast"});
}

TEST(PointwiseAdd, NonContiguousInputs) {
  // TransposedView: [[1, 4], [2, 5], [3, 6]].
  HostTensor base = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  CheckOp("aten.add.Tensor",
          {TransposedView(base), F32({3, 2}, {10, 20, 30, 40, 50, 60})},
          {In(0), In(1)}, kF32, {3, 2}, {11, 24, 32, 45, 53, 66});
  // A stride-0 (expanded) input: [1, 2, 3] repeated over 2 rows.
  HostTensor row = F32({3}, {1, 2, 3});
  HostTensor expanded = HostTensor::View(row, {2, 3}, {0, 1}, 0);
  CheckOp("aten.add.Tensor", {expanded, F32({2, 3}, {10, 20, 30, 40, 50, 60})},
          {In(0), In(1)}, kF32, {2, 3}, {11, 22, 33, 41, 52, 63});
  // A view with an offset and a step: elements 1, 3, 5 of 0..5.
  HostTensor strided =
      HostTensor::View(F32({6}, {0, 1, 2, 3, 4, 5}), {3}, {2}, 1);
  CheckOp("aten.add.Scalar", {strided}, {In(0), F(0.5)}, kF32, {3},
          {1.5, 3.5, 5.5});
}

TEST(PointwiseAdd, TypePromotion) {
  // int32 tensor + float scalar -> float32.
  CheckOp("aten.add.Tensor", {I32({2}, {1, 2})}, {In(0), F(0.5)}, kF32, {2},
          {1.5, 2.5});
  // int64 tensor + int scalar -> int64.
  CheckOp("aten.add.Tensor", {I64({2}, {1, 2})}, {In(0), I(3)}, kI64, {2},
          {4, 5});
  // int32 tensor + int scalar stays int32 (scalars do not widen).
  CheckOp("aten.add.Tensor", {I32({1}, {1})}, {In(0), I(3)}, kI32, {1}, {4});
  // float16 tensor + float32 0-d tensor -> float16.
  CheckOp("aten.add.Tensor", {F16({2}, {1, 2}), F32({}, {0.5})}, {In(0), In(1)},
          kF16, {2}, {1.5, 2.5});
  // float16 + bfloat16 -> float32.
  CheckOp("aten.add.Tensor", {F16({1}, {1}), BF16({1}, {2})}, {In(0), In(1)},
          kF32, {1}, {3});
  // bool + bool -> bool (True + True is True).
  CheckOp("aten.add.Tensor", {Bool({3}, {1, 1, 0}), Bool({3}, {1, 0, 0})},
          {In(0), In(1)}, kBool, {3}, {1, 1, 0});
  // int32 tensor + int64 0-d tensor -> int32.
  CheckOp("aten.add.Tensor", {I32({2}, {1, 2}), I64({}, {10})}, {In(0), In(1)},
          kI32, {2}, {11, 12});
  // int32 + int64 1-d (even of size 1) -> int64.
  CheckOp("aten.add.Tensor", {I32({2}, {1, 2}), I64({1}, {10})}, {In(0), In(1)},
          kI64, {2}, {11, 12});
  // A 0-d tensor of a higher category still wins: int32 + float32 0-d.
  CheckOp("aten.add.Tensor", {I32({1}, {1}), F32({}, {0.5})}, {In(0), In(1)},
          kF32, {1}, {1.5});
  // bool tensor + int scalar -> int64.
  CheckOp("aten.add.Tensor", {Bool({2}, {1, 0})}, {In(0), I(3)}, kI64, {2},
          {4, 3});
  // float16 tensor + float scalar stays float16.
  CheckOp("aten.add.Tensor", {F16({1}, {1})}, {In(0), F(0.25)}, kF16, {1},
          {1.25});
  // All operands 0-d: they promote among themselves (float16 with a 0-d
  // float32 -> float32), and a float scalar still lifts an int 0-d tensor.
  CheckOp("aten.add.Tensor", {F16({}, {1}), F32({}, {0.5})}, {In(0), In(1)},
          kF32, {}, {1.5});
  CheckOp("aten.add.Tensor", {I32({}, {1})}, {In(0), F(0.5)}, kF32, {}, {1.5});
  CheckOp("aten.mul.Tensor", {I64({}, {3}), I32({2}, {1, 2})}, {In(0), In(1)},
          kI32, {2}, {3, 6});
  // int32 wraps around.
  CheckOp("aten.add.Tensor", {I32({1}, {2147483647})}, {In(0), I(1)}, kI32, {1},
          {-2147483648.0});
}

TEST(PointwiseAdd, HalfPrecisionRounding) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even give 1.
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: gives the
  // latter (even mantissa).
  CheckOp("aten.add.Tensor",
          {F16({2}, {1, 1}), F16({2}, {0.00048828125, 0.00146484375})},
          {In(0), In(1)}, kF16, {2}, {1, 1.001953125}, 0);
  // bfloat16 keeps 8 significant bits: 1 + 2^-8 rounds to 1 (tie, even).
  CheckOp("aten.add.Tensor", {BF16({1}, {1}), BF16({1}, {0.00390625})},
          {In(0), In(1)}, kBF16, {1}, {1}, 0);
}

TEST(PointwiseAdd, ScalarOverload) {
  CheckOp("aten.add.Scalar", {F32({2}, {1, 2})}, {In(0), F(0.5)}, kF32, {2},
          {1.5, 2.5});
  CheckOp("aten.add.Scalar", {I32({2}, {1, 2})}, {In(0), I(3)}, kI32, {2},
          {4, 5});
  CheckOp("aten.add.Scalar", {I32({1}, {1})}, {In(0), F(0.5)}, kF32, {1},
          {1.5});
  CheckOp("aten.add.Scalar", {F32({1}, {1})}, {In(0), I(2), Kw("alpha", I(3))},
          kF32, {1}, {7});
}

TEST(PointwiseSub, TensorAndScalar) {
  CheckOp("aten.sub.Tensor", {F32({2}, {5, 3}), F32({2}, {1, 4})},
          {In(0), In(1), Kw("alpha", I(2))}, kF32, {2}, {3, -5});
  CheckOp("aten.sub.Tensor", {I32({2, 1}, {10, 20}), I32({2}, {1, 2})},
          {In(0), In(1)}, kI32, {2, 2}, {9, 8, 19, 18});
  CheckOp("aten.sub.Scalar", {I64({2}, {5, -5})}, {In(0), I(2)}, kI64, {2},
          {3, -7});
  CheckOp("aten.sub.Scalar", {I64({1}, {5})}, {In(0), F(0.5)}, kF32, {1},
          {4.5});
  // PyTorch rejects a bool operand on either side of a subtraction.
  ExpectInvalid("aten.sub.Tensor", {Bool({1}, {1}), Bool({1}, {0})},
                {In(0), In(1)}, {"bool"});
  ExpectInvalid("aten.sub.Tensor", {I32({1}, {1}), Bool({1}, {0})},
                {In(0), In(1)}, {"bool"});
  ExpectInvalid("aten.sub.Tensor", {F32({1}, {1})}, {In(0), B(true)}, {"bool"});
  ExpectInvalid("aten.sub.Scalar", {Bool({1}, {1})}, {In(0), I(1)}, {"bool"});
}

// ---- mul / div / remainder / fmod ----

TEST(PointwiseMul, TensorAndScalar) {
  CheckOp("aten.mul.Tensor", {F32({2}, {2, 3}), F32({2}, {4, -0.5})},
          {In(0), In(1)}, kF32, {2}, {8, -1.5});
  CheckOp("aten.mul.Tensor", {Bool({3}, {1, 1, 0}), Bool({3}, {1, 0, 1})},
          {In(0), In(1)}, kBool, {3}, {1, 0, 0});
  CheckOp("aten.mul.Tensor", {I32({2}, {3, -4})}, {In(0), I(2)}, kI32, {2},
          {6, -8});
  CheckOp("aten.mul.Scalar", {I32({1}, {3})}, {In(0), I(2)}, kI32, {1}, {6});
  CheckOp("aten.mul.Scalar", {I32({1}, {3})}, {In(0), F(1.5)}, kF32, {1},
          {4.5});
}

TEST(PointwiseDiv, TrueDivision) {
  // Integral inputs divide in the default float dtype.
  CheckOp("aten.div.Tensor", {I32({2}, {7, -7}), I32({2}, {2, 2})},
          {In(0), In(1)}, kF32, {2}, {3.5, -3.5});
  CheckOp("aten.div.Tensor", {F32({3}, {1, -1, 0}), F32({}, {0})},
          {In(0), In(1)}, kF32, {3}, {kInf, -kInf, kNaN});
  CheckOp("aten.div.Tensor", {F16({1}, {1}), F32({}, {4})}, {In(0), In(1)},
          kF16, {1}, {0.25});
  CheckOp("aten.div.Scalar", {F32({1}, {3})}, {In(0), I(2)}, kF32, {1}, {1.5});
  CheckOp("aten.div.Scalar", {I64({1}, {1})}, {In(0), I(4)}, kF32, {1}, {0.25});
}

TEST(PointwiseDiv, RoundingModes) {
  // floor on ints keeps int64 and floors toward -inf: -7 // 2 = -4.
  CheckOp("aten.div.Tensor_mode", {I64({3}, {-7, 7, 6}), I64({3}, {2, 2, -4})},
          {In(0), In(1), Kw("rounding_mode", S("floor"))}, kI64, {3},
          {-4, 3, -2});
  // trunc rounds toward zero: -7 / 2 -> -3.
  CheckOp("aten.div.Tensor_mode", {I64({3}, {-7, 7, 6}), I64({3}, {2, 2, -4})},
          {In(0), In(1), Kw("rounding_mode", S("trunc"))}, kI64, {3},
          {-3, 3, -1});
  CheckOp("aten.div.Tensor_mode", {I32({1}, {-7}), I32({1}, {2})},
          {In(0), In(1), Kw("rounding_mode", S("floor"))}, kI32, {1}, {-4});
  // Floats: floor(-7.5 / 2) = -4, trunc = -3; by -2: floor(3.75)=3.
  CheckOp("aten.div.Tensor_mode", {F32({2}, {-7.5, -7.5}), F32({2}, {2, -2})},
          {In(0), In(1), Kw("rounding_mode", S("floor"))}, kF32, {2}, {-4, 3});
  CheckOp("aten.div.Tensor_mode", {F32({2}, {-7.5, -7.5}), F32({2}, {2, -2})},
          {In(0), In(1), Kw("rounding_mode", S("trunc"))}, kF32, {2}, {-3, 3});
  // rounding_mode None is true division, also for ints.
  CheckOp("aten.div.Tensor_mode", {I64({1}, {-7}), I64({1}, {2})},
          {In(0), In(1), Kw("rounding_mode", NoneArg())}, kF32, {1}, {-3.5});
  CheckOp("aten.div.Scalar_mode", {I64({2}, {-7, 7})},
          {In(0), I(2), Kw("rounding_mode", S("floor"))}, kI64, {2}, {-4, 3});
  CheckOp("aten.div.Scalar_mode", {I64({1}, {-7})},
          {In(0), I(2), Kw("rounding_mode", S("trunc"))}, kI64, {1}, {-3});
  CheckOp("aten.div.Scalar_mode", {I64({1}, {-7})},
          {In(0), F(2), Kw("rounding_mode", S("floor"))}, kF32, {1}, {-4});
  ExpectInvalid("aten.div.Tensor_mode", {F32({1}, {1}), F32({1}, {1})},
                {In(0), In(1), Kw("rounding_mode", S("round"))},
                {"rounding_mode"});
}

TEST(PointwiseRemainder, PythonSignVersusFmod) {
  // remainder takes the divisor's sign (Python %), fmod the dividend's.
  CheckOp("aten.remainder.Tensor",
          {I64({4}, {-7, 7, -7, 7}), I64({4}, {2, -2, -2, 2})}, {In(0), In(1)},
          kI64, {4}, {1, -1, -1, 1});
  CheckOp("aten.remainder.Tensor", {F32({2}, {-7.5, 7.5}), F32({}, {2})},
          {In(0), In(1)}, kF32, {2}, {0.5, 1.5});
  CheckOp("aten.remainder.Scalar", {I64({1}, {-7})}, {In(0), I(2)}, kI64, {1},
          {1});
  CheckOp("aten.remainder.Scalar", {I32({1}, {-7})}, {In(0), F(2.5)}, kF32, {1},
          {0.5});
  CheckOp("aten.fmod.Tensor",
          {I64({4}, {-7, 7, -7, 7}), I64({4}, {2, -2, -2, 2})}, {In(0), In(1)},
          kI64, {4}, {-1, 1, -1, 1});
  CheckOp("aten.fmod.Tensor", {F32({2}, {-7.5, 7.5}), F32({}, {2})},
          {In(0), In(1)}, kF32, {2}, {-1.5, 1.5});
  CheckOp("aten.fmod.Scalar", {I64({1}, {-7})}, {In(0), I(2)}, kI64, {1}, {-1});
  CheckOp("aten.fmod.Scalar", {F32({1}, {5.5})}, {In(0), I(2)}, kF32, {1},
          {1.5});
}

// ---- bitwise / pow / maximum / minimum / atan2 / logical ----

TEST(PointwiseBitwise, AndOr) {
  CheckOp("aten.bitwise_and.Tensor", {I32({2}, {12, 10}), I32({2}, {10, 6})},
          {In(0), In(1)}, kI32, {2}, {8, 2});
  CheckOp("aten.bitwise_and.Tensor",
          {Bool({3}, {1, 1, 0}), Bool({3}, {1, 0, 0})}, {In(0), In(1)}, kBool,
          {3}, {1, 0, 0});
  CheckOp("aten.bitwise_and.Scalar", {I64({2}, {12, -1})}, {In(0), I(10)}, kI64,
          {2}, {8, 10});
  CheckOp("aten.bitwise_or.Tensor", {I32({2}, {12, 10}), I64({2}, {10, 6})},
          {In(0), In(1)}, kI64, {2}, {14, 14});
  CheckOp("aten.bitwise_or.Scalar", {I64({1}, {12})}, {In(0), I(3)}, kI64, {1},
          {15});
  // bool tensor | int scalar -> int64.
  CheckOp("aten.bitwise_or.Scalar", {Bool({2}, {1, 0})}, {In(0), I(2)}, kI64,
          {2}, {3, 2});
}

TEST(PointwiseBitwise, FloatingInputsAreRejected) {
  // PyTorch: "bitwise_and_cpu" not implemented for 'Float'.
  ExpectInvalid("aten.bitwise_and.Tensor", {F32({1}, {1}), F32({1}, {1})},
                {In(0), In(1)});
  ExpectInvalid("aten.bitwise_or.Scalar", {I32({1}, {1})}, {In(0), F(0.5)});
}

TEST(PointwisePow, AllOverloads) {
  CheckOp("aten.pow.Tensor_Tensor",
          {F32({3}, {2, 4, 2}), F32({3}, {3, 0.5, -1})}, {In(0), In(1)}, kF32,
          {3}, {8, 2, 0.5});
  CheckOp("aten.pow.Tensor_Tensor", {I64({2}, {2, 3}), I64({2}, {10, 2})},
          {In(0), In(1)}, kI64, {2}, {1024, 9});
  CheckOp("aten.pow.Tensor_Tensor", {F32({2}, {2, 3})}, {In(0), I(2)}, kF32,
          {2}, {4, 9});
  CheckOp("aten.pow.Tensor_Scalar", {F32({2}, {2, 9})}, {In(0), F(0.5)}, kF32,
          {2}, {kSqrt2, 3});
  CheckOp("aten.pow.Tensor_Scalar", {I32({2}, {3, -2})}, {In(0), I(3)}, kI32,
          {2}, {27, -8});
  // The small integral exponents code generation writes as products (as
  // PyTorch does), with pow's values at 0, -0, inf and NaN.
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> x = {1.5, -2.0, 0.0, -0.0, inf, -inf, nan};
  struct PowCase {
    double e;
    std::vector<double> want;
  };
  for (const PowCase& c : std::vector<PowCase>{
           {1, {1.5, -2, 0, -0.0, inf, -inf, nan}},
           {2, {2.25, 4, 0, 0, inf, inf, nan}},
           {3, {3.375, -8, 0, -0.0, inf, -inf, nan}},
           {-1, {1 / 1.5, -0.5, inf, -inf, 0, -0.0, nan}},
           {-2, {1 / 2.25, 0.25, inf, inf, 0, 0, nan}}}) {
    SCOPED_TRACE(c.e);
    CheckOp("aten.pow.Tensor_Scalar", {F32({7}, x)}, {In(0), F(c.e)}, kF32,
            {7}, c.want);
  }
  CheckOp("aten.pow.Tensor_Scalar", {I32({1}, {4})}, {In(0), F(0.5)}, kF32, {1},
          {2});
  // Integral bases: a negative int Scalar exponent is an error (PyTorch:
  // "Integers to negative integer powers are not allowed."); negative
  // tensor exponents give 0, except for bases 1 and -1.
  ExpectInvalid("aten.pow.Tensor_Scalar", {I32({1}, {2})}, {In(0), I(-1)},
                {"negative integer powers"});
  CheckOp("aten.pow.Tensor_Scalar", {F32({1}, {2})}, {In(0), I(-1)}, kF32, {1},
          {0.5});
  CheckOp("aten.pow.Tensor_Scalar", {I32({1}, {4})}, {In(0), F(-0.5)}, kF32,
          {1}, {0.5});
  CheckOp("aten.pow.Tensor_Tensor",
          {I64({3}, {2, 1, -1}), I64({3}, {-1, -5, -3})}, {In(0), In(1)}, kI64,
          {3}, {0, 1, -1});
  CheckOp("aten.pow.Scalar", {F32({3}, {3, -1, 0})}, {I(2), In(0)}, kF32, {3},
          {8, 0.5, 1});
  CheckOp("aten.pow.Scalar", {I32({2}, {3, 0})}, {I(2), In(0)}, kI32, {2},
          {8, 1});
  CheckOp("aten.pow.Scalar", {I32({1}, {3})}, {F(2), In(0)}, kF32, {1}, {8});
}

TEST(PointwiseMaxMin, NanPropagatesAndPromotes) {
  CheckOp("aten.maximum.default", {F32({3}, {1, 5, kNaN}), F32({3}, {3, 2, 0})},
          {In(0), In(1)}, kF32, {3}, {3, 5, kNaN});
  CheckOp("aten.maximum.default", {I32({2}, {1, 5}), I64({2}, {3, 2})},
          {In(0), In(1)}, kI64, {2}, {3, 5});
  CheckOp("aten.minimum.default", {F32({3}, {1, 5, 0}), F32({3}, {3, 2, kNaN})},
          {In(0), In(1)}, kF32, {3}, {1, 2, kNaN});
  CheckOp("aten.minimum.default", {I32({2, 1}, {1, 5}), I32({2}, {3, 2})},
          {In(0), In(1)}, kI32, {2, 2}, {1, 1, 3, 2});
}

TEST(PointwiseAtan2, Quadrants) {
  CheckOp("aten.atan2.default", {F32({3}, {1, 0, -1}), F32({3}, {1, -1, 0})},
          {In(0), In(1)}, kF32, {3}, {kPi / 4, kPi, -kPi / 2});
  CheckOp("aten.atan2.default", {I32({1}, {1}), I32({1}, {1})}, {In(0), In(1)},
          kF32, {1}, {kPi / 4});
}

TEST(PointwiseLogical, AndOr) {
  CheckOp("aten.logical_and.default",
          {F32({3}, {0, 1, 2}), I32({3}, {1, 1, 0})}, {In(0), In(1)}, kBool,
          {3}, {0, 1, 0});
  CheckOp("aten.logical_or.default",
          {F32({3}, {0, 0, kNaN}), Bool({3}, {0, 1, 0})}, {In(0), In(1)}, kBool,
          {3}, {0, 1, 1});
  CheckOp("aten.logical_or.default", {I64({2, 1}, {0, 3}), I64({2}, {0, 0})},
          {In(0), In(1)}, kBool, {2, 2}, {0, 0, 1, 1});
}

// ---- comparisons ----

TEST(PointwiseCompare, EqNe) {
  // [2, 1] with [3] -> [2, 3].
  CheckOp("aten.eq.Tensor", {F32({2, 1}, {1, 2}), F32({3}, {1, 2, 3})},
          {In(0), In(1)}, kBool, {2, 3}, {1, 0, 0, 0, 1, 0});
  CheckOp("aten.eq.Tensor", {F32({2}, {kNaN, 1}), F32({2}, {kNaN, 1})},
          {In(0), In(1)}, kBool, {2}, {0, 1});
  CheckOp("aten.eq.Scalar", {I32({2}, {1, 2})}, {In(0), I(2)}, kBool, {2},
          {0, 1});
  CheckOp("aten.ne.Tensor", {F32({2}, {kNaN, 1}), F32({2}, {kNaN, 1})},
          {In(0), In(1)}, kBool, {2}, {1, 0});
  CheckOp("aten.ne.Scalar", {F32({2}, {1, 2})}, {In(0), F(1)}, kBool, {2},
          {0, 1});
}

TEST(PointwiseCompare, Ordering) {
  // An int tensor against a float 0-d tensor compares in float32.
  CheckOp("aten.lt.Tensor", {I32({3}, {1, 2, 3}), F32({}, {2.5})},
          {In(0), In(1)}, kBool, {3}, {1, 1, 0});
  CheckOp("aten.lt.Scalar", {I32({2}, {1, 2})}, {In(0), F(1.5)}, kBool, {2},
          {1, 0});
  CheckOp("aten.le.Tensor", {F32({3}, {1, 2, 3}), F32({3}, {2, 2, 2})},
          {In(0), In(1)}, kBool, {3}, {1, 1, 0});
  CheckOp("aten.le.Scalar", {I64({3}, {1, 2, 3})}, {In(0), I(2)}, kBool, {3},
          {1, 1, 0});
  CheckOp("aten.gt.Tensor", {F32({3}, {1, 2, 3}), F32({3}, {2, 2, 2})},
          {In(0), In(1)}, kBool, {3}, {0, 0, 1});
  CheckOp("aten.gt.Scalar", {F32({3}, {1, 3, kNaN})}, {In(0), I(2)}, kBool, {3},
          {0, 1, 0});
  CheckOp("aten.ge.Tensor", {I32({3}, {1, 2, 3}), I64({3}, {2, 2, 2})},
          {In(0), In(1)}, kBool, {3}, {0, 1, 1});
  CheckOp("aten.ge.Scalar", {I64({3}, {1, 2, 3})}, {In(0), F(2.0)}, kBool, {3},
          {0, 1, 1});
}

// ---- where / clamp ----

TEST(PointwiseWhere, Overloads) {
  const HostTensor cond = Bool({3}, {1, 0, 1});
  // where(cond, int tensor, float tensor) -> float32.
  CheckOp("aten.where.self",
          {cond, I32({3}, {1, 2, 3}), F32({3}, {10, 20, 30})},
          {In(0), In(1), In(2)}, kF32, {3}, {1, 20, 3});
  // where(cond, int tensor, float scalar) -> float32.
  CheckOp("aten.where.self", {cond, I32({3}, {1, 2, 3})},
          {In(0), In(1), F(0.5)}, kF32, {3}, {1, 0.5, 3});
  CheckOp("aten.where.ScalarOther", {cond, I32({3}, {1, 2, 3})},
          {In(0), In(1), F(0.5)}, kF32, {3}, {1, 0.5, 3});
  CheckOp("aten.where.ScalarOther", {cond, I32({3}, {1, 2, 3})},
          {In(0), In(1), I(-1)}, kI32, {3}, {1, -1, 3});
  CheckOp("aten.where.ScalarSelf", {cond, I32({3}, {7, 8, 9})},
          {In(0), F(0.5), In(1)}, kF32, {3}, {0.5, 8, 0.5});
  CheckOp("aten.where.ScalarSelf", {cond, F16({3}, {7, 8, 9})},
          {In(0), F(0.5), In(1)}, kF16, {3}, {0.5, 8, 0.5});
  // Two int scalars -> int64; a float among them -> float32.
  CheckOp("aten.where.Scalar", {cond}, {In(0), I(1), I(0)}, kI64, {3},
          {1, 0, 1});
  CheckOp("aten.where.Scalar", {cond}, {In(0), F(1.5), I(0)}, kF32, {3},
          {1.5, 0, 1.5});
}

TEST(PointwiseWhere, BroadcastsConditionAndValues) {
  // cond [3, 1], self [1, 2], other 0-d -> [3, 2].
  CheckOp("aten.where.self",
          {Bool({3, 1}, {1, 0, 1}), F32({1, 2}, {1, 2}), F32({}, {0})},
          {In(0), In(1), In(2)}, kF32, {3, 2}, {1, 2, 0, 0, 1, 2});
  // The condition does not take part in promotion; a 0-d float32 does not
  // widen float16.
  CheckOp("aten.where.self",
          {Bool({2}, {0, 1}), F16({2}, {1, 2}), F32({}, {0.5})},
          {In(0), In(1), In(2)}, kF16, {2}, {0.5, 2});
  ExpectInvalid("aten.where.self",
                {I32({2}, {0, 1}), F32({2}, {1, 2}), F32({2}, {3, 4})},
                {In(0), In(1), In(2)}, {"bool"});
  ExpectInvalid("aten.where.self",
                {Bool({3}, {0, 1, 1}), F32({2}, {1, 2}), F32({2}, {3, 4})},
                {In(0), In(1), In(2)}, {"broadcast"});
}

TEST(PointwiseClamp, ScalarBounds) {
  CheckOp("aten.clamp.default", {F32({4}, {-2, 0.5, 3, kNaN})},
          {In(0), I(-1), I(1)}, kF32, {4}, {-1, 0.5, 1, kNaN});
  CheckOp("aten.clamp.default", {F32({2}, {-2, 3})}, {In(0), F(0.5)}, kF32, {2},
          {0.5, 3});
  CheckOp("aten.clamp.default", {F32({2}, {-2, 3})}, {In(0), NoneArg(), F(0.5)},
          kF32, {2}, {-2, 0.5});
  CheckOp("aten.clamp.default", {I32({3}, {1, 3, 5})}, {In(0), I(2), I(4)},
          kI32, {3}, {2, 3, 4});
  // Bounds take part in type promotion: int tensor with a float bound.
  CheckOp("aten.clamp.default", {I32({2}, {0, 3})}, {In(0), F(0.5)}, kF32, {2},
          {0.5, 3});
  ExpectInvalid("aten.clamp.default", {F32({1}, {1})},
                {In(0), NoneArg(), NoneArg()}, {"min", "max"});
}

TEST(PointwiseClamp, TensorBoundsAndMinMax) {
  CheckOp("aten.clamp.Tensor",
          {F32({3}, {1, 5, 3}), F32({3}, {2, 2, 2}), F32({1}, {4})},
          {In(0), In(1), In(2)}, kF32, {3}, {2, 4, 3});
  CheckOp("aten.clamp.Tensor", {F32({2, 1}, {1, 5}), F32({2}, {0, 2})},
          {In(0), NoneArg(), In(1)}, kF32, {2, 2}, {0, 1, 0, 2});
  CheckOp("aten.clamp_min.default", {F32({3}, {-1, 2, kNaN})}, {In(0), I(0)},
          kF32, {3}, {0, 2, kNaN});
  CheckOp("aten.clamp_min.default", {I64({2}, {-1, 2})}, {In(0), I(0)}, kI64,
          {2}, {0, 2});
  CheckOp("aten.clamp_max.default", {F32({2}, {-1, 2})}, {In(0), F(0.5)}, kF32,
          {2}, {-1, 0.5});
  CheckOp("aten.clamp_max.default", {I32({2}, {-1, 2})}, {In(0), I(0)}, kI32,
          {2}, {-1, 0});
}

// ---- casts ----

TEST(PointwiseCast, ToCopy) {
  // float -> int truncates toward zero.
  CheckOp("aten._to_copy.default", {F32({4}, {-1.75, 1.75, 2.5, -0.5})},
          {In(0), Kw("dtype", DT(v1::INT32))}, kI32, {4}, {-1, 1, 2, 0});
  // float -> bool: nonzero is true, NaN is true.
  CheckOp("aten._to_copy.default", {F32({4}, {0, 0.5, kNaN, -0.0})},
          {In(0), Kw("dtype", DT(v1::BOOL))}, kBool, {4}, {0, 1, 1, 0});
  // 0.1 in bfloat16 is 205 * 2^-11 = 0.10009765625.
  CheckOp("aten._to_copy.default", {F32({1}, {0.1})},
          {In(0), Kw("dtype", DT(v1::BFLOAT16))}, kBF16, {1}, {0.10009765625},
          0);
  // 1 + 2^-11 rounds to 1 in float16; 65520 overflows to inf.
  CheckOp("aten._to_copy.default", {F32({2}, {1.00048828125, 65520})},
          {In(0), Kw("dtype", DT(v1::FLOAT16))}, kF16, {2}, {1, kInf}, 0);
  CheckOp("aten._to_copy.default", {I64({2}, {-3, 7})},
          {In(0), Kw("dtype", DT(v1::FLOAT32))}, kF32, {2}, {-3, 7});
  CheckOp("aten._to_copy.default", {Bool({2}, {1, 0})},
          {In(0), Kw("dtype", DT(v1::INT64))}, kI64, {2}, {1, 0});
  // No dtype: a copy; of a non-contiguous input, in logical order.
  CheckOp("aten._to_copy.default", {TransposedView(I32({2, 2}, {1, 2, 3, 4}))},
          {In(0)}, kI32, {2, 2}, {1, 3, 2, 4});
}

TEST(PointwiseCast, ConvertElementType) {
  CheckOp("prims.convert_element_type.default", {F32({3}, {-2.9, 2.9, 0.5})},
          {In(0), DT(v1::INT64)}, kI64, {3}, {-2, 2, 0});
  CheckOp("prims.convert_element_type.default", {F32({2}, {kNaN, 0})},
          {In(0), DT(v1::BOOL)}, kBool, {2}, {1, 0});
  CheckOp("prims.convert_element_type.default", {I32({2}, {5, -5})},
          {In(0), DT(v1::FLOAT16)}, kF16, {2}, {5, -5});
  // int64 -> int32 wraps.
  CheckOp("prims.convert_element_type.default", {I64({1}, {4294967297.0})},
          {In(0), DT(v1::INT32)}, kI32, {1}, {1});
}

// ---- activations ----

TEST(PointwiseActivation, Gelu) {
  // 0.5 x (1 + erf(x / sqrt 2)): erf(1/sqrt 2) = 0.6826894921370859.
  CheckOp("aten.gelu.default", {F32({3}, {0, 1, -1})}, {In(0)}, kF32, {3},
          {0, 0.8413447460685429, -0.15865525393145707});
  // tanh form at 1: 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)).
  CheckOp("aten.gelu.default", {F32({2}, {0, 1})},
          {In(0), Kw("approximate", S("tanh"))}, kF32, {2},
          {0, 0.8411919906082768});
  ExpectInvalid("aten.gelu.default", {I32({1}, {1})}, {In(0)});
  ExpectInvalid("aten.gelu.default", {F32({1}, {1})},
                {In(0), Kw("approximate", S("fast"))}, {"approximate"});
}

TEST(PointwiseActivation, LeakyReluHardtanhSilu) {
  CheckOp("aten.leaky_relu.default", {F32({3}, {-2, 0, 3})}, {In(0)}, kF32, {3},
          {-0.02, 0, 3});
  CheckOp("aten.leaky_relu.default", {F32({2}, {-2, 3})}, {In(0), F(0.25)},
          kF32, {2}, {-0.5, 3});
  CheckOp("aten.hardtanh.default", {F32({3}, {-2, 0.5, 3})}, {In(0)}, kF32, {3},
          {-1, 0.5, 1});
  CheckOp("aten.hardtanh.default", {F32({3}, {-2, 0.25, 3})},
          {In(0), F(-0.5), I(2)}, kF32, {3}, {-0.5, 0.25, 2});
  CheckOp("aten.hardtanh.default", {F16({2}, {-3, 3})}, {In(0)}, kF16, {2},
          {-1, 1});
  // Integral inputs keep their dtype; the bounds truncate toward zero
  // (PyTorch's "legacy behavior of boundaries not causing type promotion").
  CheckOp("aten.hardtanh.default", {I32({3}, {-3, 0, 3})},
          {In(0), F(-1.5), F(2.5)}, kI32, {3}, {-1, 0, 2});
  ExpectInvalid("aten.hardtanh.default", {Bool({1}, {1})}, {In(0)});
  CheckOp("aten.silu.default", {F32({3}, {0, 1, -1})}, {In(0)}, kF32, {3},
          {0, 0.7310585786300049, -0.2689414213699951});
  ExpectInvalid("aten.silu.default", {I64({1}, {1})}, {In(0)});
}

TEST(PointwiseActivation, Lerp) {
  CheckOp("aten.lerp.Scalar", {F32({2}, {0, 10}), F32({2}, {10, 20})},
          {In(0), In(1), F(0.25)}, kF32, {2}, {2.5, 12.5});
  // weight >= 0.5 uses end - (end - start) * (1 - weight): same numbers.
  CheckOp("aten.lerp.Scalar", {F32({2}, {0, 10}), F32({1}, {20})},
          {In(0), In(1), F(0.75)}, kF32, {2}, {15, 17.5});
  CheckOp("aten.lerp.Tensor",
          {F32({2}, {0, 10}), F32({2}, {10, 20}), F32({2, 1}, {0.5, 1})},
          {In(0), In(1), In(2)}, kF32, {2, 2}, {5, 15, 10, 20});
  // end must have self's dtype; weight may only promote into it (PyTorch's
  // lerp meta checks), and the result has self's dtype.
  ExpectInvalid("aten.lerp.Scalar", {F16({1}, {0}), F32({1}, {1})},
                {In(0), In(1), F(0.5)}, {"end", "float32"});
  ExpectInvalid("aten.lerp.Tensor",
                {F16({1}, {0}), F16({1}, {1}), F32({1}, {0.5})},
                {In(0), In(1), In(2)}, {"weight"});
  CheckOp("aten.lerp.Tensor",
          {F32({}, {0}), F32({}, {8}), F16({2}, {0.25, 0.5})},
          {In(0), In(1), In(2)}, kF32, {2}, {2, 4});
}

// float16 ops keep Python scalars in float32 (PyTorch's opmath): float16 3
// times 0.3 is round_half(3 * 0.3f) = 0.89990234375, not 3 * half(0.3) =
// 0.900390625.
TEST(PointwiseScalars, HalfOpsKeepScalarsInFloat32) {
  auto r = RunOp("aten.mul.Tensor", {F16({1}, {3})}, {In(0), F(0.3)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type().dtype, DType::kFloat16);
  EXPECT_EQ(r->outputs[0].GetDoubleAt(0), 0.89990234375);
}

// A Python number in the first position of a Tensor overload is a wrapped
// number, as FX passes it (aten.sub.Tensor(1, x)): it does not promote an
// integral tensor of another kind, and a float number makes an integral
// result the default float.
TEST(PointwiseBinary, NumberAsSelfOfTensorOverloads) {
  CheckOp("aten.sub.Tensor", {F32({3}, {1, 2, 0.5})}, {I(1), In(0)}, kF32, {3},
          {0, -1, 0.5});
  CheckOp("aten.sub.Tensor", {I32({2}, {5, -2})}, {I(1), In(0)}, kI32, {2},
          {-4, 3});
  CheckOp("aten.sub.Tensor", {I64({2}, {5, -2})},
          {F(1.5), In(0), Kw("alpha", I(2))}, kF32, {2}, {-8.5, 5.5});
  CheckOp("aten.add.Tensor", {BF16({2, 1}, {1, 2})},
          {F(0.5), In(0), Kw("alpha", I(3))}, kBF16, {2, 1}, {3.5, 6.5});
  CheckOp("aten.mul.Tensor", {TransposedView(M23())}, {I(2), In(0)}, kF32,
          {3, 2}, {2, 8, 4, 10, 6, 12});
  CheckOp("aten.div.Tensor", {I32({2}, {2, 4})}, {I(1), In(0)}, kF32, {2},
          {0.5, 0.25});
  CheckOp("aten.div.Tensor_mode", {I32({2}, {2, -4})},
          {I(7), In(0), Kw("rounding_mode", S("floor"))}, kI32, {2}, {3, -2});
  CheckOp("aten.remainder.Tensor", {I64({2}, {3, -3})}, {I(7), In(0)}, kI64,
          {2}, {1, -2});
  CheckOp("aten.lt.Tensor", {F32({3}, {0, 1, 2})}, {I(1), In(0)}, kBool, {3},
          {0, 0, 1});
  CheckOp("aten.bitwise_and.Tensor", {Bool({2}, {1, 0})}, {B(true), In(0)},
          kBool, {2}, {1, 0});
  CheckOp("aten.sub.Tensor", {F32({0, 2}, {})}, {I(1), In(0)}, kF32, {0, 2},
          {});
  // As for a tensor self: no bool subtraction.
  ExpectInvalid("aten.sub.Tensor", {F32({1}, {1})}, {B(true), In(0)}, {"bool"});
  // At least one tensor.
  ExpectInvalid("aten.add.Tensor", {}, {I(1), I(2)}, {"tensor"});
}

}  // namespace
}  // namespace kiln::testing
