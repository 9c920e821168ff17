// Signatures of the composite family: _softmax, _log_softmax and
// native_layer_norm (their references and lowerings are the compiler's:
// compiler/ops/composite_*.cc).
#include "absl/strings/str_cat.h"
#include "graph/ops/signature_util.h"

namespace kiln {
namespace {

using ops::Arg;

absl::StatusOr<Shapes> SoftmaxShape(const OpContext& ctx) {
  auto d = ctx.WrapDim(ctx.arg(1).i, ctx.type(0).rank());
  if (!d.ok()) return d.status();
  return Shapes{ctx.type(0).sizes};
}

absl::StatusOr<std::vector<DType>> SoftmaxDType(const OpContext& ctx) {
  const DType in = ctx.type(0).dtype;
  if (!IsFloating(in)) {
    return ctx.Invalid(
        absl::StrCat("needs a floating point input, got ", DTypeName(in)));
  }
  if (ctx.arg(2).b) {
    // As CUDA's host_softmax ("conversion is supported for Half type
    // only") and torch._decomp's _softmax: float16 only, not bfloat16.
    if (in != DType::kFloat16) {
      return ctx.Invalid(absl::StrCat(
          "half_to_float=True needs a float16 input, got ", DTypeName(in)));
    }
    return std::vector<DType>{DType::kFloat32};
  }
  return std::vector<DType>{in};
}

absl::StatusOr<Shapes> LayerNormShape(const OpContext& ctx) {
  const std::vector<SymExpr>& in = ctx.type(0).sizes;
  const std::vector<SymExpr>& norm = ctx.arg(1).ints;
  if (norm.empty()) return ctx.Invalid("normalized_shape must not be empty");
  if (norm.size() > in.size()) {
    return ctx.Invalid(absl::StrCat("normalized_shape has ", norm.size(),
                                    " dims but the input has rank ",
                                    in.size()));
  }
  const size_t axis = in.size() - norm.size();
  for (size_t i = 0; i < norm.size(); ++i) {
    if (norm[i] != in[axis + i]) {
      return ctx.Invalid(absl::StrCat(
          "normalized_shape does not match the input's trailing dims (dim ",
          axis + i, ")"));
    }
  }
  for (int w : {2, 3}) {
    if (ctx.arg(w).is_none()) continue;
    if (ctx.type(w).sizes != norm) {
      return ctx.Invalid(absl::StrCat(w == 2 ? "weight" : "bias",
                                      " must have shape normalized_shape"));
    }
  }
  std::vector<SymExpr> stat(in.begin(), in.begin() + axis);
  stat.resize(in.size(), SymExpr(1));
  return Shapes{in, stat, stat};
}

// The output is in the input's dtype; mean/rstd are float32 (PyTorch's
// CUDA dtypes; its CPU kernels give a half input's dtype, which the torch
// backend gets by a cast). weight and bias are the input's dtype, or
// float32 for a half input (PyTorch's mixed-type layer norm, as CPU
// autocast leaves it: bfloat16 activations, float32 parameters).
absl::StatusOr<std::vector<DType>> LayerNormDType(const OpContext& ctx) {
  const DType in = ctx.type(0).dtype;
  if (!IsFloating(in)) {
    return ctx.Invalid(
        absl::StrCat("needs a floating point input, got ", DTypeName(in)));
  }
  const bool half = in == DType::kFloat16 || in == DType::kBFloat16;
  for (int w : {2, 3}) {
    if (ctx.arg(w).is_none()) continue;
    const DType d = ctx.type(w).dtype;
    if (d != in && !(half && d == DType::kFloat32)) {
      return ctx.Invalid(absl::StrCat(
          w == 2 ? "weight" : "bias", " dtype ", DTypeName(d),
          " differs from input dtype ", DTypeName(in),
          half ? " (a half input takes its own dtype or float32)" : ""));
    }
  }
  return std::vector<DType>{in, DType::kFloat32, DType::kFloat32};
}

std::vector<ArgSpec> SoftmaxSchema() {
  return {Arg("self", ArgKind::kTensor), Arg("dim", ArgKind::kInt),
          Arg("half_to_float", ArgKind::kBool)};
}

}  // namespace

void RegisterCompositeSignatures(OpSignatures& table) {
  table.Add({.name = "aten._softmax.default",
             .op_class = OpClass::kComposite,
             .schema = SoftmaxSchema(),
             .shape = SoftmaxShape,
             .dtype = SoftmaxDType});
  table.Add({.name = "aten._log_softmax.default",
             .op_class = OpClass::kComposite,
             .schema = SoftmaxSchema(),
             .shape = SoftmaxShape,
             .dtype = SoftmaxDType});
  table.Add({.name = "aten.native_layer_norm.default",
             .op_class = OpClass::kComposite,
             .schema = {Arg("input", ArgKind::kTensor),
                        Arg("normalized_shape", ArgKind::kIntList),
                        Arg("weight", ArgKind::kOptionalTensor),
                        Arg("bias", ArgKind::kOptionalTensor),
                        Arg("eps", ArgKind::kFloat)},
             .num_outputs = 3,
             .shape = LayerNormShape,
             .dtype = LayerNormDType});
}

}  // namespace kiln
