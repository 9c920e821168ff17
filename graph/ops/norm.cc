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
#include <array>
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

// ---- batch norm ----
// Statistics per channel (dim 1) over every other dim, float32 (PyTorch's
// CUDA dtypes for half inputs; Kiln targets GPUs first).

// input must have rank >= 2; weight/bias/running stats (optional or not)
// at the given positions must be [C].
absl::StatusOr<SymExpr> CheckChannels(const OpContext& ctx, int input,
                                      std::initializer_list<int> per_channel) {
  const TensorType& in = ctx.type(input);
  if (in.rank() < 2) {
    return ctx.Invalid(
        absl::StrCat("input must have rank >= 2 (N, C, ...), "
                     "got rank ",
                     in.rank()));
  }
  for (int i : per_channel) {
    if (ctx.arg(i).is_none()) continue;
    if (ctx.type(i).sizes != std::vector<SymExpr>{in.sizes[1]}) {
      return ctx.Invalid(absl::StrCat("argument ", i,
                                      " must have shape [C] = [",
                                      in.sizes[1].ToString(), "]"));
    }
  }
  return in.sizes[1];
}

absl::Status CheckAllFloating(const OpContext& ctx,
                              std::initializer_list<int> args) {
  for (int i : args) {
    if (ctx.arg(i).is_none()) continue;
    absl::Status st = CheckFloating(ctx, i, "every tensor argument");
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// _native_batch_norm_legit_functional(input, weight?, bias?, running_mean,
// running_var, training, momentum, eps) -> (out, save_mean, save_rstd,
// new_running_mean, new_running_var).
absl::StatusOr<Shapes> BatchNormFunctionalShape(const OpContext& ctx) {
  auto c = CheckChannels(ctx, 0, {1, 2, 3, 4});
  if (!c.ok()) return c.status();
  const std::vector<SymExpr> ch{*c};
  return Shapes{ctx.type(0).sizes, ch, ch, ch, ch};
}

absl::StatusOr<std::vector<DType>> BatchNormFunctionalDType(
    const OpContext& ctx) {
  absl::Status st = CheckAllFloating(ctx, {0, 1, 2, 3, 4});
  if (!st.ok()) return st;
  return std::vector<DType>{ctx.type(0).dtype, DType::kFloat32, DType::kFloat32,
                            ctx.type(3).dtype, ctx.type(4).dtype};
}

// _native_batch_norm_legit_no_training(input, weight?, bias?, running_mean,
// running_var, momentum, eps) -> (out, save_mean, save_rstd); the saved
// statistics are empty ([0]), as on PyTorch's CPU (Kiln runs CPU tensors
// only for now).
absl::StatusOr<Shapes> BatchNormNoTrainingShape(const OpContext& ctx) {
  auto c = CheckChannels(ctx, 0, {1, 2, 3, 4});
  if (!c.ok()) return c.status();
  const std::vector<SymExpr> empty{SymExpr(0)};
  return Shapes{ctx.type(0).sizes, empty, empty};
}

absl::StatusOr<std::vector<DType>> BatchNormNoTrainingDType(
    const OpContext& ctx) {
  absl::Status st = CheckAllFloating(ctx, {0, 1, 2, 3, 4});
  if (!st.ok()) return st;
  return std::vector<DType>{ctx.type(0).dtype, DType::kFloat32,
                            DType::kFloat32};
}

// _native_batch_norm_legit.no_stats(input, weight?, bias?, training,
// momentum, eps) -> (out, save_mean, save_rstd): batch statistics only.
absl::StatusOr<Shapes> BatchNormNoStatsShape(const OpContext& ctx) {
  auto c = CheckChannels(ctx, 0, {1, 2});
  if (!c.ok()) return c.status();
  if (!ctx.arg(3).b) {
    return ctx.Invalid("training=False needs running_mean and running_var");
  }
  const std::vector<SymExpr> ch{*c};
  return Shapes{ctx.type(0).sizes, ch, ch};
}

absl::StatusOr<std::vector<DType>> BatchNormNoStatsDType(const OpContext& ctx) {
  absl::Status st = CheckAllFloating(ctx, {0, 1, 2});
  if (!st.ok()) return st;
  return std::vector<DType>{ctx.type(0).dtype, DType::kFloat32,
                            DType::kFloat32};
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?,
// running_var?, save_mean?, save_invstd?, train, eps, output_mask) ->
// (grad_input, grad_weight, grad_bias). Training reads save_mean and
// save_invstd, eval the running statistics.
absl::StatusOr<Shapes> BatchNormBackwardShape(const OpContext& ctx) {
  absl::Status st = CheckSameSizes(ctx, 0, 1, "grad_out and input");
  if (!st.ok()) return st;
  st = CheckOutputMask(ctx, 9);
  if (!st.ok()) return st;
  auto c = CheckChannels(ctx, 1, {2, 3, 4, 5, 6});
  if (!c.ok()) return c.status();
  const bool train = ctx.arg(7).b;
  // (A std::array: a conditional of two initializer_lists leaves the
  // loop reading arrays that died with the full expression.)
  const std::array<int, 2> stats =
      train ? std::array<int, 2>{5, 6} : std::array<int, 2>{3, 4};
  for (int i : stats) {
    if (ctx.arg(i).is_none()) {
      return ctx.Invalid(train ? "train=True needs save_mean and save_invstd"
                               : "train=False needs running_mean and "
                                 "running_var");
    }
  }
  const std::vector<SymExpr> ch{*c};
  return Shapes{ctx.type(1).sizes, ch, ch};
}

absl::StatusOr<std::vector<DType>> BatchNormBackwardDType(
    const OpContext& ctx) {
  absl::Status st = CheckAllFloating(ctx, {0, 1, 2, 3, 4, 5, 6});
  if (!st.ok()) return st;
  const DType in = ctx.type(1).dtype;
  const DType w = ctx.arg(2).is_none() ? in : ctx.type(2).dtype;
  return std::vector<DType>{in, w, w};
}

// ---- group norm ----
// native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) ->
// (out, mean [N, group], rstd [N, group]): statistics over each group of
// C / group channels and their HxW positions, in the input's dtype (as
// PyTorch's CPU and CUDA kernels).

absl::Status CheckGroupArgs(const OpContext& ctx, int input, int n_arg) {
  const TensorType& in = ctx.type(input);
  if (in.rank() < 2) {
    return ctx.Invalid(
        absl::StrCat("input must have rank >= 2, got ", in.rank()));
  }
  const int64_t n = ctx.arg(n_arg).i, c = ctx.arg(n_arg + 1).i,
                hxw = ctx.arg(n_arg + 2).i, group = ctx.arg(n_arg + 3).i;
  if (group <= 0 || c % group != 0) {
    return ctx.Invalid(
        absl::StrCat("C (", c, ") must be divisible by group (", group, ")"));
  }
  SymExpr spatial(1);
  for (int d = 2; d < in.rank(); ++d) spatial = spatial * in.sizes[d];
  if (in.sizes[0] != SymExpr(n) || in.sizes[1] != SymExpr(c) ||
      spatial != SymExpr(hxw)) {
    return ctx.Invalid("N, C and HxW must be the input's (N, C, prod(rest))");
  }
  return absl::OkStatus();
}

absl::StatusOr<Shapes> GroupNormShape(const OpContext& ctx) {
  absl::Status st = CheckGroupArgs(ctx, 0, 3);
  if (!st.ok()) return st;
  auto c = CheckChannels(ctx, 0, {1, 2});
  if (!c.ok()) return c.status();
  const std::vector<SymExpr> stat{ctx.type(0).sizes[0], SymExpr(ctx.arg(6).i)};
  return Shapes{ctx.type(0).sizes, stat, stat};
}

absl::StatusOr<std::vector<DType>> GroupNormDType(const OpContext& ctx) {
  absl::Status st = CheckAllFloating(ctx, {0, 1, 2});
  if (!st.ok()) return st;
  const DType in = ctx.type(0).dtype;
  return std::vector<DType>{in, in, in};
}

// native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C,
// HxW, group, output_mask) -> (grad_input, grad_weight [C], grad_bias [C]).
absl::StatusOr<Shapes> GroupNormBackwardShape(const OpContext& ctx) {
  absl::Status st = CheckSameSizes(ctx, 0, 1, "grad_out and input");
  if (!st.ok()) return st;
  st = CheckOutputMask(ctx, 9);
  if (!st.ok()) return st;
  st = CheckGroupArgs(ctx, 1, 5);
  if (!st.ok()) return st;
  auto c = CheckChannels(ctx, 1, {4});
  if (!c.ok()) return c.status();
  const std::vector<SymExpr> stat{ctx.type(1).sizes[0], SymExpr(ctx.arg(8).i)};
  for (int i : {2, 3}) {
    if (ctx.type(i).sizes != stat) {
      return ctx.Invalid(absl::StrCat(i == 2 ? "mean" : "rstd",
                                      " must have shape [N, group]"));
    }
  }
  const std::vector<SymExpr> ch{*c};
  return Shapes{ctx.type(1).sizes, ch, ch};
}

absl::StatusOr<std::vector<DType>> GroupNormBackwardDType(
    const OpContext& ctx) {
  absl::Status st = CheckAllFloating(ctx, {0, 1, 2, 3, 4});
  if (!st.ok()) return st;
  const DType in = ctx.type(1).dtype;
  const DType w = ctx.arg(4).is_none() ? in : ctx.type(4).dtype;
  return std::vector<DType>{in, w, w};
}

std::vector<ArgSpec> AffineArgs() {
  return {Arg("input", ArgKind::kTensor),
          Arg("weight", ArgKind::kOptionalTensor),
          Arg("bias", ArgKind::kOptionalTensor)};
}

std::vector<ArgSpec> Concat(std::vector<ArgSpec> a,
                            const std::vector<ArgSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
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
  table.Add(
      {.name = "aten._native_batch_norm_legit_functional.default",
       .op_class = OpClass::kComposite,
       .schema = Concat(AffineArgs(), {Arg("running_mean", ArgKind::kTensor),
                                       Arg("running_var", ArgKind::kTensor),
                                       Arg("training", ArgKind::kBool),
                                       Arg("momentum", ArgKind::kFloat),
                                       Arg("eps", ArgKind::kFloat)}),
       .num_outputs = 5,
       .shape = BatchNormFunctionalShape,
       .dtype = BatchNormFunctionalDType});
  table.Add(
      {.name = "aten._native_batch_norm_legit_no_training.default",
       .op_class = OpClass::kComposite,
       .schema = Concat(AffineArgs(), {Arg("running_mean", ArgKind::kTensor),
                                       Arg("running_var", ArgKind::kTensor),
                                       Arg("momentum", ArgKind::kFloat),
                                       Arg("eps", ArgKind::kFloat)}),
       .num_outputs = 3,
       .shape = BatchNormNoTrainingShape,
       .dtype = BatchNormNoTrainingDType});
  table.Add({.name = "aten._native_batch_norm_legit.no_stats",
             .op_class = OpClass::kComposite,
             .schema = Concat(AffineArgs(), {Arg("training", ArgKind::kBool),
                                             Arg("momentum", ArgKind::kFloat),
                                             Arg("eps", ArgKind::kFloat)}),
             .num_outputs = 3,
             .shape = BatchNormNoStatsShape,
             .dtype = BatchNormNoStatsDType});
  table.Add(
      {.name = "aten.native_batch_norm_backward.default",
       .op_class = OpClass::kComposite,
       .schema = {Arg("grad_out", ArgKind::kTensor),
                  Arg("input", ArgKind::kTensor),
                  Arg("weight", ArgKind::kOptionalTensor),
                  Arg("running_mean", ArgKind::kOptionalTensor),
                  Arg("running_var", ArgKind::kOptionalTensor),
                  Arg("save_mean", ArgKind::kOptionalTensor),
                  Arg("save_invstd", ArgKind::kOptionalTensor),
                  Arg("train", ArgKind::kBool), Arg("eps", ArgKind::kFloat),
                  Arg("output_mask", ArgKind::kIntList)},
       .num_outputs = 3,
       .shape = BatchNormBackwardShape,
       .dtype = BatchNormBackwardDType});
  table.Add(
      {.name = "aten.native_group_norm.default",
       .op_class = OpClass::kComposite,
       .schema = Concat(AffineArgs(),
                        {Arg("N", ArgKind::kInt), Arg("C", ArgKind::kInt),
                         Arg("HxW", ArgKind::kInt), Arg("group", ArgKind::kInt),
                         Arg("eps", ArgKind::kFloat)}),
       .num_outputs = 3,
       .shape = GroupNormShape,
       .dtype = GroupNormDType});
  table.Add(
      {.name = "aten.native_group_norm_backward.default",
       .op_class = OpClass::kComposite,
       .schema = {Arg("grad_out", ArgKind::kTensor),
                  Arg("input", ArgKind::kTensor), Arg("mean", ArgKind::kTensor),
                  Arg("rstd", ArgKind::kTensor),
                  Arg("weight", ArgKind::kOptionalTensor),
                  Arg("N", ArgKind::kInt), Arg("C", ArgKind::kInt),
                  Arg("HxW", ArgKind::kInt), Arg("group", ArgKind::kInt),
                  Arg("output_mask", ArgKind::kIntList)},
       .num_outputs = 3,
       .shape = GroupNormBackwardShape,
       .dtype = GroupNormBackwardDType});
}

}  // namespace kiln
