// SymExpr algebra, PyTorch's promotion lattice and the float16/bfloat16
// conversions the reference evaluator rounds with.
#include <cmath>

#include "graph/dtype.h"
#include "graph/sym_expr.h"
#include "gtest/gtest.h"
#include "support/half.h"

namespace kiln {
namespace {

TEST(SymExpr, CanonicalFormMakesEqualityStructural) {
  const SymExpr s0 = SymExpr::Symbol(0), s1 = SymExpr::Symbol(1);
  EXPECT_EQ(s0 * s1, s1 * s0);
  EXPECT_EQ(s0 + s1 - s0, s1);
  EXPECT_EQ((s0 + SymExpr(1)) * (s0 - SymExpr(1)), s0 * s0 - SymExpr(1));
  EXPECT_TRUE((s0 - s0).IsConstant());
  EXPECT_EQ((s0 - s0).AsConstant(), 0);
  EXPECT_EQ(s0.AsSymbol(), 0);
  EXPECT_FALSE((SymExpr(2) * s0).AsSymbol().has_value());
  EXPECT_EQ((SymExpr(16) * s0 + SymExpr(4)).ToString({"n"}), "4 + 16*n");
}

TEST(SymExpr, ExactDivision) {
  const SymExpr s0 = SymExpr::Symbol(0), s1 = SymExpr::Symbol(1);
  EXPECT_EQ(SymExpr::DivExact(SymExpr(48) * s0 * s1, SymExpr(16) * s1), SymExpr(3) * s0);
  EXPECT_FALSE(SymExpr::DivExact(SymExpr(6) * s0, SymExpr(4)).has_value());
  EXPECT_FALSE(SymExpr::DivExact(s0, s1).has_value());
  EXPECT_EQ(SymExpr::DivExact(s0 + s1, s0 + s1), SymExpr(1));
  EXPECT_EQ((SymExpr(3) * s0 * s1 + SymExpr(2)).Evaluate({5, 7}), 107);
}

TEST(DType, PromoteTypesFollowsTorch) {
  EXPECT_EQ(PromoteTypes(DType::kFloat16, DType::kBFloat16), DType::kFloat32);
  EXPECT_EQ(PromoteTypes(DType::kInt32, DType::kInt64), DType::kInt64);
  EXPECT_EQ(PromoteTypes(DType::kBool, DType::kInt32), DType::kInt32);
  EXPECT_EQ(PromoteTypes(DType::kInt64, DType::kFloat16), DType::kFloat16);
  EXPECT_EQ(PromoteTypes(DType::kFloat32, DType::kFloat16), DType::kFloat32);
}

TEST(DType, ResultTypeRespectsPriorityClasses) {
  {  // float16 tensor + python float -> float16
    ResultTypeState s;
    s.AddTensor(DType::kFloat16, false);
    s.AddScalar(DType::kFloat32);
    EXPECT_EQ(s.Result(), DType::kFloat16);
  }
  {  // int32 tensor + python float -> default float
    ResultTypeState s;
    s.AddTensor(DType::kInt32, false);
    s.AddScalar(DType::kFloat32);
    EXPECT_EQ(s.Result(), DType::kFloat32);
  }
  {  // int32 tensor + int64 0-d tensor -> int32
    ResultTypeState s;
    s.AddTensor(DType::kInt32, false);
    s.AddTensor(DType::kInt64, true);
    EXPECT_EQ(s.Result(), DType::kInt32);
  }
  {  // int32 tensor + float16 0-d tensor -> float16 (higher category)
    ResultTypeState s;
    s.AddTensor(DType::kInt32, false);
    s.AddTensor(DType::kFloat16, true);
    EXPECT_EQ(s.Result(), DType::kFloat16);
  }
  {  // bool tensor + python int -> int64
    ResultTypeState s;
    s.AddTensor(DType::kBool, false);
    s.AddScalar(DType::kInt64);
    EXPECT_EQ(s.Result(), DType::kInt64);
  }
}

TEST(Half, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);                   // largest finite
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);                   // rounds to inf
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);      // smallest subnormal
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite half round-trips
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h);
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(0.1f)), 0.10009765625f);
  EXPECT_EQ(FloatToBFloat16(BitsToFloat(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(FloatToBFloat16(BitsToFloat(0x3f818000u)), 0x3f82);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
}

}  // namespace
}  // namespace kiln
