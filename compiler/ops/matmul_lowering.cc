// Lowerings of the matrix products (mm, addmm, bmm, baddbmm) to extern
// calls (loop_ir.h, LoopNode::Kind::kExtern): the runtime calls a vendor
// library (issue 16), and the code around the call stays Kiln's.
//
// An operand the library can read in place (a graph input or a realized
// node, through an affine view whose row or column stride is 1: a transposed
// weight, a slice, a reshape of a contiguous tensor) is passed as it is;
// any other operand (a broadcast, a gather, a non-unit-stride view) is first
// written contiguously by a Kiln kernel, fused with its producers. addmm's
// bias and beta become a pointwise node that reads the product's buffer and
// fuses with its consumers.
//
// float16 and bfloat16 products accumulate in float32 either way: on
// targets whose library takes them (LowerOptions::half_precision_gemm,
// cuBLASLt) the operands are read in their dtype and C is written in it;
// bfloat16 on the CPU (LowerOptions::bf16_operands_f32_result, oneDNN) reads
// its operands in bfloat16 and writes a float32 C; otherwise (float16 on the
// CPU) they are converted to float32 by the kernels that write them. A
// float32 C is rounded once at the end.
#include <optional>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"

namespace kiln {
namespace {

// alpha * x @ y (rank 2, or 3 with a batch dim) as an extern node of the
// op's output sizes, in the compute dtype.
LoweredValue AddGemm(LowerContext& ctx, const LoweredValue& x,
                     const LoweredValue& y, double alpha) {
  const ops::GemmDTypes d =
      ops::GemmDTypesFor(ctx.options(), ctx.out_type().dtype);
  return ops::AddGemm(ctx, x, y, alpha, ctx.out_type().sizes, d.operands, d.c);
}

// The product in the output dtype.
LoweredValue InOutputDType(LowerContext& ctx, LoweredValue product) {
  if (product.dtype == ctx.out_type().dtype) return product;
  return ops::Materialize(ctx, product, ctx.out_type().dtype);
}

absl::StatusOr<std::vector<LoweredValue>> LowerMm(LowerContext& ctx) {
  return std::vector<LoweredValue>{
      InOutputDType(ctx, AddGemm(ctx, ctx.value(0), ctx.value(1), 1.0))};
}

// addmm / baddbmm: beta * self + alpha * (batch1 @ batch2); beta = 0 ignores
// self (its NaN and inf do not propagate), as PyTorch.
absl::StatusOr<std::vector<LoweredValue>> LowerAddmm(LowerContext& ctx) {
  const double beta = ctx.arg(3).ScalarAsDouble();
  const double alpha = ctx.arg(4).ScalarAsDouble();
  const LoweredValue product = AddGemm(ctx, ctx.value(1), ctx.value(2), alpha);
  if (beta == 0) return std::vector<LoweredValue>{InOutputDType(ctx, product)};
  const std::vector<SymExpr>& sizes = ctx.out_type().sizes;
  // The sum in float32 (a half-precision product is rounded once before
  // it, as cuBLAS's beta * C is added to the rounded product's accumulator).
  const DType compute = DType::kFloat32;
  Expr bias = ctx.Operand(0, sizes, compute);
  if (beta != 1)
    bias = ir::Binary(ExprOp::kMul, ir::Const(beta, compute), bias, compute);
  const Expr sum = ir::Binary(
      ExprOp::kAdd, bias,
      ir::Cast(LowerContext::Read(
                   product, IdentityIndex(static_cast<int>(sizes.size()))),
               compute),
      compute);
  const LoweredValue result = ops::PointwiseOutput(ctx, sum);
  if (beta == 1 && sizes.size() == 2)
    ctx.MarkEpilogue(result, GemmEpilogue::kBias, product, &ctx.value(0));
  return std::vector<LoweredValue>{result};
}

}  // namespace

void RegisterMatmulLowerings(OpLowerings& table) {
  table.Add("aten.mm.default", LowerMm);
  table.Add("aten.addmm.default", LowerAddmm);
  table.Add("aten.bmm.default", LowerMm);
  table.Add("aten.baddbmm.default", LowerAddmm);
}

}  // namespace kiln
