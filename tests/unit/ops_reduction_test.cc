// Per-op tests of the reductions (graph/ops/reduction.cc, compiler/ops/reduction_*.cc): output dtype
// (sum of ints/bool -> int64, mean needs floating, arg* -> int64, any/all ->
// bool), output shape (dims incl. negative and several, keepdim, empty
// tensors) and reference values against numbers worked out by hand.
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing {
namespace {

[[maybe_unused]] ::testing::Environment* const kCoverage =
    RegisterCoverage("reduction", ReductionSuiteOps());

// ---- sum ----

TEST(ReductionSum, Default) {
  CheckOp("aten.sum.default", {M23()}, {In(0)}, kF32, {}, {21});
  // Integral and bool inputs sum in int64.
  CheckOp("aten.sum.default", {I32({3}, {1, -2, 2147483647})}, {In(0)}, kI64,
          {}, {2147483646});
  CheckOp("aten.sum.default", {Bool({3}, {1, 1, 0})}, {In(0)}, kI64, {}, {2});
  // dtype= casts first.
  CheckOp("aten.sum.default", {I32({2}, {1, 2})},
          {In(0), Kw("dtype", DT(v1::FLOAT32))}, kF32, {}, {3});
  // float -> int64 truncates each element before summing: 1 + 1 + (-1).
  CheckOp("aten.sum.default", {F32({3}, {1.5, 1.75, -1.5})},
          {In(0), Kw("dtype", DT(v1::INT64))}, kI64, {}, {1});
  // Empty: the identity.
  CheckOp("aten.sum.default", {F32({0, 3}, {})}, {In(0)}, kF32, {}, {0});
}

TEST(ReductionSum, DimsKeepdimNegative) {
  CheckOp("aten.sum.dim_IntList", {M23()}, {In(0), Ints({-1})}, kF32, {2},
          {6, 15});
  CheckOp("aten.sum.dim_IntList", {M23()}, {In(0), Ints({0}), B(true)}, kF32,
          {1, 3}, {5, 7, 9});
  CheckOp("aten.sum.dim_IntList", {M23()}, {In(0), Ints({1}), B(false)}, kF32,
          {2}, {6, 15});
  // Several dims, keepdim and not.
  CheckOp("aten.sum.dim_IntList", {M23()}, {In(0), Ints({0, -1})}, kF32, {},
          {21});
  CheckOp("aten.sum.dim_IntList", {M23()}, {In(0), Ints({-2, 1}), B(true)},
          kF32, {1, 1}, {21});
  // [2, 2, 2] = 0..7 over dims 0 and 2: [0+1+4+5, 2+3+6+7].
  CheckOp("aten.sum.dim_IntList", {I64({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7})},
          {In(0), Ints({0, 2})}, kI64, {2}, {10, 18});
  CheckOp("aten.sum.dim_IntList", {I64({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7})},
          {In(0), Ints({2, 0}), B(true)}, kI64, {1, 2, 1}, {10, 18});
  // None reduces everything.
  CheckOp("aten.sum.dim_IntList", {M23()}, {In(0), NoneArg()}, kF32, {}, {21});
  // So does an explicit empty list (sum, mean, amax, any).
  CheckOp("aten.sum.dim_IntList", {M23()}, {In(0), Ints({}), B(true)}, kF32,
          {1, 1}, {21});
  CheckOp("aten.mean.dim", {M23()}, {In(0), Ints({})}, kF32, {}, {3.5});
  CheckOp("aten.amax.default", {M23()}, {In(0), Ints({})}, kF32, {}, {6});
  CheckOp("aten.any.dims", {Bool({2}, {0, 1})}, {In(0), Ints({})}, kBool, {},
          {1});
  // int32 with dtype=
  CheckOp("aten.sum.dim_IntList", {I32({2, 2}, {1, 2, 3, 4})},
          {In(0), Ints({1}), B(false), Kw("dtype", DT(v1::INT32))}, kI32, {2},
          {3, 7});
  // A 0-d input takes dim 0 / -1.
  CheckOp("aten.sum.dim_IntList", {F32({}, {5})}, {In(0), Ints({-1})}, kF32, {},
          {5});
}

TEST(ReductionSum, EmptyTensors) {
  // sum over a [0, 3] tensor along dim 0: zeros of shape [3].
  CheckOp("aten.sum.dim_IntList", {F32({0, 3}, {})}, {In(0), Ints({0})}, kF32,
          {3}, {0, 0, 0});
  // ... along dim 1: an empty [0] result.
  CheckOp("aten.sum.dim_IntList", {F32({0, 3}, {})}, {In(0), Ints({1})}, kF32,
          {0}, {});
  CheckOp("aten.sum.dim_IntList", {I32({0, 3}, {})},
          {In(0), Ints({0}), B(true)}, kI64, {1, 3}, {0, 0, 0});
}

TEST(ReductionSum, NonContiguousInputs) {
  // [[1, 4], [2, 5], [3, 6]]
  CheckOp("aten.sum.dim_IntList", {TransposedView(M23())}, {In(0), Ints({0})},
          kF32, {2}, {6, 15});
  CheckOp("aten.sum.dim_IntList", {TransposedView(M23())}, {In(0), Ints({1})},
          kF32, {3}, {5, 7, 9});
  // Stride 0: [10, 20, 30] expanded to 4 rows.
  HostTensor row = F32({3}, {10, 20, 30});
  HostTensor expanded = HostTensor::View(row, {4, 3}, {0, 1}, 0);
  CheckOp("aten.sum.dim_IntList", {expanded}, {In(0), Ints({0})}, kF32, {3},
          {40, 80, 120});
  CheckOp("aten.sum.default", {expanded}, {In(0)}, kF32, {}, {240});
}

TEST(ReductionSum, HalfAccumulatesWide) {
  // float16 sums accumulate in float: 1 + 2^-11 + 2^-11 = 1 + 2^-10, which
  // float16 holds (sequential float16 adds would give 1).
  CheckOp("aten.sum.default", {F16({3}, {1, 0.00048828125, 0.00048828125})},
          {In(0)}, kF16, {}, {1.0009765625}, 0);
}

TEST(ReductionSum, BadDims) {
  ExpectInvalid("aten.sum.dim_IntList", {M23()}, {In(0), Ints({1, -1})},
                {"node 0", "aten.sum.dim_IntList", "multiple"});
  ExpectInvalid("aten.sum.dim_IntList", {M23()}, {In(0), Ints({2})});
  ExpectInvalid("aten.sum.dim_IntList", {M23()}, {In(0), Ints({-3})});
}

// ---- mean ----

TEST(ReductionMean, DefaultAndDim) {
  CheckOp("aten.mean.default", {F32({4}, {1, 2, 3, 4})}, {In(0)}, kF32, {},
          {2.5});
  CheckOp("aten.mean.default", {F32({0}, {})}, {In(0)}, kF32, {}, {kNaN});
  CheckOp("aten.mean.dim", {M23()}, {In(0), Ints({1}), B(true)}, kF32, {2, 1},
          {2, 5});
  CheckOp("aten.mean.dim", {M23()}, {In(0), Ints({-2})}, kF32, {3},
          {2.5, 3.5, 4.5});
  CheckOp("aten.mean.dim", {M23()}, {In(0), Ints({0, 1})}, kF32, {}, {3.5});
  CheckOp("aten.mean.dim", {M23()}, {In(0), NoneArg(), B(true)}, kF32, {1, 1},
          {3.5});
  // 1/3 in float16: 1365 * 2^-12 = 0.333251953125.
  CheckOp("aten.mean.dim", {F16({3}, {0, 0, 1})}, {In(0), Ints({0})}, kF16, {},
          {0.333251953125}, 0);
}

TEST(ReductionMean, IntegralNeedsADType) {
  ExpectInvalid("aten.mean.default", {I32({2}, {1, 2})}, {In(0)},
                {"node 0", "aten.mean.default", "int32"});
  ExpectInvalid("aten.mean.dim", {I64({2}, {1, 2})}, {In(0), Ints({0})},
                {"int64"});
  ExpectInvalid("aten.mean.dim", {Bool({2}, {1, 0})}, {In(0), Ints({0})});
  CheckOp("aten.mean.default", {I32({2}, {1, 2})},
          {In(0), Kw("dtype", DT(v1::FLOAT32))}, kF32, {}, {1.5});
  CheckOp("aten.mean.dim", {I64({2, 2}, {1, 2, 4, 4})},
          {In(0), Ints({1}), B(false), Kw("dtype", DT(v1::FLOAT32))}, kF32, {2},
          {1.5, 4});
}

// ---- prod ----

TEST(ReductionProd, DefaultAndDim) {
  CheckOp("aten.prod.default", {F32({4}, {1, 2, 3, 4})}, {In(0)}, kF32, {},
          {24});
  CheckOp("aten.prod.default", {I32({3}, {-2, 3, 4})}, {In(0)}, kI64, {},
          {-24});
  CheckOp("aten.prod.default", {Bool({2}, {1, 1})}, {In(0)}, kI64, {}, {1});
  CheckOp("aten.prod.default", {F32({0}, {})}, {In(0)}, kF32, {}, {1});
  CheckOp("aten.prod.dim_int", {M23()}, {In(0), I(-1)}, kF32, {2}, {6, 120});
  CheckOp("aten.prod.dim_int", {M23()}, {In(0), I(1), B(true)}, kF32, {2, 1},
          {6, 120});
  CheckOp("aten.prod.dim_int", {I32({2, 3}, {1, 2, 3, 4, 5, 6})}, {In(0), I(0)},
          kI64, {3}, {4, 10, 18});
  CheckOp("aten.prod.dim_int", {I32({2}, {3, 4})},
          {In(0), I(0), B(false), Kw("dtype", DT(v1::FLOAT16))}, kF16, {},
          {12});
}

// ---- amax / amin ----

TEST(ReductionAmaxAmin, Values) {
  const HostTensor m = F32({2, 3}, {1, 5, 3, 4, 2, 6});
  CheckOp("aten.amax.default", {m}, {In(0), Ints({1})}, kF32, {2}, {5, 6});
  CheckOp("aten.amax.default", {m}, {In(0), Ints({-2}), B(true)}, kF32, {1, 3},
          {4, 5, 6});
  // dim [] reduces everything.
  CheckOp("aten.amax.default", {m}, {In(0)}, kF32, {}, {6});
  CheckOp("aten.amax.default", {m}, {In(0), Ints({0, 1}), B(true)}, kF32,
          {1, 1}, {6});
  CheckOp("aten.amax.default", {F32({3}, {1, kNaN, 3})}, {In(0), Ints({0})},
          kF32, {}, {kNaN});
  CheckOp("aten.amax.default", {I32({3}, {-7, -2, -9})}, {In(0), Ints({0})},
          kI32, {}, {-2});
  CheckOp("aten.amin.default", {m}, {In(0), Ints({1})}, kF32, {2}, {1, 2});
  CheckOp("aten.amin.default", {m}, {In(0), Ints({0}), B(true)}, kF32, {1, 3},
          {1, 2, 3});
  CheckOp("aten.amin.default", {F32({2}, {kNaN, -1})}, {In(0)}, kF32, {},
          {kNaN});
  CheckOp("aten.amin.default", {I64({3}, {-7, -2, -9})}, {In(0), Ints({-1})},
          kI64, {}, {-9});
  CheckOp("aten.amin.default", {Bool({3}, {1, 0, 1})}, {In(0)}, kBool, {}, {0});
  CheckOp("aten.amax.default", {TransposedView(m)}, {In(0), Ints({1})}, kF32,
          {3}, {4, 5, 6});
}

TEST(ReductionAmaxAmin, EmptyTensors) {
  // No identity: reducing a size-0 dim is an error.
  ExpectInvalid("aten.amax.default", {F32({0, 3}, {})}, {In(0), Ints({0})},
                {"node 0", "aten.amax.default", "size 0"});
  ExpectInvalid("aten.amin.default", {F32({0}, {})}, {In(0)}, {"size 0"});
  // Reducing a non-empty dim of an empty tensor is fine: [0, 3] -> [0].
  CheckOp("aten.amax.default", {F32({0, 3}, {})}, {In(0), Ints({1})}, kF32, {0},
          {});
}

// ---- var ----

TEST(ReductionVar, Correction) {
  // [1, 2, 3, 4]: mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 =
  // 5; unbiased 5 / 3, population 5 / 4.
  CheckOp("aten.var.correction", {F32({4}, {1, 2, 3, 4})}, {In(0)}, kF32, {},
          {1.6666666666666667});
  CheckOp("aten.var.correction", {F32({4}, {1, 2, 3, 4})},
          {In(0), NoneArg(), Kw("correction", I(0))}, kF32, {}, {1.25});
  CheckOp("aten.var.correction", {F32({4}, {1, 2, 3, 4})},
          {In(0), NoneArg(), Kw("correction", F(2))}, kF32, {}, {2.5});
  // Rows [1, 2, 3] (mean 2, var 1) and [4, 5, 7] (mean 16/3, squared
  // deviations 16/9 + 1/9 + 25/9 = 42/9, / 2 = 7/3).
  const HostTensor m = F32({2, 3}, {1, 2, 3, 4, 5, 7});
  CheckOp("aten.var.correction", {m}, {In(0), Ints({1})}, kF32, {2},
          {1, 2.3333333333333335});
  CheckOp("aten.var.correction", {m},
          {In(0), Ints({-1}), Kw("keepdim", B(true))}, kF32, {2, 1},
          {1, 2.3333333333333335});
  // Over dim 0: columns [1, 4], [2, 5], [3, 7]: 4.5, 4.5, 8.
  CheckOp("aten.var.correction", {m}, {In(0), Ints({0})}, kF32, {3},
          {4.5, 4.5, 8});
  // One element, correction 1: 0 / 0.
  CheckOp("aten.var.correction", {F32({1}, {3})}, {In(0)}, kF32, {}, {kNaN});
  ExpectInvalid("aten.var.correction", {I32({2}, {1, 2})}, {In(0)}, {"int32"});
}

// ---- argmax / argmin ----

TEST(ReductionArg, ArgmaxArgmin) {
  // Ties give the first index.
  CheckOp("aten.argmax.default", {F32({4}, {1, 5, 3, 5})}, {In(0)}, kI64, {},
          {1});
  const HostTensor m = F32({2, 3}, {1, 5, 3, 4, 2, 6});
  CheckOp("aten.argmax.default", {m}, {In(0), I(1)}, kI64, {2}, {1, 2});
  CheckOp("aten.argmax.default", {m}, {In(0), I(-2), B(true)}, kI64, {1, 3},
          {1, 0, 1});
  // No dim: index into the flattened tensor; keepdim gives all-ones sizes.
  CheckOp("aten.argmax.default", {m}, {In(0)}, kI64, {}, {5});
  CheckOp("aten.argmax.default", {m}, {In(0), NoneArg(), B(true)}, kI64, {1, 1},
          {5});
  // NaN counts as the maximum (and the minimum).
  CheckOp("aten.argmax.default", {F32({3}, {1, kNaN, 3})}, {In(0)}, kI64, {},
          {1});
  CheckOp("aten.argmin.default", {F32({3}, {1, kNaN, 0})}, {In(0)}, kI64, {},
          {1});
  CheckOp("aten.argmin.default", {m}, {In(0), I(1)}, kI64, {2}, {0, 1});
  CheckOp("aten.argmin.default", {I32({4}, {3, -1, 2, -1})}, {In(0), I(0)},
          kI64, {}, {1});
  CheckOp("aten.argmin.default", {TransposedView(m)}, {In(0), I(0)}, kI64, {2},
          {0, 1});
  ExpectInvalid("aten.argmax.default", {F32({0, 2}, {})}, {In(0), I(0)},
                {"size 0"});
}

// ---- any / all ----

TEST(ReductionAnyAll, AllOverloads) {
  CheckOp("aten.any.default", {F32({3}, {0, 0, 0.5})}, {In(0)}, kBool, {}, {1});
  CheckOp("aten.any.default", {I32({2}, {0, 0})}, {In(0)}, kBool, {}, {0});
  CheckOp("aten.any.default", {F32({0}, {})}, {In(0)}, kBool, {}, {0});
  CheckOp("aten.all.default", {F32({3}, {1, 2, 0})}, {In(0)}, kBool, {}, {0});
  CheckOp("aten.all.default", {F32({2}, {kNaN, -1})}, {In(0)}, kBool, {}, {1});
  CheckOp("aten.all.default", {Bool({0}, {})}, {In(0)}, kBool, {}, {1});
  const HostTensor b = Bool({2, 2}, {1, 0, 0, 0});
  CheckOp("aten.any.dim", {b}, {In(0), I(1)}, kBool, {2}, {1, 0});
  CheckOp("aten.any.dim", {b}, {In(0), I(-2), B(true)}, kBool, {1, 2}, {1, 0});
  CheckOp("aten.all.dim", {Bool({2, 2}, {1, 1, 0, 1})}, {In(0), I(1)}, kBool,
          {2}, {1, 0});
  CheckOp("aten.all.dim", {Bool({2, 2}, {1, 1, 0, 1})}, {In(0), I(0), B(true)},
          kBool, {1, 2}, {0, 1});
  CheckOp("aten.any.dims", {I64({2, 2, 2}, {0, 0, 0, 1, 0, 0, 0, 0})},
          {In(0), Ints({0, 2})}, kBool, {2}, {0, 1});
  CheckOp("aten.any.dims", {b}, {In(0), NoneArg(), B(true)}, kBool, {1, 1},
          {1});
  CheckOp("aten.all.dims", {F32({2, 2}, {1, 2, 3, 0})}, {In(0), Ints({-1, 0})},
          kBool, {}, {0});
  CheckOp("aten.all.dims", {F32({2, 2}, {1, 2, 3, 0})}, {In(0), Ints({0})},
          kBool, {2}, {1, 0});
  // Empty dim reduced: any -> false, all -> true.
  CheckOp("aten.all.dim", {F32({0, 2}, {})}, {In(0), I(0)}, kBool, {2}, {1, 1});
  CheckOp("aten.any.dim", {F32({0, 2}, {})}, {In(0), I(0)}, kBool, {2}, {0, 0});
}

}  // namespace
}  // namespace kiln::testing
