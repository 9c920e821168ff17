// Lowerings of the sort family (graph/ops/sort.h): sort, sort.stable and
// topk as two reductions, without data-dependent control flow, so they run
// as the same loop IR on every target.
//
// Along the sorted dim (size n), element i's rank is the number of
// elements that come before it in the order:
//   rank[i] = sum over j of before(x[j], x[i]) or (x[j] equal to x[i] and
//             j < i)
// (a reduction over j; NaNs equal each other and come after every number
// ascending, before every number descending). The ranks are a
// permutation of [0, n), so output position q (q < k, with k = n for a
// sort) holds the one i whose rank is q:
//   indices[q] = max over i of (rank[i] == q ? i : -1)
// (a second reduction over i), and values[q] = x[indices[q]] (a gather, a
// view). That is a stable sort in both directions, as sort(stable=True)
// is, and topk takes the first k of it. The ranks are a permutation only
// if all n reads of an element see the same bits: a computed input is
// written to memory first (Stored), never recomputed in the comparisons.
//
// Cost: n comparisons per element for the ranks and n per output element
// for the inverse, so numel * (n + k) steps: quadratic in n per row. That
// is cheap for the sizes that appear in graphs (MoE routers: topk over 8
// to 64 experts, sorting a few hundred logits), not for long dims: a dim
// of static size above ops::kMaxSortSize (4096), or of symbolic size (no
// bound), is UNIMPLEMENTED naming node and op, so that clients run the
// node eagerly.
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"
#include "graph/ops/sort.h"

namespace kiln {
namespace {

Expr Int(int64_t v) { return ir::IntConst(v); }
Expr Bin(ExprOp op, Expr a, Expr b) {
  return ir::Binary(op, std::move(a), std::move(b), DType::kBool);
}
Expr IsNan(const Expr& x) { return ir::Unary(ExprOp::kIsNan, x, DType::kBool); }

// Whether `a` comes strictly before `b` ascending: NaN after every number.
Expr LessNanLast(const Expr& a, const Expr& b, bool floating) {
  Expr less = Bin(ExprOp::kLt, a, b);
  if (!floating) return less;
  return Bin(ExprOp::kOr, less,
             Bin(ExprOp::kAnd, ir::Unary(ExprOp::kNot, IsNan(a), DType::kBool),
                 IsNan(b)));
}

// Whether `a` and `b` are equal in the order (two NaNs are).
Expr SameKey(const Expr& a, const Expr& b, bool floating) {
  Expr eq = Bin(ExprOp::kEq, a, b);
  if (!floating) return eq;
  return Bin(ExprOp::kOr, eq, Bin(ExprOp::kAnd, IsNan(a), IsNan(b)));
}

// `i` clamped into [0, n): every q < k has its i (a rank equal to q), so
// this only keeps loads inside their buffer whatever was read.
Expr ClampIndex(const Expr& i, int64_t n) {
  return ir::Binary(ExprOp::kMax,
                    ir::Binary(ExprOp::kMin, i, Int(n - 1), DType::kInt64),
                    Int(0), DType::kInt64);
}

// A reduction over `space` of the int64 `body`, reducing its last dim.
absl::StatusOr<LoweredValue> ReduceLast(LowerContext& ctx,
                                        const std::vector<SymExpr>& space,
                                        ReduceKind kind, Expr body) {
  LoweredValue in;
  in.sizes = space;
  std::vector<bool> reduced(space.size(), false);
  reduced.back() = true;
  auto r = ops::LowerReductionOver(ctx, in, reduced, /*keepdim=*/false, kind,
                                   DType::kInt64, DType::kInt64,
                                   std::move(body), nullptr);
  if (!r.ok()) return r.status();
  return (*r)[0];
}

// The sorted dim's size, refused when symbolic or above kMaxSortSize.
absl::StatusOr<int64_t> SortedSize(const LowerContext& ctx, const SymExpr& size,
                                   int dim) {
  const std::optional<int64_t> n = size.AsConstant();
  if (!n) {
    return ctx.Unimplemented(absl::StrCat(
        "sorts along dim ", dim,
        " of symbolic size: Kiln's sort is quadratic in that size and "
        "compiles only static sizes up to ",
        ops::kMaxSortSize, "; run it eagerly"));
  }
  if (*n > ops::kMaxSortSize) {
    return ctx.Unimplemented(absl::StrCat(
        "sorts along dim ", dim, " of size ", *n,
        ": Kiln's sort is quadratic in that size (n comparisons per element) "
        "and compiles sizes up to ",
        ops::kMaxSortSize, "; run it eagerly"));
  }
  return *n;
}

// `v` as stored bits: a value computed by a pointwise node (that fusion
// would recompute in every reader, possibly rounding differently in a
// vector loop and its scalar tail) is written to memory first (realized),
// so that every comparison and the gather see the same element.
LoweredValue Stored(LowerContext& ctx, const LoweredValue& v) {
  if (ctx.loops().nodes[v.node].kind != LoopNode::Kind::kPointwise) return v;
  LoopNode node;
  node.kind = LoopNode::Kind::kPointwise;
  node.dtype = v.dtype;
  node.sizes = v.sizes;
  node.body =
      LowerContext::Read(v, IdentityIndex(static_cast<int>(v.sizes.size())));
  node.realize = true;
  return ctx.AddNode(std::move(node));
}

// sort, sort.stable, topk: (values, indices).
absl::StatusOr<std::vector<LoweredValue>> LowerSort(LowerContext& ctx) {
  const LoweredValue& in = ctx.value(0);
  const int r = static_cast<int>(in.sizes.size());
  const ops::SortParams p = ops::SortParamsOf(ctx.node(), r);
  const std::vector<SymExpr>& out = ctx.out_type(0).sizes;
  if (r == 0) {  // one element, at index 0
    return std::vector<LoweredValue>{
        in, ops::PointwiseNode(ctx, {}, DType::kInt64, Int(0))};
  }
  auto n = SortedSize(ctx, in.sizes[p.dim], p.dim);
  if (!n.ok()) return n.status();
  for (const SymExpr& s : out) {
    if (s == SymExpr(0)) {  // nothing to sort or to return
      return std::vector<LoweredValue>{
          ops::PointwiseNode(ctx, out, in.dtype, ir::Const(0, in.dtype)),
          ops::PointwiseNode(ctx, out, DType::kInt64, Int(0))};
    }
  }
  const LoweredValue self = Stored(ctx, in);
  const bool floating = IsFloating(self.dtype);
  const DType key = floating ? DType::kFloat32 : DType::kInt64;
  // Ranks over [self..., n]: var r is j, var p.dim is i.
  std::vector<SymExpr> space = self.sizes;
  space.push_back(SymExpr(*n));
  std::vector<Expr> at_j = IdentityIndex(r);
  at_j[p.dim] = ir::Var(r);
  const Expr xi = ir::Cast(LowerContext::Read(self, IdentityIndex(r)), key);
  const Expr xj = ir::Cast(LowerContext::Read(self, at_j), key);
  const Expr before = p.descending ? LessNanLast(xi, xj, floating)
                                   : LessNanLast(xj, xi, floating);
  const Expr tie = Bin(ExprOp::kAnd, SameKey(xj, xi, floating),
                       Bin(ExprOp::kLt, ir::Var(r), ir::Var(p.dim)));
  auto rank =
      ReduceLast(ctx, space, ReduceKind::kSum,
                 ir::Select(Bin(ExprOp::kOr, before, tie), Int(1), Int(0)));
  if (!rank.ok()) return rank.status();
  // The inverse over [out..., n]: var r is i, var p.dim is the position q.
  std::vector<SymExpr> inverse = out;
  inverse.push_back(SymExpr(*n));
  std::vector<Expr> at_i = IdentityIndex(r);
  at_i[p.dim] = ir::Var(r);
  const Expr hit = ir::Binary(ExprOp::kEq, LowerContext::Read(*rank, at_i),
                              ir::Var(p.dim), DType::kBool);
  auto last = ReduceLast(ctx, inverse, ReduceKind::kMax,
                         ir::Select(hit, ir::Var(r), Int(-1)));
  if (!last.ok()) return last.status();
  const LoweredValue indices =
      ops::PointwiseNode(ctx, out, DType::kInt64,
                   ClampIndex(LowerContext::Read(*last, IdentityIndex(r)), *n));
  // The gather clamps what it reads, not only what indices stores: a
  // reader may evaluate it where nothing was stored (cat evaluates every
  // piece at every position, selecting afterwards).
  std::vector<Expr> at = IdentityIndex(r);
  at[p.dim] = ClampIndex(LowerContext::Read(indices, IdentityIndex(r)), *n);
  return std::vector<LoweredValue>{LowerContext::Remap(self, at, out), indices};
}

}  // namespace

void RegisterSortLowerings(OpLowerings& table) {
  table.Add("aten.sort.default", LowerSort);
  table.Add("aten.sort.stable", LowerSort);
  table.Add("aten.topk.default", LowerSort);
}

}  // namespace kiln
