// Signatures of the reduction family (graph/ops/reduction.h): one
// descriptor per overload, the shape rule ReductionShape and the dtype rule
// ReductionDType shared by all of them.
#include "graph/ops/reduction.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/ops/signature_util.h"

namespace kiln {
namespace {

using ops::Arg;
using ops::ArgDefault;
using ops::KwArg;

// The dims argument as a list attr (an int dim or None become lists).
Attr DimsAttr(const Node& node, const ReductionOp& op) {
  if (op.dims_arg < 0) return Attr::None();
  const Attr& a = node.args[op.dims_arg];
  if (a.kind == Attr::Kind::kInt) return Attr::Ints({SymExpr(a.i)});
  return a;
}

bool NeedsNonEmpty(Reduction k) {
  return k == Reduction::kMax || k == Reduction::kMin ||
         k == Reduction::kArgMax || k == Reduction::kArgMin;
}

const ReductionOp& OpOf(const OpContext& ctx) {
  return *FindReduction(ctx.node().op->name);
}

absl::StatusOr<Shapes> ReductionShape(const OpContext& ctx) {
  const ReductionOp& op = OpOf(ctx);
  const TensorType& in = ctx.type(0);
  auto reduced = ops::ReducedDims(ctx, DimsAttr(ctx.node(), op), in.rank());
  if (!reduced.ok()) return reduced.status();
  if (NeedsNonEmpty(op.kind)) {
    for (int d = 0; d < in.rank(); ++d) {
      if ((*reduced)[d] && in.sizes[d] == SymExpr(0)) {
        return ctx.Invalid(
            absl::StrCat("cannot reduce over dim ", d,
                         " of size 0: the operation has no identity"));
      }
    }
  }
  return Shapes{ops::ReducedShape(in.sizes, *reduced, KeepDim(ctx.node(), op))};
}

absl::StatusOr<DType> OutDType(const OpContext& ctx, const ReductionOp& op) {
  const DType in = ctx.type(0).dtype;
  const bool has_dtype = op.dtype_arg >= 0 && !ctx.arg(op.dtype_arg).is_none();
  const DType requested = has_dtype ? ctx.arg(op.dtype_arg).dtype : in;
  switch (op.kind) {
    case Reduction::kSum:
    case Reduction::kProd:
      if (has_dtype) return requested;
      return IsFloating(in) ? in : DType::kInt64;
    case Reduction::kMean:
      if (!IsFloating(requested)) {
        return ctx.Invalid(
            absl::StrCat("could not infer output dtype: input dtype must be "
                         "floating point, got ",
                         DTypeName(requested)));
      }
      return requested;
    case Reduction::kVar:
      if (!IsFloating(in)) {
        return ctx.Invalid(absl::StrCat(
            "var needs a floating point input, got ", DTypeName(in)));
      }
      return in;
    case Reduction::kMax:
    case Reduction::kMin:
      return in;
    case Reduction::kArgMax:
    case Reduction::kArgMin:
      if (in == DType::kBool)
        return ctx.Invalid("not implemented for bool inputs");
      return DType::kInt64;
    case Reduction::kAny:
    case Reduction::kAll:
      return DType::kBool;
  }
  return in;
}

absl::StatusOr<std::vector<DType>> ReductionDType(const OpContext& ctx) {
  auto d = OutDType(ctx, OpOf(ctx));
  if (!d.ok()) return d.status();
  return std::vector<DType>{*d};
}

// The table: one descriptor per overload.
std::vector<ReductionOp> BuildReductionOps() {
  const Attr none = Attr::None();
  const Attr no = Attr::Bool(false);
  const ArgSpec self = Arg("self", ArgKind::kTensor);
  const ArgSpec dtype_kw = KwArg("dtype", ArgKind::kOptionalDType, none);
  const ArgSpec dim_list = Arg("dim", ArgKind::kOptionalIntList);
  const ArgSpec keepdim = ArgDefault("keepdim", ArgKind::kBool, no);
  const ArgSpec dim_int = Arg("dim", ArgKind::kInt);
  const ArgSpec dims_or_all =
      ArgDefault("dim", ArgKind::kOptionalIntList, none);
  const ArgSpec dims_default_all =
      ArgDefault("dim", ArgKind::kIntList, Attr::Ints({}));
  const ArgSpec optional_dim = ArgDefault("dim", ArgKind::kOptionalInt, none);
  // name, kind, schema, dims, keepdim, dtype, correction
  return {
      {"aten.sum.default", Reduction::kSum, {self, dtype_kw}, -1, -1, 1},
      {"aten.sum.dim_IntList",
       Reduction::kSum,
       {self, dim_list, keepdim, dtype_kw},
       1,
       2,
       3},
      {"aten.mean.default", Reduction::kMean, {self, dtype_kw}, -1, -1, 1},
      {"aten.mean.dim",
       Reduction::kMean,
       {self, dim_list, keepdim, dtype_kw},
       1,
       2,
       3},
      {"aten.prod.default", Reduction::kProd, {self, dtype_kw}, -1, -1, 1},
      {"aten.prod.dim_int",
       Reduction::kProd,
       {self, dim_int, keepdim, dtype_kw},
       1,
       2,
       3},
      {"aten.amax.default",
       Reduction::kMax,
       {self, dims_default_all, keepdim},
       1,
       2},
      {"aten.amin.default",
       Reduction::kMin,
       {self, dims_default_all, keepdim},
       1,
       2},
      {"aten.var.correction",
       Reduction::kVar,
       {self, dims_or_all, KwArg("correction", ArgKind::kOptionalScalar, none),
        KwArg("keepdim", ArgKind::kBool, no)},
       1,
       3,
       -1,
       2},
      {"aten.argmax.default",
       Reduction::kArgMax,
       {self, optional_dim, keepdim},
       1,
       2},
      {"aten.argmin.default",
       Reduction::kArgMin,
       {self, optional_dim, keepdim},
       1,
       2},
      {"aten.any.default", Reduction::kAny, {self}},
      {"aten.any.dim", Reduction::kAny, {self, dim_int, keepdim}, 1, 2},
      {"aten.any.dims", Reduction::kAny, {self, dims_or_all, keepdim}, 1, 2},
      {"aten.all.default", Reduction::kAll, {self}},
      {"aten.all.dim", Reduction::kAll, {self, dim_int, keepdim}, 1, 2},
      {"aten.all.dims", Reduction::kAll, {self, dims_or_all, keepdim}, 1, 2},
  };
}

}  // namespace

const std::vector<ReductionOp>& ReductionOps() {
  static const std::vector<ReductionOp> ops = BuildReductionOps();
  return ops;
}

const ReductionOp* FindReduction(absl::string_view op) {
  for (const ReductionOp& r : ReductionOps()) {
    if (r.name == op) return &r;
  }
  return nullptr;
}

bool KeepDim(const Node& node, const ReductionOp& op) {
  return op.keepdim_arg >= 0 && node.args[op.keepdim_arg].b;
}

std::vector<bool> ReducedMask(const Node& node, const ReductionOp& op,
                              int rank) {
  std::vector<bool> reduced(rank, false);
  const Attr dims = DimsAttr(node, op);
  if (dims.is_none() || dims.ints.empty()) {
    std::fill(reduced.begin(), reduced.end(), true);
    return reduced;
  }
  for (const SymExpr& e : dims.ints) {
    const int64_t d = *e.AsConstant();
    if (rank > 0) reduced[d < 0 ? d + rank : d] = true;
  }
  return reduced;
}

double Correction(const Node& node, const ReductionOp& op) {
  if (op.correction_arg >= 0 && !node.args[op.correction_arg].is_none()) {
    return node.args[op.correction_arg].ScalarAsDouble();
  }
  return 1;
}

void RegisterReductionSignatures(OpSignatures& table) {
  for (const ReductionOp& op : ReductionOps()) {
    table.Add({.name = op.name,
               .op_class = OpClass::kReduction,
               .schema = op.schema,
               .shape = ReductionShape,
               .dtype = ReductionDType});
  }
}

}  // namespace kiln
