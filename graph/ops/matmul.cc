// Signatures of the matrix products: mm, addmm, bmm and baddbmm (their
// references and lowerings are the compiler's: compiler/ops/matmul_*.cc;
// the lowering calls a vendor library, issue 16).
//
// As PyTorch: the operands must have the same dtype (no promotion), the
// inner sizes must agree, and the bias of addmm/baddbmm broadcasts to the
// result.
#include "absl/strings/str_cat.h"
#include "graph/ops/signature_util.h"

namespace kiln {
namespace {

using ops::Arg;
using ops::KwArg;

std::string ShapeString(const std::vector<SymExpr>& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i)
    absl::StrAppend(&out, i ? "x" : "", s[i].ToString());
  return out;
}

// The product of arguments `a` and `b` of rank `rank` (2: mm, 3: bmm).
absl::StatusOr<std::vector<SymExpr>> ProductShape(const OpContext& ctx, int a,
                                                  int b, int rank) {
  const std::vector<SymExpr>& x = ctx.type(a).sizes;
  const std::vector<SymExpr>& y = ctx.type(b).sizes;
  if (static_cast<int>(x.size()) != rank ||
      static_cast<int>(y.size()) != rank) {
    return ctx.Invalid(absl::StrCat("expects ", rank, "-D operands, got ",
                                    x.size(), "-D and ", y.size(), "-D"));
  }
  if (x[rank - 1] != y[rank - 2] || (rank == 3 && x[0] != y[0])) {
    return ctx.Invalid(absl::StrCat("shapes cannot be multiplied (",
                                    ShapeString(x), " and ", ShapeString(y),
                                    ")"));
  }
  std::vector<SymExpr> out(x.begin(), x.end() - 1);
  out.push_back(y[rank - 1]);
  return out;
}

absl::StatusOr<Shapes> MmShape(const OpContext& ctx) {
  auto s = ProductShape(ctx, 0, 1, 2);
  if (!s.ok()) return s.status();
  return Shapes{*s};
}

absl::StatusOr<Shapes> BmmShape(const OpContext& ctx) {
  auto s = ProductShape(ctx, 0, 1, 3);
  if (!s.ok()) return s.status();
  return Shapes{*s};
}

// addmm / baddbmm: the bias (argument 0) must broadcast to the product.
absl::StatusOr<Shapes> BiasedProductShape(const OpContext& ctx, int rank) {
  auto s = ProductShape(ctx, 1, 2, rank);
  if (!s.ok()) return s.status();
  auto b = ops::Broadcast(ctx, ctx.type(0).sizes, *s);
  if (!b.ok()) return b.status();
  if (*b != *s) {
    return ctx.Invalid(
        absl::StrCat("self of shape ", ShapeString(ctx.type(0).sizes),
                     " does not broadcast to the product's ", ShapeString(*s)));
  }
  return Shapes{*s};
}

absl::StatusOr<Shapes> AddmmShape(const OpContext& ctx) {
  return BiasedProductShape(ctx, 2);
}

absl::StatusOr<Shapes> BaddbmmShape(const OpContext& ctx) {
  return BiasedProductShape(ctx, 3);
}

// Every tensor argument has the same floating dtype (PyTorch: "expected
// m1 and m2 to have the same dtype"); Kiln's products are floating only.
absl::StatusOr<std::vector<DType>> SameFloatDType(const OpContext& ctx) {
  DType dtype = DType::kFloat32;
  bool first = true;
  for (size_t i = 0; i < ctx.node().args.size(); ++i) {
    if (!ctx.is_tensor(static_cast<int>(i))) continue;
    const DType d = ctx.type(static_cast<int>(i)).dtype;
    if (first) {
      dtype = d;
      first = false;
    } else if (d != dtype) {
      return ctx.Invalid(absl::StrCat("expects operands of one dtype, got ",
                                      DTypeName(dtype), " and ", DTypeName(d)));
    }
  }
  if (!IsFloating(dtype)) {
    return ctx.Invalid(
        absl::StrCat("matrix products of ", DTypeName(dtype),
                     " are not supported (floating dtypes only)"));
  }
  return std::vector<DType>{dtype};
}

std::vector<ArgSpec> BiasedSchema(const char* m1, const char* m2) {
  return {Arg("self", ArgKind::kTensor), Arg(m1, ArgKind::kTensor),
          Arg(m2, ArgKind::kTensor),
          KwArg("beta", ArgKind::kScalar, Attr::Int(1)),
          KwArg("alpha", ArgKind::kScalar, Attr::Int(1))};
}

}  // namespace

void RegisterMatmulSignatures(OpSignatures& table) {
  table.Add(
      {.name = "aten.mm.default",
       .op_class = OpClass::kExtern,
       .schema = {Arg("self", ArgKind::kTensor), Arg("mat2", ArgKind::kTensor)},
       .shape = MmShape,
       .dtype = SameFloatDType});
  table.Add({.name = "aten.addmm.default",
             .op_class = OpClass::kExtern,
             .schema = BiasedSchema("mat1", "mat2"),
             .shape = AddmmShape,
             .dtype = SameFloatDType});
  table.Add(
      {.name = "aten.bmm.default",
       .op_class = OpClass::kExtern,
       .schema = {Arg("self", ArgKind::kTensor), Arg("mat2", ArgKind::kTensor)},
       .shape = BmmShape,
       .dtype = SameFloatDType});
  table.Add({.name = "aten.baddbmm.default",
             .op_class = OpClass::kExtern,
             .schema = BiasedSchema("batch1", "batch2"),
             .shape = BaddbmmShape,
             .dtype = SameFloatDType});
}

}  // namespace kiln
