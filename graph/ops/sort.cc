// Signatures of the sort family (graph/ops/sort.h): sort, sort.stable and
// topk over one dim, giving (values, indices). values keep self's dtype,
// indices are int64. The sorted dim may be negative; a 0-d tensor is one
// element (dim -1 or 0). topk's k is a static int in [0, n] (n: the dim's
// size, 1 for a 0-d tensor); PyTorch keeps a 0-d result for a 0-d input
// whatever k.
#include "graph/ops/sort.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/ops/signature_util.h"
#include "graph/ops/views.h"

namespace kiln {
namespace ops {

SortParams SortParamsOf(const Node& node, int rank) {
  const std::string& op = node.op->name;
  SortParams p;
  if (op == "aten.topk.default") {
    p.k = node.args[1].i;
    p.dim = WrapCheckedDim(node.args[2].i, rank);
    p.descending = node.args[3].b;
  } else if (op == "aten.sort.stable") {
    p.dim = WrapCheckedDim(node.args[2].i, rank);
    p.descending = node.args[3].b;
  } else {  // aten.sort.default
    p.dim = WrapCheckedDim(node.args[1].i, rank);
    p.descending = node.args[2].b;
  }
  return p;
}

}  // namespace ops

namespace {

using ops::Arg;
using ops::ArgDefault;
using ops::KwArg;

// The dim argument's position in each overload.
int DimArg(const OpContext& ctx) {
  const std::string& op = ctx.node().op->name;
  if (op == "aten.sort.stable" || op == "aten.topk.default") return 2;
  return 1;
}

// sort / sort.stable: values and indices of self's shape.
absl::StatusOr<Shapes> SortShape(const OpContext& ctx) {
  const TensorType& self = ctx.type(0);
  auto d = ctx.WrapDim(ctx.arg(DimArg(ctx)).i, self.rank());
  if (!d.ok()) return d.status();
  return Shapes{self.sizes, self.sizes};
}

// topk: self's shape with k along dim (a 0-d input stays 0-d).
absl::StatusOr<Shapes> TopKShape(const OpContext& ctx) {
  const TensorType& self = ctx.type(0);
  auto d = ctx.WrapDim(ctx.arg(2).i, self.rank());
  if (!d.ok()) return d.status();
  const int64_t k = ctx.arg(1).i;
  const SymExpr n = self.rank() == 0 ? SymExpr(1) : self.sizes[*d];
  // A symbolic size is only known to be >= kMinSymbolValue.
  const std::optional<int64_t> static_n = n.AsConstant();
  if (k < 0 || (static_n && k > *static_n)) {
    return ctx.Invalid(absl::StrCat(
        "argument 'k': selected index k out of range (k = ", k, ", dim ", *d,
        " has size ", n.ToString(ctx.graph().SymbolNames()), ")"));
  }
  std::vector<SymExpr> out = self.sizes;
  if (!out.empty()) out[*d] = SymExpr(k);
  return Shapes{out, out};
}

absl::StatusOr<std::vector<DType>> SortDType(const OpContext& ctx) {
  return std::vector<DType>{ctx.type(0).dtype, DType::kInt64};
}

absl::StatusOr<std::vector<DType>> TopKDType(const OpContext& ctx) {
  if (ctx.type(0).dtype == DType::kBool)
    return ctx.Invalid("argument 'self': topk does not support bool dtypes");
  return SortDType(ctx);
}

}  // namespace

void RegisterSortSignatures(OpSignatures& table) {
  const ArgSpec self = Arg("self", ArgKind::kTensor);
  const ArgSpec dim = ArgDefault("dim", ArgKind::kInt, Attr::Int(-1));
  const ArgSpec descending =
      ArgDefault("descending", ArgKind::kBool, Attr::Bool(false));
  table.Add({.name = "aten.sort.default",
             .op_class = OpClass::kComposite,
             .schema = {self, dim, descending},
             .num_outputs = 2,
             .shape = SortShape,
             .dtype = SortDType});
  // `stable` (bool?) changes nothing: Kiln's sort is always stable.
  table.Add({.name = "aten.sort.stable",
             .op_class = OpClass::kComposite,
             .schema = {self, KwArg("stable", ArgKind::kIgnored, Attr::None()),
                        KwArg("dim", ArgKind::kInt, Attr::Int(-1)),
                        KwArg("descending", ArgKind::kBool, Attr::Bool(false))},
             .num_outputs = 2,
             .shape = SortShape,
             .dtype = SortDType});
  table.Add({.name = "aten.topk.default",
             .op_class = OpClass::kComposite,
             .schema = {self, Arg("k", ArgKind::kInt), dim,
                        ArgDefault("largest", ArgKind::kBool, Attr::Bool(true)),
                        ArgDefault("sorted", ArgKind::kBool, Attr::Bool(true))},
             .num_outputs = 2,
             .shape = TopKShape,
             .dtype = TopKDType});
}

}  // namespace kiln
