// SymExpr algebra, index simplification (ir::SimplifyIndex), PyTorch's
// promotion lattice and the float16/bfloat16 conversions the reference
// evaluator rounds with.
#include <cmath>
#include <optional>
#include <random>
#include <vector>

#include "compiler/loop_ir.h"
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

// An int64 index expression at `vars` (floor division and modulo).
int64_t EvalIndex(const Expr& e, const std::vector<int64_t>& vars) {
  auto floor_div = [](int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
  };
  switch (e->op) {
    case ExprOp::kConst:
      return e->i;
    case ExprOp::kVar:
      return vars[e->index];
    case ExprOp::kNeg:
      return -EvalIndex(e->args[0], vars);
    default:
      break;
  }
  const int64_t a = EvalIndex(e->args[0], vars);
  const int64_t b = EvalIndex(e->args[1], vars);
  switch (e->op) {
    case ExprOp::kAdd:
      return a + b;
    case ExprOp::kSub:
      return a - b;
    case ExprOp::kMul:
      return a * b;
    case ExprOp::kFloorDiv:
      return floor_div(a, b);
    case ExprOp::kRemainder:
      return a - b * floor_div(a, b);
    default:
      ADD_FAILURE() << "unexpected op in " << ir::ToString(e);
      return 0;
  }
}

std::vector<std::optional<ir::IndexRange>> Ranges(
    const std::vector<int64_t>& sizes) {
  std::vector<std::optional<ir::IndexRange>> r;
  for (int64_t s : sizes) r.push_back(ir::IndexRange{0, s - 1});
  return r;
}

Expr V(int i) { return ir::Var(i); }
Expr C(int64_t c) { return ir::IntConst(c); }

TEST(SimplifyIndex, SplitReductionOfAGroupNormCancels) {
  // A split reduction's chunk v0 (1024 of 25088) of a contiguous
  // [32, 256, 56, 56] tensor read back through its dims, and the group's
  // statistic [32, 32] at the chunk's (n, channel / 8).
  const Expr f = ir::Add(ir::Mul(V(0), C(25088)), V(1));
  const Expr x = ir::Add(
      ir::Add(
          ir::Add(ir::Mul(ir::FloorDiv(f, C(802816)), C(802816)),
                  ir::Mul(ir::Mod(ir::FloorDiv(f, C(3136)), C(256)), C(3136))),
          ir::Mul(ir::Mod(ir::FloorDiv(f, C(56)), C(56)), C(56))),
      ir::Mod(f, C(56)));
  const Expr stat =
      ir::Add(ir::Mul(ir::FloorDiv(f, C(802816)), C(32)),
              ir::FloorDiv(ir::Mod(ir::FloorDiv(f, C(3136)), C(256)), C(8)));
  const auto ranges = Ranges({1024, 25088});
  EXPECT_EQ(ir::ToString(ir::SimplifyIndex(x, ranges)), "(v0*25088 + v1)");
  EXPECT_EQ(ir::ToString(ir::SimplifyIndex(stat, ranges)), "v0");
  // Without v1's bound nothing about the chunk is known.
  const std::vector<std::optional<ir::IndexRange>> unknown = {ranges[0],
                                                              std::nullopt};
  EXPECT_EQ(ir::ToString(ir::SimplifyIndex(stat, unknown)), ir::ToString(stat));
}

TEST(SimplifyIndex, RandomReshapesKeepTheirValues) {
  // Flat positions of random dims re-read through random factorizations
  // (floor divisions and remainders), scaled, offset and nested: every
  // simplified expression equals the original at every point of the dims.
  std::mt19937 rng(17);
  auto pick = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  int simplified = 0;
  for (int round = 0; round < 300; ++round) {
    const int nvars = pick(1, 3);
    std::vector<int64_t> sizes;
    Expr flat = C(0);
    int64_t total = 1;
    for (int v = 0; v < nvars; ++v) {
      sizes.push_back(pick(1, 9));
      total *= sizes.back();
      // Sometimes flipped: size - 1 - v (a negative coefficient).
      const Expr var = pick(0, 3) == 0
                           ? ir::Add(C(sizes.back() - 1), ir::Mul(V(v), C(-1)))
                           : V(v);
      flat = ir::Add(ir::Mul(flat, C(sizes.back())), var);
    }
    if (pick(0, 3) == 0)
      flat = ir::Add(ir::Mul(flat, C(pick(1, 4))), C(pick(0, 5)));
    // Re-read flat through a factorization into 2-3 dims, then flatten
    // with random strides (a permuted or padded view).
    Expr e = C(pick(0, 3));
    int64_t stride = 1;
    for (int k = 0, n = pick(1, 3); k < n; ++k) {
      const int64_t size = pick(1, 12);
      Expr coord = ir::Mod(ir::FloorDiv(flat, C(stride)), C(size));
      if (pick(0, 4) == 0) coord = ir::FloorDiv(coord, C(pick(1, 5)));
      e = ir::Add(e, ir::Mul(coord, C(pick(0, 2) == 0 ? stride : pick(1, 40))));
      stride *= size;
    }
    if (pick(0, 2) == 0)
      e = ir::Add(e, ir::Mul(ir::FloorDiv(flat, C(stride)), C(stride)));
    if (pick(0, 3) == 0) e = ir::Mod(e, C(pick(1, 64)));
    const Expr s = ir::SimplifyIndex(e, Ranges(sizes));
    simplified += ir::ToString(s) != ir::ToString(e);
    std::vector<int64_t> at(nvars, 0);
    for (int64_t i = 0; i < total; ++i) {
      for (int64_t rest = i, v = nvars - 1; v >= 0; --v) {
        at[v] = rest % sizes[v];
        rest /= sizes[v];
      }
      ASSERT_EQ(EvalIndex(s, at), EvalIndex(e, at))
          << ir::ToString(e) << " -> " << ir::ToString(s) << " at point " << i;
    }
  }
  EXPECT_GT(simplified, 100);  // the rules fire, not only pass through
}

TEST(SimplifyIndex, NestedRemaindersShowTheirParts) {
  // qkv's gradient [tokens, 3 * 192] read from q, k, v laid out [.., 3
  // heads, .., 64]: the head and the position in it of L mod 192.
  const Expr l = V(0);
  const auto ranges = Ranges({576});
  EXPECT_EQ(ir::ToString(
                ir::SimplifyIndex(ir::Mod(ir::Mod(l, C(192)), C(64)), ranges)),
            "remainder(v0, 64)");
  EXPECT_EQ(ir::ToString(ir::SimplifyIndex(
                ir::FloorDiv(ir::Mod(l, C(192)), C(64)), ranges)),
            "remainder(floordiv(v0, 64), 3)");
  // (y mod m) mod d and floor((y mod m) / d) for d | m, and for d not
  // dividing m (left as they are), keep their values.
  std::mt19937 rng(5);
  auto pick = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  for (int round = 0; round < 200; ++round) {
    const int64_t size = pick(1, 300), d = pick(1, 12);
    const int64_t m = pick(0, 3) == 0 ? pick(1, 40) : d * pick(1, 6);
    const Expr y = ir::Add(ir::Mul(V(0), C(pick(1, 3))), C(pick(0, 7)));
    for (bool rem : {true, false}) {
      const Expr e = rem ? ir::Mod(ir::Mod(y, C(m)), C(d))
                         : ir::FloorDiv(ir::Mod(y, C(m)), C(d));
      const Expr s = ir::SimplifyIndex(e, Ranges({size}));
      for (int64_t i = 0; i < size; ++i) {
        ASSERT_EQ(EvalIndex(s, {i}), EvalIndex(e, {i}))
            << ir::ToString(e) << " -> " << ir::ToString(s) << " at " << i;
      }
    }
  }
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
