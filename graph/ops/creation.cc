// Signatures of the creation ops: full, scalar_tensor, arange (end; start,
// end; start, end, step), full_like, zeros_like, ones_like, empty_like,
// empty.memory_format and empty_strided. Kiln gives the empty ops' contents,
// which PyTorch leaves unspecified, as zeros. Their reference semantics and
// lowerings are compiler/ops/creation_reference.cc and creation_lowering.cc.
#include "graph/ops/creation.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/op_signature.h"
#include "graph/ops/signature_util.h"

namespace kiln {
namespace ops {

ArangePositions ArangePositionsOf(const Node& node) {
  ArangePositions at;
  const std::vector<ArgSpec>& schema = node.op->schema;
  for (int i = 0; i < static_cast<int>(schema.size()); ++i) {
    if (schema[i].name == "start") at.start = i;
    if (schema[i].name == "end") at.end = i;
    if (schema[i].name == "step") at.step = i;
    if (schema[i].name == "dtype") at.dtype = i;
  }
  return at;
}

ArangeRange ArangeRangeOf(const Node& node) {
  const ArangePositions at = ArangePositionsOf(node);
  const double start = at.start >= 0 ? node.args[at.start].ScalarAsDouble() : 0;
  const double end = node.args[at.end].ScalarAsDouble();
  const double step = at.step >= 0 ? node.args[at.step].ScalarAsDouble() : 1;
  return {start, end, step};
}

}  // namespace ops

namespace {

using ops::Arg;
using ops::ArgDefault;
using ops::KwArg;

// A factory's schema: `head`, then dtype and the ignored factory keywords.
std::vector<ArgSpec> Factory(std::vector<ArgSpec> head) {
  head.push_back(KwArg("dtype", ArgKind::kOptionalDType, Attr::None()));
  for (ArgSpec& a : ops::FactoryKwArgs()) head.push_back(a);
  return head;
}

// The dtype of a tensor filled with scalar `s` when no dtype is given.
DType ScalarDefaultDType(const Attr& s) {
  return s.kind == Attr::Kind::kFloat ? kDefaultFloat : s.ScalarKind();
}

absl::StatusOr<Shapes> FullShape(const OpContext& ctx) {
  for (const SymExpr& e : ctx.arg(0).ints) {
    if (auto c = e.AsConstant(); c && *c < 0)
      return ctx.Invalid(absl::StrCat("negative size ", *c));
  }
  return Shapes{ctx.arg(0).ints};
}

absl::StatusOr<std::vector<DType>> FullDType(const OpContext& ctx) {
  return std::vector<DType>{
      ctx.arg(2).is_none() ? ScalarDefaultDType(ctx.arg(1)) : ctx.arg(2).dtype};
}

// The position of the argument `name` in the node's schema (it must exist).
int ArgPosition(const OpContext& ctx, absl::string_view name) {
  const std::vector<ArgSpec>& schema = ctx.node().op->schema;
  for (int i = 0; i < static_cast<int>(schema.size()); ++i) {
    if (schema[i].name == name) return i;
  }
  return -1;
}

// A *_like factory's schema: self, `head`, then dtype, the ignored factory
// keywords and memory_format.
std::vector<ArgSpec> LikeFactory(std::vector<ArgSpec> head) {
  head.insert(head.begin(), Arg("self", ArgKind::kTensor));
  std::vector<ArgSpec> schema = Factory(std::move(head));
  schema.push_back(KwArg("memory_format", ArgKind::kIgnored, Attr::None()));
  return schema;
}

// full_like, zeros_like, ones_like, empty_like: self's sizes.
absl::StatusOr<Shapes> LikeShape(const OpContext& ctx) {
  return Shapes{ctx.type(0).sizes};
}

// *_like: the dtype argument, else self's dtype (not the fill value's).
absl::StatusOr<std::vector<DType>> LikeDType(const OpContext& ctx) {
  const Attr& dtype = ctx.arg(ArgPosition(ctx, "dtype"));
  return std::vector<DType>{dtype.is_none() ? ctx.type(0).dtype : dtype.dtype};
}

// empty.memory_format, empty_strided: the dtype argument, else the default
// float.
absl::StatusOr<std::vector<DType>> EmptyDType(const OpContext& ctx) {
  const Attr& dtype = ctx.arg(ArgPosition(ctx, "dtype"));
  return std::vector<DType>{dtype.is_none() ? kDefaultFloat : dtype.dtype};
}

// empty_strided: the sizes; the strides (one per size, non-negative) only
// say how PyTorch would lay the result out, and Kiln picks layouts.
absl::StatusOr<Shapes> EmptyStridedShape(const OpContext& ctx) {
  if (ctx.arg(1).ints.size() != ctx.arg(0).ints.size()) {
    return ctx.Invalid(absl::StrCat("mismatch in length of strides (",
                                    ctx.arg(1).ints.size(), ") and shape (",
                                    ctx.arg(0).ints.size(), ")"));
  }
  for (const SymExpr& e : ctx.arg(1).ints) {
    if (auto c = e.AsConstant(); c && *c < 0)
      return ctx.Invalid(absl::StrCat("negative stride ", *c));
  }
  return FullShape(ctx);
}

absl::StatusOr<Shapes> ScalarTensorShape(const OpContext&) {
  return Shapes{{}};
}

absl::StatusOr<std::vector<DType>> ScalarTensorDType(const OpContext& ctx) {
  return std::vector<DType>{ctx.arg(1).is_none() ? kDefaultFloat
                                                 : ctx.arg(1).dtype};
}

// arange with a symbolic end (a SymInt over the symbols, as a dynamic
// sequence length gives torch.arange(seq_len)): end - start elements, for
// an int start and step 1, never negative for any symbol value.
absl::StatusOr<Shapes> SymbolicArangeShape(const OpContext& ctx,
                                           const SymExpr& end) {
  const ops::ArangePositions at = ops::ArangePositionsOf(ctx.node());
  const Attr* start = at.start >= 0 ? &ctx.arg(at.start) : nullptr;
  const Attr* step = at.step >= 0 ? &ctx.arg(at.step) : nullptr;
  if ((start != nullptr && start->kind != Attr::Kind::kInt) ||
      (step != nullptr && (step->kind != Attr::Kind::kInt || step->i != 1))) {
    return ctx.Invalid(
        "arange with a symbolic end needs an int start and step 1");
  }
  const SymExpr length = end - SymExpr(start != nullptr ? start->i : 0);
  if (!length.NonNegativeFrom(kMinSymbolValue)) {
    return ctx.Invalid(absl::StrCat("arange's length ",
                                    length.ToString(ctx.graph().SymbolNames()),
                                    " may be negative"));
  }
  return Shapes{{length}};
}

// arange: ceil((end - start) / step) elements.
absl::StatusOr<Shapes> ArangeShape(const OpContext& ctx) {
  const Attr& end_arg = ctx.arg(ops::ArangePositionsOf(ctx.node()).end);
  if (end_arg.kind == Attr::Kind::kInts) {
    return SymbolicArangeShape(ctx, end_arg.ints[0]);
  }
  auto [start, end, step] = ops::ArangeRangeOf(ctx.node());
  if (step == 0 || !std::isfinite(start) || !std::isfinite(end) ||
      !std::isfinite(step)) {
    return ctx.Invalid("arange needs finite start/end and a nonzero step");
  }
  const double n = std::ceil((end - start) / step);
  if (n < 0)
    return ctx.Invalid(
        "upper bound and lower bound are inconsistent with the step sign");
  if (n > static_cast<double>(int64_t{1} << 40))
    return ctx.Invalid("arange has too many elements");
  return Shapes{{SymExpr(static_cast<int64_t>(n))}};
}

// arange: the given dtype, else the default float if start, end or step is
// a float, else int64.
absl::StatusOr<std::vector<DType>> ArangeDType(const OpContext& ctx) {
  const ops::ArangePositions at = ops::ArangePositionsOf(ctx.node());
  if (!ctx.arg(at.dtype).is_none())
    return std::vector<DType>{ctx.arg(at.dtype).dtype};
  bool any_float = false;
  for (int i : {at.start, at.end, at.step}) {
    if (i >= 0 && ctx.arg(i).kind == Attr::Kind::kFloat) any_float = true;
  }
  return std::vector<DType>{any_float ? kDefaultFloat : DType::kInt64};
}

}  // namespace

void RegisterCreationSignatures(OpSignatures& table) {
  table.Add({.name = "aten.full.default",
             .op_class = OpClass::kCreation,
             .schema = Factory({Arg("size", ArgKind::kIntList),
                                Arg("fill_value", ArgKind::kScalar)}),
             .num_outputs = 1,
             .shape = FullShape,
             .dtype = FullDType});
  table.Add({.name = "aten.scalar_tensor.default",
             .op_class = OpClass::kCreation,
             .schema = Factory({Arg("s", ArgKind::kScalar)}),
             .num_outputs = 1,
             .shape = ScalarTensorShape,
             .dtype = ScalarTensorDType});
  table.Add({.name = "aten.arange.default",
             .op_class = OpClass::kCreation,
             .schema = Factory({Arg("end", ArgKind::kSymScalar)}),
             .num_outputs = 1,
             .shape = ArangeShape,
             .dtype = ArangeDType});
  table.Add({.name = "aten.arange.start",
             .op_class = OpClass::kCreation,
             .schema = Factory({Arg("start", ArgKind::kScalar),
                                Arg("end", ArgKind::kSymScalar)}),
             .num_outputs = 1,
             .shape = ArangeShape,
             .dtype = ArangeDType});
  table.Add(
      {.name = "aten.arange.start_step",
       .op_class = OpClass::kCreation,
       .schema = Factory({Arg("start", ArgKind::kScalar),
                          Arg("end", ArgKind::kSymScalar),
                          ArgDefault("step", ArgKind::kScalar, Attr::Int(1))}),
       .num_outputs = 1,
       .shape = ArangeShape,
       .dtype = ArangeDType});
  table.Add({.name = "aten.full_like.default",
             .op_class = OpClass::kCreation,
             .schema = LikeFactory({Arg("fill_value", ArgKind::kScalar)}),
             .num_outputs = 1,
             .shape = LikeShape,
             .dtype = LikeDType});
  for (const char* name : {"aten.zeros_like.default", "aten.ones_like.default",
                           "aten.empty_like.default"}) {
    table.Add({.name = name,
               .op_class = OpClass::kCreation,
               .schema = LikeFactory({}),
               .num_outputs = 1,
               .shape = LikeShape,
               .dtype = LikeDType});
  }
  std::vector<ArgSpec> empty = Factory({Arg("size", ArgKind::kIntList)});
  empty.push_back(KwArg("memory_format", ArgKind::kIgnored, Attr::None()));
  table.Add({.name = "aten.empty.memory_format",
             .op_class = OpClass::kCreation,
             .schema = std::move(empty),
             .num_outputs = 1,
             .shape = FullShape,
             .dtype = EmptyDType});
  table.Add({.name = "aten.empty_strided.default",
             .op_class = OpClass::kCreation,
             .schema = Factory({Arg("size", ArgKind::kIntList),
                                Arg("stride", ArgKind::kIntList)}),
             .num_outputs = 1,
             .shape = EmptyStridedShape,
             .dtype = EmptyDType});
}

}  // namespace kiln
