// Signatures of the pointwise ops of op set v1: unary, binary (Tensor and
// Scalar overloads), comparisons, logical and bitwise ops, where/clamp/casts
// and activations.
//
// Every op but the casts is a PointwiseSignature (graph/ops/pointwise.h):
// one shape rule (its operands broadcast) and one dtype rule (the compute
// dtype, checked against the dtypes the op supports and by the op's own
// check) for all of them. Their element functions and lowerings are the
// compiler's (compiler/ops/pointwise_reference.cc, pointwise_lowering.cc).
#include "graph/ops/pointwise.h"

#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "graph/ops/signature_util.h"

namespace kiln {
namespace ops {
namespace {

// ---- schemas ----

std::vector<ArgSpec> UnarySchema() { return {Arg("self", ArgKind::kTensor)}; }
// The Tensor overloads: FX passes a Python number in either position, as
// a wrapped number (aten.sub.Tensor(1, x)); at least one is a tensor.
std::vector<ArgSpec> BinarySchema() {
  return {Arg("self", ArgKind::kTensorOrScalar),
          Arg("other", ArgKind::kTensorOrScalar)};
}
std::vector<ArgSpec> BinaryScalarSchema() {
  return {Arg("self", ArgKind::kTensor), Arg("other", ArgKind::kScalar)};
}
std::vector<ArgSpec> TensorPairSchema() {
  return {Arg("self", ArgKind::kTensor), Arg("other", ArgKind::kTensor)};
}
// `schema` followed by one keyword-only argument.
std::vector<ArgSpec> WithKwArg(std::vector<ArgSpec> schema, ArgSpec kwarg) {
  schema.push_back(std::move(kwarg));
  return schema;
}
std::vector<ArgSpec> AlphaSchema(std::vector<ArgSpec> schema) {
  return WithKwArg(std::move(schema),
                   KwArg("alpha", ArgKind::kScalar, Attr::Int(1)));
}
std::vector<ArgSpec> RoundingModeSchema(std::vector<ArgSpec> schema) {
  return WithKwArg(
      std::move(schema),
      KwArg("rounding_mode", ArgKind::kOptionalString, Attr::None()));
}
std::vector<ArgSpec> PowSchema(ArgKind self, ArgKind exponent) {
  return {Arg("self", self), Arg("exponent", exponent)};
}
// where(condition, self, other).
std::vector<ArgSpec> WhereSchema(ArgKind self, ArgKind other) {
  return {Arg("condition", ArgKind::kTensor), Arg("self", self),
          Arg("other", other)};
}
// clamp(self, min=None, max=None), min and max of `kind`.
std::vector<ArgSpec> ClampSchema(ArgKind kind) {
  return {Arg("self", ArgKind::kTensor), ArgDefault("min", kind, Attr::None()),
          ArgDefault("max", kind, Attr::None())};
}
std::vector<ArgSpec> LerpSchema(ArgKind weight) {
  return {Arg("self", ArgKind::kTensor), Arg("end", ArgKind::kTensor),
          Arg("weight", weight)};
}
std::vector<ArgSpec> ToCopySchema() {
  std::vector<ArgSpec> schema = {
      Arg("self", ArgKind::kTensor),
      KwArg("dtype", ArgKind::kOptionalDType, Attr::None())};
  for (ArgSpec& a : FactoryKwArgs()) schema.push_back(a);
  schema.push_back(KwArg("non_blocking", ArgKind::kIgnored, Attr::Bool(false)));
  schema.push_back(KwArg("memory_format", ArgKind::kIgnored, Attr::None()));
  return schema;
}
std::vector<ArgSpec> ConvertElementTypeSchema() {
  return {Arg("a", ArgKind::kTensor), Arg("dtype", ArgKind::kOptionalDType)};
}

// ---- op-specific checks ----

// add: PyTorch's alpha_check.
absl::Status CheckAlpha(const OpContext& ctx, DType compute) {
  const Attr& alpha = ctx.arg(2);
  if (!IsFloating(compute) && alpha.kind == Attr::Kind::kFloat) {
    return ctx.Invalid(
        "for integral input tensors, argument alpha must not be a floating "
        "point number");
  }
  // A bool alpha needs a bool result; an int alpha is fine for any result,
  // bool included (True + True with alpha=1).
  if (compute != DType::kBool && alpha.kind == Attr::Kind::kBool) {
    return ctx.Invalid("a bool alpha is only supported for bool results");
  }
  return absl::OkStatus();
}

// sub: PyTorch's sub_check rejects a bool operand on either side, not only
// bool - bool (a wrapped True counts as a bool tensor); then alpha_check.
absl::Status CheckSub(const OpContext& ctx, DType compute) {
  auto is_bool = [&ctx](int i) {
    return ctx.is_tensor(i) ? ctx.type(i).dtype == DType::kBool
                            : ctx.arg(i).kind == Attr::Kind::kBool;
  };
  if (is_bool(0) || is_bool(1)) {
    return ctx.Invalid(
        "subtraction with a bool tensor is not supported; use "
        "logical_xor or logical_not");
  }
  return CheckAlpha(ctx, compute);
}

// div's rounding_mode: None, "trunc" or "floor".
absl::Status CheckRoundingMode(const OpContext& ctx, DType) {
  const Attr& m = ctx.arg(2);
  if (!m.is_none() && m.str != "trunc" && m.str != "floor") {
    return ctx.Invalid(absl::StrCat(
        "rounding_mode must be None, 'trunc' or 'floor', got '", m.str, "'"));
  }
  return absl::OkStatus();
}

// pow(Tensor, Scalar): PyTorch raises "Integers to negative integer powers
// are not allowed." for an integral base with a negative int exponent.
absl::Status CheckIntegerPowExponent(const OpContext& ctx, DType compute) {
  const Attr& exponent = ctx.arg(1);
  if (!IsFloating(compute) && exponent.kind == Attr::Kind::kInt &&
      exponent.i < 0) {
    return ctx.Invalid("integers to negative integer powers are not allowed");
  }
  return absl::OkStatus();
}

absl::Status CheckIntegralOrBool(const OpContext& ctx, DType compute) {
  if (!IsIntegralOrBool(compute))
    return ctx.Invalid("needs integral or bool inputs");
  return absl::OkStatus();
}

absl::Status CheckBoolCondition(const OpContext& ctx, DType) {
  if (!ctx.is_tensor(0) || ctx.type(0).dtype != DType::kBool) {
    return ctx.Invalid("where expects a bool condition tensor");
  }
  return absl::OkStatus();
}

absl::Status CheckClampBounds(const OpContext& ctx, DType) {
  if (ctx.arg(1).is_none() && ctx.arg(2).is_none()) {
    return ctx.Invalid("at least one of 'min' or 'max' must not be None");
  }
  return absl::OkStatus();
}

absl::Status CheckGeluApproximateArg(const OpContext& ctx, int arg) {
  const std::string& m = ctx.arg(arg).str;
  if (m != "none" && m != "tanh") {
    return ctx.Invalid(
        absl::StrCat("approximate must be 'none' or 'tanh', got '", m, "'"));
  }
  return absl::OkStatus();
}
absl::Status CheckGeluApproximate(const OpContext& ctx, DType) {
  return CheckGeluApproximateArg(ctx, 1);
}
absl::Status CheckGeluBackwardApproximate(const OpContext& ctx, DType) {
  return CheckGeluApproximateArg(ctx, 2);
}

// lerp, as PyTorch's lerp meta functions: `end` must have self's dtype; a
// tensor `weight` may differ only if it promotes into self's dtype (it is
// converted to it), so the result has self's dtype.
absl::Status CheckLerpDTypes(const OpContext& ctx, DType) {
  const DType self = ctx.type(0).dtype;
  if (ctx.type(1).dtype != self) {
    return ctx.Invalid(absl::StrCat("expected dtype ", DTypeName(self),
                                    " for `end` but got dtype ",
                                    DTypeName(ctx.type(1).dtype)));
  }
  if (ctx.is_tensor(2) && PromoteTypes(self, ctx.type(2).dtype) != self) {
    return ctx.Invalid(
        absl::StrCat("`weight` dtype ", DTypeName(ctx.type(2).dtype),
                     " does not promote into `input` dtype ", DTypeName(self)));
  }
  return absl::OkStatus();
}

// ---- the table ----

// A unary op computing in floating point (integral/bool inputs compute in
// the default float dtype).
PointwiseSignature FloatUnary(std::string name) {
  return {.name = std::move(name),
          .schema = UnarySchema(),
          .operands = {0},
          .promotion = Promotion::kIntToFloat,
          .int_compute = false};
}
// A unary op that keeps integral dtypes.
PointwiseSignature KeepUnary(std::string name, bool allow_bool) {
  return {.name = std::move(name),
          .schema = UnarySchema(),
          .operands = {0},
          .allow_bool = allow_bool};
}
// A comparison: result_type compute, bool output.
PointwiseSignature Comparison(std::string name, std::vector<ArgSpec> schema) {
  return {.name = std::move(name),
          .schema = std::move(schema),
          .operands = {0, 1},
          .promotion = Promotion::kBoolOutput};
}
// The backward of an activation: (grad_output, <name>) combined
// elementwise in floating point (PyTorch's sigmoid_backward & co.).
PointwiseSignature FloatBackward(std::string name, const char* saved) {
  return {.name = std::move(name),
          .schema = {Arg("grad_output", ArgKind::kTensor),
                     Arg(saved, ArgKind::kTensor)},
          .operands = {0, 1},
          .promotion = Promotion::kFloatOnly,
          .int_compute = false,
          .allow_bool = false};
}
// where(condition, self, other): the condition broadcasts but does not take
// part in type promotion; operands 1 and 2 do. The condition is listed last.
PointwiseSignature Where(std::string name, ArgKind self, ArgKind other) {
  return {.name = std::move(name),
          .schema = WhereSchema(self, other),
          .operands = {1, 2, 0},
          .check = CheckBoolCondition,
          .promoted_operands = 2};
}

std::vector<PointwiseSignature> BuildPointwiseTable() {
  std::vector<PointwiseSignature> t = {
      // Unary ops with floating results.
      FloatUnary("aten.exp.default"),
      FloatUnary("aten.exp2.default"),
      FloatUnary("aten.expm1.default"),
      FloatUnary("aten.log.default"),
      FloatUnary("aten.log2.default"),
      FloatUnary("aten.log1p.default"),
      FloatUnary("aten.sqrt.default"),
      FloatUnary("aten.rsqrt.default"),
      FloatUnary("aten.reciprocal.default"),
      FloatUnary("aten.sin.default"),
      FloatUnary("aten.cos.default"),
      FloatUnary("aten.tan.default"),
      FloatUnary("aten.tanh.default"),
      FloatUnary("aten.sigmoid.default"),
      FloatUnary("aten.erf.default"),
      // Unary ops that keep integral dtypes.
      KeepUnary("aten.abs.default", /*allow_bool=*/false),
      KeepUnary("aten.neg.default", /*allow_bool=*/false),
      KeepUnary("aten.relu.default", /*allow_bool=*/false),
      KeepUnary("aten.floor.default", /*allow_bool=*/false),
      KeepUnary("aten.ceil.default", /*allow_bool=*/false),
      KeepUnary("aten.round.default", /*allow_bool=*/false),
      KeepUnary("aten.trunc.default", /*allow_bool=*/false),
      KeepUnary("aten.sign.default", /*allow_bool=*/true),
      {.name = "aten.logical_not.default",
       .schema = UnarySchema(),
       .operands = {0},
       .promotion = Promotion::kBoolOutput},
      {.name = "aten.isnan.default",
       .schema = UnarySchema(),
       .operands = {0},
       .promotion = Promotion::kBoolOutput},
      {.name = "aten.bitwise_not.default",
       .schema = UnarySchema(),
       .operands = {0},
       .float_compute = false,
       .check = CheckIntegralOrBool},
      // add/sub: self (+|-) alpha * other.
      {.name = "aten.add.Tensor",
       .schema = AlphaSchema(BinarySchema()),
       .operands = {0, 1},
       .check = CheckAlpha},
      {.name = "aten.add.Scalar",
       .schema = AlphaSchema(BinaryScalarSchema()),
       .operands = {0, 1},
       .check = CheckAlpha},
      {.name = "aten.sub.Tensor",
       .schema = AlphaSchema(BinarySchema()),
       .operands = {0, 1},
       .check = CheckSub},
      {.name = "aten.sub.Scalar",
       .schema = AlphaSchema(BinaryScalarSchema()),
       .operands = {0, 1},
       .check = CheckSub},
  };
  // Binary arithmetic, Tensor and Scalar overloads.
  for (bool scalar : {false, true}) {
    const char* suffix = scalar ? ".Scalar" : ".Tensor";
    const std::vector<ArgSpec> schema =
        scalar ? BinaryScalarSchema() : BinarySchema();
    t.push_back({.name = absl::StrCat("aten.mul", suffix),
                 .schema = schema,
                 .operands = {0, 1}});
    t.push_back({.name = absl::StrCat("aten.div", suffix),
                 .schema = schema,
                 .operands = {0, 1},
                 .promotion = Promotion::kIntToFloat,
                 .int_compute = false});
    // div with rounding_mode: None (true division), "trunc" or "floor".
    t.push_back({.name = absl::StrCat("aten.div", suffix, "_mode"),
                 .schema = RoundingModeSchema(schema),
                 .operands = {0, 1},
                 .allow_bool = false,
                 .check = CheckRoundingMode,
                 .true_division_if_none_arg = 2});
    t.push_back({.name = absl::StrCat("aten.remainder", suffix),
                 .schema = schema,
                 .operands = {0, 1},
                 .allow_bool = false});
    t.push_back({.name = absl::StrCat("aten.fmod", suffix),
                 .schema = schema,
                 .operands = {0, 1},
                 .allow_bool = false});
    t.push_back({.name = absl::StrCat("aten.bitwise_and", suffix),
                 .schema = schema,
                 .operands = {0, 1},
                 .float_compute = false});
    t.push_back({.name = absl::StrCat("aten.bitwise_or", suffix),
                 .schema = schema,
                 .operands = {0, 1},
                 .float_compute = false});
  }
  const PointwiseSignature rest[] = {
      {.name = "aten.pow.Tensor_Tensor",
       .schema = PowSchema(ArgKind::kTensor, ArgKind::kTensorOrScalar),
       .operands = {0, 1},
       .allow_bool = false},
      {.name = "aten.pow.Tensor_Scalar",
       .schema = PowSchema(ArgKind::kTensor, ArgKind::kScalar),
       .operands = {0, 1},
       .allow_bool = false,
       .check = CheckIntegerPowExponent},
      {.name = "aten.pow.Scalar",
       .schema = PowSchema(ArgKind::kScalar, ArgKind::kTensor),
       .operands = {0, 1},
       .allow_bool = false},
      {.name = "aten.maximum.default",
       .schema = TensorPairSchema(),
       .operands = {0, 1}},
      {.name = "aten.minimum.default",
       .schema = TensorPairSchema(),
       .operands = {0, 1}},
      {.name = "aten.atan2.default",
       .schema = TensorPairSchema(),
       .operands = {0, 1},
       .promotion = Promotion::kIntToFloat,
       .int_compute = false},
      {.name = "aten.logical_and.default",
       .schema = TensorPairSchema(),
       .operands = {0, 1},
       .promotion = Promotion::kBoolOutput},
      {.name = "aten.logical_or.default",
       .schema = TensorPairSchema(),
       .operands = {0, 1},
       .promotion = Promotion::kBoolOutput},
      // Comparisons.
      Comparison("aten.eq.Tensor", BinarySchema()),
      Comparison("aten.eq.Scalar", BinaryScalarSchema()),
      Comparison("aten.ne.Tensor", BinarySchema()),
      Comparison("aten.ne.Scalar", BinaryScalarSchema()),
      Comparison("aten.lt.Tensor", BinarySchema()),
      Comparison("aten.lt.Scalar", BinaryScalarSchema()),
      Comparison("aten.le.Tensor", BinarySchema()),
      Comparison("aten.le.Scalar", BinaryScalarSchema()),
      Comparison("aten.gt.Tensor", BinarySchema()),
      Comparison("aten.gt.Scalar", BinaryScalarSchema()),
      Comparison("aten.ge.Tensor", BinarySchema()),
      Comparison("aten.ge.Scalar", BinaryScalarSchema()),
      // Selection.
      Where("aten.where.self", ArgKind::kTensorOrScalar,
            ArgKind::kTensorOrScalar),
      Where("aten.where.ScalarSelf", ArgKind::kScalar, ArgKind::kTensor),
      Where("aten.where.ScalarOther", ArgKind::kTensor, ArgKind::kScalar),
      Where("aten.where.Scalar", ArgKind::kScalar, ArgKind::kScalar),
      // clamp(self, min?, max?), clamp_min, clamp_max.
      {.name = "aten.clamp.default",
       .schema = ClampSchema(ArgKind::kOptionalScalar),
       .operands = {0, 1, 2},
       .allow_bool = false,
       .check = CheckClampBounds},
      {.name = "aten.clamp.Tensor",
       .schema = ClampSchema(ArgKind::kOptionalTensor),
       .operands = {0, 1, 2},
       .allow_bool = false,
       .check = CheckClampBounds},
      {.name = "aten.clamp_min.default",
       .schema = {Arg("self", ArgKind::kTensor), Arg("min", ArgKind::kScalar)},
       .operands = {0, 1},
       .allow_bool = false},
      {.name = "aten.clamp_max.default",
       .schema = {Arg("self", ArgKind::kTensor), Arg("max", ArgKind::kScalar)},
       .operands = {0, 1},
       .allow_bool = false},
      // Activations.
      {.name = "aten.gelu.default",
       .schema = WithKwArg(UnarySchema(), KwArg("approximate", ArgKind::kString,
                                                Attr::String("none"))),
       .operands = {0},
       .promotion = Promotion::kFloatOnly,
       .int_compute = false,
       .allow_bool = false,
       .check = CheckGeluApproximate},
      {.name = "aten.leaky_relu.default",
       .schema = {Arg("self", ArgKind::kTensor),
                  ArgDefault("negative_slope", ArgKind::kScalar,
                             Attr::Float(0.01))},
       .operands = {0},
       .promotion = Promotion::kFloatOnly,
       .int_compute = false,
       .allow_bool = false},
      {.name = "aten.hardtanh.default",
       .schema = {Arg("self", ArgKind::kTensor),
                  ArgDefault("min_val", ArgKind::kScalar, Attr::Int(-1)),
                  ArgDefault("max_val", ArgKind::kScalar, Attr::Int(1))},
       .operands = {0},
       .allow_bool = false},
      {.name = "aten.silu.default",
       .schema = UnarySchema(),
       .operands = {0},
       .promotion = Promotion::kFloatOnly,
       .int_compute = false,
       .allow_bool = false},
      // Backward ops of activations that Core ATen leaves whole.
      {.name = "aten.threshold_backward.default",
       .schema = {Arg("grad_output", ArgKind::kTensor),
                  Arg("self", ArgKind::kTensor),
                  Arg("threshold", ArgKind::kScalar)},
       .operands = {0, 1},
       .allow_bool = false},
      {.name = "aten.gelu_backward.default",
       .schema = WithKwArg({Arg("grad_output", ArgKind::kTensor),
                            Arg("self", ArgKind::kTensor)},
                           KwArg("approximate", ArgKind::kString,
                                 Attr::String("none"))),
       .operands = {0, 1},
       .promotion = Promotion::kFloatOnly,
       .int_compute = false,
       .allow_bool = false,
       .check = CheckGeluBackwardApproximate},
      FloatBackward("aten.sigmoid_backward.default", "output"),
      FloatBackward("aten.tanh_backward.default", "output"),
      FloatBackward("aten.silu_backward.default", "self"),
      // lerp: self + weight * (end - self).
      {.name = "aten.lerp.Scalar",
       .schema = LerpSchema(ArgKind::kScalar),
       .operands = {0, 1},
       .promotion = Promotion::kFloatOnly,
       .int_compute = false,
       .allow_bool = false,
       .check = CheckLerpDTypes},
      {.name = "aten.lerp.Tensor",
       .schema = LerpSchema(ArgKind::kTensor),
       .operands = {0, 1, 2},
       .promotion = Promotion::kFloatOnly,
       .int_compute = false,
       .allow_bool = false,
       .check = CheckLerpDTypes,
       .promoted_operands = 2},  // weight converts to self's dtype
  };
  t.insert(t.end(), std::begin(rest), std::end(rest));
  return t;
}

const std::vector<PointwiseSignature>& PointwiseTable() {
  static const std::vector<PointwiseSignature>* const table =
      new std::vector<PointwiseSignature>(BuildPointwiseTable());
  return *table;
}

// ---- the rules ----

// The operands broadcast.
absl::StatusOr<Shapes> PointwiseShape(const PointwiseSignature& op,
                                      const OpContext& ctx) {
  bool any_tensor = false;
  for (int i : op.operands) any_tensor |= ctx.is_tensor(i);
  if (!any_tensor) {
    return ctx.Invalid("needs at least one tensor argument, got only numbers");
  }
  auto s = BroadcastArgs(ctx, op.operands);
  if (!s.ok()) return s.status();
  return Shapes{*std::move(s)};
}

// The compute dtype, if the op supports it; bool for comparisons and
// logical ops.
absl::StatusOr<std::vector<DType>> PointwiseDType(const PointwiseSignature& op,
                                                  const OpContext& ctx) {
  const DType compute = ComputeDType(op, ctx.node(), [&ctx](int i) {
    return std::pair(ctx.type(i).dtype, ctx.type(i).rank() == 0);
  });
  if (!IsFloating(compute) && !op.int_compute) {
    return ctx.Invalid(absl::StrCat("not implemented for ", DTypeName(compute),
                                    " inputs (needs floating point)"));
  }
  if (IsFloating(compute) && !op.float_compute) {
    return ctx.Invalid(absl::StrCat("not implemented for ", DTypeName(compute),
                                    " inputs (needs integral or bool)"));
  }
  if (compute == DType::kBool && !op.allow_bool) {
    return ctx.Invalid("not implemented for bool inputs");
  }
  if (op.promotion == Promotion::kFloatOnly && !IsFloating(compute)) {
    return ctx.Invalid(
        absl::StrCat("needs floating point inputs, got ", DTypeName(compute)));
  }
  if (op.check) {
    absl::Status st = op.check(ctx, compute);
    if (!st.ok()) return st;
  }
  const DType out =
      op.promotion == Promotion::kBoolOutput ? DType::kBool : compute;
  return std::vector<DType>{out};
}

// Casts (_to_copy, convert_element_type): self's shape; the dtype argument's
// dtype, or self's when None.
constexpr int kCastDTypeArg = 1;

absl::StatusOr<Shapes> CastShape(const OpContext& ctx) {
  return Shapes{ctx.type(0).sizes};
}

absl::StatusOr<std::vector<DType>> CastDType(const OpContext& ctx) {
  const Attr& d = ctx.arg(kCastDTypeArg);
  return std::vector<DType>{d.is_none() ? ctx.type(0).dtype : d.dtype};
}

}  // namespace

const PointwiseSignature* FindPointwiseSignature(absl::string_view op) {
  static const auto* const by_name = [] {
    auto* map =
        new absl::flat_hash_map<absl::string_view, const PointwiseSignature*>;
    for (const PointwiseSignature& s : PointwiseTable()) (*map)[s.name] = &s;
    return map;
  }();
  auto it = by_name->find(op);
  return it == by_name->end() ? nullptr : it->second;
}

DType ComputeDType(const PointwiseSignature& op, const Node& node,
                   OperandDType operand_dtype) {
  ResultTypeState state;
  const int n = op.promoted_operands < 0 ? static_cast<int>(op.operands.size())
                                         : op.promoted_operands;
  for (int k = 0; k < n; ++k) {
    const Attr& a = node.args[op.operands[k]];
    if (a.kind == Attr::Kind::kTensor) {
      auto [dtype, zero_dim] = operand_dtype(op.operands[k]);
      state.AddTensor(dtype, zero_dim);
    } else if (a.is_scalar()) {
      state.AddScalar(a.ScalarKind());
    }
  }
  DType d = state.Result();
  const bool true_division = op.true_division_if_none_arg >= 0 &&
                             node.args[op.true_division_if_none_arg].is_none();
  if ((op.promotion == Promotion::kIntToFloat || true_division) &&
      !IsFloating(d)) {
    d = kDefaultFloat;
  }
  return d;
}

}  // namespace ops

void RegisterPointwiseSignatures(OpSignatures& table) {
  for (const ops::PointwiseSignature& op : ops::PointwiseTable()) {
    const ops::PointwiseSignature* p = &op;
    table.Add(OpSignature{
        .name = op.name,
        .op_class = OpClass::kPointwise,
        .schema = op.schema,
        .shape = [p](const OpContext& c) { return ops::PointwiseShape(*p, c); },
        .dtype = [p](const OpContext& c) { return ops::PointwiseDType(*p, c); },
    });
  }
  // Casts: the compute dtype is the target dtype.
  table.Add(OpSignature{.name = "aten._to_copy.default",
                        .op_class = OpClass::kPointwise,
                        .schema = ops::ToCopySchema(),
                        .shape = ops::CastShape,
                        .dtype = ops::CastDType});
  table.Add(OpSignature{.name = "prims.convert_element_type.default",
                        .op_class = OpClass::kPointwise,
                        .schema = ops::ConvertElementTypeSchema(),
                        .shape = ops::CastShape,
                        .dtype = ops::CastDType});
}

}  // namespace kiln
