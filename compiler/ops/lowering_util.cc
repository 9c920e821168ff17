#include "compiler/ops/lowering_util.h"

#include <optional>
#include <utility>

#include "graph/ops/random.h"
#include "graph/ops/signature_util.h"

namespace kiln::ops {
namespace {

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

}  // namespace

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

int ContiguousNode(LowerContext& ctx, const LoweredValue& v, DType dtype) {
  const LoopNode& node = ctx.loops().nodes[v.node];
  bool whole = v.dtype == dtype && node.dtype == dtype &&
               node.sizes == v.sizes && v.index.size() == v.sizes.size();
  for (size_t d = 0; whole && d < v.index.size(); ++d) {
    whole = v.index[d]->op == ExprOp::kVar &&
            v.index[d]->index == static_cast<int64_t>(d);
  }
  if (whole && node.kind == LoopNode::Kind::kInput) {
    const std::vector<SymExpr> contiguous = ContiguousStrides(node.sizes);
    for (size_t d = 0; whole && d < node.sizes.size(); ++d) {
      whole = node.sizes[d] == SymExpr(1) || node.strides[d] == contiguous[d];
    }
  }
  if (whole) return v.node;
  return Materialize(ctx, v, dtype).node;
}

GemmDTypes GemmDTypesFor(const LowerOptions& options, DType out) {
  if (options.half_precision_gemm) return {out, out};
  if (out == DType::kBFloat16 && options.bf16_operands_f32_result)
    return {DType::kBFloat16, DType::kFloat32};
  return {DType::kFloat32, DType::kFloat32};
}

LoweredValue AddGemm(LowerContext& ctx, const LoweredValue& x,
                     const LoweredValue& y, double alpha,
                     const std::vector<SymExpr>& sizes, DType data,
                     std::optional<DType> result) {
  const int rank = static_cast<int>(sizes.size());
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
  const LowerOptions& options = ctx.options();
  g.tf32 = options.tf32 && data == DType::kFloat32;
  g.strict_reduction =
      (data == DType::kFloat16 && options.strict_fp16_reduction) ||
      (data == DType::kBFloat16 && options.strict_bf16_reduction);
  g.deterministic = options.deterministic_gemms;
  LoopNode node;
  node.kind = LoopNode::Kind::kExtern;
  node.dtype = result.value_or(data);
  node.sizes = sizes;
  node.gemm = std::move(g);
  node.extern_inputs = {a.node, b.node};
  return ctx.AddNode(std::move(node));
}

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

LoweredValue PointwiseNode(LowerContext& ctx, std::vector<SymExpr> sizes,
                           DType dtype, Expr body) {
  LoopNode node;
  node.kind = LoopNode::Kind::kPointwise;
  node.dtype = dtype;
  node.sizes = std::move(sizes);
  node.body = ir::Cast(std::move(body), dtype);
  return ctx.AddNode(std::move(node));
}

LoweredValue PointwiseOutput(LowerContext& ctx, Expr body) {
  return PointwiseNode(ctx, ctx.out_type().sizes, ctx.out_type().dtype,
                       std::move(body));
}

DType SumDType(DType dtype) {
  return IsFloating(dtype) ? DType::kFloat32 : DType::kInt64;
}

LoweredValue AddScatter(LowerContext& ctx, const std::vector<SymExpr>& sizes,
                        DType dtype, const Expr& base,
                        const std::vector<SymExpr>& space,
                        std::vector<Expr> target, const Expr& value,
                        bool replace, int in_order) {
  const DType acc = replace ? dtype : SumDType(dtype);
  LoopNode node;
  node.kind = LoopNode::Kind::kScatter;
  node.scatter_replace = replace;
  node.dtype = acc;
  node.sizes = sizes;
  node.body = ir::Cast(base, acc);
  node.scatter_sizes = space;
  node.scatter_value = ir::Cast(value, acc);
  for (size_t d = 0; d < space.size(); ++d) {
    bool own = ctx.options().atomic_scatters;
    for (const Expr& t : target) {
      own = own || (t->op == ExprOp::kVar && t->index == static_cast<int>(d));
    }
    node.scatter_inner.push_back(!own || static_cast<int>(d) == in_order);
  }
  node.scatter_index = std::move(target);
  return ctx.AddNode(std::move(node));
}

std::vector<LoweredValue> ScatterOutput(LowerContext& ctx,
                                        const LoweredValue& sum, DType dtype) {
  if (sum.dtype == dtype) return {sum};
  return {PointwiseOutput(
      ctx, ir::Cast(LowerContext::Read(
                        sum, IdentityIndex(static_cast<int>(sum.sizes.size()))),
                    dtype))};
}

Expr RowMajorIndex(const std::vector<SymExpr>& sizes) {
  Expr index = ir::IntConst(0);
  Expr stride = ir::IntConst(1);
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    index = ir::Add(index, ir::Mul(ir::Var(d), stride));
    stride = ir::Mul(stride, ir::FromSym(sizes[d]));
  }
  return index;
}

Expr PhiloxWordAt(const Expr& seed, const Expr& offset, const Expr& index,
                  int words, int which) {
  const int per_call = kPhiloxWords / words;
  const Expr call = ir::Binary(ExprOp::kFloorDiv, index, ir::IntConst(per_call),
                               DType::kInt64);
  const Expr lane = ir::Binary(ExprOp::kRemainder, index,
                               ir::IntConst(per_call), DType::kInt64);
  Expr word = ir::Philox(seed, offset, call, (per_call - 1) * words + which);
  for (int l = per_call - 2; l >= 0; --l) {
    word =
        ir::Select(ir::Binary(ExprOp::kEq, lane, ir::IntConst(l), DType::kBool),
                   ir::Philox(seed, offset, call, l * words + which), word);
  }
  return word;
}

Expr BernoulliDraw(const Expr& word, int64_t threshold) {
  return ir::Binary(ExprOp::kLt,
                    ir::Binary(ExprOp::kBitAnd, word,
                               ir::IntConst((int64_t{1} << kBernoulliBits) - 1),
                               DType::kInt64),
                    ir::IntConst(threshold), DType::kBool);
}

}  // namespace kiln::ops
