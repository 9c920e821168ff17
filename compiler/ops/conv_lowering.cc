// Lowerings of the convolutions (signatures: graph/ops/conv.cc) to the
// GEMM extern call (loop_ir.h, GemmCall; issue 16) with Kiln kernels
// around it, batched over the groups:
//
//   im2col   col[g] ([C/G * K, N * L]): the input read at
//            p * stride - padding + k * dilation for each output position
//            p and kernel offset k, zero where that falls in the padding.
//            Without padding it is a view of the input, read by the GEMM in
//            place where it is affine (a 1x1 convolution of one image), else
//            written by a Kiln kernel (the same copy the padded case writes);
//   forward  out[g] = W[g] @ col[g] ([O/G, N * L]), read back as
//            [N, O, *S] (a view: the bias kernel or the consumer reads
//            through it);
//   col2im   a transposed convolution: cols[g] = W[g]^T @ x[g]
//            ([O/G * K, N * L_in], the weight read transposed in place),
//            then a reduction over the kernel offsets gathers, for each
//            output position, the columns whose window covers it (no
//            atomics);
//   backward grad_input is the other direction's transposed (or regular)
//            convolution with the same weight, grad_weight[g] =
//            grad_output[g] @ col[g]^T (one GEMM summing over the batch and
//            the positions), grad_bias a sum; output_mask skips outputs.
//
// Every GEMM computes in float32; float16/bfloat16 operands are converted
// by the kernels that write them and results are rounded once.
//
// Where the target has a convolution library (LowerOptions::
// library_convolutions: cuDNN on CUDA for float32, float16 and bfloat16;
// oneDNN on the CPU for float32) a convolution is instead one library call
// per direction (loop_ir.h, ConvCall) over whole contiguous operands, in
// the operands' dtype:
//   convolution            forward (transposed: backward data)
//   convolution_backward   grad_input: backward data (transposed: forward),
//                          grad_weight: backward filter, grad_bias a sum.
#include <cstdint>
#include <utility>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"
#include "graph/ops/conv.h"

namespace kiln {
namespace {

using ops::ConvGeometry;

constexpr DType kF32 = DType::kFloat32;

Expr C(int64_t v) { return ir::IntConst(v); }
Expr S(const SymExpr& e) { return ir::FromSym(e); }
Expr Lt(Expr a, Expr b) { return ir::Binary(ExprOp::kLt, a, b, DType::kBool); }
Expr Ge(Expr a, Expr b) { return ir::Binary(ExprOp::kGe, a, b, DType::kBool); }
Expr Eq(Expr a, Expr b) { return ir::Binary(ExprOp::kEq, a, b, DType::kBool); }
Expr And(Expr a, Expr b) {
  return ir::Binary(ExprOp::kAnd, a, b, DType::kBool);
}
// 0 <= i < n, and i clamped into [0, n) (a load that stays in its buffer).
Expr InRange(Expr i, const SymExpr& n) { return And(Ge(i, C(0)), Lt(i, S(n))); }
Expr Clamp(Expr i, const SymExpr& n) {
  const Expr lo = ir::Binary(ExprOp::kMax, i, C(0), DType::kInt64);
  return ir::Binary(ExprOp::kMin, lo, S(n - SymExpr(1)), DType::kInt64);
}

SymExpr Product(const std::vector<SymExpr>& s) {
  SymExpr p(1);
  for (const SymExpr& e : s) p = p * e;
  return p;
}

// The multi-index of `flat` over row-major `sizes`, written as a reshape
// writes it (ir::Affine folds it back when the reader is contiguous).
std::vector<Expr> Unflatten(const Expr& flat,
                            const std::vector<SymExpr>& sizes) {
  std::vector<Expr> idx(sizes.size());
  SymExpr stride(1);
  for (size_t a = sizes.size(); a-- > 0;) {
    Expr e = ir::FloorDiv(flat, S(stride));
    if (a != 0) e = ir::Mod(e, S(sizes[a]));
    idx[a] = e;
    stride = stride * sizes[a];
  }
  return idx;
}

// Row-major flat number of `idx` over `sizes`.
Expr Flatten(const std::vector<Expr>& idx, const std::vector<SymExpr>& sizes) {
  Expr flat = C(0);
  for (size_t d = 0; d < idx.size(); ++d)
    flat = ir::Add(ir::Mul(flat, S(sizes[d])), idx[d]);
  return flat;
}

std::vector<SymExpr> Spatial(const LoweredValue& v) {
  return std::vector<SymExpr>(v.sizes.begin() + 2, v.sizes.end());
}
std::vector<SymExpr> KernelSizes(const ConvGeometry& g) {
  return std::vector<SymExpr>(g.kernel.begin(), g.kernel.end());
}
int64_t Channels(const LoweredValue& v) { return *v.sizes[1].AsConstant(); }

// The group and the channel within it of channel `c` (groups of `per`).
std::pair<Expr, Expr> GroupOf(const Expr& c, int64_t groups, int64_t per) {
  if (groups == 1) return {C(0), c};
  return {ir::FloorDiv(c, C(per)), ir::Mod(c, C(per))};
}

// im2col of `src` ([N, C, *S]) for output positions `positions` ([*P]):
// [G, C/G * K, N * prod(P)], element (g, (c, k), (n, p)) =
// src[n, g * C/G + c, p * stride - padding + k * dilation], 0 in the
// padding. With padding a float32 node [G, C/G, *K, N, *P] (its select
// and clamped loads), without a view of `src`.
LoweredValue Im2Col(LowerContext& ctx, const LoweredValue& src,
                    const ConvGeometry& g,
                    const std::vector<SymExpr>& positions) {
  const int dims = g.dims;
  const int64_t cg = Channels(src) / g.groups;
  const std::vector<SymExpr> kernel = KernelSizes(g);
  const std::vector<SymExpr> in = Spatial(src);
  bool padded = false;
  for (int64_t p : g.padding) padded |= p != 0;
  // Over vars (g, c, *k, n, *p) of the 5-part space.
  auto source_index = [&](const std::vector<Expr>& v, bool clamp) {
    std::vector<Expr> idx{v[2 + dims], ir::Add(ir::Mul(v[0], C(cg)), v[1])};
    for (int d = 0; d < dims; ++d) {
      Expr i = ir::Add(
          ir::Add(ir::Mul(v[3 + dims + d], C(g.stride[d])), C(-g.padding[d])),
          ir::Mul(v[2 + d], C(g.dilation[d])));
      idx.push_back(clamp ? Clamp(i, in[d]) : i);
    }
    return idx;
  };
  std::vector<SymExpr> space{SymExpr(g.groups), SymExpr(cg)};
  space.insert(space.end(), kernel.begin(), kernel.end());
  space.push_back(src.sizes[0]);
  space.insert(space.end(), positions.begin(), positions.end());
  LoweredValue col;
  if (padded) {
    const std::vector<Expr> v = IdentityIndex(static_cast<int>(space.size()));
    const std::vector<Expr> idx = source_index(v, false);
    Expr inside;
    for (int d = 0; d < dims; ++d) {
      const Expr r = InRange(idx[2 + d], in[d]);
      inside = inside ? And(inside, r) : r;
    }
    LoopNode node;
    node.kind = LoopNode::Kind::kPointwise;
    node.dtype = kF32;
    node.sizes = space;
    node.body = ir::Select(
        inside, ir::Cast(LowerContext::Read(src, source_index(v, true)), kF32),
        ir::Const(0, kF32));
    col = ctx.AddNode(std::move(node));
  }
  // The matrix view: (g, r, j) with r over (c, *k), j over (n, *p).
  std::vector<SymExpr> rows{SymExpr(cg)}, cols{src.sizes[0]};
  rows.insert(rows.end(), kernel.begin(), kernel.end());
  cols.insert(cols.end(), positions.begin(), positions.end());
  std::vector<Expr> v{ir::Var(0)};
  for (Expr& e : Unflatten(ir::Var(1), rows)) v.push_back(std::move(e));
  for (Expr& e : Unflatten(ir::Var(2), cols)) v.push_back(std::move(e));
  const std::vector<SymExpr> sizes{SymExpr(g.groups), Product(rows),
                                   Product(cols)};
  if (padded) return LowerContext::Remap(col, v, sizes);
  return LowerContext::Remap(src, source_index(v, false), sizes);
}

// `m` ([G, R, C]) read transposed: [G, C, R].
LoweredValue Transposed(const LoweredValue& m) {
  return LowerContext::Remap(m, {ir::Var(0), ir::Var(2), ir::Var(1)},
                             {m.sizes[0], m.sizes[2], m.sizes[1]});
}

// The weight `w` ([A, B, *K], A in G groups) as the GEMM's per-group
// matrix [G, A/G, B * K]: row a of group g is w[g * A/G + a].
LoweredValue WeightMatrix(const LoweredValue& w, int64_t groups) {
  const int64_t ag = *w.sizes[0].AsConstant() / groups;
  std::vector<SymExpr> rest(w.sizes.begin() + 1, w.sizes.end());
  std::vector<Expr> idx{ir::Add(ir::Mul(ir::Var(0), C(ag)), ir::Var(1))};
  for (Expr& e : Unflatten(ir::Var(2), rest)) idx.push_back(std::move(e));
  return LowerContext::Remap(w, idx,
                             {SymExpr(groups), SymExpr(ag), Product(rest)});
}

// `v` ([N, C, *S]) as the per-group matrix [G, C/G, N * prod(S)].
LoweredValue GroupMatrix(const LoweredValue& v, int64_t groups) {
  const int64_t cg = Channels(v) / groups;
  std::vector<SymExpr> cols{v.sizes[0]};
  const std::vector<SymExpr> s = Spatial(v);
  cols.insert(cols.end(), s.begin(), s.end());
  const std::vector<Expr> j = Unflatten(ir::Var(2), cols);
  std::vector<Expr> idx{j[0], ir::Add(ir::Mul(ir::Var(0), C(cg)), ir::Var(1))};
  idx.insert(idx.end(), j.begin() + 1, j.end());
  return LowerContext::Remap(v, idx,
                             {SymExpr(groups), SymExpr(cg), Product(cols)});
}

// A convolution's result [G, O/G, N * prod(P)] read as [N, O, *P].
LoweredValue ToNchw(const LoweredValue& p, int64_t groups, int64_t og,
                    const SymExpr& batch, const std::vector<SymExpr>& spatial) {
  const int dims = static_cast<int>(spatial.size());
  std::vector<SymExpr> cols{batch}, sizes{batch, SymExpr(groups * og)};
  cols.insert(cols.end(), spatial.begin(), spatial.end());
  sizes.insert(sizes.end(), spatial.begin(), spatial.end());
  std::vector<Expr> j{ir::Var(0)};
  for (int d = 0; d < dims; ++d) j.push_back(ir::Var(2 + d));
  auto [gr, o] = GroupOf(ir::Var(1), groups, og);
  return LowerContext::Remap(p, {gr, o, Flatten(j, cols)}, sizes);
}

// A regular convolution of `src` ([N, C, *S]) with `w` ([O, C/G, *K]) at
// output positions `positions`: [N, O, *positions] in float32.
LoweredValue ConvForward(LowerContext& ctx, const LoweredValue& src,
                         const LoweredValue& w, const ConvGeometry& g,
                         const std::vector<SymExpr>& positions) {
  const LoweredValue col = Im2Col(ctx, src, g, positions);
  const LoweredValue a = WeightMatrix(w, g.groups);
  const LoweredValue p = ops::AddGemm(
      ctx, a, col, 1.0, {a.sizes[0], a.sizes[1], col.sizes[2]}, kF32);
  return ToNchw(p, g.groups, *a.sizes[1].AsConstant(), src.sizes[0], positions);
}

// A transposed convolution of `src` ([N, C, *small]) with `w`
// ([C, O/G, *K]) onto positions `large`: [N, O, *large] in float32.
absl::StatusOr<LoweredValue> ConvTransposed(LowerContext& ctx,
                                            const LoweredValue& src,
                                            const LoweredValue& w,
                                            const ConvGeometry& g,
                                            const std::vector<SymExpr>& large) {
  const int dims = g.dims;
  const int64_t og = *w.sizes[1].AsConstant();
  const int64_t kk = g.kernel_elements();
  const std::vector<SymExpr> small = Spatial(src);
  const LoweredValue a = Transposed(WeightMatrix(w, g.groups));
  const LoweredValue b = GroupMatrix(src, g.groups);
  const LoweredValue cols =
      ops::AddGemm(ctx, a, b, 1.0, {a.sizes[0], a.sizes[1], b.sizes[2]}, kF32);
  // Space (n, o, *y, *k), reducing *k: y = i * stride - padding +
  // k * dilation for the source position i it comes from.
  std::vector<SymExpr> space{src.sizes[0], SymExpr(g.groups * og)};
  space.insert(space.end(), large.begin(), large.end());
  for (int64_t k : g.kernel) space.push_back(SymExpr(k));
  std::vector<Expr> i, k;
  Expr valid;
  for (int d = 0; d < dims; ++d) {
    k.push_back(ir::Var(2 + dims + d));
    const Expr num = ir::Add(ir::Add(ir::Var(2 + d), C(g.padding[d])),
                             ir::Mul(k.back(), C(-g.dilation[d])));
    const Expr at = ir::FloorDiv(num, C(g.stride[d]));
    Expr ok = And(Ge(num, C(0)), Lt(at, S(small[d])));
    if (g.stride[d] != 1) ok = And(ok, Eq(ir::Mod(num, C(g.stride[d])), C(0)));
    valid = valid ? And(valid, ok) : ok;
    i.push_back(Clamp(at, small[d]));
  }
  std::vector<Expr> j{ir::Var(0)};
  j.insert(j.end(), i.begin(), i.end());
  std::vector<SymExpr> cols_sizes{src.sizes[0]};
  cols_sizes.insert(cols_sizes.end(), small.begin(), small.end());
  auto [gr, o] = GroupOf(ir::Var(1), g.groups, og);
  const Expr row = ir::Add(ir::Mul(o, C(kk)), Flatten(k, KernelSizes(g)));
  const Expr body = ir::Select(
      valid, LowerContext::Read(cols, {gr, row, Flatten(j, cols_sizes)}),
      ir::Const(0, kF32));
  std::vector<bool> reduced(space.size(), false);
  for (int d = 0; d < dims; ++d) reduced[2 + dims + d] = true;
  auto r =
      ops::LowerReductionOver(ctx, LoweredValue{.sizes = space}, reduced, false,
                              ReduceKind::kSum, kF32, kF32, body, nullptr);
  if (!r.ok()) return r.status();
  return (*r)[0];
}

// The weight gradient: for each group, the products of `a` ([N, A, *P],
// the side indexed at positions p) with the im2col of `b` ([N, B, *S]) at
// positions P, summed over the batch and positions: [A, B/G, *K] in float32.
LoweredValue GradWeight(LowerContext& ctx, const LoweredValue& a,
                        const LoweredValue& b, const ConvGeometry& g) {
  const LoweredValue lhs = GroupMatrix(a, g.groups);
  const LoweredValue rhs = Transposed(Im2Col(ctx, b, g, Spatial(a)));
  const LoweredValue p = ops::AddGemm(
      ctx, lhs, rhs, 1.0, {lhs.sizes[0], lhs.sizes[1], rhs.sizes[2]}, kF32);
  const int64_t ag = *lhs.sizes[1].AsConstant();
  const int64_t bg = Channels(b) / g.groups;
  std::vector<SymExpr> sizes{SymExpr(g.groups * ag), SymExpr(bg)};
  std::vector<SymExpr> rest{SymExpr(bg)};
  std::vector<Expr> r{ir::Var(1)};
  for (int d = 0; d < g.dims; ++d) {
    sizes.push_back(SymExpr(g.kernel[d]));
    rest.push_back(SymExpr(g.kernel[d]));
    r.push_back(ir::Var(2 + d));
  }
  auto [gr, row] = GroupOf(ir::Var(0), g.groups, ag);
  return LowerContext::Remap(p, {gr, row, Flatten(r, rest)}, sizes);
}

// ---- library convolutions (ConvCall) ----

// Whether the convolution is a library call: the target has the library,
// it takes the dtype, and (transposed) the larger side's positions are
// those a regular convolution maps onto the smaller side's, which an
// output_padding of at least the stride (PyTorch allows up to the
// dilation) breaks; those stay Kiln's kernels, as PyTorch keeps them off
// cuDNN.
bool UsesLibrary(const LowerContext& ctx, const ConvGeometry& g, DType dtype) {
  const LowerOptions& o = ctx.options();
  const bool half = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  if (!o.library_convolutions ||
      !(dtype == DType::kFloat32 || (half && o.half_precision_convolutions) ||
        (dtype == DType::kBFloat16 && o.bf16_convolutions_f32_result))) {
    return false;
  }
  for (int d = 0; g.transposed && d < g.dims; ++d) {
    if (g.output_padding[d] >= g.stride[d]) return false;
  }
  return true;
}

// The library call `direction` over the convolution x [N, C, *S], w, y
// with `g`'s stride, padding, dilation and groups; `first` and `second`
// are its operands in ConvCall's order (read in `dtype`), the result the
// third tensor: of `dtype`, or float32 for bfloat16 where the library
// writes that (LowerOptions::bf16_convolutions_f32_result; AsOutput
// rounds it).
LoweredValue LibraryConv(LowerContext& ctx, ConvDirection direction,
                         const ConvGeometry& g, const LoweredValue& first,
                         const LoweredValue& second,
                         std::vector<SymExpr> x_sizes,
                         std::vector<SymExpr> w_sizes,
                         std::vector<SymExpr> y_sizes, DType dtype) {
  ConvCall call;
  call.direction = direction;
  call.stride = g.stride;
  call.padding = g.padding;
  call.dilation = g.dilation;
  call.groups = g.groups;
  call.tf32 = ctx.options().tf32_convolution && dtype == DType::kFloat32;
  call.deterministic = ctx.options().deterministic_convolutions;
  call.benchmark = ctx.options().cudnn_benchmark;
  LoopNode node;
  node.kind = LoopNode::Kind::kExtern;
  node.dtype = dtype == DType::kBFloat16 &&
                       !ctx.options().half_precision_convolutions &&
                       ctx.options().bf16_convolutions_f32_result
                   ? DType::kFloat32
                   : dtype;
  node.sizes = direction == ConvDirection::kForward        ? y_sizes
               : direction == ConvDirection::kBackwardData ? x_sizes
                                                           : w_sizes;
  call.x_sizes = std::move(x_sizes);
  call.w_sizes = std::move(w_sizes);
  call.y_sizes = std::move(y_sizes);
  node.conv = std::move(call);
  node.extern_inputs = {ops::ContiguousNode(ctx, first, dtype),
                        ops::ContiguousNode(ctx, second, dtype)};
  return ctx.AddNode(std::move(node));
}

// `v` (float32) as output o: cast when the output is half precision.
LoweredValue AsOutput(LowerContext& ctx, const LoweredValue& v, int o) {
  if (ctx.out_type(o).dtype == v.dtype) return v;
  return ops::Materialize(ctx, v, ctx.out_type(o).dtype);
}

absl::StatusOr<ConvGeometry> GeometryOf(const LowerContext& ctx, int input,
                                        int weight, int first_arg) {
  return ops::ConvGeometryOf(ctx.node(), first_arg, ctx.value(input).sizes,
                             ctx.value(weight).sizes);
}

// ---- convolution ----

absl::StatusOr<std::vector<LoweredValue>> LowerConvolution(LowerContext& ctx) {
  auto g = GeometryOf(ctx, 0, 1, 3);
  if (!g.ok()) return g.status();
  const LoweredValue& x = ctx.value(0);
  const LoweredValue& w = ctx.value(1);
  const DType dtype = ctx.out_type(0).dtype;
  LoweredValue y;
  if (UsesLibrary(ctx, *g, dtype)) {
    // A transposed convolution is the backward data pass of the regular
    // convolution from its output's positions to its input's.
    const std::vector<SymExpr>& out = ctx.out_type(0).sizes;
    y = g->transposed ? LibraryConv(ctx, ConvDirection::kBackwardData, *g, x, w,
                                    out, w.sizes, x.sizes, dtype)
                      : LibraryConv(ctx, ConvDirection::kForward, *g, x, w,
                                    x.sizes, w.sizes, out, dtype);
  } else if (g->transposed) {
    auto t = ConvTransposed(ctx, x, w, *g, g->out_spatial);
    if (!t.ok()) return t.status();
    y = *t;
  } else {
    y = ConvForward(ctx, x, w, *g, g->out_spatial);
  }
  if (!ctx.is_tensor(2)) return std::vector<LoweredValue>{AsOutput(ctx, y, 0)};
  // The bias kernel reads the product through its layout transform.
  const int rank = static_cast<int>(y.sizes.size());
  const Expr bias =
      ir::Cast(LowerContext::Read(ctx.value(2), {ir::Var(1)}), kF32);
  const Expr sum = ir::Binary(
      ExprOp::kAdd, ir::Cast(LowerContext::Read(y, IdentityIndex(rank)), kF32),
      bias, kF32);
  return std::vector<LoweredValue>{ops::PointwiseOutput(ctx, sum)};
}

// ---- convolution_backward ----

bool MaskBit(const LowerContext& ctx, int i) {
  return ctx.arg(10).ints[i].AsConstant().value_or(1) != 0;
}

// Zeros for output o (its mask bit is 0: nothing reads it).
LoweredValue Zeros(LowerContext& ctx, int o) {
  LoopNode node;
  node.kind = LoopNode::Kind::kPointwise;
  node.dtype = ctx.out_type(o).dtype;
  node.sizes = ctx.out_type(o).sizes;
  node.body = ir::Cast(ir::Const(0, kF32), node.dtype);
  return ctx.AddNode(std::move(node));
}

absl::StatusOr<std::vector<LoweredValue>> LowerConvolutionBackward(
    LowerContext& ctx) {
  auto g = GeometryOf(ctx, 1, 2, 4);
  if (!g.ok()) return g.status();
  const LoweredValue& gy = ctx.value(0);
  const LoweredValue& x = ctx.value(1);
  const LoweredValue& w = ctx.value(2);
  const DType dtype = ctx.out_type(0).dtype;
  std::vector<LoweredValue> out;
  if (UsesLibrary(ctx, *g, dtype)) {
    // The library's x is the larger side: the input of a regular
    // convolution, grad_output of a transposed one.
    const LoweredValue& cx = g->transposed ? gy : x;
    const LoweredValue& cy = g->transposed ? x : gy;
    if (!MaskBit(ctx, 0)) {
      out.push_back(Zeros(ctx, 0));
    } else if (g->transposed) {
      out.push_back(AsOutput(ctx,
                             LibraryConv(ctx, ConvDirection::kForward, *g, gy,
                                         w, cx.sizes, w.sizes, cy.sizes, dtype),
                             0));
    } else {
      out.push_back(
          AsOutput(ctx,
                   LibraryConv(ctx, ConvDirection::kBackwardData, *g, gy, w,
                               cx.sizes, w.sizes, cy.sizes, dtype),
                   0));
    }
    if (!MaskBit(ctx, 1)) {
      out.push_back(Zeros(ctx, 1));
    } else {
      out.push_back(
          AsOutput(ctx,
                   LibraryConv(ctx, ConvDirection::kBackwardFilter, *g, cx, cy,
                               cx.sizes, w.sizes, cy.sizes, dtype),
                   1));
    }
  } else {
    // grad_input: the convolution in the other direction with the same
    // weight, onto the input's positions.
    if (!MaskBit(ctx, 0)) {
      out.push_back(Zeros(ctx, 0));
    } else if (g->transposed) {
      out.push_back(
          AsOutput(ctx, ConvForward(ctx, gy, w, *g, g->in_spatial), 0));
    } else {
      auto t = ConvTransposed(ctx, gy, w, *g, g->in_spatial);
      if (!t.ok()) return t.status();
      out.push_back(AsOutput(ctx, *t, 0));
    }
    // grad_weight: the small side's channels times the im2col of the large
    // side's (regular: grad_output and the input; transposed: the input and
    // grad_output).
    if (!MaskBit(ctx, 1)) {
      out.push_back(Zeros(ctx, 1));
    } else {
      const LoweredValue gw = g->transposed ? GradWeight(ctx, x, gy, *g)
                                            : GradWeight(ctx, gy, x, *g);
      out.push_back(AsOutput(ctx, gw, 1));
    }
  }
  // grad_bias: grad_output summed over all dims but the channels.
  if (!MaskBit(ctx, 2)) {
    out.push_back(Zeros(ctx, 2));
  } else {
    std::vector<bool> reduced(gy.sizes.size(), true);
    reduced[1] = false;
    auto r =
        ops::LowerReductionOver(ctx, gy, reduced, false, ReduceKind::kSum, kF32,
                                ctx.out_type(2).dtype, nullptr, nullptr);
    if (!r.ok()) return r.status();
    out.push_back((*r)[0]);
  }
  return out;
}

}  // namespace

void RegisterConvLowerings(OpLowerings& table) {
  table.Add("aten.convolution.default", LowerConvolution);
  table.Add("aten.convolution_backward.default", LowerConvolutionBackward);
}

}  // namespace kiln
