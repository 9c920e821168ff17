// Lowerings of the random ops (signatures in graph/ops/random.cc): pointwise
// nodes whose bodies draw ExprOp::kPhilox words by the element's row-major
// index (Word), so random numbers fuse with their neighbours like any pointwise
// op. The arithmetic on the words is graph/ops/random.h's, the same as the
// reference's (compiler/ops/random_reference.cc).
#include <cmath>
#include <cstdint>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"
#include "graph/ops/random.h"

namespace kiln {
namespace {

constexpr DType kF32 = DType::kFloat32;

// Word `which` (< words) of each element of `sizes` for an op drawing
// `words` words per element: the word at the element's row-major index of
// the node's stream (its seed and offset keywords).
Expr Word(const LowerContext& ctx, const std::vector<SymExpr>& sizes, int words,
          int which) {
  const ops::RandomArgs at = ops::RandomArgsOf(ctx.node());
  return ops::PhiloxWordAt(LowerContext::Read(ctx.value(at.seed), {}),
                           ir::IntConst(ctx.arg(at.offset).i),
                           ops::RowMajorIndex(sizes), words, which);
}

// The low `bits` bits of `word` as an int64.
Expr LowBits(const Expr& word, int bits) {
  return ir::Binary(ExprOp::kBitAnd, word,
                    ir::IntConst((int64_t{1} << bits) - 1), DType::kInt64);
}

// A float32 uniform in [0, 1) of `bits` bits (exact).
Expr Uniform(const Expr& word, int bits) {
  return ir::Binary(ExprOp::kMul, ir::Cast(LowBits(word, bits), kF32),
                    ir::Const(std::ldexp(1.0, -bits), kF32), kF32);
}

Expr MulF(Expr a, Expr b) {
  return ir::Binary(ExprOp::kMul, std::move(a), std::move(b), kF32);
}

absl::StatusOr<std::vector<LoweredValue>> LowerRand(LowerContext& ctx) {
  const TensorType& out = ctx.out_type();
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, Uniform(Word(ctx, out.sizes, 1, 0), ops::UniformBits(out.dtype)))};
}

// Box-Muller: sqrt(-2 log(1 - u1)) * cos(2 pi u2), in float32.
absl::StatusOr<std::vector<LoweredValue>> LowerRandn(LowerContext& ctx) {
  const std::vector<SymExpr>& sizes = ctx.out_type().sizes;
  const Expr u1 = Uniform(Word(ctx, sizes, 2, 0), ops::kBernoulliBits);
  const Expr u2 = Uniform(Word(ctx, sizes, 2, 1), ops::kBernoulliBits);
  const Expr log1m = ir::Unary(
      ExprOp::kLog, ir::Binary(ExprOp::kSub, ir::Const(1, kF32), u1, kF32),
      kF32);
  const Expr radius =
      ir::Unary(ExprOp::kSqrt, MulF(ir::Const(-2, kF32), log1m), kF32);
  const Expr theta = MulF(ir::Const(ops::kTwoPi, kF32), u2);
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, MulF(radius, ir::Unary(ExprOp::kCos, theta, kF32)))};
}

absl::StatusOr<std::vector<LoweredValue>> LowerBernoulliP(LowerContext& ctx) {
  const std::vector<SymExpr>& sizes = ctx.out_type().sizes;
  const int64_t threshold =
      ops::BernoulliThreshold(ctx.arg(1).ScalarAsDouble());
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, ops::BernoulliDraw(Word(ctx, sizes, 1, 0), threshold))};
}

// bernoulli.default: 1 iff a 24-bit uniform < p.
absl::StatusOr<std::vector<LoweredValue>> LowerBernoulli(LowerContext& ctx) {
  const std::vector<SymExpr>& sizes = ctx.out_type().sizes;
  const Expr u = Uniform(Word(ctx, sizes, 1, 0), ops::kBernoulliBits);
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, ir::Binary(ExprOp::kLt, u, ctx.Operand(0, sizes, kF32),
                      DType::kBool))};
}

// A bool pointwise node over `sizes` computing `body`.
LoweredValue BoolNode(LowerContext& ctx, const std::vector<SymExpr>& sizes,
                      Expr body) {
  LoopNode node;
  node.kind = LoopNode::Kind::kPointwise;
  node.dtype = DType::kBool;
  node.sizes = sizes;
  node.body = std::move(body);
  return ctx.AddNode(std::move(node));
}

// native_dropout: keep = bernoulli(1 - p), output = input * keep * scale in
// float32; not training: (input itself, ones).
absl::StatusOr<std::vector<LoweredValue>> LowerNativeDropout(
    LowerContext& ctx) {
  const std::vector<SymExpr>& sizes = ctx.out_type(0).sizes;
  if (!ops::DropoutTrains(ctx.node())) {
    return std::vector<LoweredValue>{
        ctx.value(0), BoolNode(ctx, sizes, ir::IntConst(1, DType::kBool))};
  }
  const double p = ctx.arg(1).ScalarAsDouble();
  // The output reads the mask node rather than drawing again: where the
  // mask is stored (saved for backward) and the output is computed in
  // another kernel (a reduction's, e.g. a sum of it), that kernel reads a
  // byte per element instead of computing Philox's ten rounds a second
  // time; where the mask is not stored, fusion inlines it as before.
  const LoweredValue mask =
      BoolNode(ctx, sizes,
               ops::BernoulliDraw(Word(ctx, sizes, 1, 0),
                                  ops::BernoulliThreshold(1.0 - p)));
  const Expr keep =
      LowerContext::Read(mask, IdentityIndex(static_cast<int>(sizes.size())));
  const Expr out =
      MulF(MulF(ctx.Operand(0, sizes, kF32), ir::Cast(keep, kF32)),
           ir::Const(ops::DropoutScale(p), kF32));
  LoweredValue out_value = ops::PointwiseOutput(ctx, out);
  return std::vector<LoweredValue>{out_value, mask};
}

// native_dropout_backward: grad_output * mask * scale, in float32.
absl::StatusOr<std::vector<LoweredValue>> LowerNativeDropoutBackward(
    LowerContext& ctx) {
  const std::vector<SymExpr>& sizes = ctx.out_type().sizes;
  const Expr body = MulF(MulF(ctx.Operand(0, sizes, kF32),
                              ctx.Operand(1, sizes, kF32)),
                         ir::Const(ctx.arg(2).ScalarAsDouble(), kF32));
  return std::vector<LoweredValue>{ops::PointwiseOutput(ctx, body)};
}

}  // namespace

void RegisterRandomLowerings(OpLowerings& table) {
  table.Add("aten.native_dropout.default", LowerNativeDropout);
  table.Add("aten.native_dropout_backward.default", LowerNativeDropoutBackward);
  table.Add("aten.rand.default", LowerRand);
  table.Add("aten.rand_like.default", LowerRand);
  table.Add("aten.randn.default", LowerRandn);
  table.Add("aten.randn_like.default", LowerRandn);
  table.Add("aten.bernoulli.p", LowerBernoulliP);
  table.Add("aten.bernoulli.default", LowerBernoulli);
}

}  // namespace kiln
