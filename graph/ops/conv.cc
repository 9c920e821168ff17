// Signatures of the convolutions: convolution (1-D to 3-D, strided, padded,
// dilated, grouped, transposed) and convolution_backward (references and
// lowerings: compiler/ops/conv_*.cc; the lowering calls the GEMM library,
// issue 16). The geometry is graph/ops/conv.h's.
//
// As PyTorch: input, weight and bias have one floating dtype; the outputs
// have it too. output_mask (bool[3]) arrives as an int list of 0/1 (as the
// norm family's); an output whose mask bit is 0 is still defined (zeros of
// its shape), and nothing reads it.
#include "graph/ops/conv.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/ops/signature_util.h"

namespace kiln::ops {

int64_t ConvGeometry::kernel_elements() const {
  int64_t k = 1;
  for (int64_t x : kernel) k *= x;
  return k;
}

namespace {

// Argument `arg` (an int list of one entry or `dims`) expanded to `dims`
// static ints, each at least `min`.
absl::StatusOr<std::vector<int64_t>> ExpandedInts(const Node& node, int arg,
                                                  const char* what, int dims,
                                                  int64_t min) {
  const std::vector<SymExpr>& v = node.args[arg].ints;
  if (static_cast<int>(v.size()) != dims && v.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must have one entry or ", dims,
                     " (one per spatial dim), got ", v.size()));
  }
  std::vector<int64_t> out;
  for (int d = 0; d < dims; ++d) {
    const std::optional<int64_t> c = v[v.size() == 1 ? 0 : d].AsConstant();
    if (!c) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " must be static ints"));
    }
    if (*c < min) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " must be ",
                       min == 0 ? "non-negative" : "positive", ", got ", *c));
    }
    out.push_back(*c);
  }
  return out;
}

absl::StatusOr<int64_t> StaticSize(const SymExpr& e, const char* what) {
  if (auto c = e.AsConstant()) return *c;
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be static, got ", e.ToString()));
}

}  // namespace

absl::StatusOr<ConvGeometry> ConvGeometryOf(
    const Node& node, int first_arg, const std::vector<SymExpr>& input,
    const std::vector<SymExpr>& weight) {
  ConvGeometry g;
  if (weight.size() < 3 || weight.size() > 5) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight must be 3-D, 4-D or 5-D (1 to 3 spatial dims), got ",
        ShapeString(weight)));
  }
  if (input.size() != weight.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a ", weight.size(), "-D (batched) input for weight of size ",
        ShapeString(weight), ", got input of size ", ShapeString(input)));
  }
  g.dims = static_cast<int>(weight.size()) - 2;
  g.transposed = node.args[first_arg + 3].b;
  g.groups = node.args[first_arg + 5].i;
  if (g.groups < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("groups must be positive, got ", g.groups));
  }
  auto stride = ExpandedInts(node, first_arg, "stride", g.dims, 1);
  if (!stride.ok()) return stride.status();
  auto padding = ExpandedInts(node, first_arg + 1, "padding", g.dims, 0);
  if (!padding.ok()) return padding.status();
  auto dilation = ExpandedInts(node, first_arg + 2, "dilation", g.dims, 1);
  if (!dilation.ok()) return dilation.status();
  auto output_padding =
      ExpandedInts(node, first_arg + 4, "output_padding", g.dims, 0);
  if (!output_padding.ok()) return output_padding.status();
  g.stride = *stride;
  g.padding = *padding;
  g.dilation = *dilation;
  g.output_padding =
      g.transposed ? *output_padding : std::vector<int64_t>(g.dims, 0);
  std::vector<int64_t> w;
  for (const SymExpr& e : weight) {
    auto s = StaticSize(e, "weight sizes");
    if (!s.ok()) return s.status();
    w.push_back(*s);
  }
  g.kernel.assign(w.begin() + 2, w.end());
  auto c = StaticSize(input[1], "the input's channels");
  if (!c.ok()) return c.status();
  g.in_channels = *c;
  if (g.in_channels < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected the input's non-batch dims to have positive length, got "
        "input of size ",
        ShapeString(input)));
  }
  if (g.transposed) {
    if (w[0] != g.in_channels || g.in_channels % g.groups != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weight of size ", ShapeString(weight), " expects input[1] = ", w[0],
          " divisible by groups = ", g.groups, ", got input of size ",
          ShapeString(input)));
    }
    g.out_channels = w[1] * g.groups;
  } else {
    if (w[1] * g.groups != g.in_channels || w[0] % g.groups != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weight of size ", ShapeString(weight), " and groups = ", g.groups,
          " expect input[1] = ", w[1] * g.groups,
          " and weight[0] divisible by ", g.groups, ", got input of size ",
          ShapeString(input)));
    }
    g.out_channels = w[0];
  }
  g.batch = input[0];
  g.out_sizes = {g.batch, SymExpr(g.out_channels)};
  for (int d = 0; d < g.dims; ++d) {
    const SymExpr& in = input[2 + d];
    if (auto i = in.AsConstant(); i && *i < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected the input's non-batch dims to have positive length, got "
          "input of size ",
          ShapeString(input)));
    }
    g.in_spatial.push_back(in);
    const int64_t s = g.stride[d], p = g.padding[d], dl = g.dilation[d];
    const int64_t span = dl * (g.kernel[d] - 1);
    SymExpr out;
    if (g.transposed) {
      if (g.output_padding[d] >= s && g.output_padding[d] >= dl) {
        return absl::InvalidArgumentError(absl::StrCat(
            "output_padding must be smaller than either stride or dilation, "
            "got output_padding ",
            g.output_padding[d], ", stride ", s, ", dilation ", dl));
      }
      out = (in - SymExpr(1)) * SymExpr(s) +
            SymExpr(span - 2 * p + g.output_padding[d] + 1);
    } else if (auto i = in.AsConstant()) {
      const int64_t num = *i + 2 * p - span - 1;
      if (num < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("the padded input's spatial size ", *i + 2 * p,
                         " is smaller than the dilated kernel's ", span + 1,
                         " (dim ", d + 2, ")"));
      }
      out = SymExpr(num / s + 1);
    } else if (s == 1) {
      out = in + SymExpr(2 * p - span);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "a symbolic spatial size (", in.ToString(),
          ") needs stride 1 (its output size would not be a polynomial)"));
    }
    if (auto o = out.AsConstant(); o && *o < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the output's spatial size would be ", *o));
    }
    g.out_spatial.push_back(out);
    g.out_sizes.push_back(out);
  }
  return g;
}

namespace {

// Every tensor argument has the same floating dtype (PyTorch: "Input type
// and weight type should be the same").
absl::StatusOr<DType> OneFloatDType(const OpContext& ctx,
                                    const std::vector<int>& args) {
  std::optional<DType> dtype;
  for (int i : args) {
    if (!ctx.is_tensor(i)) continue;
    const DType d = ctx.type(i).dtype;
    if (dtype && d != *dtype) {
      return ctx.Invalid(absl::StrCat("expects tensors of one dtype, got ",
                                      DTypeName(*dtype), " and ",
                                      DTypeName(d)));
    }
    dtype = d;
  }
  if (!IsFloating(*dtype)) {
    return ctx.Invalid(
        absl::StrCat("convolutions of ", DTypeName(*dtype),
                     " are not supported (floating dtypes only)"));
  }
  return *dtype;
}

absl::StatusOr<ConvGeometry> GeometryOf(const OpContext& ctx, int input,
                                        int weight, int first_arg) {
  auto g = ConvGeometryOf(ctx.node(), first_arg, ctx.type(input).sizes,
                          ctx.type(weight).sizes);
  if (!g.ok()) return ctx.Invalid(g.status().message());
  return g;
}

// convolution(input, weight, bias?, stride, padding, dilation, transposed,
// output_padding, groups).
absl::StatusOr<Shapes> ConvolutionShape(const OpContext& ctx) {
  auto g = GeometryOf(ctx, 0, 1, 3);
  if (!g.ok()) return g.status();
  if (ctx.is_tensor(2) &&
      ctx.type(2).sizes != std::vector<SymExpr>{SymExpr(g->out_channels)}) {
    return ctx.Invalid(absl::StrCat("bias must have shape [", g->out_channels,
                                    "], got ", ShapeString(ctx.type(2).sizes)));
  }
  return Shapes{g->out_sizes};
}

absl::StatusOr<std::vector<DType>> ConvolutionDType(const OpContext& ctx) {
  auto d = OneFloatDType(ctx, {0, 1, 2});
  if (!d.ok()) return d.status();
  return std::vector<DType>{*d};
}

// convolution_backward(grad_output, input, weight, bias_sizes?, stride,
// padding, dilation, transposed, output_padding, groups, output_mask) ->
// (grad_input, grad_weight, grad_bias).
absl::StatusOr<Shapes> ConvolutionBackwardShape(const OpContext& ctx) {
  auto g = GeometryOf(ctx, 1, 2, 4);
  if (!g.ok()) return g.status();
  if (ctx.type(0).sizes != g->out_sizes) {
    return ctx.Invalid(absl::StrCat(
        "grad_output must have the convolution's output shape ",
        ShapeString(g->out_sizes), ", got ", ShapeString(ctx.type(0).sizes)));
  }
  if (ctx.arg(10).ints.size() != 3) {
    return ctx.Invalid("output_mask must have 3 entries");
  }
  // grad_bias has bias_sizes ([O]; PyTorch passes [0] for a convolution
  // without bias, whose grad_bias the mask turns off), [O] when None.
  const std::vector<SymExpr> channels{SymExpr(g->out_channels)};
  const std::vector<SymExpr> bias =
      ctx.arg(3).is_none() ? channels : ctx.arg(3).ints;
  const bool grad_bias = ctx.arg(10).ints[2].AsConstant().value_or(1) != 0;
  if (grad_bias && bias != channels) {
    return ctx.Invalid(absl::StrCat("bias_sizes must be [", g->out_channels,
                                    "] for grad_bias, got ",
                                    ShapeString(bias)));
  }
  return Shapes{ctx.type(1).sizes, ctx.type(2).sizes, bias};
}

absl::StatusOr<std::vector<DType>> ConvolutionBackwardDType(
    const OpContext& ctx) {
  auto d = OneFloatDType(ctx, {0, 1, 2});
  if (!d.ok()) return d.status();
  return std::vector<DType>{*d, *d, *d};
}

std::vector<ArgSpec> GeometryArgs() {
  return {Arg("stride", ArgKind::kIntList),
          Arg("padding", ArgKind::kIntList),
          Arg("dilation", ArgKind::kIntList),
          Arg("transposed", ArgKind::kBool),
          Arg("output_padding", ArgKind::kIntList),
          Arg("groups", ArgKind::kInt)};
}

std::vector<ArgSpec> Concat(std::vector<ArgSpec> a,
                            const std::vector<ArgSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace
}  // namespace kiln::ops

namespace kiln {

void RegisterConvSignatures(OpSignatures& table) {
  using ops::Arg;
  table.Add({.name = "aten.convolution.default",
             .op_class = OpClass::kExtern,
             .schema = ops::Concat({Arg("input", ArgKind::kTensor),
                                    Arg("weight", ArgKind::kTensor),
                                    Arg("bias", ArgKind::kOptionalTensor)},
                                   ops::GeometryArgs()),
             .shape = ops::ConvolutionShape,
             .dtype = ops::ConvolutionDType});
  table.Add({.name = "aten.convolution_backward.default",
             .op_class = OpClass::kExtern,
             .schema = ops::Concat(
                 ops::Concat({Arg("grad_output", ArgKind::kTensor),
                              Arg("input", ArgKind::kTensor),
                              Arg("weight", ArgKind::kTensor),
                              Arg("bias_sizes", ArgKind::kOptionalIntList)},
                             ops::GeometryArgs()),
                 {Arg("output_mask", ArgKind::kIntList)}),
             .num_outputs = 3,
             .shape = ops::ConvolutionBackwardShape,
             .dtype = ops::ConvolutionBackwardDType});
}

}  // namespace kiln
