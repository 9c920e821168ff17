// Lowerings of the creation ops (signatures in graph/ops/creation.cc): a
// pointwise node over the output computing the fill value or the arange
// element. The *_like ops read only their input's sizes; the empty ops give
// zeros.
#include <cmath>
#include <cstdint>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"
#include "graph/ops/creation.h"

namespace kiln {
namespace {

// The scalar `value` as a constant: floating in the output dtype (float32
// for an integral output and a float value), else int64.
Expr FillConstant(const Attr& value, DType out) {
  return IsFloating(out) || value.kind == Attr::Kind::kFloat
             ? ir::Const(value.ScalarAsDouble(),
                         IsFloating(out) ? out : DType::kFloat32)
             : ir::IntConst(value.kind == Attr::Kind::kBool ? value.b : value.i,
                            DType::kInt64);
}

absl::StatusOr<std::vector<LoweredValue>> LowerFull(LowerContext& ctx) {
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, FillConstant(ctx.arg(1), ctx.out_type().dtype))};
}

absl::StatusOr<std::vector<LoweredValue>> LowerFullLike(LowerContext& ctx) {
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, FillConstant(ctx.arg(1), ctx.out_type().dtype))};
}

// zeros_like, empty_like, empty.memory_format, empty_strided.
absl::StatusOr<std::vector<LoweredValue>> LowerZeros(LowerContext& ctx) {
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, FillConstant(Attr::Int(0), ctx.out_type().dtype))};
}

absl::StatusOr<std::vector<LoweredValue>> LowerOnesLike(LowerContext& ctx) {
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, FillConstant(Attr::Int(1), ctx.out_type().dtype))};
}

absl::StatusOr<std::vector<LoweredValue>> LowerScalarTensor(LowerContext& ctx) {
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, FillConstant(ctx.arg(0), ctx.out_type().dtype))};
}

// arange.default, .start, .start_step: start + i * step computed in float,
// or in int64 for an integral output with integral start and step.
absl::StatusOr<std::vector<LoweredValue>> LowerArange(LowerContext& ctx) {
  auto [start, end, step] = ops::ArangeRangeOf(ctx.node());
  (void)end;
  // Computed in double-free float: start + i * step, as the reference.
  const Expr i = ir::Cast(ir::Var(0), DType::kFloat32);
  Expr v =
      ir::Binary(ExprOp::kAdd, ir::Const(start, DType::kFloat32),
                 ir::Binary(ExprOp::kMul, i, ir::Const(step, DType::kFloat32),
                            DType::kFloat32),
                 DType::kFloat32);
  if (!IsFloating(ctx.out_type().dtype) && start == std::floor(start) &&
      step == std::floor(step)) {
    v = ir::Add(ir::IntConst(static_cast<int64_t>(start)),
                ir::Mul(ir::Var(0), ir::IntConst(static_cast<int64_t>(step))));
  }
  return std::vector<LoweredValue>{ops::PointwiseOutput(ctx, v)};
}

}  // namespace

void RegisterCreationLowerings(OpLowerings& table) {
  table.Add("aten.full.default", LowerFull);
  table.Add("aten.scalar_tensor.default", LowerScalarTensor);
  table.Add("aten.arange.default", LowerArange);
  table.Add("aten.arange.start", LowerArange);
  table.Add("aten.arange.start_step", LowerArange);
  table.Add("aten.full_like.default", LowerFullLike);
  table.Add("aten.zeros_like.default", LowerZeros);
  table.Add("aten.ones_like.default", LowerOnesLike);
  table.Add("aten.empty_like.default", LowerZeros);
  table.Add("aten.empty.memory_format", LowerZeros);
  table.Add("aten.empty_strided.default", LowerZeros);
}

}  // namespace kiln
