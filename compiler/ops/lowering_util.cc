#include "compiler/ops/lowering_util.h"

#include <utility>

namespace kiln::ops {

// PLACEHOLDER: LowerReductionOver and ReadKept move here from
// compiler/ops/reduction_old.cc.

LoweredValue PointwiseOutput(LowerContext& ctx, Expr body) {
  LoopNode node;
  node.kind = LoopNode::Kind::kPointwise;
  node.dtype = ctx.out_type().dtype;
  node.sizes = ctx.out_type().sizes;
  node.body = ir::Cast(std::move(body), node.dtype);
  return ctx.AddNode(std::move(node));
}

}  // namespace kiln::ops
