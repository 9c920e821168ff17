// Lowerings of the indexing ops (signatures in graph/ops/indexing.cc):
// slice and select are index maps over their input; cat is a pointwise node
// selecting, along `dim`, the input each element comes from.
#include <cstdint>
#include <utility>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"
#include "graph/ops/indexing.h"
#include "graph/ops/views.h"

namespace kiln {
namespace {

using ops::OptionalInt;
using ops::WrapCheckedDim;

// slice: start + i * step along `dim`; on a symbolic dim the start is a
// polynomial (ops::SymbolicSlice, which the shape rule checked).
absl::StatusOr<std::vector<LoweredValue>> LowerSlice(LowerContext& ctx) {
  const LoweredValue& v = ctx.value(0);
  const int rank = static_cast<int>(v.sizes.size());
  const int d = WrapCheckedDim(ctx.arg(1).i, rank);
  const int64_t step = ctx.arg(4).i;
  Expr start;
  if (ctx.arg(3).kind == Attr::Kind::kInts) {  // a symbolic end: start >= 0
    start = ir::IntConst(OptionalInt(ctx.arg(2)).value_or(0));
  } else if (auto n = v.sizes[d].AsConstant()) {
    start = ir::IntConst(ops::ClampSlice(*n, OptionalInt(ctx.arg(2)),
                                         OptionalInt(ctx.arg(3)), step)
                             .start);
  } else {
    std::optional<ops::SymSliceBounds> b = ops::SymbolicSlice(
        v.sizes[d], OptionalInt(ctx.arg(2)), OptionalInt(ctx.arg(3)), step);
    if (!b) return absl::InternalError("slice bounds not checked");
    start = b->start.IsConstant() ? ir::IntConst(*b->start.AsConstant())
                                  : ir::FromSym(b->start);
  }
  std::vector<Expr> j = IdentityIndex(rank);
  j[d] = ir::Add(start, ir::Mul(ir::Var(d), ir::IntConst(step)));
  return std::vector<LoweredValue>{
      LowerContext::Remap(v, j, ctx.out_type().sizes)};
}

absl::StatusOr<std::vector<LoweredValue>> LowerSelect(LowerContext& ctx) {
  const LoweredValue& v = ctx.value(0);
  const int rank = static_cast<int>(v.sizes.size());
  const int d = WrapCheckedDim(ctx.arg(1).i, rank);
  const int64_t index = ctx.arg(2).i;
  std::vector<Expr> j;
  for (int k = 0, o = 0; k < rank; ++k) {
    if (k != d) {
      j.push_back(ir::Var(o++));
    } else if (index >= 0) {
      j.push_back(ir::IntConst(index));
    } else {  // from the end; the size may be symbolic
      j.push_back(ir::Add(ir::FromSym(v.sizes[d]), ir::IntConst(index)));
    }
  }
  return std::vector<LoweredValue>{
      LowerContext::Remap(v, j, ctx.out_type().sizes)};
}

// slice_scatter / select_scatter: a pointwise node over self's shape
// choosing, along `dim`, src where the position is in the slice (is the
// selected index) and self elsewhere. src's index is clamped into range, so
// the unchosen branch never reads outside src.
Expr ScatterBody(LowerContext& ctx, int d, Expr in_slice, Expr src_pos,
                 bool drop_dim) {
  const std::vector<SymExpr>& sizes = ctx.out_type().sizes;
  const DType dtype = ctx.out_type().dtype;
  const int rank = static_cast<int>(sizes.size());
  std::vector<Expr> j;
  for (int k = 0; k < rank; ++k) {
    if (k != d) {
      j.push_back(ir::Var(k));
    } else if (!drop_dim) {
      j.push_back(std::move(src_pos));
    }
  }
  const Expr self = LowerContext::Read(ctx.value(0), IdentityIndex(rank));
  const Expr src = LowerContext::Read(ctx.value(1), j);
  return ir::Select(std::move(in_slice), ir::Cast(src, dtype),
                    ir::Cast(self, dtype));
}

Expr IntBinary(ExprOp op, Expr a, Expr b, DType dtype = DType::kInt64) {
  return ir::Binary(op, std::move(a), std::move(b), dtype);
}

absl::StatusOr<std::vector<LoweredValue>> LowerSliceScatter(LowerContext& ctx) {
  const std::vector<SymExpr>& sizes = ctx.out_type().sizes;
  const int rank = static_cast<int>(sizes.size());
  const int d = WrapCheckedDim(ctx.arg(2).i, rank);
  const int64_t step = ctx.arg(5).i;
  // Start and length: constants, or polynomials on a symbolic dim (step 1,
  // length >= 1; checked by the shape rule).
  Expr start, length, last;
  if (auto n = sizes[d].AsConstant()) {
    const ops::SliceBounds b = ops::ClampSlice(*n, OptionalInt(ctx.arg(3)),
                                               OptionalInt(ctx.arg(4)), step);
    if (b.length == 0) {  // nothing replaced: self
      return std::vector<LoweredValue>{ops::PointwiseOutput(
          ctx, LowerContext::Read(ctx.value(0), IdentityIndex(rank)))};
    }
    start = ir::IntConst(b.start);
    length = ir::IntConst(b.length * step);
    last = ir::IntConst(b.length - 1);
  } else {
    std::optional<ops::SymSliceBounds> b = ops::SymbolicSlice(
        sizes[d], OptionalInt(ctx.arg(3)), OptionalInt(ctx.arg(4)), step);
    if (!b) return absl::InternalError("slice_scatter bounds not checked");
    auto sym = [](const SymExpr& e) {
      return e.IsConstant() ? ir::IntConst(*e.AsConstant()) : ir::FromSym(e);
    };
    start = sym(b->start);
    length = sym(b->length);
    last = sym(b->length - SymExpr(1));
  }
  const Expr v = ir::Var(d);
  const Expr rel = IntBinary(ExprOp::kSub, v, start);
  Expr in_slice = ir::Binary(
      ExprOp::kAnd, IntBinary(ExprOp::kGe, rel, ir::IntConst(0), DType::kBool),
      IntBinary(ExprOp::kLt, rel, length, DType::kBool), DType::kBool);
  if (step != 1) {
    in_slice =
        ir::Binary(ExprOp::kAnd, in_slice,
                   IntBinary(ExprOp::kEq, ir::Mod(rel, ir::IntConst(step)),
                             ir::IntConst(0), DType::kBool),
                   DType::kBool);
  }
  Expr pos = ir::FloorDiv(rel, ir::IntConst(step));
  pos = IntBinary(ExprOp::kMin, IntBinary(ExprOp::kMax, pos, ir::IntConst(0)),
                  last);
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, ScatterBody(ctx, d, std::move(in_slice), std::move(pos), false))};
}

absl::StatusOr<std::vector<LoweredValue>> LowerSelectScatter(
    LowerContext& ctx) {
  const std::vector<SymExpr>& sizes = ctx.out_type().sizes;
  const int rank = static_cast<int>(sizes.size());
  const int d = WrapCheckedDim(ctx.arg(2).i, rank);
  const int64_t index = ctx.arg(3).i;
  const Expr at = index >= 0
                      ? ir::IntConst(index)
                      : ir::Add(ir::FromSym(sizes[d]), ir::IntConst(index));
  Expr chosen = IntBinary(ExprOp::kEq, ir::Var(d), at, DType::kBool);
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, ScatterBody(ctx, d, std::move(chosen), nullptr, true))};
}

// cat: a chain of selects on the concatenated dim, last piece innermost;
// legacy empty 1-D inputs are skipped. A select evaluates both branches, so
// each piece is read at its position clamped into its own range: at other
// pieces' positions its load stays inside its buffer (unclamped, a GPU
// kernel faulted on DenseNet's concatenations).
absl::StatusOr<std::vector<LoweredValue>> LowerCat(LowerContext& ctx) {
  const TensorType& out = ctx.out_type();
  if (out.rank() == 1 && out.sizes[0] == SymExpr(0)) {
    return std::vector<LoweredValue>{
        ops::PointwiseOutput(ctx, ir::Const(0, out.dtype))};
  }
  const int d = WrapCheckedDim(ctx.arg(1).i, out.rank());
  Expr body;
  SymExpr offset(0);
  std::vector<std::pair<SymExpr, Expr>> pieces;  // (end offset, value)
  // Pieces empty along the dim hold no position (and no element to read).
  auto skipped = [&](const LoweredValue& v) {
    return ops::SkippedByCat(v.sizes) || v.sizes[d] == SymExpr(0);
  };
  int live = 0;
  for (ValueId t : ctx.arg(0).tensors) live += skipped(ctx.value_of(t)) ? 0 : 1;
  if (live == 0) {  // an empty result
    return std::vector<LoweredValue>{
        ops::PointwiseOutput(ctx, ir::Const(0, out.dtype))};
  }
  for (ValueId t : ctx.arg(0).tensors) {
    const LoweredValue& v = ctx.value_of(t);
    if (skipped(v)) continue;
    std::vector<Expr> idx = IdentityIndex(out.rank());
    idx[d] =
        ir::Add(ir::Var(d), ir::Mul(ir::IntConst(-1), ir::FromSym(offset)));
    const bool first = pieces.empty();
    const bool last = static_cast<int>(pieces.size()) + 1 == live;
    if (!last) {  // positions past the piece
      idx[d] = IntBinary(ExprOp::kMin, idx[d],
                         ir::Add(ir::FromSym(v.sizes[d]), ir::IntConst(-1)));
    }
    if (!first) {  // positions before it
      idx[d] = IntBinary(ExprOp::kMax, idx[d], ir::IntConst(0));
    }
    offset = offset + v.sizes[d];
    pieces.emplace_back(offset,
                        ir::Cast(LowerContext::Read(v, idx), out.dtype));
  }
  body = pieces.back().second;
  for (size_t k = pieces.size() - 1; k-- > 0;) {
    Expr in_piece = ir::Binary(ExprOp::kLt, ir::Var(d),
                               ir::FromSym(pieces[k].first), DType::kBool);
    body = ir::Select(in_piece, pieces[k].second, body);
  }
  return std::vector<LoweredValue>{ops::PointwiseOutput(ctx, body)};
}

}  // namespace

void RegisterIndexingLowerings(OpLowerings& table) {
  table.Add("aten.slice.Tensor", LowerSlice);
  table.Add("aten.select.int", LowerSelect);
  table.Add("aten.slice_scatter.default", LowerSliceScatter);
  table.Add("aten.select_scatter.default", LowerSelectScatter);
  table.Add("aten.cat.default", LowerCat);
}

}  // namespace kiln
