// Signatures of the 2-d pooling ops: max_pool2d_with_indices and its
// backward, avg_pool2d and its backward, _adaptive_avg_pool2d and its
// backward (references and lowerings: compiler/ops/pooling_*.cc). The
// window arithmetic is graph/ops/pooling.h's.
#include "graph/ops/pooling.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/ops/signature_util.h"

namespace kiln::ops {

int64_t PoolOutputSize(int64_t in, int64_t kernel, int64_t pad, int64_t stride,
                       int64_t dilation, bool ceil_mode) {
  const int64_t num =
      in + 2 * pad - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  // div_rtn: rounds toward negative infinity.
  int64_t out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

int64_t AdaptiveMaxWindow(int64_t out, int64_t in) {
  int64_t k = 0;
  for (int64_t o = 0; o < out; ++o) {
    k = std::max(k, AdaptiveEnd(o, out, in) - AdaptiveStart(o, out, in));
  }
  return k;
}

namespace {

// One int or two (an int list), or `fallback` when the list is empty.
absl::Status PairOf(const Node& node, int arg, const char* what,
                    int64_t fallback_h, int64_t fallback_w, int64_t& h,
                    int64_t& w) {
  if (arg < 0) {
    h = fallback_h;
    w = fallback_w;
    return absl::OkStatus();
  }
  const std::vector<SymExpr>& v = node.args[arg].ints;
  if (v.empty()) {
    h = fallback_h;
    w = fallback_w;
    return absl::OkStatus();
  }
  if (v.size() > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be one int or two, got ", v.size()));
  }
  auto a = v[0].AsConstant(), b = v.back().AsConstant();
  if (!a || !b) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be static"));
  }
  h = *a;
  w = *b;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Pool2dWindow> Pool2dWindowOf(const Node& node, int kernel_arg,
                                            int stride_arg, int pad_arg,
                                            int dilation_arg, int ceil_arg,
                                            int64_t h, int64_t w) {
  Pool2dWindow p;
  p.h = h;
  p.w = w;
  absl::Status st = PairOf(node, kernel_arg, "kernel_size", 0, 0, p.kh, p.kw);
  if (st.ok()) st = PairOf(node, stride_arg, "stride", p.kh, p.kw, p.sh, p.sw);
  if (st.ok()) st = PairOf(node, pad_arg, "padding", 0, 0, p.ph, p.pw);
  if (st.ok()) {
    st = PairOf(node, dilation_arg, "dilation", 1, 1, p.dh, p.dw);
  }
  if (!st.ok()) return st;
  p.ceil_mode = node.args[ceil_arg].b;
  if (p.kh <= 0 || p.kw <= 0 || p.sh <= 0 || p.sw <= 0 || p.dh <= 0 ||
      p.dw <= 0 || p.ph < 0 || p.pw < 0) {
    return absl::InvalidArgumentError(
        "kernel_size, stride and dilation must be positive and padding "
        "non-negative");
  }
  // PyTorch: "pad should be at most half of effective kernel size".
  if (p.ph > ((p.kh - 1) * p.dh + 1) / 2 ||
      p.pw > ((p.kw - 1) * p.dw + 1) / 2) {
    return absl::InvalidArgumentError(
        "pad should be at most half of effective kernel size");
  }
  p.oh = PoolOutputSize(h, p.kh, p.ph, p.sh, p.dh, p.ceil_mode);
  p.ow = PoolOutputSize(w, p.kw, p.pw, p.sw, p.dw, p.ceil_mode);
  if (p.oh <= 0 || p.ow <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("output size is too small (",
                                                   p.oh, "x", p.ow,
                                                   ") for input ", h, "x", w));
  }
  return p;
}

namespace {

// The input (argument `input`): rank 3 or 4 with static, non-empty H, W.
absl::Status CheckPoolInput(const OpContext& ctx, int input, int64_t& h,
                            int64_t& w) {
  const TensorType& t = ctx.type(input);
  if (t.rank() != 3 && t.rank() != 4) {
    return ctx.Invalid(
        absl::StrCat("expects a 3-d or 4-d input, got rank ", t.rank()));
  }
  auto hh = StaticInt(ctx, t.sizes[t.rank() - 2], "H");
  if (!hh.ok()) return hh.status();
  auto ww = StaticInt(ctx, t.sizes[t.rank() - 1], "W");
  if (!ww.ok()) return ww.status();
  h = *hh;
  w = *ww;
  if (!IsFloating(t.dtype)) {
    return ctx.Invalid(
        absl::StrCat("needs a floating point input, got ", DTypeName(t.dtype)));
  }
  return absl::OkStatus();
}

std::vector<SymExpr> WithSpatial(const TensorType& t, int64_t oh, int64_t ow) {
  std::vector<SymExpr> s(t.sizes.begin(), t.sizes.end() - 2);
  s.push_back(SymExpr(oh));
  s.push_back(SymExpr(ow));
  return s;
}

// The window of a pooling node whose input is argument `input`.
absl::StatusOr<Pool2dWindow> WindowOf(const OpContext& ctx, int input,
                                      int kernel_arg, int dilation_arg,
                                      int ceil_arg) {
  int64_t h = 0, w = 0;
  absl::Status st = CheckPoolInput(ctx, input, h, w);
  if (!st.ok()) return st;
  auto p = Pool2dWindowOf(ctx.node(), kernel_arg, kernel_arg + 1,
                          kernel_arg + 2, dilation_arg, ceil_arg, h, w);
  if (!p.ok()) return ctx.Invalid(p.status().message());
  return p;
}

absl::Status CheckGradOutput(const OpContext& ctx,
                             const std::vector<SymExpr>& want) {
  if (ctx.type(0).sizes != want) {
    return ctx.Invalid("grad_output must have the pooled output's shape");
  }
  return absl::OkStatus();
}

absl::StatusOr<Shapes> MaxPoolShape(const OpContext& ctx) {
  auto p = WindowOf(ctx, 0, 1, 4, 5);
  if (!p.ok()) return p.status();
  const std::vector<SymExpr> out = WithSpatial(ctx.type(0), p->oh, p->ow);
  return Shapes{out, out};
}

absl::StatusOr<std::vector<DType>> MaxPoolDType(const OpContext& ctx) {
  return std::vector<DType>{ctx.type(0).dtype, DType::kInt64};
}

absl::StatusOr<Shapes> MaxPoolBackwardShape(const OpContext& ctx) {
  auto p = WindowOf(ctx, 1, 2, 5, 6);
  if (!p.ok()) return p.status();
  const std::vector<SymExpr> out = WithSpatial(ctx.type(1), p->oh, p->ow);
  absl::Status st = CheckGradOutput(ctx, out);
  if (!st.ok()) return st;
  if (ctx.type(7).sizes != out || ctx.type(7).dtype != DType::kInt64) {
    return ctx.Invalid("indices must be int64 of the pooled output's shape");
  }
  return Shapes{ctx.type(1).sizes};
}

absl::StatusOr<Shapes> AvgPoolShape(const OpContext& ctx) {
  auto p = WindowOf(ctx, 0, 1, -1, 4);
  if (!p.ok()) return p.status();
  if (!ctx.arg(6).is_none() && ctx.arg(6).i == 0) {
    return ctx.Invalid("divisor_override must not be zero");
  }
  return Shapes{WithSpatial(ctx.type(0), p->oh, p->ow)};
}

absl::StatusOr<Shapes> AvgPoolBackwardShape(const OpContext& ctx) {
  auto p = WindowOf(ctx, 1, 2, -1, 5);
  if (!p.ok()) return p.status();
  if (!ctx.arg(7).is_none() && ctx.arg(7).i == 0) {
    return ctx.Invalid("divisor_override must not be zero");
  }
  absl::Status st =
      CheckGradOutput(ctx, WithSpatial(ctx.type(1), p->oh, p->ow));
  if (!st.ok()) return st;
  return Shapes{ctx.type(1).sizes};
}

absl::StatusOr<Shapes> AdaptiveAvgPoolShape(const OpContext& ctx) {
  int64_t h = 0, w = 0;
  absl::Status st = CheckPoolInput(ctx, 0, h, w);
  if (!st.ok()) return st;
  int64_t oh = 0, ow = 0;
  st = PairOf(ctx.node(), 1, "output_size", -1, -1, oh, ow);
  if (!st.ok()) return ctx.Invalid(st.message());
  if (oh <= 0 || ow <= 0) {
    return ctx.Invalid("output_size must be positive");
  }
  return Shapes{WithSpatial(ctx.type(0), oh, ow)};
}

absl::StatusOr<Shapes> AdaptiveAvgPoolBackwardShape(const OpContext& ctx) {
  int64_t h = 0, w = 0;
  absl::Status st = CheckPoolInput(ctx, 1, h, w);
  if (!st.ok()) return st;
  const TensorType& g = ctx.type(0);
  if (g.rank() != ctx.type(1).rank()) {
    return ctx.Invalid("grad_output must have the input's rank");
  }
  for (int d : {g.rank() - 2, g.rank() - 1}) {
    auto s = StaticInt(ctx, g.sizes[d], "grad_output's H and W");
    if (!s.ok()) return s.status();
    if (*s <= 0) return ctx.Invalid("grad_output's H and W must be positive");
  }
  return Shapes{ctx.type(1).sizes};
}

// The input's dtype (argument `input`); grad_output must share it.
absl::StatusOr<std::vector<DType>> InputDType(const OpContext& ctx, int input) {
  const DType d = ctx.type(input).dtype;
  if (input > 0 && ctx.type(0).dtype != d) {
    return ctx.Invalid(
        absl::StrCat("grad_output dtype ", DTypeName(ctx.type(0).dtype),
                     " differs from input dtype ", DTypeName(d)));
  }
  return std::vector<DType>{d};
}
absl::StatusOr<std::vector<DType>> ForwardDType(const OpContext& ctx) {
  return InputDType(ctx, 0);
}
absl::StatusOr<std::vector<DType>> BackwardDType(const OpContext& ctx) {
  return InputDType(ctx, 1);
}

std::vector<ArgSpec> WindowArgs(bool with_defaults) {
  if (!with_defaults) {
    return {Arg("kernel_size", ArgKind::kIntList),
            Arg("stride", ArgKind::kIntList),
            Arg("padding", ArgKind::kIntList)};
  }
  return {Arg("kernel_size", ArgKind::kIntList),
          ArgDefault("stride", ArgKind::kIntList, Attr::Ints({})),
          ArgDefault("padding", ArgKind::kIntList, Attr::Ints({SymExpr(0)}))};
}

std::vector<ArgSpec> Join(std::vector<std::vector<ArgSpec>> parts) {
  std::vector<ArgSpec> out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace
}  // namespace kiln::ops

namespace kiln {

void RegisterPoolingSignatures(OpSignatures& table) {
  using ops::Arg;
  using ops::ArgDefault;
  table.Add({.name = "aten.max_pool2d_with_indices.default",
             .op_class = OpClass::kComposite,
             .schema = ops::Join({{Arg("self", ArgKind::kTensor)},
                                  ops::WindowArgs(true),
                                  {ArgDefault("dilation", ArgKind::kIntList,
                                              Attr::Ints({SymExpr(1)})),
                                   ArgDefault("ceil_mode", ArgKind::kBool,
                                              Attr::Bool(false))}}),
             .num_outputs = 2,
             .shape = ops::MaxPoolShape,
             .dtype = ops::MaxPoolDType});
  table.Add({.name = "aten.max_pool2d_with_indices_backward.default",
             .op_class = OpClass::kComposite,
             .schema = ops::Join({{Arg("grad_output", ArgKind::kTensor),
                                   Arg("self", ArgKind::kTensor)},
                                  ops::WindowArgs(false),
                                  {Arg("dilation", ArgKind::kIntList),
                                   Arg("ceil_mode", ArgKind::kBool),
                                   Arg("indices", ArgKind::kTensor)}}),
             .shape = ops::MaxPoolBackwardShape,
             .dtype = ops::BackwardDType});
  table.Add(
      {.name = "aten.avg_pool2d.default",
       .op_class = OpClass::kComposite,
       .schema = ops::Join(
           {{Arg("self", ArgKind::kTensor)},
            ops::WindowArgs(true),
            {ArgDefault("ceil_mode", ArgKind::kBool, Attr::Bool(false)),
             ArgDefault("count_include_pad", ArgKind::kBool, Attr::Bool(true)),
             ArgDefault("divisor_override", ArgKind::kOptionalInt,
                        Attr::None())}}),
       .shape = ops::AvgPoolShape,
       .dtype = ops::ForwardDType});
  table.Add(
      {.name = "aten.avg_pool2d_backward.default",
       .op_class = OpClass::kComposite,
       .schema = ops::Join({{Arg("grad_output", ArgKind::kTensor),
                             Arg("self", ArgKind::kTensor)},
                            ops::WindowArgs(false),
                            {Arg("ceil_mode", ArgKind::kBool),
                             Arg("count_include_pad", ArgKind::kBool),
                             Arg("divisor_override", ArgKind::kOptionalInt)}}),
       .shape = ops::AvgPoolBackwardShape,
       .dtype = ops::BackwardDType});
  table.Add({.name = "aten._adaptive_avg_pool2d.default",
             .op_class = OpClass::kComposite,
             .schema = {Arg("self", ArgKind::kTensor),
                        Arg("output_size", ArgKind::kIntList)},
             .shape = ops::AdaptiveAvgPoolShape,
             .dtype = ops::ForwardDType});
  table.Add({.name = "aten._adaptive_avg_pool2d_backward.default",
             .op_class = OpClass::kComposite,
             .schema = {Arg("grad_output", ArgKind::kTensor),
                        Arg("self", ArgKind::kTensor)},
             .shape = ops::AdaptiveAvgPoolBackwardShape,
             .dtype = ops::BackwardDType});
}

}  // namespace kiln
