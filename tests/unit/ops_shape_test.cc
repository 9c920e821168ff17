// Per-op tests of views, data movement and creation ops
// (graph/ops/{views,indexing,creation}.cc and their compiler tables): output
// dtype and shape (-1 inference, negative dims, legacy empty tensors in cat,
// dtype inference of creation ops) and reference values against numbers worked
// out by hand, over contiguous and non-contiguous inputs.
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing {
namespace {

[[maybe_unused]] ::testing::Environment* const kCoverage =
    RegisterCoverage("shape", ShapeSuiteOps());

// 0, 1, ..., n - 1 as int64 with the given sizes.
HostTensor Iota(std::vector<int64_t> sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<double>(i));
  return I64(std::move(sizes), v);
}

// ---- view / reshape / _unsafe_view ----

TEST(ShapeView, SizesAndInference) {
  CheckOp("aten.view.default", {M23()}, {In(0), Ints({3, 2})}, kF32, {3, 2},
          {1, 2, 3, 4, 5, 6});
  CheckOp("aten.view.default", {M23()}, {In(0), Ints({-1})}, kF32, {6},
          {1, 2, 3, 4, 5, 6});
  CheckOp("aten.view.default", {M23()}, {In(0), Ints({3, -1})}, kF32, {3, 2},
          {1, 2, 3, 4, 5, 6});
  CheckOp("aten.view.default", {M23()}, {In(0), Ints({-1, 1, 6})}, kF32,
          {1, 1, 6}, {1, 2, 3, 4, 5, 6});
  CheckOp("aten.view.default", {I32({1, 1}, {7})}, {In(0), Ints({})}, kI32, {},
          {7});
  CheckOp("aten.view.default", {F32({0, 3}, {})}, {In(0), Ints({-1, 3})}, kF32,
          {0, 3}, {});
  ExpectInvalid("aten.view.default", {M23()}, {In(0), Ints({-1, -1})},
                {"node 0", "aten.view.default", "-1"});
  ExpectInvalid("aten.view.default", {M23()}, {In(0), Ints({4, -1})});
  ExpectInvalid("aten.view.default", {M23()}, {In(0), Ints({5})});
  // 0 elements: the -1 could be anything.
  ExpectInvalid("aten.view.default", {F32({0, 3}, {})}, {In(0), Ints({0, -1})});
}

TEST(ShapeView, ReshapeOfNonContiguousInput) {
  // TransposedView(M23) is [[1, 4], [2, 5], [3, 6]]: reshape copies in
  // logical order.
  CheckOp("aten.reshape.default", {TransposedView(M23())}, {In(0), Ints({6})},
          kF32, {6}, {1, 4, 2, 5, 3, 6});
  CheckOp("aten.reshape.default", {TransposedView(M23())},
          {In(0), Ints({2, -1})}, kF32, {2, 3}, {1, 4, 2, 5, 3, 6});
  HostTensor expanded = HostTensor::View(F32({2}, {7, 8}), {3, 2}, {0, 1}, 0);
  CheckOp("aten.reshape.default", {expanded}, {In(0), Ints({-1})}, kF32, {6},
          {7, 8, 7, 8, 7, 8});
  CheckOp("aten._unsafe_view.default", {Iota({2, 3})}, {In(0), Ints({3, 2})},
          kI64, {3, 2}, {0, 1, 2, 3, 4, 5});
  CheckOp("aten._unsafe_view.default", {TransposedView(Iota({2, 3}))},
          {In(0), Ints({-1})}, kI64, {6}, {0, 3, 1, 4, 2, 5});
}

// ---- permute / transpose / t ----

TEST(ShapePermute, Values) {
  CheckOp("aten.permute.default", {M23()}, {In(0), Ints({1, 0})}, kF32, {3, 2},
          {1, 4, 2, 5, 3, 6});
  // out[k][i][j] = in[i][j][k] = 12 i + 4 j + k.
  const std::vector<double> expected = {0,  4,  8,  12, 16, 20, 1,  5,
                                        9,  13, 17, 21, 2,  6,  10, 14,
                                        18, 22, 3,  7,  11, 15, 19, 23};
  CheckOp("aten.permute.default", {Iota({2, 3, 4})}, {In(0), Ints({2, 0, 1})},
          kI64, {4, 2, 3}, expected);
  CheckOp("aten.permute.default", {Iota({2, 3, 4})}, {In(0), Ints({-1, 0, -2})},
          kI64, {4, 2, 3}, expected);
  CheckOp("aten.permute.default", {TransposedView(M23())},
          {In(0), Ints({1, 0})}, kF32, {2, 3}, {1, 2, 3, 4, 5, 6});
  ExpectInvalid("aten.permute.default", {M23()}, {In(0), Ints({0, 0})},
                {"repeat"});
  ExpectInvalid("aten.permute.default", {M23()}, {In(0), Ints({0})});
}

TEST(ShapeTranspose, Values) {
  CheckOp("aten.transpose.int", {M23()}, {In(0), I(0), I(1)}, kF32, {3, 2},
          {1, 4, 2, 5, 3, 6});
  CheckOp("aten.transpose.int", {M23()}, {In(0), I(-1), I(-2)}, kF32, {3, 2},
          {1, 4, 2, 5, 3, 6});
  // out[a][b][c] = in[c][b][a] = 4 c + 2 b + a.
  CheckOp("aten.transpose.int", {Iota({2, 2, 2})}, {In(0), I(0), I(-1)}, kI64,
          {2, 2, 2}, {0, 4, 2, 6, 1, 5, 3, 7});
  CheckOp("aten.transpose.int", {Iota({2, 3})}, {In(0), I(1), I(1)}, kI64,
          {2, 3}, {0, 1, 2, 3, 4, 5});
  CheckOp("aten.transpose.int", {F32({}, {4})}, {In(0), I(0), I(-1)}, kF32, {},
          {4});
  ExpectInvalid("aten.transpose.int", {M23()}, {In(0), I(0), I(2)});
}

TEST(ShapeT, Values) {
  CheckOp("aten.t.default", {M23()}, {In(0)}, kF32, {3, 2}, {1, 4, 2, 5, 3, 6});
  CheckOp("aten.t.default", {I32({3}, {1, 2, 3})}, {In(0)}, kI32, {3},
          {1, 2, 3});
  CheckOp("aten.t.default", {TransposedView(M23())}, {In(0)}, kF32, {2, 3},
          {1, 2, 3, 4, 5, 6});
  ExpectInvalid("aten.t.default", {Iota({2, 2, 2})}, {In(0)}, {"rank"});
}

// ---- expand ----

TEST(ShapeExpand, Values) {
  const HostTensor col = F32({3, 1}, {1, 2, 3});
  CheckOp("aten.expand.default", {col}, {In(0), Ints({3, 4})}, kF32, {3, 4},
          {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  // -1 keeps a size.
  CheckOp("aten.expand.default", {col}, {In(0), Ints({-1, 2})}, kF32, {3, 2},
          {1, 1, 2, 2, 3, 3});
  // New leading dims.
  CheckOp("aten.expand.default", {col}, {In(0), Ints({2, -1, 2})}, kF32,
          {2, 3, 2}, {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  CheckOp("aten.expand.default", {F32({}, {5})}, {In(0), Ints({2, 2})}, kF32,
          {2, 2}, {5, 5, 5, 5});
  CheckOp("aten.expand.default", {Bool({1, 2}, {1, 0})}, {In(0), Ints({0, 2})},
          kBool, {0, 2}, {});
  ExpectInvalid("aten.expand.default", {col}, {In(0), Ints({4, 4})},
                {"expand"});
  ExpectInvalid("aten.expand.default", {col}, {In(0), Ints({-1, 3, 1})});
  ExpectInvalid("aten.expand.default", {col}, {In(0), Ints({4})});
}

// ---- unsqueeze / squeeze ----

TEST(ShapeUnsqueeze, NegativeDims) {
  CheckOp("aten.unsqueeze.default", {M23()}, {In(0), I(0)}, kF32, {1, 2, 3},
          {1, 2, 3, 4, 5, 6});
  CheckOp("aten.unsqueeze.default", {M23()}, {In(0), I(-1)}, kF32, {2, 3, 1},
          {1, 2, 3, 4, 5, 6});
  CheckOp("aten.unsqueeze.default", {M23()}, {In(0), I(1)}, kF32, {2, 1, 3},
          {1, 2, 3, 4, 5, 6});
  CheckOp("aten.unsqueeze.default", {M23()}, {In(0), I(-2)}, kF32, {2, 1, 3},
          {1, 2, 3, 4, 5, 6});
  CheckOp("aten.unsqueeze.default", {M23()}, {In(0), I(-3)}, kF32, {1, 2, 3},
          {1, 2, 3, 4, 5, 6});
  CheckOp("aten.unsqueeze.default", {F32({}, {9})}, {In(0), I(-1)}, kF32, {1},
          {9});
  CheckOp("aten.unsqueeze.default", {TransposedView(M23())}, {In(0), I(1)},
          kF32, {3, 1, 2}, {1, 4, 2, 5, 3, 6});
  ExpectInvalid("aten.unsqueeze.default", {M23()}, {In(0), I(3)});
  ExpectInvalid("aten.unsqueeze.default", {M23()}, {In(0), I(-4)});
}

TEST(ShapeSqueeze, AllOverloads) {
  const HostTensor t = F32({1, 2, 1, 3}, {1, 2, 3, 4, 5, 6});
  const std::vector<double> v = {1, 2, 3, 4, 5, 6};
  CheckOp("aten.squeeze.default", {t}, {In(0)}, kF32, {2, 3}, v);
  CheckOp("aten.squeeze.default", {F32({1, 1}, {4})}, {In(0)}, kF32, {}, {4});
  CheckOp("aten.squeeze.dim", {t}, {In(0), I(-2)}, kF32, {1, 2, 3}, v);
  CheckOp("aten.squeeze.dim", {t}, {In(0), I(0)}, kF32, {2, 1, 3}, v);
  // A dim whose size is not 1 stays.
  CheckOp("aten.squeeze.dim", {t}, {In(0), I(1)}, kF32, {1, 2, 1, 3}, v);
  CheckOp("aten.squeeze.dims", {t}, {In(0), Ints({0, -2})}, kF32, {2, 3}, v);
  CheckOp("aten.squeeze.dims", {t}, {In(0), Ints({0, 1})}, kF32, {2, 1, 3}, v);
  CheckOp("aten.squeeze.dims", {t}, {In(0), Ints({})}, kF32, {1, 2, 1, 3}, v);
  CheckOp("aten.squeeze.dim", {F32({}, {3})}, {In(0), I(-1)}, kF32, {}, {3});
  // A [3, 1] transposed view of [1, 3], squeezed.
  CheckOp("aten.squeeze.dim", {TransposedView(F32({1, 3}, {1, 2, 3}))},
          {In(0), I(-1)}, kF32, {3}, {1, 2, 3});
  ExpectInvalid("aten.squeeze.dim", {t}, {In(0), I(4)});
  ExpectInvalid("aten.squeeze.dims", {t}, {In(0), Ints({-5})});
  // A dim listed twice (also as its negative alias) is an error, as in
  // PyTorch's dim_list_to_bitset.
  ExpectInvalid("aten.squeeze.dims", {t}, {In(0), Ints({0, -4})}, {"multiple"});
}

// ---- slice / select ----

TEST(ShapeSlice, BoundsAndSteps) {
  const HostTensor r = Iota({6});
  // Negative start and end: [-4, -1) = [2, 5).
  CheckOp("aten.slice.Tensor", {r}, {In(0), I(0), I(-4), I(-1)}, kI64, {3},
          {2, 3, 4});
  CheckOp("aten.slice.Tensor", {r}, {In(0), I(0), NoneArg(), NoneArg(), I(2)},
          kI64, {3}, {0, 2, 4});
  CheckOp("aten.slice.Tensor", {r}, {In(0), I(-1), I(-5), I(100), I(2)}, kI64,
          {3}, {1, 3, 5});
  // Out-of-range bounds clamp; start past end is empty.
  CheckOp("aten.slice.Tensor", {r}, {In(0), I(0), I(-100), I(2)}, kI64, {2},
          {0, 1});
  CheckOp("aten.slice.Tensor", {r}, {In(0), I(0), I(4), I(2)}, kI64, {0}, {});
  CheckOp("aten.slice.Tensor", {r}, {In(0)}, kI64, {6}, {0, 1, 2, 3, 4, 5});
  // Along the last dim of [2, 4]: columns 1 and 3.
  CheckOp("aten.slice.Tensor", {Iota({2, 4})},
          {In(0), I(-1), I(1), NoneArg(), I(2)}, kI64, {2, 2}, {1, 3, 5, 7});
  // Of a non-contiguous input: rows 1.. of [[1, 4], [2, 5], [3, 6]].
  CheckOp("aten.slice.Tensor", {TransposedView(M23())}, {In(0), I(0), I(1)},
          kF32, {2, 2}, {2, 5, 3, 6});
  ExpectInvalid("aten.slice.Tensor", {r}, {In(0), I(0), I(0), I(6), I(0)},
                {"step"});
  ExpectInvalid("aten.slice.Tensor", {r}, {In(0), I(0), I(5), I(0), I(-1)},
                {"step"});
  ExpectInvalid("aten.slice.Tensor", {r}, {In(0), I(1)});
}

TEST(ShapeSelect, NegativeIndexAndDim) {
  CheckOp("aten.select.int", {M23()}, {In(0), I(0), I(-1)}, kF32, {3},
          {4, 5, 6});
  CheckOp("aten.select.int", {M23()}, {In(0), I(1), I(-3)}, kF32, {2}, {1, 4});
  CheckOp("aten.select.int", {M23()}, {In(0), I(-1), I(2)}, kF32, {2}, {3, 6});
  CheckOp("aten.select.int", {I32({3}, {7, 8, 9})}, {In(0), I(0), I(1)}, kI32,
          {}, {8});
  // Column 0 of [[1, 4], [2, 5], [3, 6]].
  CheckOp("aten.select.int", {TransposedView(M23())}, {In(0), I(1), I(0)}, kF32,
          {3}, {1, 2, 3});
  ExpectInvalid("aten.select.int", {M23()}, {In(0), I(0), I(2)},
                {"node 0", "aten.select.int", "out of range"});
  ExpectInvalid("aten.select.int", {M23()}, {In(0), I(1), I(-4)},
                {"out of range"});
  ExpectInvalid("aten.select.int", {F32({}, {1})}, {In(0), I(0), I(0)});
}

// ---- clone / cat ----

TEST(ShapeClone, CopiesInLogicalOrder) {
  CheckOp("aten.clone.default", {I32({2, 2}, {1, 2, 3, 4})}, {In(0)}, kI32,
          {2, 2}, {1, 2, 3, 4});
  auto r = RunTracked("aten.clone.default", {TransposedView(M23())}, {In(0)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, kF32, {3, 2}, {1, 4, 2, 5, 3, 6});
  EXPECT_TRUE(r->outputs[0].IsContiguous());
  CheckOp("aten.clone.default", {Bool({0}, {})}, {In(0)}, kBool, {0}, {});
}

TEST(ShapeCat, DimsAndValues) {
  CheckOp("aten.cat.default", {F32({2, 2}, {1, 2, 3, 4}), F32({1, 2}, {5, 6})},
          {Refs({0, 1}), I(0)}, kF32, {3, 2}, {1, 2, 3, 4, 5, 6});
  CheckOp("aten.cat.default", {F32({2, 1}, {1, 2}), F32({2, 2}, {3, 4, 5, 6})},
          {Refs({0, 1}), I(-1)}, kF32, {2, 3}, {1, 3, 4, 2, 5, 6});
  // dim defaults to 0; a tensor may appear twice.
  CheckOp("aten.cat.default", {I32({2}, {1, 2})}, {Refs({0, 0})}, kI32, {4},
          {1, 2, 1, 2});
  // Non-contiguous inputs.
  CheckOp("aten.cat.default", {TransposedView(M23()), F32({3, 1}, {7, 8, 9})},
          {Refs({0, 1}), I(1)}, kF32, {3, 3}, {1, 4, 7, 2, 5, 8, 3, 6, 9});
  // Size-0 along the cat dim is fine when the rank matches.
  CheckOp("aten.cat.default", {F32({0, 2}, {}), F32({1, 2}, {1, 2})},
          {Refs({0, 1})}, kF32, {1, 2}, {1, 2});
}

TEST(ShapeCat, MixedDTypesPromote) {
  CheckOp("aten.cat.default", {I32({1}, {1}), F32({2}, {2.5, 3})},
          {Refs({0, 1})}, kF32, {3}, {1, 2.5, 3});
  CheckOp("aten.cat.default", {I32({1}, {1}), I64({1}, {2})}, {Refs({0, 1})},
          kI64, {2}, {1, 2});
  CheckOp("aten.cat.default", {Bool({2}, {1, 0}), I32({1}, {5})},
          {Refs({0, 1})}, kI32, {3}, {1, 0, 5});
  // float16 with bfloat16 meets at float32.
  CheckOp("aten.cat.default", {F16({1}, {1}), BF16({1}, {2})}, {Refs({0, 1})},
          kF32, {2}, {1, 2});
}

TEST(ShapeCat, LegacyEmptyTensorIsSkipped) {
  // A 1-D [0] tensor is skipped whatever the other ranks and the dim.
  CheckOp("aten.cat.default", {F32({0}, {}), F32({2, 2}, {1, 2, 3, 4})},
          {Refs({0, 1}), I(1)}, kF32, {2, 2}, {1, 2, 3, 4});
  CheckOp("aten.cat.default",
          {F32({2, 1}, {1, 2}), F32({0}, {}), F32({2, 1}, {3, 4})},
          {Refs({0, 1, 2}), I(-1)}, kF32, {2, 2}, {1, 3, 2, 4});
  // It still takes part in type promotion (torch.cat([tensor([]),
  // tensor([1, 2])]) is float).
  CheckOp("aten.cat.default", {F32({0}, {}), I64({2}, {1, 2})}, {Refs({0, 1})},
          kF32, {2}, {1, 2});
  CheckOp("aten.cat.default", {F32({0}, {}), F32({0}, {})}, {Refs({0, 1})},
          kF32, {0}, {});
}

TEST(ShapeCat, Errors) {
  ExpectInvalid("aten.cat.default", {F32({2, 2}, {}), F32({2}, {})},
                {Refs({0, 1})}, {"node 0", "aten.cat.default", "rank"});
  ExpectInvalid("aten.cat.default", {F32({2, 2}, {}), F32({2, 3}, {})},
                {Refs({0, 1}), I(0)}, {"size"});
  ExpectInvalid("aten.cat.default", {F32({}, {1}), F32({}, {2})},
                {Refs({0, 1})}, {"zero-dim"});
  ExpectInvalid("aten.cat.default", {F32({2}, {})}, {Refs({0}), I(1)});
}

// ---- creation ----

TEST(ShapeFull, DTypeInference) {
  // A float fill gives the default float dtype, an int fill int64, a bool
  // fill bool.
  CheckOp("aten.full.default", {}, {Ints({2, 3}), F(1.5)}, kF32, {2, 3},
          {1.5, 1.5, 1.5, 1.5, 1.5, 1.5});
  CheckOp("aten.full.default", {}, {Ints({2}), I(7)}, kI64, {2}, {7, 7});
  CheckOp("aten.full.default", {}, {Ints({2}), B(true)}, kBool, {2}, {1, 1});
  // dtype= converts the fill like a cast: 2.75 -> 2.
  CheckOp("aten.full.default", {},
          {Ints({3}), F(2.75), Kw("dtype", DT(v1::INT32))}, kI32, {3},
          {2, 2, 2});
  // 0.1 in float16: 1638 * 2^-14 = 0.0999755859375.
  CheckOp("aten.full.default", {},
          {Ints({1}), F(0.1), Kw("dtype", DT(v1::FLOAT16))}, kF16, {1},
          {0.0999755859375}, 0);
  CheckOp("aten.full.default", {}, {Ints({}), I(-3)}, kI64, {}, {-3});
  CheckOp("aten.full.default", {}, {Ints({0, 2}), F(1)}, kF32, {0, 2}, {});
  ExpectInvalid("aten.full.default", {}, {Ints({-1}), F(1)}, {"negative"});
}

TEST(ShapeScalarTensor, DefaultsToFloat) {
  // Unlike full, scalar_tensor defaults to the default float dtype even for
  // an int.
  CheckOp("aten.scalar_tensor.default", {}, {I(3)}, kF32, {}, {3});
  CheckOp("aten.scalar_tensor.default", {}, {F(-2.5)}, kF32, {}, {-2.5});
  CheckOp("aten.scalar_tensor.default", {},
          {F(2.5), Kw("dtype", DT(v1::FLOAT16))}, kF16, {}, {2.5});
  CheckOp("aten.scalar_tensor.default", {}, {I(7), Kw("dtype", DT(v1::INT64))},
          kI64, {}, {7});
  CheckOp("aten.scalar_tensor.default", {},
          {B(true), Kw("dtype", DT(v1::BOOL))}, kBool, {}, {1});
}

TEST(ShapeArange, AllOverloads) {
  // Int arguments give int64, any float argument float32.
  CheckOp("aten.arange.default", {}, {I(5)}, kI64, {5}, {0, 1, 2, 3, 4});
  CheckOp("aten.arange.default", {}, {F(2.5)}, kF32, {3}, {0, 1, 2});
  CheckOp("aten.arange.default", {}, {I(0)}, kI64, {0}, {});
  CheckOp("aten.arange.default", {}, {I(3), Kw("dtype", DT(v1::FLOAT16))}, kF16,
          {3}, {0, 1, 2});
  CheckOp("aten.arange.start", {}, {I(1), I(4)}, kI64, {3}, {1, 2, 3});
  CheckOp("aten.arange.start", {}, {F(-1), I(1)}, kF32, {2}, {-1, 0});
  CheckOp("aten.arange.start", {}, {I(-2), I(1), Kw("dtype", DT(v1::INT32))},
          kI32, {3}, {-2, -1, 0});
  // ceil((10 - 0) / 3) = 4 elements.
  CheckOp("aten.arange.start_step", {}, {I(0), I(10), I(3)}, kI64, {4},
          {0, 3, 6, 9});
  CheckOp("aten.arange.start_step", {}, {I(1), F(2.5), F(0.5)}, kF32, {3},
          {1, 1.5, 2});
  CheckOp("aten.arange.start_step", {}, {I(5), I(0), I(-2)}, kI64, {3},
          {5, 3, 1});
  CheckOp("aten.arange.start_step", {}, {I(0), I(3)}, kI64, {3}, {0, 1, 2});
  ExpectInvalid("aten.arange.start_step", {}, {I(0), I(3), I(0)});
  ExpectInvalid("aten.arange.start_step", {}, {I(0), I(3), I(-1)},
                {"step sign"});
}

// ---- alias / copy ----

TEST(ShapeAlias, IsTheValue) {
  CheckOp("aten.alias.default", {M23()}, {In(0)}, kF32, {2, 3},
          {1, 2, 3, 4, 5, 6});
  CheckOp("aten.alias.default", {TransposedView(M23())}, {In(0)}, kF32, {3, 2},
          {1, 4, 2, 5, 3, 6});
  CheckOp("aten.alias.default", {Bool({}, {1})}, {In(0)}, kBool, {}, {1});
  CheckOp("aten.alias.default", {I64({0, 2}, {})}, {In(0)}, kI64, {0, 2}, {});
}

TEST(ShapeCopy, BroadcastsSrcAndConvertsToSelfsDType) {
  // src broadcast to self's shape; self's values are not read.
  CheckOp("aten.copy.default", {M23(), F32({3}, {7, 8, 9})}, {In(0), In(1)},
          kF32, {2, 3}, {7, 8, 9, 7, 8, 9});
  CheckOp("aten.copy.default", {M23(), F32({2, 1}, {-1, 5})}, {In(0), In(1)},
          kF32, {2, 3}, {-1, -1, -1, 5, 5, 5});
  // Self's dtype: floats truncate toward zero into int32.
  CheckOp("aten.copy.default", {I32({2}, {0, 0}), F32({2}, {1.75, -2.5})},
          {In(0), In(1), B(false)}, kI32, {2}, {1, -2});
  // Into bool (nonzero is true), non_blocking by keyword.
  CheckOp("aten.copy.default", {Bool({3}, {}), F32({3}, {0, 0.5, -2})},
          {In(0), In(1), Kw("non_blocking", B(true))}, kBool, {3}, {0, 1, 1});
  // int64 into bfloat16 rounds; a non-contiguous src in logical order.
  CheckOp("aten.copy.default", {BF16({2}, {}), I64({2}, {257, -3})},
          {In(0), In(1)}, kBF16, {2}, {256, -3});
  CheckOp("aten.copy.default", {F16({3, 2}, {}), TransposedView(M23())},
          {In(0), In(1)}, kF16, {3, 2}, {1, 4, 2, 5, 3, 6});
  CheckOp("aten.copy.default", {F32({0, 3}, {}), F32({3}, {1, 2, 3})},
          {In(0), In(1)}, kF32, {0, 3}, {});
  // src must broadcast to self's shape, not the other way.
  ExpectInvalid("aten.copy.default", {F32({3}, {}), M23()}, {In(0), In(1)},
                {"aten.copy.default", "broadcast"});
  ExpectInvalid("aten.copy.default", {F32({2}, {}), F32({3}, {})},
                {In(0), In(1)});
}

// ---- full_like / zeros_like / ones_like / empty_like ----

TEST(ShapeLike, SelfsSizesAndDType) {
  // full_like takes self's dtype, not the fill value's.
  CheckOp("aten.full_like.default", {I32({2, 2}, {})}, {In(0), F(2.5)}, kI32,
          {2, 2}, {2, 2, 2, 2});
  CheckOp("aten.full_like.default", {I32({2}, {})},
          {In(0), F(2.5), Kw("dtype", DT(v1::FLOAT32))}, kF32, {2}, {2.5, 2.5});
  CheckOp(
      "aten.full_like.default", {TransposedView(M23())},
      {In(0), I(-1), Kw("device", NoneArg()), Kw("memory_format", NoneArg())},
      kF32, {3, 2}, {-1, -1, -1, -1, -1, -1});
  CheckOp("aten.full_like.default", {M23()},
          {In(0), B(true), Kw("dtype", DT(v1::BOOL))}, kBool, {2, 3},
          {1, 1, 1, 1, 1, 1});
  CheckOp("aten.zeros_like.default", {M23()}, {In(0)}, kF32, {2, 3},
          {0, 0, 0, 0, 0, 0});
  CheckOp("aten.zeros_like.default", {M23()},
          {In(0), Kw("dtype", DT(v1::INT64))}, kI64, {2, 3},
          {0, 0, 0, 0, 0, 0});
  CheckOp("aten.ones_like.default", {BF16({3}, {})}, {In(0)}, kBF16, {3},
          {1, 1, 1});
  CheckOp("aten.ones_like.default", {I32({}, {4})},
          {In(0), Kw("dtype", DT(v1::FLOAT16)), Kw("pin_memory", B(false))},
          kF16, {}, {1});
  CheckOp("aten.ones_like.default", {F32({0, 2}, {})},
          {In(0), Kw("dtype", DT(v1::BOOL))}, kBool, {0, 2}, {});
  // empty_like's contents are unspecified; Kiln gives zeros.
  CheckOp("aten.empty_like.default", {I64({2}, {5, 6})}, {In(0)}, kI64, {2},
          {0, 0});
  CheckOp("aten.empty_like.default", {M23()},
          {In(0), Kw("dtype", DT(v1::BFLOAT16))}, kBF16, {2, 3},
          {0, 0, 0, 0, 0, 0});
  // dtype is keyword-only.
  ExpectInvalid("aten.zeros_like.default", {M23()}, {In(0), DT(v1::INT64)});
}

// ---- empty.memory_format / empty_strided ----

TEST(ShapeEmpty, ZerosOfTheDefaultFloat) {
  CheckOp("aten.empty.memory_format", {}, {Ints({2, 3})}, kF32, {2, 3},
          {0, 0, 0, 0, 0, 0});
  CheckOp(
      "aten.empty.memory_format", {},
      {Ints({2}), Kw("dtype", DT(v1::INT32)), Kw("memory_format", NoneArg())},
      kI32, {2}, {0, 0});
  CheckOp("aten.empty.memory_format", {}, {Ints({0, 4})}, kF32, {0, 4}, {});
  CheckOp("aten.empty_strided.default", {}, {Ints({2, 3}), Ints({1, 2})}, kF32,
          {2, 3}, {0, 0, 0, 0, 0, 0});
  CheckOp("aten.empty_strided.default", {},
          {Ints({3}), Ints({1}), Kw("dtype", DT(v1::FLOAT16)),
           Kw("pin_memory", B(false))},
          kF16, {3}, {0, 0, 0});
  CheckOp("aten.empty_strided.default", {},
          {Ints({}), Ints({}), Kw("dtype", DT(v1::BOOL))}, kBool, {}, {0});
  ExpectInvalid("aten.empty_strided.default", {}, {Ints({2, 3}), Ints({1})},
                {"strides"});
  ExpectInvalid("aten.empty.memory_format", {}, {Ints({-1})}, {"negative"});
}

// ---- split / split_with_sizes / unbind: one output per piece ----

// ---- slice_scatter / select_scatter ----

TEST(ShapeSliceScatter, SrcOverTheSlice) {
  // self [[1, 2, 3], [4, 5, 6]]; src over columns 0 and 2 (step 2).
  CheckOp("aten.slice_scatter.default", {M23(), F32({2, 2}, {10, 30, 40, 60})},
          {In(0), In(1), I(1), I(0), I(3), I(2)}, kF32, {2, 3},
          {10, 2, 30, 40, 5, 60});
  // Along dim 0 from the end (negative start), default end.
  CheckOp("aten.slice_scatter.default", {M23(), F32({1, 3}, {7, 8, 9})},
          {In(0), In(1), I(0), I(-1)}, kF32, {2, 3}, {1, 2, 3, 7, 8, 9});
  // An empty slice replaces nothing.
  CheckOp("aten.slice_scatter.default", {M23(), F32({2, 0}, {})},
          {In(0), In(1), I(1), I(2), I(2)}, kF32, {2, 3}, {1, 2, 3, 4, 5, 6});
  ExpectInvalid("aten.slice_scatter.default", {M23(), F32({2, 2}, {})},
                {In(0), In(1), I(1), I(0), I(3)},
                {"node 0", "slice_scatter", "src has shape [2, 2]"});
  ExpectInvalid("aten.slice_scatter.default", {M23(), F16({2, 3}, {})},
                {In(0), In(1), I(1)}, {"dtype"});
}

TEST(ShapeSelectScatter, SrcOverTheIndex) {
  CheckOp("aten.select_scatter.default", {M23(), F32({2}, {7, 8})},
          {In(0), In(1), I(1), I(-1)}, kF32, {2, 3}, {1, 2, 7, 4, 5, 8});
  CheckOp("aten.select_scatter.default", {M23(), F32({3}, {7, 8, 9})},
          {In(0), In(1), I(0), I(0)}, kF32, {2, 3}, {7, 8, 9, 4, 5, 6});
  ExpectInvalid("aten.select_scatter.default", {M23(), F32({3}, {})},
                {In(0), In(1), I(1), I(3)}, {"out of range"});
}

// ---- as_strided / as_strided_scatter: self's row-major elements ----

TEST(ShapeAsStrided, ViewsOfRowMajorElements) {
  // M23 is 1..6: element offset + i * 1 + j * 2.
  CheckOp("aten.as_strided.default", {M23()},
          {In(0), Ints({2, 2}), Ints({1, 2}), I(1)}, kF32, {2, 2},
          {2, 4, 3, 5});
  // A transposed self is read in its logical row-major order 1, 4, 2, 5, ...
  CheckOp("aten.as_strided.default", {TransposedView(M23())},
          {In(0), Ints({3}), Ints({2})}, kF32, {3}, {1, 2, 3});
  // Stride 0 repeats; the default offset is 0.
  CheckOp("aten.as_strided.default", {Iota({2, 3})},
          {In(0), Ints({2, 3}), Ints({0, 1}), Kw("storage_offset", I(3))}, kI64,
          {2, 3}, {3, 4, 5, 3, 4, 5});
  CheckOp("aten.as_strided.default", {M23()},
          {In(0), Ints({0, 4}), Ints({9, 9})}, kF32, {0, 4}, {});
  ExpectInvalid("aten.as_strided.default", {M23()},
                {In(0), Ints({2, 3}), Ints({3, 1}), I(1)},
                {"node 0", "as_strided", "reaches element 6", "has 6"});
  ExpectInvalid("aten.as_strided.default", {M23()},
                {In(0), Ints({2, 3}), Ints({3})}, {"length of strides"});
  ExpectInvalid("aten.as_strided.default", {M23()},
                {In(0), Ints({2}), Ints({-1}), I(5)}, {"non-negative"});
}

TEST(ShapeAsStridedScatter, SrcThroughTheView) {
  CheckOp("aten.as_strided_scatter.default", {M23(), F32({2}, {10, 20})},
          {In(0), In(1), Ints({2}), Ints({3}), I(1)}, kF32, {2, 3},
          {1, 10, 3, 4, 20, 6});
  // Dims in another order than their strides': src[i][j] lands at i + 3j.
  CheckOp("aten.as_strided_scatter.default",
          {M23(), F32({2, 2}, {10, 20, 30, 40})},
          {In(0), In(1), Ints({2, 2}), Ints({1, 3})}, kF32, {2, 3},
          {10, 30, 3, 20, 40, 6});
  CheckOp("aten.as_strided_scatter.default",
          {TransposedView(Iota({2, 3})), I64({3}, {7, 8, 9})},
          {In(0), In(1), Ints({3}), Ints({2})}, kI64, {3, 2},
          {7, 3, 8, 4, 9, 5});
  CheckOp("aten.as_strided_scatter.default", {M23(), F32({0}, {})},
          {In(0), In(1), Ints({0}), Ints({1})}, kF32, {2, 3},
          {1, 2, 3, 4, 5, 6});
  ExpectInvalid(
      "aten.as_strided_scatter.default", {M23(), F32({2, 2}, {1, 2, 3, 4})},
      {In(0), In(1), Ints({2, 2}), Ints({1, 1})}, {"node 0", "overlaps"});
  ExpectInvalid("aten.as_strided_scatter.default", {M23(), F32({3}, {})},
                {In(0), In(1), Ints({2}), Ints({1})},
                {"src has shape [3]", "[2]"});
  ExpectInvalid("aten.as_strided_scatter.default", {M23(), F16({2}, {})},
                {In(0), In(1), Ints({2}), Ints({1})}, {"dtype"});
}

TEST(ShapeRepeat, TilesAndAddsLeadingDims) {
  CheckOp("aten.repeat.default", {M23()}, {In(0), Ints({2, 1})}, kF32, {4, 3},
          {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6});
  // A new leading dim; dim 1 repeated twice; of a transposed view.
  CheckOp("aten.repeat.default", {TransposedView(Iota({1, 2}))},
          {In(0), Ints({2, 1, 2})}, kI64, {2, 2, 2}, {0, 0, 1, 1, 0, 0, 1, 1});
  CheckOp("aten.repeat.default", {M23()}, {In(0), Ints({0, 2})}, kF32, {0, 6},
          {});
  ExpectInvalid("aten.repeat.default", {M23()}, {In(0), Ints({2})},
                {"node 0", "repeat", "can not be smaller"});
  ExpectInvalid("aten.repeat.default", {M23()}, {In(0), Ints({1, -1})},
                {"non-negative"});
}

TEST(ShapeLiftFreshCopy, IsACopy) {
  CheckOp("aten.lift_fresh_copy.default", {TransposedView(M23())}, {In(0)},
          kF32, {3, 2}, {1, 4, 2, 5, 3, 6});
}

TEST(ShapeSplit, PiecesAlongTheDim) {
  // Iota({5, 2}) split in pieces of 2 rows: [2, 2], [2, 2], [1, 2].
  auto r = RunTracked("aten.split.Tensor", {Iota({5, 2})}, {In(0), I(2)}, 3);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kI64, {2, 2}, {0, 1, 2, 3});
  ExpectOutput(*r, 1, kI64, {2, 2}, {4, 5, 6, 7});
  ExpectOutput(*r, 2, kI64, {1, 2}, {8, 9});
  // Negative dim, over a non-contiguous input ([[1, 4], [2, 5], [3, 6]]).
  r = RunTracked("aten.split.Tensor", {TransposedView(M23())},
                 {In(0), I(1), I(-1)}, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {3, 1}, {1, 2, 3});
  ExpectOutput(*r, 1, kF32, {3, 1}, {4, 5, 6});
  // A split size above the dim's size: one piece; a size-0 dim: one empty.
  r = RunTracked("aten.split.Tensor", {M23()}, {In(0), I(8), Kw("dim", I(1))},
                 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {2, 3}, {1, 2, 3, 4, 5, 6});
  r = RunTracked("aten.split.Tensor", {F32({0, 2}, {})}, {In(0), I(3)}, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {0, 2}, {});
  // The node must define one output per piece.
  ExpectInvalid("aten.split.Tensor", {Iota({5, 2})}, {In(0), I(2)},
                {"outputs", "3"});
  ExpectInvalid("aten.split.Tensor", {Iota({5, 2})}, {In(0), I(0)},
                {"split_size"});
  ExpectInvalid("aten.split.Tensor", {I64({}, {1})}, {In(0), I(1)}, {"rank"});
}

TEST(ShapeSplitWithSizes, SizesMustAddUp) {
  auto r = RunTracked("aten.split_with_sizes.default", {Iota({2, 5})},
                      {In(0), Ints({1, 0, 4}), I(-1)}, 3);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kI64, {2, 1}, {0, 5});
  ExpectOutput(*r, 1, kI64, {2, 0}, {});
  ExpectOutput(*r, 2, kI64, {2, 4}, {1, 2, 3, 4, 6, 7, 8, 9});
  r = RunTracked("aten.split_with_sizes.default", {TransposedView(M23())},
                 {In(0), Ints({2, 1})}, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {2, 2}, {1, 4, 2, 5});
  ExpectOutput(*r, 1, kF32, {1, 2}, {3, 6});
  ExpectInvalid("aten.split_with_sizes.default", {Iota({2, 5})},
                {In(0), Ints({1, 3}), I(1)}, {"add up"});
  ExpectInvalid("aten.split_with_sizes.default", {Iota({2, 5})},
                {In(0), Ints({-1, 3})}, {"negative"});
}

TEST(ShapeUnbind, OneSelectPerIndex) {
  auto r = RunTracked("aten.unbind.int", {M23()}, {In(0)}, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {3}, {1, 2, 3});
  ExpectOutput(*r, 1, kF32, {3}, {4, 5, 6});
  r = RunTracked("aten.unbind.int", {TransposedView(Iota({2, 3}))},
                 {In(0), I(-1)}, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kI64, {3}, {0, 1, 2});
  ExpectOutput(*r, 1, kI64, {3}, {3, 4, 5});
  r = RunTracked("aten.unbind.int", {Bool({1, 2}, {1, 0})},
                 {In(0), Kw("dim", I(1))}, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kBool, {1}, {1});
  ExpectOutput(*r, 1, kBool, {1}, {0});
  // Unbinding a size-0 dim gives no outputs (a graph needs one).
  ExpectInvalid("aten.unbind.int", {F32({0, 2}, {})}, {In(0)}, {"no outputs"});
  ExpectInvalid("aten.unbind.int", {M23()}, {In(0), I(2)});
}

}  // namespace
}  // namespace kiln::testing
