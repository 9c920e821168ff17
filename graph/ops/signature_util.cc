#include "graph/ops/signature_util.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::ops {

std::string ShapeString(const std::vector<SymExpr>& sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i)
    absl::StrAppend(&out, i ? ", " : "", sizes[i].ToString());
  return out + "]";
}

ArgSpec Arg(std::string name, ArgKind kind) {
  return ArgSpec{std::move(name), kind, std::nullopt, false};
}
ArgSpec ArgDefault(std::string name, ArgKind kind, Attr default_value) {
  return ArgSpec{std::move(name), kind, std::move(default_value), false};
}
ArgSpec KwArg(std::string name, ArgKind kind, Attr default_value) {
  return ArgSpec{std::move(name), kind, std::move(default_value), true};
}
std::vector<ArgSpec> FactoryKwArgs() {
  return {KwArg("layout", ArgKind::kIgnored, Attr::None()),
          KwArg("device", ArgKind::kIgnored, Attr::None()),
          KwArg("pin_memory", ArgKind::kIgnored, Attr::None())};
}

namespace {
std::string ShapeString(const OpContext& ctx, const std::vector<SymExpr>& s) {
  const std::vector<std::string> names = ctx.graph().SymbolNames();
  std::vector<std::string> parts;
  for (const SymExpr& e : s) parts.push_back(e.ToString(names));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}
}  // namespace

absl::StatusOr<std::vector<SymExpr>> Broadcast(const OpContext& ctx,
                                               const std::vector<SymExpr>& a,
                                               const std::vector<SymExpr>& b) {
  const size_t rank = std::max(a.size(), b.size());
  std::vector<SymExpr> out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const SymExpr one(1);
    const SymExpr& x = i < rank - a.size() ? one : a[i - (rank - a.size())];
    const SymExpr& y = i < rank - b.size() ? one : b[i - (rank - b.size())];
    if (x == y || y == one) {
      out[i] = x;
    } else if (x == one) {
      out[i] = y;
    } else {
      return ctx.Invalid(absl::StrCat("shapes ", ShapeString(ctx, a), " and ",
                                      ShapeString(ctx, b),
                                      " do not broadcast (dim ", i, ")"));
    }
  }
  return out;
}

std::vector<SymExpr> OperandShape(const OpContext& ctx, int i) {
  return ctx.is_tensor(i) ? ctx.type(i).sizes : std::vector<SymExpr>{};
}

absl::StatusOr<std::vector<SymExpr>> BroadcastArgs(
    const OpContext& ctx, const std::vector<int>& args) {
  std::vector<SymExpr> shape;
  for (int i : args) {
    auto s = Broadcast(ctx, shape, OperandShape(ctx, i));
    if (!s.ok()) return s.status();
    shape = *std::move(s);
  }
  return shape;
}

DType ResultTypeOf(const OpContext& ctx, const std::vector<int>& args) {
  ResultTypeState state;
  for (int i : args) {
    const Attr& a = ctx.arg(i);
    if (a.kind == Attr::Kind::kTensor) {
      state.AddTensor(ctx.type(i).dtype, ctx.type(i).rank() == 0);
    } else if (a.is_scalar()) {
      state.AddScalar(a.ScalarKind());
    }
  }
  return state.Result();
}

absl::StatusOr<std::vector<bool>> ReducedDims(const OpContext& ctx,
                                              const Attr& dims, int rank) {
  std::vector<bool> reduced(rank, false);
  if (dims.is_none() || dims.ints.empty()) {
    std::fill(reduced.begin(), reduced.end(), true);
    return reduced;
  }
  for (const SymExpr& e : dims.ints) {
    auto d = StaticInt(ctx, e, "dim");
    if (!d.ok()) return d.status();
    auto w = ctx.WrapDim(*d, rank);
    if (!w.ok()) return w.status();
    if (rank == 0) continue;
    if (reduced[*w]) {
      return ctx.Invalid(absl::StrCat(
          "dim ", *w, " appears multiple times in the list of dims"));
    }
    reduced[*w] = true;
  }
  return reduced;
}

std::vector<SymExpr> ReducedShape(const std::vector<SymExpr>& sizes,
                                  const std::vector<bool>& reduced,
                                  bool keepdim) {
  std::vector<SymExpr> out;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (!reduced[d]) {
      out.push_back(sizes[d]);
    } else if (keepdim) {
      out.push_back(SymExpr(1));
    }
  }
  return out;
}

absl::StatusOr<int64_t> StaticInt(const OpContext& ctx, const SymExpr& e,
                                  absl::string_view what) {
  if (auto c = e.AsConstant()) return *c;
  return ctx.Invalid(absl::StrCat(what, " must be a static int, got ",
                                  e.ToString(ctx.graph().SymbolNames())));
}

}  // namespace kiln::ops
