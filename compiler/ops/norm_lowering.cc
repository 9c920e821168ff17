// Lowerings of the norm family (signatures: graph/ops/norm.cc) to
// reductions and pointwise nodes, computing in float32 (float16/bfloat16
// inputs as PyTorch's opmath), so that fusion keeps each op in one row
// kernel with its neighbours and the GPU splits its reductions as it does
// the forward ops'. The formulas are norm_reference.cc's.
#include <utility>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"

namespace kiln {
namespace {

using ops::LowerReductionOver;
using ops::ReadKept;

constexpr DType kF32 = DType::kFloat32;

Expr Mul(Expr a, Expr b) { return ir::Binary(ExprOp::kMul, a, b, kF32); }
Expr Sub(Expr a, Expr b) { return ir::Binary(ExprOp::kSub, a, b, kF32); }

// Argument i read broadcast over `sizes`, in float32.
Expr ReadF32(const LowerContext& ctx, int i,
             const std::vector<SymExpr>& sizes) {
  return ir::Cast(LowerContext::ReadBroadcast(ctx.value(i), sizes), kF32);
}

Expr MeanOf(Expr acc, Expr count) {
  return ir::Binary(ExprOp::kDiv, acc, ir::Cast(count, kF32), kF32);
}

// A float32 sum of `body` over the `reduced` dims of `space`; keepdim.
absl::StatusOr<LoweredValue> SumOver(LowerContext& ctx,
                                     const LoweredValue& space,
                                     const std::vector<bool>& reduced,
                                     bool keepdim, Expr body, DType out,
                                     bool mean = false) {
  auto r =
      LowerReductionOver(ctx, space, reduced, keepdim, ReduceKind::kSum, kF32,
                         out, std::move(body), mean ? MeanOf : nullptr);
  if (!r.ok()) return r.status();
  return (*r)[0];
}

// A pointwise node of output o's sizes and dtype computing `body`.
LoweredValue OutputNode(LowerContext& ctx, int o, Expr body) {
  LoopNode node;
  node.kind = LoopNode::Kind::kPointwise;
  node.dtype = ctx.out_type(o).dtype;
  node.sizes = ctx.out_type(o).sizes;
  node.body = ir::Cast(std::move(body), node.dtype);
  return ctx.AddNode(std::move(node));
}

// Zeros for output o (an output its mask turned off: nothing reads it).
LoweredValue ZerosOutput(LowerContext& ctx, int o) {
  return OutputNode(ctx, o, ir::Const(0, kF32));
}

bool MaskBit(const LowerContext& ctx, int arg, int i) {
  return ctx.arg(arg).ints[i].AsConstant().value_or(1) != 0;
}

// ---- softmax backward ----

absl::StatusOr<std::vector<LoweredValue>> LowerSoftmaxBackward(
    LowerContext& ctx, bool log) {
  const LoweredValue& y = ctx.value(1);
  const int rank = static_cast<int>(y.sizes.size());
  std::vector<bool> reduced(rank, false);
  if (rank > 0) {
    const int64_t d = ctx.arg(2).i;
    reduced[d < 0 ? d + rank : d] = true;
  }
  const Expr g = ReadF32(ctx, 0, y.sizes);
  const Expr out = ReadF32(ctx, 1, y.sizes);
  auto s = SumOver(ctx, y, reduced, true, log ? g : Mul(g, out), kF32);
  if (!s.ok()) return s.status();
  const Expr sum = ReadKept(*s, reduced);
  const Expr gi = log ? Sub(g, Mul(ir::Unary(ExprOp::kExp, out, kF32), sum))
                      : Mul(out, Sub(g, sum));
  return std::vector<LoweredValue>{OutputNode(ctx, 0, gi)};
}

absl::StatusOr<std::vector<LoweredValue>> LowerSoftmaxBackwardData(
    LowerContext& ctx) {
  return LowerSoftmaxBackward(ctx, /*log=*/false);
}

absl::StatusOr<std::vector<LoweredValue>> LowerLogSoftmaxBackwardData(
    LowerContext& ctx) {
  return LowerSoftmaxBackward(ctx, /*log=*/true);
}

// ---- native_layer_norm_backward ----

absl::StatusOr<std::vector<LoweredValue>> LowerLayerNormBackward(
    LowerContext& ctx) {
  const LoweredValue& in = ctx.value(1);
  const int rank = static_cast<int>(in.sizes.size());
  const int axis = rank - static_cast<int>(ctx.arg(2).ints.size());
  std::vector<bool> row(rank, false), outer(rank, false);
  for (int d = 0; d < rank; ++d) (d >= axis ? row : outer)[d] = true;
  const Expr g = ReadF32(ctx, 0, in.sizes);
  const Expr x = ReadF32(ctx, 1, in.sizes);
  const Expr mean = ir::Cast(ReadKept(ctx.value(3), row), kF32);
  const Expr rstd = ir::Cast(ReadKept(ctx.value(4), row), kF32);
  const Expr xhat = Mul(Sub(x, mean), rstd);
  const bool has_w = ctx.is_tensor(5);
  std::vector<LoweredValue> outs;
  if (MaskBit(ctx, 7, 0)) {
    // Weight element of input element v: its trailing dims.
    const Expr gw = has_w ? Mul(g, ReadF32(ctx, 5, in.sizes)) : g;
    auto m1 = SumOver(ctx, in, row, true, gw, kF32, /*mean=*/true);
    if (!m1.ok()) return m1.status();
    auto m2 = SumOver(ctx, in, row, true, Mul(gw, xhat), kF32, /*mean=*/true);
    if (!m2.ok()) return m2.status();
    outs.push_back(OutputNode(ctx, 0,
                              Mul(rstd, Sub(Sub(gw, ReadKept(*m1, row)),
                                            Mul(xhat, ReadKept(*m2, row))))));
  } else {
    outs.push_back(ZerosOutput(ctx, 0));
  }
  const struct {
    int arg;
    Expr body;
  } params[] = {{5, Mul(g, xhat)}, {6, g}};
  for (int k = 0; k < 2; ++k) {
    if (!MaskBit(ctx, 7, k + 1) || !ctx.is_tensor(params[k].arg)) {
      outs.push_back(ZerosOutput(ctx, k + 1));
      continue;
    }
    auto s = SumOver(ctx, in, outer, /*keepdim=*/false, params[k].body,
                     ctx.out_type(k + 1).dtype);
    if (!s.ok()) return s.status();
    outs.push_back(*s);
  }
  return outs;
}

}  // namespace

void RegisterNormLowerings(OpLowerings& table) {
  table.Add("aten._softmax_backward_data.default", LowerSoftmaxBackwardData);
  table.Add("aten._log_softmax_backward_data.default",
            LowerLogSoftmaxBackwardData);
  table.Add("aten.native_layer_norm_backward.default", LowerLayerNormBackward);
}

}  // namespace kiln
