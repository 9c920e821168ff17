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
// cuBLASLt) the operands are read in their dtype; otherwise (CPU BLAS) they
// are converted to float32 by the kernels that write them and the product
// is rounded once at the end.
#include <optional>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"

namespace kiln {
namespace {

// The dtype of the library call's matrices for a product in `out` (Kiln's
// floating dtypes are float32, float16 and bfloat16); it accumulates in
// float32.
DType GemmDType(const LowerContext& ctx, DType out) {
  return ctx.options().half_precision_gemm ? out : DType::kFloat32;
}

// Whether a leading dimension can serve a matrix whose rows (or columns)
// have `extent` elements: statically known to be too small is not.
bool LeadingDimOk(const SymExpr& ld, const SymExpr& extent) {
  const std::optional<int64_t> l = ld.AsConstant(), e = extent.AsConstant();
  if (l && *l < 1) return false;
  return !(l && e && *l < *e);
}

// How the library reads `v` (rank 2, or 3 with a batch dim) in place, or
// nullopt when it cannot.
std::optional<MatrixLayout> InPlaceLayout(const LoopGraph& loops,
                                          const LoweredValue& v) {
  const LoopNode& node = loops.nodes[v.node];
  const std::vector<SymExpr> strides = node.kind == LoopNode::Kind::kInput
                                           ? node.strides
                                           : ContiguousStrides(node.sizes);
  const int rank = static_cast<int>(v.sizes.size());
  Expr flat = ir::IntConst(0);
  for (size_t d = 0; d < v.index.size(); ++d)
    flat = ir::Add(flat, ir::Mul(v.index[d], ir::FromSym(strides[d])));
  std::optional<ir::AffineForm> affine = ir::Affine(flat, rank);
  if (!affine) return std::nullopt;
  const SymExpr& rows = v.sizes[rank - 2];
  const SymExpr& cols = v.sizes[rank - 1];
  MatrixLayout layout;
  if (rows == SymExpr(0) || cols == SymExpr(0) ||
      (rank == 3 && v.sizes[0] == SymExpr(0))) {
    // No elements: nothing is read, any valid layout will do.
    layout.row_stride = cols == SymExpr(0) ? SymExpr(1) : cols;
    return layout;
  }
  layout.offset = affine->constant;
  layout.batch_stride = rank == 3 ? affine->coeffs[0] : SymExpr(0);
  layout.row_stride = affine->coeffs[rank - 2];
  layout.col_stride = affine->coeffs[rank - 1];
  // The stride of a dim of size 1 is free: pick one the library takes.
  if (rank == 3 && v.sizes[0] == SymExpr(1)) layout.batch_stride = SymExpr(0);
  if (rows == SymExpr(1)) {
    layout.row_stride = layout.col_stride == SymExpr(1) ? cols : SymExpr(1);
  }
  if (cols == SymExpr(1)) {
    layout.col_stride = layout.row_stride == SymExpr(1) ? rows : SymExpr(1);
  }
  if (layout.col_stride == SymExpr(1) && LeadingDimOk(layout.row_stride, cols))
    return layout;
  if (layout.row_stride == SymExpr(1) && LeadingDimOk(layout.col_stride, rows))
    return layout;
  return std::nullopt;
}

// `v` converted to `dtype` in a contiguous node of its own.
LoweredValue Materialize(LowerContext& ctx, const LoweredValue& v,
                         DType dtype) {
  LoopNode node;
  node.kind = LoopNode::Kind::kPointwise;
  node.dtype = dtype;
  node.sizes = v.sizes;
  node.body = ir::Cast(
      LowerContext::Read(v, IdentityIndex(static_cast<int>(v.sizes.size()))),
      dtype);
  return ctx.AddNode(std::move(node));
}

struct GemmOperand {
  int node;
  MatrixLayout layout;
};

GemmOperand OperandOf(LowerContext& ctx, const LoweredValue& v, DType dtype) {
  LoweredValue x = v.dtype == dtype ? v : Materialize(ctx, v, dtype);
  if (std::optional<MatrixLayout> in_place = InPlaceLayout(ctx.loops(), x))
    return {x.node, *in_place};
  // Written contiguously, row-major: always a layout the library takes.
  x = Materialize(ctx, x, dtype);
  const int rank = static_cast<int>(x.sizes.size());
  MatrixLayout contiguous;
  contiguous.batch_stride = x.sizes[rank - 2] * x.sizes[rank - 1];
  contiguous.row_stride = x.sizes[rank - 1];
  if (x.sizes[rank - 2] == SymExpr(1)) contiguous.row_stride = SymExpr(1);
  return {x.node, contiguous};
}

// alpha * x @ y (rank 2, or 3 with a batch dim) as an extern node of the
// op's output sizes, in the compute dtype.
LoweredValue AddGemm(LowerContext& ctx, const LoweredValue& x,
                     const LoweredValue& y, double alpha) {
  const std::vector<SymExpr>& sizes = ctx.out_type().sizes;
  const int rank = static_cast<int>(sizes.size());
  const DType data = GemmDType(ctx, ctx.out_type().dtype);
  const GemmOperand a = OperandOf(ctx, x, data);
  const GemmOperand b = OperandOf(ctx, y, data);
  GemmCall g;
  g.a = a.layout;
  g.b = b.layout;
  g.batch = rank == 3 ? sizes[0] : SymExpr(1);
  g.m = sizes[rank - 2];
  g.n = sizes[rank - 1];
  g.k = x.sizes[rank - 1];
  g.c.offset = SymExpr(0);
  g.c.batch_stride = g.m * g.n;
  g.c.row_stride = g.n;
  g.c.col_stride = SymExpr(1);
  g.alpha = alpha;
  g.compute_dtype = DType::kFloat32;
  LoopNode node;
  node.kind = LoopNode::Kind::kExtern;
  node.dtype = data;
  node.sizes = sizes;
  node.gemm = std::move(g);
  node.extern_inputs = {a.node, b.node};
  return ctx.AddNode(std::move(node));
}

// The product in the output dtype.
LoweredValue InOutputDType(LowerContext& ctx, LoweredValue product) {
  if (product.dtype == ctx.out_type().dtype) return product;
  return Materialize(ctx, product, ctx.out_type().dtype);
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
  return std::vector<LoweredValue>{ops::PointwiseOutput(ctx, sum)};
}

}  // namespace

void RegisterMatmulLowerings(OpLowerings& table) {
  table.Add("aten.mm.default", LowerMm);
  table.Add("aten.addmm.default", LowerAddmm);
  table.Add("aten.bmm.default", LowerMm);
  table.Add("aten.baddbmm.default", LowerAddmm);
}

}  // namespace kiln
