// Lowerings of the views and copies (signatures in graph/ops/views.cc):
// each composes an index map over its input (LowerContext::Remap), never a
// copy.
#include <cstdint>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"
#include "graph/ops/views.h"

namespace kiln {
namespace {

using ops::WrapCheckedDim;

// `v` with its dims in the order `perm`.
LoweredValue PermuteValue(const LoweredValue& v, const std::vector<int>& perm) {
  std::vector<Expr> j(perm.size());
  std::vector<SymExpr> sizes(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) {
    j[perm[k]] = ir::Var(static_cast<int>(k));
    sizes[k] = v.sizes[perm[k]];
  }
  return LowerContext::Remap(v, j, sizes);
}

// view, reshape, _unsafe_view as an index map. Size-1 dims are dropped on
// both sides; the rest are matched into groups with equal element counts (a
// flatten or an unflatten is one group), and only within a group does the
// map need a division or modulus. Groups that cannot be matched (symbolic
// sizes that don't divide) fall back to one group over all dims.
absl::StatusOr<std::vector<LoweredValue>> LowerView(LowerContext& ctx) {
  const LoweredValue& v = ctx.value(0);
  const std::vector<SymExpr>& out = ctx.out_type().sizes;
  std::vector<int> in_dims, out_dims;  // non-1 dims
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    if (v.sizes[d] != SymExpr(1)) in_dims.push_back(static_cast<int>(d));
  }
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] != SymExpr(1)) out_dims.push_back(static_cast<int>(d));
  }
  std::vector<Expr> j(v.sizes.size(), ir::IntConst(0));
  // Emits the map for one group: in_dims[a0, a1) <- out_dims[b0, b1).
  auto emit = [&](size_t a0, size_t a1, size_t b0, size_t b1) {
    Expr flat = ir::IntConst(0);
    for (size_t b = b0; b < b1; ++b) {
      flat = ir::Add(ir::Mul(flat, ir::FromSym(out[out_dims[b]])),
                     ir::Var(out_dims[b]));
    }
    SymExpr stride(1);
    for (size_t a = a1; a-- > a0;) {
      Expr e = ir::FloorDiv(flat, ir::FromSym(stride));
      if (a != a0) e = ir::Mod(e, ir::FromSym(v.sizes[in_dims[a]]));
      if (a1 - a0 == 1 && b1 - b0 == 1) e = ir::Var(out_dims[b0]);
      j[in_dims[a]] = e;
      stride = stride * v.sizes[in_dims[a]];
    }
  };
  size_t a = 0, b = 0;
  bool grouped = true;
  while (a < in_dims.size() && b < out_dims.size()) {
    size_t a1 = a + 1, b1 = b + 1;
    SymExpr pa = v.sizes[in_dims[a]], pb = out[out_dims[b]];
    while (pa != pb) {
      if (SymExpr::DivExact(pb, pa) && a1 < in_dims.size()) {
        pa = pa * v.sizes[in_dims[a1++]];
      } else if (SymExpr::DivExact(pa, pb) && b1 < out_dims.size()) {
        pb = pb * out[out_dims[b1++]];
      } else {
        grouped = false;
        break;
      }
    }
    if (!grouped) break;
    emit(a, a1, b, b1);
    a = a1;
    b = b1;
  }
  if (!grouped || a != in_dims.size() || b != out_dims.size()) {
    emit(0, in_dims.size(), 0, out_dims.size());
  }
  return std::vector<LoweredValue>{LowerContext::Remap(v, j, out)};
}

absl::StatusOr<std::vector<LoweredValue>> LowerPermute(LowerContext& ctx) {
  const int rank = static_cast<int>(ctx.value(0).sizes.size());
  std::vector<int> perm;
  for (const SymExpr& e : ctx.arg(1).ints)
    perm.push_back(WrapCheckedDim(*e.AsConstant(), rank));
  return std::vector<LoweredValue>{PermuteValue(ctx.value(0), perm)};
}

absl::StatusOr<std::vector<LoweredValue>> LowerTranspose(LowerContext& ctx) {
  const int rank = static_cast<int>(ctx.value(0).sizes.size());
  return std::vector<LoweredValue>{PermuteValue(
      ctx.value(0),
      ops::TransposePermutation(rank, WrapCheckedDim(ctx.arg(1).i, rank),
                                WrapCheckedDim(ctx.arg(2).i, rank)))};
}

absl::StatusOr<std::vector<LoweredValue>> LowerT(LowerContext& ctx) {
  const int rank = static_cast<int>(ctx.value(0).sizes.size());
  return std::vector<LoweredValue>{PermuteValue(
      ctx.value(0), rank == 2 ? std::vector<int>{1, 0}
                              : ops::TransposePermutation(rank, 0, 0))};
}

// expand: new leading dims are not read; an expanded size-1 dim reads 0.
absl::StatusOr<std::vector<LoweredValue>> LowerExpand(LowerContext& ctx) {
  const LoweredValue& v = ctx.value(0);
  const std::vector<SymExpr>& out = ctx.out_type().sizes;
  const size_t lead = out.size() - v.sizes.size();
  std::vector<Expr> j;
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    const bool expanded =
        v.sizes[d] == SymExpr(1) && out[lead + d] != SymExpr(1);
    j.push_back(expanded ? ir::IntConst(0)
                         : ir::Var(static_cast<int>(lead + d)));
  }
  return std::vector<LoweredValue>{LowerContext::Remap(v, j, out)};
}

// repeat: output index i reads self at i[lead + d] mod self's size d (the
// new leading dims are not read).
absl::StatusOr<std::vector<LoweredValue>> LowerRepeat(LowerContext& ctx) {
  const LoweredValue& v = ctx.value(0);
  const std::vector<SymExpr>& out = ctx.out_type().sizes;
  const size_t lead = out.size() - v.sizes.size();
  std::vector<Expr> j;
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    const Expr i = ir::Var(static_cast<int>(lead + d));
    j.push_back(
        out[lead + d] == v.sizes[d] ? i : ir::Mod(i, ir::FromSym(v.sizes[d])));
  }
  return std::vector<LoweredValue>{LowerContext::Remap(v, j, out)};
}

absl::StatusOr<std::vector<LoweredValue>> LowerUnsqueeze(LowerContext& ctx) {
  const LoweredValue& v = ctx.value(0);
  const int rank = static_cast<int>(v.sizes.size());
  const int d = WrapCheckedDim(ctx.arg(1).i, rank + 1);
  std::vector<Expr> j;
  for (int k = 0; k <= rank; ++k) {
    if (k != d) j.push_back(ir::Var(k));
  }
  return std::vector<LoweredValue>{
      LowerContext::Remap(v, j, ctx.out_type().sizes)};
}

// squeeze.default, .dim, .dims: a squeezed dim reads 0.
absl::StatusOr<std::vector<LoweredValue>> LowerSqueeze(LowerContext& ctx) {
  const LoweredValue& v = ctx.value(0);
  const int rank = static_cast<int>(v.sizes.size());
  std::vector<bool> sel = *ops::SqueezedDims(ctx.node(), rank, nullptr);
  std::vector<Expr> j;
  int k = 0;
  for (int d = 0; d < rank; ++d) {
    if (sel[d] && v.sizes[d] == SymExpr(1)) {
      j.push_back(ir::IntConst(0));
    } else {
      j.push_back(ir::Var(k++));
    }
  }
  return std::vector<LoweredValue>{
      LowerContext::Remap(v, j, ctx.out_type().sizes)};
}

// The row-major strides of static `sizes`.
std::vector<int64_t> RowMajorStrides(const std::vector<SymExpr>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t acc = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = acc;
    acc *= *sizes[d].AsConstant();
  }
  return strides;
}

// as_strided: output index i reads self's row-major element
// p = offset + sum(i[d] * stride[d]), unravelled into self's dims.
absl::StatusOr<std::vector<LoweredValue>> LowerAsStrided(LowerContext& ctx) {
  const LoweredValue& v = ctx.value(0);
  const std::vector<int64_t> flat = RowMajorStrides(v.sizes);
  const ops::StridedView view = *ops::StridedViewOf(
      ctx.node(), 1, *NumElements(v.sizes).AsConstant(), false, nullptr);
  Expr p = ir::IntConst(view.offset);
  for (size_t d = 0; d < view.sizes.size(); ++d) {
    if (view.sizes[d] != 1 && view.strides[d] != 0) {
      p = ir::Add(p, ir::Mul(ir::Var(static_cast<int>(d)),
                             ir::IntConst(view.strides[d])));
    }
  }
  std::vector<Expr> j(v.sizes.size(), ir::IntConst(0));
  bool outermost = true;  // p < numel: no modulus on the first non-1 dim
  for (size_t k = 0; k < v.sizes.size(); ++k) {
    const int64_t n = *v.sizes[k].AsConstant();
    if (n == 1) continue;
    Expr e = ir::FloorDiv(p, ir::IntConst(flat[k]));
    if (!outermost) e = ir::Mod(e, ir::IntConst(n));
    j[k] = e;
    outermost = false;
  }
  return std::vector<LoweredValue>{
      LowerContext::Remap(v, j, ctx.out_type().sizes)};
}

// as_strided_scatter: a pointwise node over self's shape. Each element's
// row-major position, less the offset, is divided by the view's strides,
// largest first (ops::StridedViewOf checked that this finds the index of
// any position the view covers); it takes src where every quotient is in
// range and nothing remains, self elsewhere. src's index is clamped into
// range, so the unchosen branch never reads outside src.
absl::StatusOr<std::vector<LoweredValue>> LowerAsStridedScatter(
    LowerContext& ctx) {
  const std::vector<SymExpr>& sizes = ctx.out_type().sizes;
  const DType dtype = ctx.out_type().dtype;
  const int rank = static_cast<int>(sizes.size());
  const std::vector<int64_t> flat = RowMajorStrides(sizes);
  const ops::StridedView view = *ops::StridedViewOf(
      ctx.node(), 2, *NumElements(sizes).AsConstant(), true, nullptr);
  const Expr self = LowerContext::Read(ctx.value(0), IdentityIndex(rank));
  bool empty = false;
  for (int64_t n : view.sizes) empty |= n == 0;
  if (empty) {
    return std::vector<LoweredValue>{ops::PointwiseOutput(ctx, self)};
  }
  auto i64 = [](ExprOp op, Expr a, Expr b) {
    return ir::Binary(op, std::move(a), std::move(b), DType::kInt64);
  };
  auto test = [](ExprOp op, Expr a, Expr b) {
    return ir::Binary(op, std::move(a), std::move(b), DType::kBool);
  };
  auto both = [](Expr a, Expr b) {
    return ir::Binary(ExprOp::kAnd, std::move(a), std::move(b), DType::kBool);
  };
  Expr rest = ir::IntConst(-view.offset);
  for (int k = 0; k < rank; ++k) {
    if (*sizes[k].AsConstant() != 1) {
      rest = ir::Add(rest, ir::Mul(ir::Var(k), ir::IntConst(flat[k])));
    }
  }
  Expr hit = test(ExprOp::kGe, rest, ir::IntConst(0));
  std::vector<Expr> i(view.sizes.size(), ir::IntConst(0));
  for (int d : ops::ScatterDimOrder(view)) {
    const Expr s = ir::IntConst(view.strides[d]);
    const Expr q = ir::FloorDiv(rest, s);
    hit = both(hit, test(ExprOp::kLt, q, ir::IntConst(view.sizes[d])));
    i[d] =
        i64(ExprOp::kMax, i64(ExprOp::kMin, q, ir::IntConst(view.sizes[d] - 1)),
            ir::IntConst(0));
    rest = i64(ExprOp::kSub, rest, ir::Mul(q, s));
  }
  hit = both(hit, test(ExprOp::kEq, rest, ir::IntConst(0)));
  const Expr src = LowerContext::Read(ctx.value(1), i);
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, ir::Select(hit, ir::Cast(src, dtype), ir::Cast(self, dtype)))};
}

// Values are immutable: a clone is the value.
absl::StatusOr<std::vector<LoweredValue>> LowerClone(LowerContext& ctx) {
  return std::vector<LoweredValue>{ctx.value(0)};
}

// alias: the value itself.
absl::StatusOr<std::vector<LoweredValue>> LowerAlias(LowerContext& ctx) {
  return std::vector<LoweredValue>{ctx.value(0)};
}

// copy: a pointwise node reading src broadcast to self's sizes, cast to
// self's dtype; self is not read.
absl::StatusOr<std::vector<LoweredValue>> LowerCopy(LowerContext& ctx) {
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, LowerContext::ReadBroadcast(ctx.value(1), ctx.out_type().sizes))};
}

// split.Tensor, split_with_sizes: piece o reads the dim from the sum of
// the sizes before it.
absl::StatusOr<std::vector<LoweredValue>> LowerSplit(LowerContext& ctx) {
  const LoweredValue& v = ctx.value(0);
  const int rank = static_cast<int>(v.sizes.size());
  const int d = WrapCheckedDim(ctx.arg(ops::SplitDimArg(ctx.node())).i, rank);
  std::vector<LoweredValue> out;
  SymExpr at(0);
  for (size_t o = 0; o < ctx.node().outputs.size(); ++o) {
    const std::vector<SymExpr>& sizes = ctx.out_type(static_cast<int>(o)).sizes;
    std::vector<Expr> j;
    for (int k = 0; k < rank; ++k) j.push_back(ir::Var(k));
    j[d] = ir::Add(ir::FromSym(at), ir::Var(d));
    out.push_back(LowerContext::Remap(v, j, sizes));
    at = at + sizes[d];
  }
  return out;
}

// unbind.int: output o reads index o of the dim.
absl::StatusOr<std::vector<LoweredValue>> LowerUnbind(LowerContext& ctx) {
  const LoweredValue& v = ctx.value(0);
  const int rank = static_cast<int>(v.sizes.size());
  const int d = WrapCheckedDim(ctx.arg(1).i, rank);
  std::vector<LoweredValue> out;
  for (size_t o = 0; o < ctx.node().outputs.size(); ++o) {
    std::vector<Expr> j;
    for (int k = 0, x = 0; k < rank; ++k) {
      j.push_back(k == d ? ir::IntConst(static_cast<int64_t>(o))
                         : ir::Var(x++));
    }
    out.push_back(
        LowerContext::Remap(v, j, ctx.out_type(static_cast<int>(o)).sizes));
  }
  return out;
}

}  // namespace

void RegisterViewLowerings(OpLowerings& table) {
  table.Add("aten.view.default", LowerView);
  table.Add("aten.reshape.default", LowerView);
  table.Add("aten._unsafe_view.default", LowerView);
  table.Add("aten.permute.default", LowerPermute);
  table.Add("aten.transpose.int", LowerTranspose);
  table.Add("aten.t.default", LowerT);
  table.Add("aten.expand.default", LowerExpand);
  table.Add("aten.repeat.default", LowerRepeat);
  table.Add("aten.unsqueeze.default", LowerUnsqueeze);
  table.Add("aten.squeeze.default", LowerSqueeze);
  table.Add("aten.squeeze.dim", LowerSqueeze);
  table.Add("aten.squeeze.dims", LowerSqueeze);
  table.Add("aten.as_strided.default", LowerAsStrided);
  table.Add("aten.as_strided_scatter.default", LowerAsStridedScatter);
  table.Add("aten.lift_fresh_copy.default", LowerClone);
  table.Add("aten.clone.default", LowerClone);
  table.Add("aten.alias.default", LowerAlias);
  table.Add("aten.copy.default", LowerCopy);
  table.Add("aten.split.Tensor", LowerSplit);
  table.Add("aten.split_with_sizes.default", LowerSplit);
  table.Add("aten.unbind.int", LowerUnbind);
}

}  // namespace kiln
