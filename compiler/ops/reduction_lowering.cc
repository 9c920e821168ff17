// Lowerings of the reduction family (graph/ops/reduction.h): one reduction
// node per op (var: the mean, then the sum of squared deviations from it).
#include <utility>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"
#include "graph/ops/reduction.h"

namespace kiln {
namespace {

using ops::LowerReductionOver;
using ops::ReadKept;

// What every reduction lowering starts from.
struct ReductionArgs {
  const LoweredValue& in;
  DType out;
  std::vector<bool> reduced;
  bool keepdim;
};

ReductionArgs ArgsOf(const LowerContext& ctx) {
  const ReductionOp& op = *FindReduction(ctx.node().op->name);
  const LoweredValue& in = ctx.value(0);
  return {in, ctx.out_type().dtype,
          ReducedMask(ctx.node(), op, static_cast<int>(in.sizes.size())),
          KeepDim(ctx.node(), op)};
}

Expr FloatDiv(Expr acc, Expr count) {
  return ir::Binary(ExprOp::kDiv, acc, ir::Cast(count, DType::kFloat32),
                    DType::kFloat32);
}

// A reduction node of `kind` computing in `compute` with no finalize.
absl::StatusOr<std::vector<LoweredValue>> LowerPlain(LowerContext& ctx,
                                                     ReduceKind kind,
                                                     DType compute) {
  ReductionArgs a = ArgsOf(ctx);
  return LowerReductionOver(ctx, a.in, a.reduced, a.keepdim, kind, compute,
                            a.out, nullptr, nullptr);
}

absl::StatusOr<std::vector<LoweredValue>> LowerSum(LowerContext& ctx) {
  return LowerPlain(ctx, ReduceKind::kSum, ctx.out_type().dtype);
}

absl::StatusOr<std::vector<LoweredValue>> LowerProd(LowerContext& ctx) {
  return LowerPlain(ctx, ReduceKind::kProd, ctx.out_type().dtype);
}

absl::StatusOr<std::vector<LoweredValue>> LowerMean(LowerContext& ctx) {
  ReductionArgs a = ArgsOf(ctx);
  return LowerReductionOver(ctx, a.in, a.reduced, a.keepdim, ReduceKind::kSum,
                            a.out, a.out, nullptr, FloatDiv);
}

absl::StatusOr<std::vector<LoweredValue>> LowerAmax(LowerContext& ctx) {
  return LowerPlain(ctx, ReduceKind::kMax, ctx.value(0).dtype);
}

absl::StatusOr<std::vector<LoweredValue>> LowerAmin(LowerContext& ctx) {
  return LowerPlain(ctx, ReduceKind::kMin, ctx.value(0).dtype);
}

absl::StatusOr<std::vector<LoweredValue>> LowerArgMax(LowerContext& ctx) {
  return LowerPlain(ctx, ReduceKind::kArgMax, ctx.value(0).dtype);
}

absl::StatusOr<std::vector<LoweredValue>> LowerArgMin(LowerContext& ctx) {
  return LowerPlain(ctx, ReduceKind::kArgMin, ctx.value(0).dtype);
}

absl::StatusOr<std::vector<LoweredValue>> LowerAny(LowerContext& ctx) {
  return LowerPlain(ctx, ReduceKind::kAny, DType::kBool);
}

absl::StatusOr<std::vector<LoweredValue>> LowerAll(LowerContext& ctx) {
  return LowerPlain(ctx, ReduceKind::kAll, DType::kBool);
}

// Two passes over each row, numerically sound: the mean first, then the sum
// of squared deviations from it, divided by max(0, count - correction).
absl::StatusOr<std::vector<LoweredValue>> LowerVar(LowerContext& ctx) {
  ReductionArgs a = ArgsOf(ctx);
  const DType f32 = DType::kFloat32;
  auto mean = LowerReductionOver(ctx, a.in, a.reduced, /*keepdim=*/true,
                                 ReduceKind::kSum, f32, f32, nullptr, FloatDiv);
  if (!mean.ok()) return mean.status();
  const Expr x = ir::Cast(LowerContext::ReadBroadcast(a.in, a.in.sizes), f32);
  const Expr dev =
      ir::Binary(ExprOp::kSub, x, ReadKept((*mean)[0], a.reduced), f32);
  const Expr sq = ir::Binary(ExprOp::kMul, dev, dev, f32);
  const double correction =
      Correction(ctx.node(), *FindReduction(ctx.node().op->name));
  auto finalize = [correction](Expr acc, Expr count) {
    Expr n = ir::Binary(ExprOp::kSub, ir::Cast(count, DType::kFloat32),
                        ir::Const(correction, DType::kFloat32),
                        DType::kFloat32);
    n = ir::Binary(ExprOp::kMax, n, ir::Const(0, DType::kFloat32),
                   DType::kFloat32);
    return ir::Binary(ExprOp::kDiv, acc, n, DType::kFloat32);
  };
  return LowerReductionOver(ctx, a.in, a.reduced, a.keepdim, ReduceKind::kSum,
                            f32, a.out, sq, finalize);
}

LowerFn LoweringOf(Reduction kind) {
  switch (kind) {
    case Reduction::kSum:
      return LowerSum;
    case Reduction::kMean:
      return LowerMean;
    case Reduction::kProd:
      return LowerProd;
    case Reduction::kMax:
      return LowerAmax;
    case Reduction::kMin:
      return LowerAmin;
    case Reduction::kVar:
      return LowerVar;
    case Reduction::kArgMax:
      return LowerArgMax;
    case Reduction::kArgMin:
      return LowerArgMin;
    case Reduction::kAny:
      return LowerAny;
    case Reduction::kAll:
      return LowerAll;
  }
  return nullptr;
}

}  // namespace

void RegisterReductionLowerings(OpLowerings& table) {
  for (const ReductionOp& op : ReductionOps()) {
    table.Add(op.name, LoweringOf(op.kind));
  }
}

}  // namespace kiln
