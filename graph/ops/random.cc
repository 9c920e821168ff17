// Signatures of the random ops: native_dropout (and its backward),
// rand/randn and their *_like forms, bernoulli (.p and with a tensor of
// probabilities). Each takes Kiln's `seed` and `offset` keywords
// (graph/ops/random.h); their reference semantics and lowerings are
// compiler/ops/random_reference.cc and random_lowering.cc.
#include "graph/ops/random.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/op_signature.h"
#include "graph/ops/signature_util.h"

namespace kiln {
namespace ops {

RandomArgs RandomArgsOf(const Node& node) {
  RandomArgs at;
  const std::vector<ArgSpec>& schema = node.op->schema;
  for (int i = 0; i < static_cast<int>(schema.size()); ++i) {
    if (schema[i].name == "seed") at.seed = i;
    if (schema[i].name == "offset") at.offset = i;
  }
  return at;
}

int UniformBits(DType d) {
  switch (d) {
    case DType::kFloat16:
      return 11;
    case DType::kBFloat16:
      return 8;
    default:
      return 24;
  }
}

int64_t BernoulliThreshold(double p) {
  constexpr double kScale = static_cast<double>(int64_t{1} << kBernoulliBits);
  if (!(p > 0)) return 0;  // also NaN
  if (p >= 1) return int64_t{1} << kBernoulliBits;
  return static_cast<int64_t>(std::ceil(p * kScale));
}

double DropoutScale(double p) { return p == 1 ? 0.0 : 1.0 / (1.0 - p); }

bool DropoutTrains(const Node& node) {
  const Attr& train = node.args[2];
  return train.is_none() || train.ScalarAsDouble() != 0;
}

absl::Status CheckSeed(const OpContext& ctx) {
  const RandomArgs at = RandomArgsOf(ctx.node());
  if (!ctx.is_tensor(at.seed)) {
    return ctx.Invalid(
        "a random op needs Kiln's `seed` keyword: an int64 0-dim tensor (the "
        "torch backend adds it)");
  }
  const TensorType& seed = ctx.type(at.seed);
  if (seed.dtype != DType::kInt64 || seed.rank() != 0) {
    return ctx.Invalid(absl::StrCat("seed must be an int64 0-dim tensor, got ",
                                    DTypeName(seed.dtype), " of rank ",
                                    seed.rank()));
  }
  if (ctx.arg(at.offset).i < 0) {
    return ctx.Invalid(absl::StrCat("offset must be non-negative, got ",
                                    ctx.arg(at.offset).i));
  }
  return absl::OkStatus();
}

}  // namespace ops

namespace {

using ops::Arg;
using ops::ArgDefault;
using ops::KwArg;

// `head` followed by Kiln's seed and offset keywords.
std::vector<ArgSpec> Seeded(std::vector<ArgSpec> head) {
  head.push_back(KwArg("seed", ArgKind::kOptionalTensor, Attr::None()));
  head.push_back(KwArg("offset", ArgKind::kInt, Attr::Int(0)));
  return head;
}

// rand/randn: size, then dtype and the ignored factory keywords.
std::vector<ArgSpec> RandFactory() {
  std::vector<ArgSpec> s = {Arg("size", ArgKind::kIntList),
                            KwArg("dtype", ArgKind::kOptionalDType, Attr::None())};
  for (ArgSpec& a : ops::FactoryKwArgs()) s.push_back(a);
  return Seeded(std::move(s));
}

// rand_like/randn_like: self, dtype, the factory keywords, memory_format.
std::vector<ArgSpec> RandLike() {
  std::vector<ArgSpec> s = {Arg("self", ArgKind::kTensor),
                            KwArg("dtype", ArgKind::kOptionalDType, Attr::None())};
  for (ArgSpec& a : ops::FactoryKwArgs()) s.push_back(a);
  s.push_back(KwArg("memory_format", ArgKind::kIgnored, Attr::None()));
  return Seeded(std::move(s));
}

absl::Status CheckFloating(const OpContext& ctx, DType d,
                           absl::string_view what) {
  if (IsFloating(d)) return absl::OkStatus();
  return ctx.Invalid(absl::StrCat(what, " must be floating, got ",
                                  DTypeName(d)));
}

absl::Status CheckProbability(const OpContext& ctx, double p) {
  if (p >= 0 && p <= 1) return absl::OkStatus();
  return ctx.Invalid(
      absl::StrCat("probability has to be between 0 and 1, but got ", p));
}

absl::StatusOr<Shapes> RandShape(const OpContext& ctx) {
  if (absl::Status s = ops::CheckSeed(ctx); !s.ok()) return s;
  for (const SymExpr& e : ctx.arg(0).ints) {
    if (auto c = e.AsConstant(); c && *c < 0)
      return ctx.Invalid(absl::StrCat("negative size ", *c));
  }
  return Shapes{ctx.arg(0).ints};
}

absl::StatusOr<std::vector<DType>> RandDType(const OpContext& ctx) {
  const DType d = ctx.arg(1).is_none() ? kDefaultFloat : ctx.arg(1).dtype;
  if (absl::Status s = CheckFloating(ctx, d, "the dtype"); !s.ok()) return s;
  return std::vector<DType>{d};
}

absl::StatusOr<Shapes> RandLikeShape(const OpContext& ctx) {
  if (absl::Status s = ops::CheckSeed(ctx); !s.ok()) return s;
  return Shapes{ctx.type(0).sizes};
}

absl::StatusOr<std::vector<DType>> RandLikeDType(const OpContext& ctx) {
  const DType d = ctx.arg(1).is_none() ? ctx.type(0).dtype : ctx.arg(1).dtype;
  if (absl::Status s = CheckFloating(ctx, d, "the dtype"); !s.ok()) return s;
  return std::vector<DType>{d};
}

// bernoulli.p: self's sizes and dtype (any dtype: 0 or 1).
absl::StatusOr<Shapes> BernoulliPShape(const OpContext& ctx) {
  if (absl::Status s = ops::CheckSeed(ctx); !s.ok()) return s;
  if (absl::Status s = CheckProbability(ctx, ctx.arg(1).ScalarAsDouble());
      !s.ok())
    return s;
  return Shapes{ctx.type(0).sizes};
}

// bernoulli.default: self holds the probabilities.
absl::StatusOr<Shapes> BernoulliShape(const OpContext& ctx) {
  if (absl::Status s = ops::CheckSeed(ctx); !s.ok()) return s;
  return Shapes{ctx.type(0).sizes};
}

absl::StatusOr<std::vector<DType>> SelfDType(const OpContext& ctx) {
  return std::vector<DType>{ctx.type(0).dtype};
}

absl::StatusOr<std::vector<DType>> FloatingSelfDType(const OpContext& ctx) {
  if (absl::Status s = CheckFloating(ctx, ctx.type(0).dtype, "self"); !s.ok())
    return s;
  return std::vector<DType>{ctx.type(0).dtype};
}

// native_dropout: (output, mask) of input's sizes.
absl::StatusOr<Shapes> DropoutShape(const OpContext& ctx) {
  if (absl::Status s = ops::CheckSeed(ctx); !s.ok()) return s;
  const Attr& train = ctx.arg(2);
  if (!train.is_none() && train.kind != Attr::Kind::kBool)
    return ctx.Invalid("train must be a bool or None");
  if (absl::Status s = CheckProbability(ctx, ctx.arg(1).ScalarAsDouble());
      !s.ok())
    return s;
  return Shapes{ctx.type(0).sizes, ctx.type(0).sizes};
}

absl::StatusOr<std::vector<DType>> DropoutDType(const OpContext& ctx) {
  if (absl::Status s = CheckFloating(ctx, ctx.type(0).dtype, "input"); !s.ok())
    return s;
  return std::vector<DType>{ctx.type(0).dtype, DType::kBool};
}

// native_dropout_backward(grad_output, mask, scale): grad and mask
// broadcast; mask must be bool (ATen checks it too).
absl::StatusOr<Shapes> DropoutBackwardShape(const OpContext& ctx) {
  if (ctx.type(1).dtype != DType::kBool) {
    return ctx.Invalid(absl::StrCat("mask should be bool, got ",
                                    DTypeName(ctx.type(1).dtype)));
  }
  auto sizes = ops::BroadcastArgs(ctx, {0, 1});
  if (!sizes.ok()) return sizes.status();
  return Shapes{*sizes};
}

absl::StatusOr<std::vector<DType>> DropoutBackwardDType(const OpContext& ctx) {
  if (absl::Status s = CheckFloating(ctx, ctx.type(0).dtype, "grad_output");
      !s.ok())
    return s;
  return std::vector<DType>{ctx.type(0).dtype};
}

}  // namespace

void RegisterRandomSignatures(OpSignatures& table) {
  table.Add({.name = "aten.native_dropout.default",
             .op_class = OpClass::kPointwise,
             .schema = Seeded({Arg("input", ArgKind::kTensor),
                               Arg("p", ArgKind::kFloat),
                               Arg("train", ArgKind::kOptionalScalar)}),
             .num_outputs = 2,
             .shape = DropoutShape,
             .dtype = DropoutDType});
  table.Add({.name = "aten.native_dropout_backward.default",
             .op_class = OpClass::kPointwise,
             .schema = {Arg("grad_output", ArgKind::kTensor),
                        Arg("mask", ArgKind::kTensor),
                        Arg("scale", ArgKind::kFloat)},
             .num_outputs = 1,
             .shape = DropoutBackwardShape,
             .dtype = DropoutBackwardDType});
  for (const char* name : {"aten.rand.default", "aten.randn.default"}) {
    table.Add({.name = name,
               .op_class = OpClass::kCreation,
               .schema = RandFactory(),
               .num_outputs = 1,
               .shape = RandShape,
               .dtype = RandDType});
  }
  for (const char* name :
       {"aten.rand_like.default", "aten.randn_like.default"}) {
    table.Add({.name = name,
               .op_class = OpClass::kCreation,
               .schema = RandLike(),
               .num_outputs = 1,
               .shape = RandLikeShape,
               .dtype = RandLikeDType});
  }
  table.Add({.name = "aten.bernoulli.p",
             .op_class = OpClass::kPointwise,
             .schema = Seeded({Arg("self", ArgKind::kTensor),
                               ArgDefault("p", ArgKind::kFloat, Attr::Float(0.5)),
                               KwArg("generator", ArgKind::kIgnored, Attr::None())}),
             .num_outputs = 1,
             .shape = BernoulliPShape,
             .dtype = SelfDType});
  table.Add({.name = "aten.bernoulli.default",
             .op_class = OpClass::kPointwise,
             .schema = Seeded({Arg("self", ArgKind::kTensor),
                               KwArg("generator", ArgKind::kIgnored, Attr::None())}),
             .num_outputs = 1,
             .shape = BernoulliShape,
             .dtype = FloatingSelfDType});
}

}  // namespace kiln
