// Lowerings of the composite family: _softmax and _log_softmax (row max,
// then the sum of exponentials, in float32) and native_layer_norm (mean,
// then the variance about it) as reductions and pointwise nodes that fusion
// keeps in one row kernel.
#include <utility>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"

namespace kiln {
namespace {

using ops::LowerReductionOver;
using ops::ReadKept;

absl::StatusOr<std::vector<LoweredValue>> LowerSoftmaxOrLogSoftmax(
    LowerContext& ctx, bool log) {
  const LoweredValue& in = ctx.value(0);
  const int rank = static_cast<int>(in.sizes.size());
  std::vector<bool> reduced(rank, false);
  if (rank > 0) {
    const int64_t d = ctx.arg(1).i;
    reduced[d < 0 ? d + rank : d] = true;
  }
  const DType f32 = DType::kFloat32;
  const Expr x = ir::Cast(LowerContext::ReadBroadcast(in, in.sizes), f32);
  auto mx = LowerReductionOver(ctx, in, reduced, true, ReduceKind::kMax, f32,
                               f32, x, nullptr);
  if (!mx.ok()) return mx.status();
  const Expr shifted =
      ir::Binary(ExprOp::kSub, x, ReadKept((*mx)[0], reduced), f32);
  const Expr e = ir::Unary(ExprOp::kExp, shifted, f32);
  auto sum = LowerReductionOver(ctx, in, reduced, true, ReduceKind::kSum, f32,
                                f32, e, nullptr);
  if (!sum.ok()) return sum.status();
  const Expr denom = ReadKept((*sum)[0], reduced);
  const Expr out =
      log ? ir::Binary(ExprOp::kSub, shifted,
                       ir::Unary(ExprOp::kLog, denom, f32), f32)
          : ir::Binary(ExprOp::kDiv, e, denom, f32);
  LoopNode node;
  node.kind = LoopNode::Kind::kPointwise;
  node.dtype = ctx.out_type().dtype;
  node.sizes = in.sizes;
  node.body = ir::Cast(out, node.dtype);
  return std::vector<LoweredValue>{ctx.AddNode(std::move(node))};
}

absl::StatusOr<std::vector<LoweredValue>> LowerSoftmax(LowerContext& ctx) {
  return LowerSoftmaxOrLogSoftmax(ctx, /*log=*/false);
}

absl::StatusOr<std::vector<LoweredValue>> LowerLogSoftmax(LowerContext& ctx) {
  return LowerSoftmaxOrLogSoftmax(ctx, /*log=*/true);
}

Expr MeanOf(Expr acc, Expr count) {
  return ir::Binary(ExprOp::kDiv, acc, ir::Cast(count, DType::kFloat32),
                    DType::kFloat32);
}

// Two passes per row (mean, then variance about it): numerically sound
// where E[x^2] - E[x]^2 is not. Fusion keeps all of it in one row kernel.
absl::StatusOr<std::vector<LoweredValue>> LowerLayerNorm(LowerContext& ctx) {
  const LoweredValue& in = ctx.value(0);
  const int rank = static_cast<int>(in.sizes.size());
  const int axis = rank - static_cast<int>(ctx.arg(1).ints.size());
  std::vector<bool> reduced(rank, false);
  for (int d = axis; d < rank; ++d) reduced[d] = true;
  const DType f32 = DType::kFloat32;
  const Expr x = ir::Cast(LowerContext::ReadBroadcast(in, in.sizes), f32);
  auto mean = LowerReductionOver(ctx, in, reduced, true, ReduceKind::kSum, f32,
                                 f32, x, MeanOf);
  if (!mean.ok()) return mean.status();
  const Expr dev =
      ir::Binary(ExprOp::kSub, x, ReadKept((*mean)[0], reduced), f32);
  auto var = LowerReductionOver(ctx, in, reduced, true, ReduceKind::kSum, f32,
                                f32, ir::Binary(ExprOp::kMul, dev, dev, f32),
                                MeanOf);
  if (!var.ok()) return var.status();
  const LoweredValue& v = (*var)[0];
  LoopNode rstd;
  rstd.kind = LoopNode::Kind::kPointwise;
  rstd.dtype = ctx.out_type(2).dtype;
  rstd.sizes = v.sizes;
  rstd.body = ir::Cast(
      ir::Unary(ExprOp::kRsqrt,
                ir::Binary(ExprOp::kAdd,
                           LowerContext::Read(v, IdentityIndex(rank)),
                           ir::Const(ctx.arg(4).ScalarAsDouble(), f32), f32),
                f32),
      rstd.dtype);
  LoweredValue rstd_value = ctx.AddNode(std::move(rstd));
  Expr y = ir::Binary(ExprOp::kMul, dev,
                      ir::Cast(ReadKept(rstd_value, reduced), f32), f32);
  if (ctx.is_tensor(2)) {
    y = ir::Binary(
        ExprOp::kMul, y,
        ir::Cast(LowerContext::ReadBroadcast(ctx.value(2), in.sizes), f32),
        f32);
  }
  if (ctx.is_tensor(3)) {
    y = ir::Binary(
        ExprOp::kAdd, y,
        ir::Cast(LowerContext::ReadBroadcast(ctx.value(3), in.sizes), f32),
        f32);
  }
  LoopNode out;
  out.kind = LoopNode::Kind::kPointwise;
  out.dtype = ctx.out_type(0).dtype;
  out.sizes = in.sizes;
  out.body = ir::Cast(y, out.dtype);
  LoweredValue out_value = ctx.AddNode(std::move(out));
  LoweredValue mean_value = (*mean)[0];
  return std::vector<LoweredValue>{out_value, mean_value, rstd_value};
}

}  // namespace

void RegisterCompositeLowerings(OpLowerings& table) {
  table.Add("aten._softmax.default", LowerSoftmax);
  table.Add("aten._log_softmax.default", LowerLogSoftmax);
  table.Add("aten.native_layer_norm.default", LowerLayerNorm);
}

}  // namespace kiln
