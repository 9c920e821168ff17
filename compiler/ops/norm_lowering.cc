// Lowerings of the norm family (signatures: graph/ops/norm.cc) to
// reductions and pointwise nodes, computing in float32 (float16/bfloat16
// inputs as PyTorch's opmath), so that fusion keeps each op in one row
// kernel with its neighbours and the GPU splits its reductions as it does
// the forward ops'. The formulas are norm_reference.cc's.
#include <optional>
#include <utility>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"

namespace kiln {
namespace {

using ops::LowerReductionOver;
using ops::ReadKept;

constexpr DType kF32 = DType::kFloat32;

Expr Mul(Expr a, Expr b) { return ir::Binary(ExprOp::kMul, a, b, kF32); }
Expr Sub(Expr a, Expr b) { return ir::Binary(ExprOp::kSub, a, b, kF32); }

// Argument i read broadcast over `sizes`, in float32.
Expr ReadF32(const LowerContext& ctx, int i,
             const std::vector<SymExpr>& sizes) {
  return ir::Cast(LowerContext::ReadBroadcast(ctx.value(i), sizes), kF32);
}

Expr MeanOf(Expr acc, Expr count) {
  return ir::Binary(ExprOp::kDiv, acc, ir::Cast(count, kF32), kF32);
}

// A float32 sum of `body` over the `reduced` dims of `space`; keepdim.
absl::StatusOr<LoweredValue> SumOver(LowerContext& ctx,
                                     const LoweredValue& space,
                                     const std::vector<bool>& reduced,
                                     bool keepdim, Expr body, DType out,
                                     bool mean = false) {
  auto r =
      LowerReductionOver(ctx, space, reduced, keepdim, ReduceKind::kSum, kF32,
                         out, std::move(body), mean ? MeanOf : nullptr);
  if (!r.ok()) return r.status();
  return (*r)[0];
}

// A pointwise node of output o's sizes and dtype computing `body`.
LoweredValue OutputNode(LowerContext& ctx, int o, Expr body) {
  return ops::PointwiseNode(ctx, ctx.out_type(o).sizes, ctx.out_type(o).dtype,
                            std::move(body));
}

// Zeros for output o (an output its mask turned off: nothing reads it).
LoweredValue ZerosOutput(LowerContext& ctx, int o) {
  return OutputNode(ctx, o, ir::Const(0, kF32));
}

bool MaskBit(const LowerContext& ctx, int arg, int i) {
  return ctx.arg(arg).ints[i].AsConstant().value_or(1) != 0;
}

// ---- softmax backward ----

absl::StatusOr<std::vector<LoweredValue>> LowerSoftmaxBackward(
    LowerContext& ctx, bool log) {
  const LoweredValue& y = ctx.value(1);
  const int rank = static_cast<int>(y.sizes.size());
  std::vector<bool> reduced(rank, false);
  if (rank > 0) {
    const int64_t d = ctx.arg(2).i;
    reduced[d < 0 ? d + rank : d] = true;
  }
  const Expr g = ReadF32(ctx, 0, y.sizes);
  const Expr out = ReadF32(ctx, 1, y.sizes);
  auto s = SumOver(ctx, y, reduced, true, log ? g : Mul(g, out), kF32);
  if (!s.ok()) return s.status();
  const Expr sum = ReadKept(*s, reduced);
  const Expr gi = log ? Sub(g, Mul(ir::Unary(ExprOp::kExp, out, kF32), sum))
                      : Mul(out, Sub(g, sum));
  return std::vector<LoweredValue>{OutputNode(ctx, 0, gi)};
}

absl::StatusOr<std::vector<LoweredValue>> LowerSoftmaxBackwardData(
    LowerContext& ctx) {
  return LowerSoftmaxBackward(ctx, /*log=*/false);
}

absl::StatusOr<std::vector<LoweredValue>> LowerLogSoftmaxBackwardData(
    LowerContext& ctx) {
  return LowerSoftmaxBackward(ctx, /*log=*/true);
}

// ---- native_layer_norm_backward ----

absl::StatusOr<std::vector<LoweredValue>> LowerLayerNormBackward(
    LowerContext& ctx) {
  const LoweredValue& in = ctx.value(1);
  const int rank = static_cast<int>(in.sizes.size());
  const int axis = rank - static_cast<int>(ctx.arg(2).ints.size());
  std::vector<bool> row(rank, false), outer(rank, false);
  for (int d = 0; d < rank; ++d) (d >= axis ? row : outer)[d] = true;
  const Expr g = ReadF32(ctx, 0, in.sizes);
  const Expr x = ReadF32(ctx, 1, in.sizes);
  const Expr mean = ir::Cast(ReadKept(ctx.value(3), row), kF32);
  const Expr rstd = ir::Cast(ReadKept(ctx.value(4), row), kF32);
  const Expr xhat = Mul(Sub(x, mean), rstd);
  const bool has_w = ctx.is_tensor(5);
  std::vector<LoweredValue> outs;
  if (MaskBit(ctx, 7, 0)) {
    // Weight element of input element v: its trailing dims.
    const Expr gw = has_w ? Mul(g, ReadF32(ctx, 5, in.sizes)) : g;
    auto m1 = SumOver(ctx, in, row, true, gw, kF32, /*mean=*/true);
    if (!m1.ok()) return m1.status();
    auto m2 = SumOver(ctx, in, row, true, Mul(gw, xhat), kF32, /*mean=*/true);
    if (!m2.ok()) return m2.status();
    outs.push_back(OutputNode(ctx, 0,
                              Mul(rstd, Sub(Sub(gw, ReadKept(*m1, row)),
                                            Mul(xhat, ReadKept(*m2, row))))));
  } else {
    outs.push_back(ZerosOutput(ctx, 0));
  }
  const struct {
    int arg;
    Expr body;
  } params[] = {{5, Mul(g, xhat)}, {6, g}};
  for (int k = 0; k < 2; ++k) {
    if (!MaskBit(ctx, 7, k + 1) || !ctx.is_tensor(params[k].arg)) {
      outs.push_back(ZerosOutput(ctx, k + 1));
      continue;
    }
    auto s = SumOver(ctx, in, outer, /*keepdim=*/false, params[k].body,
                     ctx.out_type(k + 1).dtype);
    if (!s.ok()) return s.status();
    outs.push_back(*s);
  }
  return outs;
}

// ---- batch norm: per channel (dim 1) over every other dim ----

Expr Add(Expr a, Expr b) { return ir::Binary(ExprOp::kAdd, a, b, kF32); }
Expr Rsqrt(Expr a) { return ir::Unary(ExprOp::kRsqrt, a, kF32); }

// A [C] argument read at the channel of the input space (var 1), in
// float32; None reads as `none`.
Expr ChannelRead(const LowerContext& ctx, int i, double none) {
  if (!ctx.is_tensor(i)) return ir::Const(none, kF32);
  return ir::Cast(LowerContext::Read(ctx.value(i), {ir::Var(1)}), kF32);
}

// A [C] value (a node of shape [C]) read at the channel of the input space.
Expr AtChannel(const LoweredValue& v) {
  return ir::Cast(LowerContext::Read(v, {ir::Var(1)}), kF32);
}

std::vector<bool> AllButChannel(int rank) {
  std::vector<bool> reduced(rank, true);
  reduced[1] = false;
  return reduced;
}

// The elements per channel, in float32.
Expr ChannelCount(const LoweredValue& in) {
  SymExpr n(1);
  for (size_t d = 0; d < in.sizes.size(); ++d) {
    if (d != 1) n = n * in.sizes[d];
  }
  return ir::Cast(ir::FromSym(n), kF32);
}

// (x - mean) * rstd * weight + bias over the input, weight and bias at
// args 1 and 2.
LoweredValue NormalizedOutput(LowerContext& ctx, Expr mean, Expr rstd) {
  const LoweredValue& in = ctx.value(0);
  const Expr x = ReadF32(ctx, 0, in.sizes);
  return OutputNode(ctx, 0,
                    Add(Mul(Mul(Sub(x, mean), rstd), ChannelRead(ctx, 1, 1.0)),
                        ChannelRead(ctx, 2, 0.0)));
}

// Training batch norm: out, save_mean, save_rstd (outputs 0..2), and the
// batch mean and biased variance nodes ([C], float32) in `moments`.
absl::StatusOr<std::vector<LoweredValue>> TrainBatchNorm(
    LowerContext& ctx, double eps, std::vector<LoweredValue>& moments) {
  const LoweredValue& in = ctx.value(0);
  const std::vector<bool> reduced = AllButChannel(in.sizes.size());
  const Expr x = ReadF32(ctx, 0, in.sizes);
  auto mean = SumOver(ctx, in, reduced, false, x, kF32, /*mean=*/true);
  if (!mean.ok()) return mean.status();
  const Expr dev = Sub(x, AtChannel(*mean));
  auto var = SumOver(ctx, in, reduced, false, Mul(dev, dev), kF32,
                     /*mean=*/true);
  if (!var.ok()) return var.status();
  const LoweredValue rstd = ops::PointwiseNode(
      ctx, mean->sizes, ctx.out_type(2).dtype,
      Rsqrt(Add(ir::Cast(LowerContext::Read(*var, {ir::Var(0)}), kF32),
                ir::Const(eps, kF32))));
  moments = {*mean, *var};
  return std::vector<LoweredValue>{
      NormalizedOutput(ctx, AtChannel(*mean), AtChannel(rstd)), *mean, rstd};
}

// Eval batch norm from the running statistics (args 3 and 4).
LoweredValue EvalBatchNorm(LowerContext& ctx, double eps) {
  return NormalizedOutput(
      ctx, ChannelRead(ctx, 3, 0),
      Rsqrt(Add(ChannelRead(ctx, 4, 1), ir::Const(eps, kF32))));
}

absl::StatusOr<std::vector<LoweredValue>> LowerBatchNormFunctional(
    LowerContext& ctx) {
  const LoweredValue& rm = ctx.value(3);
  const LoweredValue& rv = ctx.value(4);
  const Expr rm_c = ir::Cast(LowerContext::Read(rm, {ir::Var(0)}), kF32);
  const Expr rv_c = ir::Cast(LowerContext::Read(rv, {ir::Var(0)}), kF32);
  if (!ctx.arg(5).b) {
    return std::vector<LoweredValue>{EvalBatchNorm(ctx, ctx.arg(7).f),
                                     ZerosOutput(ctx, 1), ZerosOutput(ctx, 2),
                                     OutputNode(ctx, 3, rm_c),
                                     OutputNode(ctx, 4, rv_c)};
  }
  std::vector<LoweredValue> moments;
  auto outs = TrainBatchNorm(ctx, ctx.arg(7).f, moments);
  if (!outs.ok()) return outs.status();
  const Expr m = ir::Const(ctx.arg(6).f, kF32);
  const Expr keep = ir::Const(1 - ctx.arg(6).f, kF32);
  const Expr mean =
      ir::Cast(LowerContext::Read(moments[0], {ir::Var(0)}), kF32);
  const Expr var = ir::Cast(LowerContext::Read(moments[1], {ir::Var(0)}), kF32);
  // The running variance takes the unbiased estimate: var * n / (n - 1).
  const Expr n = ChannelCount(ctx.value(0));
  const Expr unbiased =
      ir::Binary(ExprOp::kDiv, Mul(var, n), Sub(n, ir::Const(1, kF32)), kF32);
  outs->push_back(OutputNode(ctx, 3, Add(Mul(m, mean), Mul(keep, rm_c))));
  outs->push_back(OutputNode(ctx, 4, Add(Mul(m, unbiased), Mul(keep, rv_c))));
  return outs;
}

absl::StatusOr<std::vector<LoweredValue>> LowerBatchNormNoTraining(
    LowerContext& ctx) {
  return std::vector<LoweredValue>{EvalBatchNorm(ctx, ctx.arg(6).f),
                                   ZerosOutput(ctx, 1), ZerosOutput(ctx, 2)};
}

absl::StatusOr<std::vector<LoweredValue>> LowerBatchNormNoStats(
    LowerContext& ctx) {
  std::vector<LoweredValue> moments;
  return TrainBatchNorm(ctx, ctx.arg(5).f, moments);
}

absl::StatusOr<std::vector<LoweredValue>> LowerBatchNormBackward(
    LowerContext& ctx) {
  const LoweredValue& in = ctx.value(1);
  const std::vector<bool> reduced = AllButChannel(in.sizes.size());
  const bool train = ctx.arg(7).b;
  const Expr g = ReadF32(ctx, 0, in.sizes);
  const Expr x = ReadF32(ctx, 1, in.sizes);
  const Expr mean = ChannelRead(ctx, train ? 5 : 3, 0);
  const Expr rstd =
      train ? ChannelRead(ctx, 6, 1)
            : Rsqrt(Add(ChannelRead(ctx, 4, 1), ir::Const(ctx.arg(8).f, kF32)));
  const Expr xhat = Mul(Sub(x, mean), rstd);
  const Expr w = ChannelRead(ctx, 2, 1);
  // The two channel sums, each computed once (float32): grad_input takes
  // their means, grad_weight and grad_bias the sums themselves.
  const bool input_grad = MaskBit(ctx, 9, 0);
  const bool need_sums = (input_grad && train) || MaskBit(ctx, 9, 1) ||
                         MaskBit(ctx, 9, 2);
  LoweredValue sum_gx, sum_g;
  if (need_sums) {
    auto s = SumOver(ctx, in, reduced, false, Mul(g, xhat), kF32);
    if (!s.ok()) return s.status();
    sum_gx = *s;
    s = SumOver(ctx, in, reduced, false, g, kF32);
    if (!s.ok()) return s.status();
    sum_g = *s;
  }
  std::vector<LoweredValue> outs;
  if (!input_grad) {
    outs.push_back(ZerosOutput(ctx, 0));
  } else if (!train) {
    outs.push_back(OutputNode(ctx, 0, Mul(Mul(g, rstd), w)));
  } else {
    // The means as SumOver(mean=true) computes them: sum / count.
    const Expr n = ChannelCount(in);
    const Expr mean_g = ir::Binary(ExprOp::kDiv, AtChannel(sum_g), n, kF32);
    const Expr mean_gx =
        ir::Binary(ExprOp::kDiv, AtChannel(sum_gx), n, kF32);
    outs.push_back(OutputNode(
        ctx, 0,
        Mul(Mul(rstd, w), Sub(Sub(g, mean_g), Mul(xhat, mean_gx)))));
  }
  const LoweredValue* sums[] = {&sum_gx, &sum_g};
  for (int k = 0; k < 2; ++k) {
    if (!MaskBit(ctx, 9, k + 1)) {
      outs.push_back(ZerosOutput(ctx, k + 1));
      continue;
    }
    outs.push_back(OutputNode(
        ctx, k + 1, LowerContext::Read(*sums[k], {ir::Var(0)})));
  }
  return outs;
}

// ---- group norm: [N, C, *] viewed as [N, group, C / group * HxW] ----

struct GroupShape {
  int64_t group, cg;  // groups and channels per group
  SymExpr hxw;        // positions per channel
};

GroupShape GroupShapeOf(const LowerContext& ctx, const LoweredValue& in,
                        int group_arg, int c_arg) {
  SymExpr hxw(1);
  for (size_t d = 2; d < in.sizes.size(); ++d) hxw = hxw * in.sizes[d];
  const int64_t group = ctx.arg(group_arg).i;
  return {group, ctx.arg(c_arg).i / group, hxw};
}

// The input's index (over the vars of the [N, group, cg * HxW] view) of
// view element (n, k, d): (n, k * cg + d / HxW, spatial(d % HxW)).
std::vector<Expr> GroupIndex(const std::vector<SymExpr>& sizes,
                             const GroupShape& s) {
  const Expr hxw = ir::FromSym(s.hxw);
  std::vector<Expr> index = {ir::Var(0),
                             ir::Add(ir::Mul(ir::Var(1), ir::IntConst(s.cg)),
                                     ir::FloorDiv(ir::Var(2), hxw))};
  Expr flat = ir::Mod(ir::Var(2), hxw);
  std::vector<Expr> spatial;
  for (size_t d = sizes.size(); d-- > 2;) {
    const Expr size = ir::FromSym(sizes[d]);
    spatial.insert(spatial.begin(), d == 2 ? flat : ir::Mod(flat, size));
    flat = ir::FloorDiv(flat, size);
  }
  index.insert(index.end(), spatial.begin(), spatial.end());
  return index;
}

// `v` (of the input's shape) as the [N, group, cg * HxW] view.
LoweredValue GroupView(const LoweredValue& v, const GroupShape& s) {
  return LowerContext::Remap(
      v, GroupIndex(v.sizes, s),
      {v.sizes[0], SymExpr(s.group), SymExpr(s.cg) * s.hxw});
}

// A [N, group] value read at the group of the input space's (n, c).
Expr AtGroup(const LoweredValue& v, const GroupShape& s) {
  return ir::Cast(
      LowerContext::Read(
          v, {ir::Var(0), ir::FloorDiv(ir::Var(1), ir::IntConst(s.cg))}),
      kF32);
}

// Whether group statistics go through per-channel ones: a reduction over
// each (n, c)'s positions first, then over the group's channels. Rows of
// HxW instead of cg * HxW give the GPU 8x the rows at ResNet's group norm
// (32 groups of 8 channels), and the backward reads its input twice
// instead of three times (ATen's kernels take the same two steps). With one
// channel a group there is nothing to combine, and over a few positions
// per channel the [N, C] intermediate would cost a pass of its own.
bool PerChannelFirst(const GroupShape& s) {
  if (s.cg <= 1) return false;
  const std::optional<int64_t> hxw = s.hxw.AsConstant();
  return !hxw.has_value() || *hxw >= 32;
}

// The positions of a channel, in float32.
Expr Positions(const GroupShape& s) {
  return ir::Cast(ir::FromSym(s.hxw), kF32);
}

// The channel of view element (n, k, j) of a [N, group, cg] view: k * cg + j.
Expr ViewChannel(const GroupShape& s) {
  return ir::Add(ir::Mul(ir::Var(1), ir::IntConst(s.cg)), ir::Var(2));
}

// A [N, C] value read at view element (n, k, j) of its [N, group, cg] view.
Expr AtViewChannel(const LoweredValue& v, const GroupShape& s) {
  return ir::Cast(LowerContext::Read(v, {ir::Var(0), ViewChannel(s)}), kF32);
}

// A [N, C] value as its [N, group, cg] view.
LoweredValue ChannelsByGroup(const LoweredValue& v, const GroupShape& s) {
  return LowerContext::Remap(v, {ir::Var(0), ViewChannel(s)},
                             {v.sizes[0], SymExpr(s.group), SymExpr(s.cg)});
}

// Every input dim reduced but N and C.
std::vector<bool> Spatial(int rank) {
  std::vector<bool> reduced(rank, true);
  reduced[0] = reduced[1] = false;
  return reduced;
}

// The mean and biased variance ([N, group], float32) of each group.
//   One step: over the [N, group, cg * HxW] view, the mean, then the sum
//   of squared deviations from it.
//   Per channel first: each channel's mean m_c and squared deviations M_c
//   over its HxW positions, then combined as Chan et al.'s parallel
//   variance does (exact, and no cancellation):
//     mean = mean_c(m_c),  M = sum_c(M_c + HxW * (m_c - mean)^2).
absl::StatusOr<std::pair<LoweredValue, LoweredValue>> GroupMoments(
    LowerContext& ctx, const LoweredValue& in, const GroupShape& s) {
  const std::vector<bool> row = {false, false, true};
  if (!PerChannelFirst(s)) {
    const LoweredValue xv = GroupView(in, s);
    const Expr x = ir::Cast(LowerContext::ReadBroadcast(xv, xv.sizes), kF32);
    auto mean = SumOver(ctx, xv, row, false, x, kF32, /*mean=*/true);
    if (!mean.ok()) return mean.status();
    const Expr dev = Sub(
        x, ir::Cast(LowerContext::Read(*mean, {ir::Var(0), ir::Var(1)}), kF32));
    auto var = SumOver(ctx, xv, row, false, Mul(dev, dev), kF32, /*mean=*/true);
    if (!var.ok()) return var.status();
    return std::make_pair(*mean, *var);
  }
  const std::vector<bool> spatial = Spatial(in.sizes.size());
  const Expr x = ir::Cast(LowerContext::ReadBroadcast(in, in.sizes), kF32);
  auto mc = SumOver(ctx, in, spatial, false, x, kF32, /*mean=*/true);
  if (!mc.ok()) return mc.status();
  const Expr dev =
      Sub(x, ir::Cast(LowerContext::Read(*mc, {ir::Var(0), ir::Var(1)}), kF32));
  auto m2c = SumOver(ctx, in, spatial, false, Mul(dev, dev), kF32);
  if (!m2c.ok()) return m2c.status();
  const LoweredValue channels = ChannelsByGroup(*mc, s);
  auto mean = SumOver(ctx, channels, row, false, AtViewChannel(*mc, s), kF32,
                      /*mean=*/true);
  if (!mean.ok()) return mean.status();
  const Expr shift =
      Sub(AtViewChannel(*mc, s),
          ir::Cast(LowerContext::Read(*mean, {ir::Var(0), ir::Var(1)}), kF32));
  auto m2 = SumOver(
      ctx, channels, row, false,
      Add(AtViewChannel(*m2c, s), Mul(Positions(s), Mul(shift, shift))), kF32);
  if (!m2.ok()) return m2.status();
  const Expr count = Mul(Positions(s), ir::Const(s.cg, kF32));
  const LoweredValue var = ops::PointwiseNode(
      ctx, m2->sizes, kF32,
      ir::Binary(ExprOp::kDiv, LowerContext::Read(*m2, IdentityIndex(2)), count,
                 kF32));
  return std::make_pair(*mean, var);
}

// Statistics in float32; mean and rstd are stored in the input's dtype
// while the output normalizes with the unrounded ones.
absl::StatusOr<std::vector<LoweredValue>> LowerGroupNorm(LowerContext& ctx) {
  const LoweredValue& in = ctx.value(0);
  const GroupShape s = GroupShapeOf(ctx, in, 6, 4);
  auto moments = GroupMoments(ctx, in, s);
  if (!moments.ok()) return moments.status();
  const auto& [mean, var] = *moments;
  const LoweredValue rstd =
      ops::PointwiseNode(ctx, var.sizes, kF32,
                         Rsqrt(Add(LowerContext::Read(var, IdentityIndex(2)),
                                   ir::Const(ctx.arg(7).f, kF32))));
  const LoweredValue out =
      NormalizedOutput(ctx, AtGroup(mean, s), AtGroup(rstd, s));
  std::vector<LoweredValue> outs = {out, mean, rstd};
  for (int o : {1, 2}) {
    if (ctx.out_type(o).dtype != kF32) {
      outs[o] =
          ops::PointwiseNode(ctx, outs[o].sizes, ctx.out_type(o).dtype,
                             LowerContext::Read(outs[o], IdentityIndex(2)));
    }
  }
  return outs;
}

// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)) over each group (gw
// = g * weight[c]); dweight[c] = sum(g * xhat), dbias[c] = sum(g) over N
// and HxW. Per channel first (PerChannelFirst), as ATen's kernels: A[n, c] =
// sum(g * xhat) and B[n, c] = sum(g) over the channel's positions (one
// pass over g and x), then the group sums are sum_c(w_c * B) and
// sum_c(w_c * A), dweight and dbias the sums of A and B over N.
absl::StatusOr<std::vector<LoweredValue>> LowerGroupNormBackward(
    LowerContext& ctx) {
  const LoweredValue& in = ctx.value(1);
  const GroupShape s = GroupShapeOf(ctx, in, 8, 6);
  const Expr g = ReadF32(ctx, 0, in.sizes);
  const Expr x = ReadF32(ctx, 1, in.sizes);
  const Expr rstd = AtGroup(ctx.value(3), s);
  const Expr xhat = Mul(Sub(x, AtGroup(ctx.value(2), s)), rstd);
  const Expr gw = Mul(g, ChannelRead(ctx, 4, 1));
  const bool input_grad = MaskBit(ctx, 9, 0);
  const bool param_grad[] = {MaskBit(ctx, 9, 1), MaskBit(ctx, 9, 2)};
  const bool per_channel = PerChannelFirst(s);
  const std::vector<bool> row = {false, false, true};
  const Expr bodies[] = {Mul(g, xhat), g};
  // Per channel: sums[0] = A (of g * xhat), sums[1] = B (of g), [N, C].
  LoweredValue sums[2];
  for (int k = 0; k < 2 && per_channel; ++k) {
    if (!input_grad && !param_grad[k]) continue;
    auto sum =
        SumOver(ctx, in, Spatial(in.sizes.size()), false, bodies[k], kF32);
    if (!sum.ok()) return sum.status();
    sums[k] = *sum;
  }
  std::vector<LoweredValue> outs;
  if (!input_grad) {
    outs.push_back(ZerosOutput(ctx, 0));
  } else if (per_channel) {
    // The group sums of gw and gw * xhat: sum_c(w_c * B), sum_c(w_c * A).
    const Expr w_v =
        ctx.is_tensor(4)
            ? ir::Cast(LowerContext::Read(ctx.value(4), {ViewChannel(s)}), kF32)
            : ir::Const(1, kF32);
    const LoweredValue channels = ChannelsByGroup(sums[0], s);
    auto m1 = SumOver(ctx, channels, row, false,
                      Mul(w_v, AtViewChannel(sums[1], s)), kF32);
    if (!m1.ok()) return m1.status();
    auto m2 = SumOver(ctx, channels, row, false,
                      Mul(w_v, AtViewChannel(sums[0], s)), kF32);
    if (!m2.ok()) return m2.status();
    const Expr count = Mul(Positions(s), ir::Const(s.cg, kF32));
    auto mean_of = [&](const LoweredValue& v) {
      return ir::Binary(ExprOp::kDiv, AtGroup(v, s), count, kF32);
    };
    outs.push_back(OutputNode(
        ctx, 0,
        Mul(rstd, Sub(Sub(gw, mean_of(*m1)), Mul(xhat, mean_of(*m2))))));
  } else {
    // The group means of gw and gw * xhat, over the [N, group, D] view:
    // the same expressions with the view's vars substituted.
    const LoweredValue gv = GroupView(ctx.value(0), s);
    // Input var d is to_input[d] over the view's vars.
    const std::vector<Expr> to_input = GroupIndex(in.sizes, s);
    const Expr gw_v = ir::SubstituteVars(gw, to_input);
    const Expr xhat_v = ir::SubstituteVars(xhat, to_input);
    auto m1 = SumOver(ctx, gv, row, false, gw_v, kF32, /*mean=*/true);
    if (!m1.ok()) return m1.status();
    auto m2 =
        SumOver(ctx, gv, row, false, Mul(gw_v, xhat_v), kF32, /*mean=*/true);
    if (!m2.ok()) return m2.status();
    outs.push_back(OutputNode(
        ctx, 0,
        Mul(rstd, Sub(Sub(gw, AtGroup(*m1, s)), Mul(xhat, AtGroup(*m2, s))))));
  }
  // dweight and dbias: per channel the sums of A and B over N, else sums
  // over N and HxW.
  for (int k = 0; k < 2; ++k) {
    if (!param_grad[k]) {
      outs.push_back(ZerosOutput(ctx, k + 1));
      continue;
    }
    const DType dtype = ctx.out_type(k + 1).dtype;
    auto sum =
        per_channel
            ? SumOver(
                  ctx, sums[k], {true, false}, false,
                  ir::Cast(LowerContext::Read(sums[k], IdentityIndex(2)), kF32),
                  dtype)
            : SumOver(ctx, in, AllButChannel(in.sizes.size()), false, bodies[k],
                      dtype);
    if (!sum.ok()) return sum.status();
    outs.push_back(*sum);
  }
  return outs;
}

}  // namespace

void RegisterNormLowerings(OpLowerings& table) {
  table.Add("aten._softmax_backward_data.default", LowerSoftmaxBackwardData);
  table.Add("aten._log_softmax_backward_data.default",
            LowerLogSoftmaxBackwardData);
  table.Add("aten.native_layer_norm_backward.default", LowerLayerNormBackward);
  table.Add("aten._native_batch_norm_legit_functional.default",
            LowerBatchNormFunctional);
  table.Add("aten._native_batch_norm_legit_no_training.default",
            LowerBatchNormNoTraining);
  table.Add("aten._native_batch_norm_legit.no_stats", LowerBatchNormNoStats);
  table.Add("aten.native_batch_norm_backward.default", LowerBatchNormBackward);
  table.Add("aten.native_group_norm.default", LowerGroupNorm);
  table.Add("aten.native_group_norm_backward.default", LowerGroupNormBackward);
}

}  // namespace kiln
