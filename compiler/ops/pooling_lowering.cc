// Lowerings of the 2-d pooling ops (signatures: graph/ops/pooling.cc) to
// reductions over window vars with index expressions:
//   forward   [..., OH, OW, KH, KW] reducing (KH, KW): the input read at
//             oh * stride - pad + kh * dilation, padding a select (reads
//             clamped into the input so no load leaves its buffer);
//   backward  [..., H, W, JH, JW] reducing the windows that may cover each
//             input position (a bounded gather: no atomics): the output
//             position a window offset implies, when it exists and (max
//             pool) its saved index names this input position. On the CPU
//             max pool's backward is instead a scatter over the outputs
//             (linear, deterministic).
// Sums accumulate in float32; the results are stored in the input dtype.
#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"
#include "graph/ops/pooling.h"

namespace kiln {
namespace {

using ops::LowerReductionOver;
using ops::PointwiseNode;
using ops::Pool2dWindow;

constexpr DType kF32 = DType::kFloat32;
constexpr DType kI64 = DType::kInt64;

Expr C(int64_t v) { return ir::IntConst(v); }
Expr Sub(Expr a, Expr b) { return ir::Add(a, ir::Mul(C(-1), b)); }
Expr Lt(Expr a, Expr b) { return ir::Binary(ExprOp::kLt, a, b, DType::kBool); }
Expr Ge(Expr a, Expr b) { return ir::Binary(ExprOp::kGe, a, b, DType::kBool); }
Expr Eq(Expr a, Expr b) { return ir::Binary(ExprOp::kEq, a, b, DType::kBool); }
Expr And(Expr a, Expr b) {
  return ir::Binary(ExprOp::kAnd, a, b, DType::kBool);
}
Expr Min(Expr a, Expr b) { return ir::Binary(ExprOp::kMin, a, b, kI64); }
Expr Max(Expr a, Expr b) { return ir::Binary(ExprOp::kMax, a, b, kI64); }
// 0 <= i < n.
Expr InRange(Expr i, int64_t n) { return And(Ge(i, C(0)), Lt(i, C(n))); }
// i clamped into [0, n): a load index that stays in its buffer.
Expr Clamp(Expr i, int64_t n) { return Min(Max(i, C(0)), C(n - 1)); }

// The pooling geometry of a node: its batch dims (all but the last two of
// the input) and the window.
struct Geometry {
  std::vector<SymExpr> batch;
  Pool2dWindow p;
};

absl::StatusOr<Geometry> GeometryOf(const LowerContext& ctx, int input,
                                    int kernel_arg, int dilation_arg,
                                    int ceil_arg) {
  const std::vector<SymExpr>& s = ctx.value(input).sizes;
  const int64_t h = *s[s.size() - 2].AsConstant();
  const int64_t w = *s[s.size() - 1].AsConstant();
  auto p = ops::Pool2dWindowOf(ctx.node(), kernel_arg, kernel_arg + 1,
                               kernel_arg + 2, dilation_arg, ceil_arg, h, w);
  if (!p.ok()) return p.status();
  return Geometry{std::vector<SymExpr>(s.begin(), s.end() - 2), *p};
}

// A value standing for the iteration space `sizes` (LowerReductionOver
// reads only its sizes when given a body).
LoweredValue Space(const std::vector<SymExpr>& batch,
                   std::initializer_list<int64_t> rest) {
  LoweredValue v;
  v.sizes = batch;
  for (int64_t r : rest) v.sizes.push_back(SymExpr(r));
  return v;
}

// The last two dims of the space reduced.
std::vector<bool> WindowDims(size_t nb) {
  std::vector<bool> r(nb + 4, false);
  r[nb + 2] = r[nb + 3] = true;
  return r;
}

// `v` read at the batch vars and (h, w), in float32.
Expr ReadAt(const LoweredValue& v, size_t nb, Expr h, Expr w, DType as = kF32) {
  std::vector<Expr> idx = IdentityIndex(static_cast<int>(nb));
  idx.push_back(std::move(h));
  idx.push_back(std::move(w));
  return ir::Cast(LowerContext::Read(v, idx), as);
}

absl::StatusOr<LoweredValue> Reduce(LowerContext& ctx,
                                    const LoweredValue& space, ReduceKind kind,
                                    DType out, Expr body,
                                    std::function<Expr(Expr, Expr)> fin) {
  auto r =
      LowerReductionOver(ctx, space, WindowDims(space.sizes.size() - 4), false,
                         kind, kF32, out, std::move(body), std::move(fin));
  if (!r.ok()) return r.status();
  return (*r)[0];
}

// ---- max_pool2d_with_indices ----

// Max pool over a window of at most kMaxUnrolledWindow offsets where the
// target asks (LowerOptions::unrolled_pool_windows: the CPU): one pointwise
// node per output with the window unrolled, so its kernel runs across
// outputs (vectorised) where the argmax reduction below runs one output at
// a time (ResNet-18's 3x3 stride-2 pool on the CPU: 2.4 ms of a 16.6 ms
// forward). The maximum is a chain of NaN-propagating maxes; the index is
// the first window offset holding it (the first NaN when it is NaN), as
// PyTorch's kernel and the argmax reduction choose.
constexpr int64_t kMaxUnrolledWindow = 16;

std::vector<LoweredValue> UnrolledMaxPool(LowerContext& ctx,
                                          const Geometry& geo) {
  const Pool2dWindow& p = geo.p;
  const size_t nb = geo.batch.size();
  const Expr oh = ir::Var(nb), ow = ir::Var(nb + 1);
  std::vector<Expr> values, valid, flat;
  for (int64_t kh = 0; kh < p.kh; ++kh) {
    for (int64_t kw = 0; kw < p.kw; ++kw) {
      const Expr ih = ir::Add(ir::Mul(oh, C(p.sh)), C(kh * p.dh - p.ph));
      const Expr iw = ir::Add(ir::Mul(ow, C(p.sw)), C(kw * p.dw - p.pw));
      valid.push_back(And(InRange(ih, p.h), InRange(iw, p.w)));
      values.push_back(ir::Select(
          valid.back(),
          ReadAt(ctx.value(0), nb, Clamp(ih, p.h), Clamp(iw, p.w)),
          ir::Const(-std::numeric_limits<double>::infinity(), kF32)));
      flat.push_back(ir::Add(ir::Mul(ih, C(p.w)), iw));
    }
  }
  Expr best = values[0];
  for (size_t k = 1; k < values.size(); ++k)
    best = ir::Binary(ExprOp::kMax, best, values[k], kF32);
  const Expr best_is_nan = ir::Unary(ExprOp::kIsNan, best, DType::kBool);
  // From the last offset to the first, so that the first in the input
  // that holds it wins (a window of -inf only: its first input position,
  // PyTorch's starting index, never the padding).
  Expr index = flat[0];
  for (int64_t k = static_cast<int64_t>(values.size()) - 1; k >= 0; --k) {
    const Expr holds = ir::Select(
        best_is_nan, ir::Unary(ExprOp::kIsNan, values[k], DType::kBool),
        Eq(values[k], best));
    index = ir::Select(And(valid[k], holds), flat[k], index);
  }
  const DType dtype = ctx.out_type(0).dtype;
  return {PointwiseNode(ctx, ctx.out_type(0).sizes, dtype, best),
          PointwiseNode(ctx, ctx.out_type(1).sizes, kI64, index)};
}

absl::StatusOr<std::vector<LoweredValue>> LowerMaxPool(LowerContext& ctx) {
  auto geo = GeometryOf(ctx, 0, 1, 4, 5);
  if (!geo.ok()) return geo.status();
  if (ctx.options().unrolled_pool_windows &&
      geo->p.kh * geo->p.kw <= kMaxUnrolledWindow) {
    return UnrolledMaxPool(ctx, *geo);
  }
  const Pool2dWindow& p = geo->p;
  const size_t nb = geo->batch.size();
  const Expr oh = ir::Var(nb), ow = ir::Var(nb + 1);
  const Expr ih = ir::Add(ir::Add(ir::Mul(oh, C(p.sh)), C(-p.ph)),
                          ir::Mul(ir::Var(nb + 2), C(p.dh)));
  const Expr iw = ir::Add(ir::Add(ir::Mul(ow, C(p.sw)), C(-p.pw)),
                          ir::Mul(ir::Var(nb + 3), C(p.dw)));
  const Expr body =
      ir::Select(And(InRange(ih, p.h), InRange(iw, p.w)),
                 ReadAt(ctx.value(0), nb, Clamp(ih, p.h), Clamp(iw, p.w)),
                 ir::Const(-std::numeric_limits<double>::infinity(), kF32));
  const LoweredValue space = Space(geo->batch, {p.oh, p.ow, p.kh, p.kw});
  // One reduction, the argmax (its first NaN wins, as PyTorch's kernel's);
  // the maximum is the input read where it points (a second max reduction
  // over the window cost as much again: ResNet-18's CPU pool 3.6 ms).
  auto arg = Reduce(ctx, space, ReduceKind::kArgMax, kI64, body, nullptr);
  if (!arg.ok()) return arg.status();
  // The window offset k = kh * KW + kw as the input's flat h * W + w.
  const Expr k = LowerContext::Read(*arg, IdentityIndex(nb + 2));
  const Expr kh = ir::FloorDiv(k, C(p.kw)), kw = ir::Mod(k, C(p.kw));
  const Expr at_h =
      ir::Add(ir::Add(ir::Mul(oh, C(p.sh)), C(-p.ph)), ir::Mul(kh, C(p.dh)));
  const Expr at_w =
      ir::Add(ir::Add(ir::Mul(ow, C(p.sw)), C(-p.pw)), ir::Mul(kw, C(p.dw)));
  // A window of -inf only may point into the padding: the clamped read is
  // then a -inf of the window (padding is less than half the window).
  const DType dtype = ctx.out_type(0).dtype;
  LoopNode mx;
  mx.kind = LoopNode::Kind::kPointwise;
  mx.dtype = dtype;
  mx.sizes = ctx.out_type(0).sizes;
  mx.body = ReadAt(ctx.value(0), nb, Clamp(at_h, p.h), Clamp(at_w, p.w), dtype);
  LoopNode ind;
  ind.kind = LoopNode::Kind::kPointwise;
  ind.dtype = kI64;
  ind.sizes = ctx.out_type(1).sizes;
  ind.body = ir::Add(ir::Mul(at_h, C(p.w)), at_w);
  return std::vector<LoweredValue>{ctx.AddNode(std::move(mx)),
                                   ctx.AddNode(std::move(ind))};
}

// The windows that may cover input position i along one dim (stride s,
// padding pad, dilation d, kernel k, n outputs), enumerated by a reduction
// var j < count: either
//  - by window offset (j = the offset kk): o = (i + pad - kk * d) / s when
//    that divides exactly, k candidates; or
//  - by output position, when fewer (ceil(k / s) for d = 1: 2 instead of 9
//    windows of a 3x3 stride-2 pool in 2-d, and no divisibility test):
//    o = (i + pad) / s - j, covering i when its offset i + pad - o * s is
//    below k * d (and a multiple of d).
// `valid` says whether o exists (0 <= o < n) and covers i; `o` is clamped
// into [0, n) so that a read at it stays in its buffer.
struct Source {
  Expr o, valid;
};
struct Candidates {
  int64_t count;
  bool by_output;
};
Candidates CandidatesOf(int64_t k, int64_t s, int64_t d) {
  const int64_t by_output = (k - 1) * d / s + 1;
  return by_output < k ? Candidates{by_output, true} : Candidates{k, false};
}
Source SourceOf(Expr i, Expr j, const Candidates& c, int64_t k, int64_t s,
                int64_t pad, int64_t d, int64_t n) {
  if (c.by_output) {
    const Expr o = Sub(ir::FloorDiv(ir::Add(i, C(pad)), C(s)), j);
    const Expr offset = Sub(ir::Add(i, C(pad)), ir::Mul(o, C(s)));
    Expr valid = And(InRange(o, n), Lt(offset, C(k * d)));
    if (d > 1) valid = And(valid, Eq(ir::Mod(offset, C(d)), C(0)));
    return {Clamp(o, n), valid};
  }
  const Expr num = Sub(ir::Add(i, C(pad)), ir::Mul(j, C(d)));
  const Expr o = ir::FloorDiv(num, C(s));
  Expr valid = And(Ge(num, C(0)), Eq(ir::Mod(num, C(s)), C(0)));
  valid = And(valid, Lt(o, C(n)));
  return {Clamp(o, n), valid};
}

// max_pool2d_with_indices_backward on the CPU: a scatter over the output
// positions (ops::AddScatter), each adding its gradient at the input
// position its saved index names, as PyTorch's CPU kernel does (an index
// outside the plane adds nothing, as in the reference). Linear in the
// outputs, where the gather visits every candidate window of every input
// position (ResNet-18's 3x3 stride-2 pool: 4.9 of a 38 ms backward);
// deterministic (the planes in parallel, each one's positions in order).
std::vector<LoweredValue> MaxPoolBackwardScatter(LowerContext& ctx,
                                                 const Geometry& geo) {
  const Pool2dWindow& p = geo.p;
  const size_t nb = geo.batch.size();
  std::vector<SymExpr> space = geo.batch;
  space.push_back(SymExpr(p.oh));
  space.push_back(SymExpr(p.ow));
  const std::vector<Expr> q = IdentityIndex(static_cast<int>(nb + 2));
  const int64_t plane = p.h * p.w;
  const Expr raw = ir::Cast(LowerContext::Read(ctx.value(7), q), kI64);
  const Expr at = Clamp(raw, plane);
  std::vector<Expr> target(q.begin(), q.begin() + nb);
  target.push_back(ir::FloorDiv(at, C(p.w)));
  target.push_back(ir::Binary(ExprOp::kRemainder, at, C(p.w), kI64));
  const Expr value = ir::Select(
      InRange(raw, plane), ir::Cast(LowerContext::Read(ctx.value(0), q), kF32),
      ir::Const(0, kF32));
  const TensorType& out = ctx.out_type(0);
  const LoweredValue sum =
      ops::AddScatter(ctx, out.sizes, out.dtype, ir::Const(0, kF32), space,
                      std::move(target), value);
  return ops::ScatterOutput(ctx, sum, out.dtype);
}

absl::StatusOr<std::vector<LoweredValue>> LowerMaxPoolBackward(
    LowerContext& ctx) {
  auto geo = GeometryOf(ctx, 1, 2, 5, 6);
  if (!geo.ok()) return geo.status();
  // CUDA keeps the gather below: a scatter there adds atomically.
  if (!ctx.options().atomic_scatters) return MaxPoolBackwardScatter(ctx, *geo);
  const Pool2dWindow& p = geo->p;
  const size_t nb = geo->batch.size();
  const Expr ih = ir::Var(nb), iw = ir::Var(nb + 1);
  const Candidates ch = CandidatesOf(p.kh, p.sh, p.dh);
  const Candidates cw = CandidatesOf(p.kw, p.sw, p.dw);
  const Source h =
      SourceOf(ih, ir::Var(nb + 2), ch, p.kh, p.sh, p.ph, p.dh, p.oh);
  const Source w =
      SourceOf(iw, ir::Var(nb + 3), cw, p.kw, p.sw, p.pw, p.dw, p.ow);
  const Expr picked = Eq(ReadAt(ctx.value(7), nb, h.o, w.o, kI64),
                         ir::Add(ir::Mul(ih, C(p.w)), iw));
  const Expr body =
      ir::Select(And(And(h.valid, w.valid), picked),
                 ReadAt(ctx.value(0), nb, h.o, w.o), ir::Const(0, kF32));
  auto r = Reduce(ctx, Space(geo->batch, {p.h, p.w, ch.count, cw.count}),
                  ReduceKind::kSum, ctx.out_type(0).dtype, body, nullptr);
  if (!r.ok()) return r.status();
  return std::vector<LoweredValue>{*r};
}

// ---- avg_pool2d ----

// PyTorch's avg_pool2d divisor of output (oh, ow), in float32.
Expr AvgDivisor(const Pool2dWindow& p, Expr oh, Expr ow, bool count_include_pad,
                const Attr& divisor_override) {
  if (!divisor_override.is_none()) {
    return ir::Const(static_cast<double>(divisor_override.i), kF32);
  }
  const Expr h0 = ir::Add(ir::Mul(oh, C(p.sh)), C(-p.ph));
  const Expr w0 = ir::Add(ir::Mul(ow, C(p.sw)), C(-p.pw));
  const Expr h1 = Min(ir::Add(h0, C(p.kh)), C(p.h + p.ph));
  const Expr w1 = Min(ir::Add(w0, C(p.kw)), C(p.w + p.pw));
  Expr n;
  if (count_include_pad) {
    n = ir::Mul(Sub(h1, h0), Sub(w1, w0));
  } else {
    n = ir::Mul(Sub(Min(h1, C(p.h)), Max(h0, C(0))),
                Sub(Min(w1, C(p.w)), Max(w0, C(0))));
  }
  return ir::Cast(n, kF32);
}

absl::StatusOr<std::vector<LoweredValue>> LowerAvgPool(LowerContext& ctx) {
  auto geo = GeometryOf(ctx, 0, 1, -1, 4);
  if (!geo.ok()) return geo.status();
  const Pool2dWindow& p = geo->p;
  const size_t nb = geo->batch.size();
  const Expr oh = ir::Var(nb), ow = ir::Var(nb + 1);
  const Expr ih =
      ir::Add(ir::Add(ir::Mul(oh, C(p.sh)), C(-p.ph)), ir::Var(nb + 2));
  const Expr iw =
      ir::Add(ir::Add(ir::Mul(ow, C(p.sw)), C(-p.pw)), ir::Var(nb + 3));
  const Expr body =
      ir::Select(And(InRange(ih, p.h), InRange(iw, p.w)),
                 ReadAt(ctx.value(0), nb, Clamp(ih, p.h), Clamp(iw, p.w)),
                 ir::Const(0, kF32));
  const Expr divisor = AvgDivisor(p, oh, ow, ctx.arg(5).b, ctx.arg(6));
  auto r =
      Reduce(ctx, Space(geo->batch, {p.oh, p.ow, p.kh, p.kw}), ReduceKind::kSum,
             ctx.out_type(0).dtype, body, [divisor](Expr acc, Expr) {
               return ir::Binary(ExprOp::kDiv, acc, divisor, kF32);
             });
  if (!r.ok()) return r.status();
  return std::vector<LoweredValue>{*r};
}

absl::StatusOr<std::vector<LoweredValue>> LowerAvgPoolBackward(
    LowerContext& ctx) {
  auto geo = GeometryOf(ctx, 1, 2, -1, 5);
  if (!geo.ok()) return geo.status();
  const Pool2dWindow& p = geo->p;
  const size_t nb = geo->batch.size();
  const Candidates ch = CandidatesOf(p.kh, p.sh, 1);
  const Candidates cw = CandidatesOf(p.kw, p.sw, 1);
  const Source h =
      SourceOf(ir::Var(nb), ir::Var(nb + 2), ch, p.kh, p.sh, p.ph, 1, p.oh);
  const Source w =
      SourceOf(ir::Var(nb + 1), ir::Var(nb + 3), cw, p.kw, p.sw, p.pw, 1, p.ow);
  const Expr share =
      ir::Binary(ExprOp::kDiv, ReadAt(ctx.value(0), nb, h.o, w.o),
                 AvgDivisor(p, h.o, w.o, ctx.arg(6).b, ctx.arg(7)), kF32);
  const Expr body =
      ir::Select(And(h.valid, w.valid), share, ir::Const(0, kF32));
  auto r = Reduce(ctx, Space(geo->batch, {p.h, p.w, ch.count, cw.count}),
                  ReduceKind::kSum, ctx.out_type(0).dtype, body, nullptr);
  if (!r.ok()) return r.status();
  return std::vector<LoweredValue>{*r};
}

// ---- _adaptive_avg_pool2d ----

// [floor(o * in / out), ceil((o + 1) * in / out)) as expressions.
Expr AdaptiveStart(Expr o, int64_t out, int64_t in) {
  return ir::FloorDiv(ir::Mul(o, C(in)), C(out));
}
Expr AdaptiveEnd(Expr o, int64_t out, int64_t in) {
  return ir::FloorDiv(ir::Add(ir::Mul(ir::Add(o, C(1)), C(in)), C(out - 1)),
                      C(out));
}
Expr AdaptiveArea(Expr oh, Expr ow, int64_t out_h, int64_t out_w, int64_t h,
                  int64_t w) {
  return ir::Cast(
      ir::Mul(Sub(AdaptiveEnd(oh, out_h, h), AdaptiveStart(oh, out_h, h)),
              Sub(AdaptiveEnd(ow, out_w, w), AdaptiveStart(ow, out_w, w))),
      kF32);
}

absl::StatusOr<std::vector<LoweredValue>> LowerAdaptiveAvgPool(
    LowerContext& ctx) {
  const std::vector<SymExpr>& s = ctx.value(0).sizes;
  const std::vector<SymExpr>& os = ctx.out_type(0).sizes;
  const size_t nb = s.size() - 2;
  const int64_t h = *s[nb].AsConstant(), w = *s[nb + 1].AsConstant();
  const int64_t out_h = *os[nb].AsConstant(), out_w = *os[nb + 1].AsConstant();
  const Expr oh = ir::Var(nb), ow = ir::Var(nb + 1);
  const Expr ih = ir::Add(AdaptiveStart(oh, out_h, h), ir::Var(nb + 2));
  const Expr iw = ir::Add(AdaptiveStart(ow, out_w, w), ir::Var(nb + 3));
  const Expr body = ir::Select(
      And(Lt(ih, AdaptiveEnd(oh, out_h, h)), Lt(iw, AdaptiveEnd(ow, out_w, w))),
      ReadAt(ctx.value(0), nb, Clamp(ih, h), Clamp(iw, w)), ir::Const(0, kF32));
  const Expr area = AdaptiveArea(oh, ow, out_h, out_w, h, w);
  const std::vector<SymExpr> batch(s.begin(), s.end() - 2);
  auto r = Reduce(ctx,
                  Space(batch, {out_h, out_w, ops::AdaptiveMaxWindow(out_h, h),
                                ops::AdaptiveMaxWindow(out_w, w)}),
                  ReduceKind::kSum, ctx.out_type(0).dtype, body,
                  [area](Expr acc, Expr) {
                    return ir::Binary(ExprOp::kDiv, acc, area, kF32);
                  });
  if (!r.ok()) return r.status();
  return std::vector<LoweredValue>{*r};
}

// Input position i is in the windows of outputs [floor(i * out / in),
// ceil((i + 1) * out / in)): the adaptive window with the roles swapped.
absl::StatusOr<std::vector<LoweredValue>> LowerAdaptiveAvgPoolBackward(
    LowerContext& ctx) {
  const std::vector<SymExpr>& s = ctx.value(1).sizes;
  const std::vector<SymExpr>& gs = ctx.value(0).sizes;
  const size_t nb = s.size() - 2;
  const int64_t h = *s[nb].AsConstant(), w = *s[nb + 1].AsConstant();
  const int64_t out_h = *gs[nb].AsConstant(), out_w = *gs[nb + 1].AsConstant();
  const Expr ih = ir::Var(nb), iw = ir::Var(nb + 1);
  const Expr oh = ir::Add(AdaptiveStart(ih, h, out_h), ir::Var(nb + 2));
  const Expr ow = ir::Add(AdaptiveStart(iw, w, out_w), ir::Var(nb + 3));
  const Expr ohc = Clamp(oh, out_h), owc = Clamp(ow, out_w);
  const Expr share =
      ir::Binary(ExprOp::kDiv, ReadAt(ctx.value(0), nb, ohc, owc),
                 AdaptiveArea(ohc, owc, out_h, out_w, h, w), kF32);
  const Expr body = ir::Select(
      And(Lt(oh, AdaptiveEnd(ih, h, out_h)), Lt(ow, AdaptiveEnd(iw, w, out_w))),
      share, ir::Const(0, kF32));
  const std::vector<SymExpr> batch(s.begin(), s.end() - 2);
  auto r = Reduce(ctx,
                  Space(batch, {h, w, ops::AdaptiveMaxWindow(h, out_h),
                                ops::AdaptiveMaxWindow(w, out_w)}),
                  ReduceKind::kSum, ctx.out_type(0).dtype, body, nullptr);
  if (!r.ok()) return r.status();
  return std::vector<LoweredValue>{*r};
}

}  // namespace

void RegisterPoolingLowerings(OpLowerings& table) {
  table.Add("aten.max_pool2d_with_indices.default", LowerMaxPool);
  table.Add("aten.max_pool2d_with_indices_backward.default",
            LowerMaxPoolBackward);
  table.Add("aten.avg_pool2d.default", LowerAvgPool);
  table.Add("aten.avg_pool2d_backward.default", LowerAvgPoolBackward);
  table.Add("aten._adaptive_avg_pool2d.default", LowerAdaptiveAvgPool);
  table.Add("aten._adaptive_avg_pool2d_backward.default",
            LowerAdaptiveAvgPoolBackward);
}

}  // namespace kiln
