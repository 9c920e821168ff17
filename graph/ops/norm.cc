// Signatures of the norm family: the backward ops of softmax and layer norm
// that Core ATen leaves whole (_softmax_backward_data,
// _log_softmax_backward_data, native_layer_norm_backward), batch norm
// (_native_batch_norm_legit*, native_batch_norm_backward) and group norm
// (native_group_norm and its backward). Their references and lowerings are
// the compiler's (compiler/ops/norm_*.cc).
//
// output_mask (bool[3]) arrives as an int list of 0/1 (kiln/fx_graph.py
// sends a list of bools so); an output whose mask bit is 0 is still defined
// (zeros of its shape), and nothing reads it.
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/ops/signature_util.h"

namespace kiln {
namespace {

using ops::Arg;

absl::Status CheckFloating(const OpContext& ctx, int i, const char* what) {
  const DType d = ctx.type(i).dtype;
  if (!IsFloating(d)) {
    return ctx.Invalid(
        absl::StrCat(what, " must be floating point, got ", DTypeName(d)));
  }
  return absl::OkStatus();
}

absl::Status CheckSameSizes(const OpContext& ctx, int a, int b,
                            const char* what) {
  if (ctx.type(a).sizes != ctx.type(b).sizes) {
    return ctx.Invalid(absl::StrCat(what, " must have the same shape"));
  }
  return absl::OkStatus();
}

absl::Status CheckOutputMask(const OpContext& ctx, int i) {
  if (ctx.arg(i).ints.size() != 3) {
    return ctx.Invalid("output_mask must have 3 entries");
  }
  return absl::OkStatus();
}

// ---- _softmax_backward_data / _log_softmax_backward_data ----
// (grad_output, output, dim, input_dtype): the gradient in input_dtype.

absl::StatusOr<Shapes> SoftmaxBackwardShape(const OpContext& ctx) {
  auto d = ctx.WrapDim(ctx.arg(2).i, ctx.type(1).rank());
  if (!d.ok()) return d.status();
  absl::Status st = CheckSameSizes(ctx, 0, 1, "grad_output and output");
  if (!st.ok()) return st;
  return Shapes{ctx.type(1).sizes};
}

absl::StatusOr<std::vector<DType>> SoftmaxBackwardDType(const OpContext& ctx) {
  for (int i : {0, 1}) {
    absl::Status st = CheckFloating(ctx, i, i == 0 ? "grad_output" : "output");
    if (!st.ok()) return st;
  }
  const Attr& dt = ctx.arg(3);
  const DType out = dt.is_none() ? ctx.type(0).dtype : dt.dtype;
  if (!IsFloating(out)) {
    return ctx.Invalid(absl::StrCat("input_dtype must be floating point, got ",
                                    DTypeName(out)));
  }
  return std::vector<DType>{out};
}

std::vector<ArgSpec> SoftmaxBackwardSchema() {
  return {Arg("grad_output", ArgKind::kTensor), Arg("output", ArgKind::kTensor),
          Arg("dim", ArgKind::kInt),
          Arg("input_dtype", ArgKind::kOptionalDType)};
}

// ---- native_layer_norm_backward ----
// (grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
//  output_mask) -> (grad_input, grad_weight, grad_bias).

absl::StatusOr<Shapes> LayerNormBackwardShape(const OpContext& ctx) {
  const std::vector<SymExpr>& in = ctx.type(1).sizes;
  const std::vector<SymExpr>& norm = ctx.arg(2).ints;
  absl::Status st = CheckSameSizes(ctx, 0, 1, "grad_out and input");
  if (!st.ok()) return st;
  st = CheckOutputMask(ctx, 7);
  if (!st.ok()) return st;
  if (norm.empty() || norm.size() > in.size()) {
    return ctx.Invalid(absl::StrCat("normalized_shape has ", norm.size(),
                                    " dims, the input has rank ", in.size()));
  }
  const size_t axis = in.size() - norm.size();
  for (size_t i = 0; i < norm.size(); ++i) {
    if (norm[i] != in[axis + i]) {
      return ctx.Invalid(
          "normalized_shape does not match the input's trailing dims");
    }
  }
  std::vector<SymExpr> stat(in.begin(), in.begin() + axis);
  stat.resize(in.size(), SymExpr(1));
  for (int i : {3, 4}) {
    if (ctx.type(i).sizes != stat) {
      return ctx.Invalid(absl::StrCat(
          i == 3 ? "mean" : "rstd",
          " must have shape input.shape[:axis] + [1] * len(normalized_shape)"));
    }
  }
  for (int w : {5, 6}) {
    if (!ctx.arg(w).is_none() && ctx.type(w).sizes != norm) {
      return ctx.Invalid(absl::StrCat(w == 5 ? "weight" : "bias",
                                      " must have shape normalized_shape"));
    }
  }
  return Shapes{in, norm, norm};
}

absl::StatusOr<std::vector<DType>> LayerNormBackwardDType(
    const OpContext& ctx) {
  for (int i : {0, 1, 3, 4}) {
    absl::Status st = CheckFloating(ctx, i, "grad_out, input, mean and rstd");
    if (!st.ok()) return st;
  }
  const DType in = ctx.type(1).dtype;
  const DType w = ctx.arg(5).is_none() ? in : ctx.type(5).dtype;
  const DType b = ctx.arg(6).is_none() ? in : ctx.type(6).dtype;
  return std::vector<DType>{in, w, b};
}

}  // namespace

void RegisterNormSignatures(OpSignatures& table) {
  table.Add({.name = "aten._softmax_backward_data.default",
             .op_class = OpClass::kComposite,
             .schema = SoftmaxBackwardSchema(),
             .shape = SoftmaxBackwardShape,
             .dtype = SoftmaxBackwardDType});
  table.Add({.name = "aten._log_softmax_backward_data.default",
             .op_class = OpClass::kComposite,
             .schema = SoftmaxBackwardSchema(),
             .shape = SoftmaxBackwardShape,
             .dtype = SoftmaxBackwardDType});
  table.Add(
      {.name = "aten.native_layer_norm_backward.default",
       .op_class = OpClass::kComposite,
       .schema = {Arg("grad_out", ArgKind::kTensor),
                  Arg("input", ArgKind::kTensor),
                  Arg("normalized_shape", ArgKind::kIntList),
                  Arg("mean", ArgKind::kTensor), Arg("rstd", ArgKind::kTensor),
                  Arg("weight", ArgKind::kOptionalTensor),
                  Arg("bias", ArgKind::kOptionalTensor),
                  Arg("output_mask", ArgKind::kIntList)},
       .num_outputs = 3,
       .shape = LayerNormBackwardShape,
       .dtype = LayerNormBackwardDType});
}

}  // namespace kiln
