#include "compiler/ops/lowering_util.h"

#include <utility>

#include "graph/ops/signature_util.h"

namespace kiln::ops {

absl::StatusOr<std::vector<LoweredValue>> LowerReductionOver(
    LowerContext& ctx, const LoweredValue& in, const std::vector<bool>& reduced,
    bool keepdim, ReduceKind kind, DType compute, DType out_dtype,
    Expr body_override, std::function<Expr(Expr acc, Expr count)> finalize) {
  const std::vector<SymExpr>& space = in.sizes;
  LoopNode node;
  node.kind = LoopNode::Kind::kReduction;
  node.dtype = out_dtype;
  node.reduce = kind;
  node.reduce_sizes = space;
  node.reduced = reduced;
  node.keepdim = keepdim;
  node.sizes = ReducedShape(space, reduced, keepdim);
  node.body = body_override
                  ? body_override
                  : ir::Cast(LowerContext::ReadBroadcast(in, space), compute);
  node.acc_dtype =
      IsFloating(compute) ? DType::kFloat32
      : (kind == ReduceKind::kAny || kind == ReduceKind::kAll) ? DType::kBool
      : IsArgReduce(kind)                                      ? compute
                                                               : DType::kInt64;
  if (finalize) {
    SymExpr count(1);
    for (size_t d = 0; d < space.size(); ++d) {
      if (reduced[d]) count = count * space[d];
    }
    node.finalize = finalize(ir::Acc(0, node.acc_dtype), ir::FromSym(count));
  }
  return std::vector<LoweredValue>{ctx.AddNode(std::move(node))};
}

Expr ReadKept(const LoweredValue& r, const std::vector<bool>& reduced) {
  std::vector<Expr> idx;
  for (size_t d = 0; d < reduced.size(); ++d) {
    idx.push_back(reduced[d] ? ir::IntConst(0) : ir::Var(static_cast<int>(d)));
  }
  return LowerContext::Read(r, idx);
}

LoweredValue PointwiseOutput(LowerContext& ctx, Expr body) {
  LoopNode node;
  node.kind = LoopNode::Kind::kPointwise;
  node.dtype = ctx.out_type().dtype;
  node.sizes = ctx.out_type().sizes;
  node.body = ir::Cast(std::move(body), node.dtype);
  return ctx.AddNode(std::move(node));
}

}  // namespace kiln::ops
