// Signatures of the views and copies: view, reshape, _unsafe_view, permute,
// transpose, t, expand, repeat, unsqueeze, squeeze, alias, as_strided,
// as_strided_scatter, clone, lift_fresh_copy and copy (the functional copy_:
// src broadcast to self's shape, in self's dtype). In the
// graph these are value transformations (graphs are functional); their
// reference semantics and lowerings are compiler/ops/views_reference.cc and
// views_lowering.cc.
#include "graph/ops/views.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/ops/signature_util.h"

namespace kiln {
namespace ops {

absl::StatusOr<std::vector<DType>> SameDTypeAsSelf(const OpContext& ctx) {
  return std::vector<DType>{ctx.type(0).dtype};
}

int WrapCheckedDim(int64_t dim, int rank) {
  return static_cast<int>(dim < 0 ? dim + std::max(rank, 1) : dim);
}

std::vector<int> TransposePermutation(int rank, int a, int b) {
  std::vector<int> perm(rank);
  for (int i = 0; i < rank; ++i) perm[i] = i;
  if (rank > 0) std::swap(perm[a], perm[b]);
  return perm;
}

absl::StatusOr<std::vector<bool>> SqueezedDims(const Node& node, int rank,
                                               const OpContext* ctx) {
  std::vector<bool> sel(rank, node.args.size() == 1);
  if (node.args.size() == 1) return sel;
  std::vector<SymExpr> dims =
      node.args[1].kind == Attr::Kind::kInt
          ? std::vector<SymExpr>{SymExpr(node.args[1].i)}
          : node.args[1].ints;
  for (const SymExpr& e : dims) {
    int64_t d = e.AsConstant().value_or(0);
    if (ctx) {
      auto w = ctx->WrapDim(d, rank);
      if (!w.ok()) return w.status();
      d = *w;
      // As PyTorch's dim_list_to_bitset (squeeze.dims).
      if (rank > 0 && sel[d]) {
        return ctx->Invalid(absl::StrCat(
            "dim ", d, " appears multiple times in the list of dims"));
      }
    } else {
      d = WrapCheckedDim(d, rank);
    }
    if (rank > 0) sel[d] = true;
  }
  return sel;
}

int SplitDimArg(const Node& node) {
  return node.op->name == "aten.unbind.int" ? 1 : 2;
}

std::vector<int> ScatterDimOrder(const StridedView& view) {
  std::vector<int> dims;
  for (size_t d = 0; d < view.sizes.size(); ++d) {
    if (view.sizes[d] > 1) dims.push_back(static_cast<int>(d));
  }
  std::stable_sort(dims.begin(), dims.end(), [&](int a, int b) {
    return view.strides[a] > view.strides[b];
  });
  return dims;
}

absl::StatusOr<StridedView> StridedViewOf(const Node& node, int first,
                                          int64_t self_numel, bool scatter,
                                          const OpContext* ctx) {
  StridedView view;
  const Attr& offset = node.args[first + 2];
  if (offset.kind == Attr::Kind::kInt) view.offset = offset.i;
  std::string bad;
  auto statics = [&](const std::vector<SymExpr>& in, const char* what,
                     std::vector<int64_t>* out) {
    for (const SymExpr& e : in) {
      std::optional<int64_t> c = e.AsConstant();
      if (!c || *c < 0) {
        if (bad.empty()) {
          bad = absl::StrCat(what, " must be static and non-negative, got ",
                             e.ToString(ctx->graph().SymbolNames()));
        }
        out->push_back(0);
      } else {
        out->push_back(*c);
      }
    }
  };
  if (!ctx) {
    for (const SymExpr& e : node.args[first].ints)
      view.sizes.push_back(*e.AsConstant());
    for (const SymExpr& e : node.args[first + 1].ints)
      view.strides.push_back(*e.AsConstant());
    return view;
  }
  statics(node.args[first].ints, "size", &view.sizes);
  statics(node.args[first + 1].ints, "stride", &view.strides);
  if (!bad.empty()) return ctx->Invalid(bad);
  if (view.sizes.size() != view.strides.size()) {
    return ctx->Invalid(absl::StrCat(
        "mismatch in length of strides and shape (", view.strides.size(),
        " strides, ", view.sizes.size(), " sizes)"));
  }
  if (view.offset < 0) {
    return ctx->Invalid(absl::StrCat("negative storage offset ", view.offset));
  }
  int64_t last = view.offset, numel = 1;
  for (size_t d = 0; d < view.sizes.size(); ++d) {
    numel *= view.sizes[d];
    last += (view.sizes[d] - 1) * view.strides[d];
  }
  if (numel > 0 && last >= self_numel) {
    return ctx->Invalid(absl::StrCat(
        "the view reaches element ", last, " of self, which has ", self_numel,
        " (sizes, strides and storage_offset address self's elements in "
        "row-major order)"));
  }
  if (scatter && numel > 0) {
    int64_t span = 0;  // the positions the smaller-stride dims reach
    std::vector<int> order = ScatterDimOrder(view);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      if (view.strides[*it] <= span) {
        return ctx->Invalid(absl::StrCat(
            "dim ", *it, " (size ", view.sizes[*it], ", stride ",
            view.strides[*it],
            ") overlaps the dims of smaller stride: as_strided_scatter "
            "takes views whose elements have distinct positions, each "
            "stride above the span of the smaller ones"));
      }
      span += (view.sizes[*it] - 1) * view.strides[*it];
    }
  }
  return view;
}

}  // namespace ops

namespace {

using ops::Arg;
using ops::KwArg;
using ops::SameDTypeAsSelf;

// view, reshape, _unsafe_view: one -1 is inferred; the element count must
// match.
absl::StatusOr<Shapes> ViewShape(const OpContext& ctx) {
  const TensorType& in = ctx.type(0);
  const std::vector<SymExpr>& requested = ctx.arg(1).ints;
  const SymExpr numel = NumElements(in.sizes);
  int infer = -1;
  SymExpr known(1);
  for (size_t i = 0; i < requested.size(); ++i) {
    if (requested[i] == SymExpr(-1)) {
      if (infer >= 0)
        return ctx.Invalid("only one dimension can be inferred (-1)");
      infer = static_cast<int>(i);
      continue;
    }
    if (auto c = requested[i].AsConstant(); c && *c < 0) {
      return ctx.Invalid(absl::StrCat("invalid size ", *c, " at position ", i));
    }
    known = known * requested[i];
  }
  std::vector<SymExpr> out = requested;
  if (infer >= 0) {
    std::optional<SymExpr> q;
    if (known != SymExpr(0)) q = SymExpr::DivExact(numel, known);
    if (!q) {
      return ctx.Invalid(
          absl::StrCat("cannot infer the -1 size: ",
                       numel.ToString(ctx.graph().SymbolNames()),
                       " elements are not a multiple of ",
                       known.ToString(ctx.graph().SymbolNames())));
    }
    out[infer] = *q;
  }
  if (NumElements(out) != numel) {
    return ctx.Invalid(absl::StrCat(
        "shape with ", NumElements(out).ToString(ctx.graph().SymbolNames()),
        " elements is invalid for an input of ",
        numel.ToString(ctx.graph().SymbolNames()), " elements"));
  }
  return Shapes{out};
}

// permute's dims checked: static, in range, each dim once.
absl::StatusOr<std::vector<int>> PermutationOf(const OpContext& ctx,
                                               const std::vector<SymExpr>& dims,
                                               int rank) {
  if (static_cast<int>(dims.size()) != rank) {
    return ctx.Invalid(absl::StrCat("permutation has ", dims.size(),
                                    " dims, tensor has rank ", rank));
  }
  std::vector<int> perm;
  std::vector<bool> seen(rank, false);
  for (const SymExpr& e : dims) {
    auto d = ops::StaticInt(ctx, e, "dim");
    if (!d.ok()) return d.status();
    auto w = ctx.WrapDim(*d, rank);
    if (!w.ok()) return w.status();
    if (seen[*w])
      return ctx.Invalid(
          absl::StrCat("dim ", *w, " repeats in the permutation"));
    seen[*w] = true;
    perm.push_back(*w);
  }
  return perm;
}

absl::StatusOr<Shapes> PermuteShape(const OpContext& ctx) {
  auto perm = PermutationOf(ctx, ctx.arg(1).ints, ctx.type(0).rank());
  if (!perm.ok()) return perm.status();
  std::vector<SymExpr> out;
  for (int p : *perm) out.push_back(ctx.type(0).sizes[p]);
  return Shapes{out};
}

absl::StatusOr<Shapes> TransposeShape(const OpContext& ctx) {
  const int rank = ctx.type(0).rank();
  auto a = ctx.WrapDim(ctx.arg(1).i, rank);
  if (!a.ok()) return a.status();
  auto b = ctx.WrapDim(ctx.arg(2).i, rank);
  if (!b.ok()) return b.status();
  std::vector<SymExpr> out = ctx.type(0).sizes;
  if (rank > 0) std::swap(out[*a], out[*b]);
  return Shapes{out};
}

// t: rank <= 2, the dims reversed.
absl::StatusOr<Shapes> TShape(const OpContext& ctx) {
  std::vector<SymExpr> out = ctx.type(0).sizes;
  if (out.size() > 2) {
    return ctx.Invalid(absl::StrCat(
        "t() expects a tensor of rank <= 2, got rank ", out.size()));
  }
  std::reverse(out.begin(), out.end());
  return Shapes{out};
}

// expand: new leading dims, -1 keeps a dim, only size-1 dims expand.
absl::StatusOr<Shapes> ExpandShape(const OpContext& ctx) {
  const std::vector<SymExpr>& in = ctx.type(0).sizes;
  const std::vector<SymExpr>& req = ctx.arg(1).ints;
  if (req.size() < in.size()) {
    return ctx.Invalid(absl::StrCat("the number of sizes (", req.size(),
                                    ") must be at least the tensor's rank (",
                                    in.size(), ")"));
  }
  const size_t lead = req.size() - in.size();
  std::vector<SymExpr> out(req.size());
  for (size_t i = 0; i < req.size(); ++i) {
    if (i < lead) {
      if (auto c = req[i].AsConstant(); c && *c < 0) {
        return ctx.Invalid(absl::StrCat(
            "size ", *c, " is not allowed for new leading dim ", i));
      }
      out[i] = req[i];
      continue;
    }
    const SymExpr& have = in[i - lead];
    if (req[i] == SymExpr(-1) || req[i] == have) {
      out[i] = have;
    } else if (have == SymExpr(1)) {
      if (auto c = req[i].AsConstant(); c && *c < 0) {
        return ctx.Invalid(absl::StrCat("invalid size ", *c, " at dim ", i));
      }
      out[i] = req[i];
    } else {
      return ctx.Invalid(
          absl::StrCat("cannot expand dim ", i, " of size ",
                       have.ToString(ctx.graph().SymbolNames()), " to ",
                       req[i].ToString(ctx.graph().SymbolNames()),
                       " (only size-1 dims expand)"));
    }
  }
  return Shapes{out};
}

absl::StatusOr<Shapes> UnsqueezeShape(const OpContext& ctx) {
  std::vector<SymExpr> out = ctx.type(0).sizes;
  auto d = ctx.WrapDim(ctx.arg(1).i, static_cast<int>(out.size()) + 1);
  if (!d.ok()) return d.status();
  out.insert(out.begin() + *d, SymExpr(1));
  return Shapes{out};
}

// squeeze.default, .dim, .dims: only static size-1 dims go; a symbolic
// size is >= 2.
absl::StatusOr<Shapes> SqueezeShape(const OpContext& ctx) {
  const std::vector<SymExpr>& in = ctx.type(0).sizes;
  auto sel = ops::SqueezedDims(ctx.node(), static_cast<int>(in.size()), &ctx);
  if (!sel.ok()) return sel.status();
  std::vector<SymExpr> out;
  for (size_t d = 0; d < in.size(); ++d) {
    if (!((*sel)[d] && in[d] == SymExpr(1))) out.push_back(in[d]);
  }
  return Shapes{out};
}

// clone, alias: self's sizes.
absl::StatusOr<Shapes> CloneShape(const OpContext& ctx) {
  return Shapes{ctx.type(0).sizes};
}

// copy(self, src): src must broadcast to self's sizes, which the result has.
absl::StatusOr<Shapes> CopyShape(const OpContext& ctx) {
  const std::vector<SymExpr>& self = ctx.type(0).sizes;
  auto b = ops::Broadcast(ctx, self, ctx.type(1).sizes);
  if (!b.ok()) return b.status();
  if (*b != self) {
    return ctx.Invalid(
        "src does not broadcast to self's shape (copy writes self's shape)");
  }
  return Shapes{self};
}

// split.Tensor, split_with_sizes, unbind.int: the sizes of the pieces along
// the dim. split and unbind need a static size there (the number of pieces
// is the number of outputs); split_with_sizes' sizes must add up to it.
absl::StatusOr<std::vector<SymExpr>> SplitPieces(const OpContext& ctx,
                                                 int* dim) {
  const TensorType& in = ctx.type(0);
  if (in.rank() == 0) return ctx.Invalid("expects a tensor of rank >= 1");
  const int rank = in.rank();
  auto d = ctx.WrapDim(ctx.arg(ops::SplitDimArg(ctx.node())).i, rank);
  if (!d.ok()) return d.status();
  *dim = *d;
  const SymExpr& size = in.sizes[*d];
  const std::string& op = ctx.node().op->name;
  if (op == "aten.split_with_sizes.default") {
    SymExpr total(0);
    for (const SymExpr& e : ctx.arg(1).ints) {
      if (auto c = e.AsConstant(); c && *c < 0) {
        return ctx.Invalid(absl::StrCat("split size ", *c, " is negative"));
      }
      total = total + e;
    }
    if (total != size) {
      return ctx.Invalid(absl::StrCat(
          "split sizes add up to ", total.ToString(ctx.graph().SymbolNames()),
          ", the dim has size ", size.ToString(ctx.graph().SymbolNames())));
    }
    return ctx.arg(1).ints;
  }
  auto n = ops::StaticInt(ctx, size, "the split dim's size");
  if (!n.ok()) return n.status();
  if (op == "aten.unbind.int") return std::vector<SymExpr>(*n, SymExpr(1));
  const int64_t split = ctx.arg(1).i;
  if (split < 0 || (split == 0 && *n > 0)) {
    return ctx.Invalid(absl::StrCat(
        "split_size ", split, " must be positive for a dim of size ", *n));
  }
  if (*n == 0) return std::vector<SymExpr>{SymExpr(0)};
  std::vector<SymExpr> pieces;
  for (int64_t at = 0; at < *n; at += split) {
    pieces.push_back(SymExpr(std::min(split, *n - at)));
  }
  return pieces;
}

absl::StatusOr<Shapes> SplitShape(const OpContext& ctx) {
  int d = 0;
  auto pieces = SplitPieces(ctx, &d);
  if (!pieces.ok()) return pieces.status();
  const bool unbind = ctx.node().op->name == "aten.unbind.int";
  Shapes out;
  for (const SymExpr& p : *pieces) {
    std::vector<SymExpr> sizes = ctx.type(0).sizes;
    if (unbind) {
      sizes.erase(sizes.begin() + d);
    } else {
      sizes[d] = p;
    }
    out.push_back(std::move(sizes));
  }
  return out;
}

// repeat(self, repeats): self padded with leading size-1 dims to
// len(repeats) dims, each dim's size times its (static, non-negative)
// repeat.
absl::StatusOr<Shapes> RepeatShape(const OpContext& ctx) {
  const std::vector<SymExpr>& in = ctx.type(0).sizes;
  const std::vector<SymExpr>& repeats = ctx.arg(1).ints;
  if (repeats.size() < in.size()) {
    return ctx.Invalid(absl::StrCat(
        "number of dimensions of repeat dims (", repeats.size(),
        ") can not be smaller than number of dimensions of tensor (", in.size(),
        ")"));
  }
  const size_t lead = repeats.size() - in.size();
  std::vector<SymExpr> out;
  for (size_t d = 0; d < repeats.size(); ++d) {
    std::optional<int64_t> r = repeats[d].AsConstant();
    if (!r || *r < 0) {
      return ctx.Invalid(absl::StrCat(
          "repeat ", repeats[d].ToString(ctx.graph().SymbolNames()), " of dim ",
          d, ": Kiln takes static, non-negative repeats"));
    }
    out.push_back(d < lead ? SymExpr(*r) : in[d - lead] * SymExpr(*r));
  }
  return Shapes{out};
}

// as_strided(self, size, stride, storage_offset): `size`; self's element
// count must be static (ops::StridedViewOf checks the rest).
absl::StatusOr<Shapes> AsStridedShape(const OpContext& ctx) {
  auto n = ops::StaticInt(ctx, NumElements(ctx.type(0).sizes), "self's size");
  if (!n.ok()) return n.status();
  auto view = ops::StridedViewOf(ctx.node(), 1, *n, false, &ctx);
  if (!view.ok()) return view.status();
  return Shapes{std::vector<SymExpr>(view->sizes.begin(), view->sizes.end())};
}

// as_strided_scatter(self, src, size, stride, storage_offset): self's shape;
// src has the view's shape and self's dtype.
absl::StatusOr<Shapes> AsStridedScatterShape(const OpContext& ctx) {
  auto n = ops::StaticInt(ctx, NumElements(ctx.type(0).sizes), "self's size");
  if (!n.ok()) return n.status();
  auto view = ops::StridedViewOf(ctx.node(), 2, *n, true, &ctx);
  if (!view.ok()) return view.status();
  if (ctx.type(1).dtype != ctx.type(0).dtype) {
    return ctx.Invalid(absl::StrCat("src has dtype ",
                                    DTypeName(ctx.type(1).dtype), ", self ",
                                    DTypeName(ctx.type(0).dtype)));
  }
  if (ctx.type(1).sizes !=
      std::vector<SymExpr>(view->sizes.begin(), view->sizes.end())) {
    std::vector<std::string> got;
    for (const SymExpr& e : ctx.type(1).sizes)
      got.push_back(e.ToString(ctx.graph().SymbolNames()));
    return ctx.Invalid(absl::StrCat("src has shape [", absl::StrJoin(got, ", "),
                                    "], the view it is written to [",
                                    absl::StrJoin(view->sizes, ", "), "]"));
  }
  return Shapes{ctx.type(0).sizes};
}

absl::StatusOr<std::vector<DType>> SplitDType(const OpContext& ctx) {
  int d = 0;
  auto pieces = SplitPieces(ctx, &d);
  if (!pieces.ok()) return pieces.status();
  return std::vector<DType>(pieces->size(), ctx.type(0).dtype);
}

ArgSpec Self() { return Arg("self", ArgKind::kTensor); }

}  // namespace

void RegisterViewSignatures(OpSignatures& table) {
  table.Add({.name = "aten.view.default",
             .op_class = OpClass::kView,
             .schema = {Self(), Arg("size", ArgKind::kIntList)},
             .num_outputs = 1,
             .shape = ViewShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.reshape.default",
             .op_class = OpClass::kView,
             .schema = {Self(), Arg("size", ArgKind::kIntList)},
             .num_outputs = 1,
             .shape = ViewShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten._unsafe_view.default",
             .op_class = OpClass::kView,
             .schema = {Self(), Arg("size", ArgKind::kIntList)},
             .num_outputs = 1,
             .shape = ViewShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.permute.default",
             .op_class = OpClass::kView,
             .schema = {Self(), Arg("dims", ArgKind::kIntList)},
             .num_outputs = 1,
             .shape = PermuteShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.transpose.int",
             .op_class = OpClass::kView,
             .schema = {Self(), Arg("dim0", ArgKind::kInt),
                        Arg("dim1", ArgKind::kInt)},
             .num_outputs = 1,
             .shape = TransposeShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.t.default",
             .op_class = OpClass::kView,
             .schema = {Self()},
             .num_outputs = 1,
             .shape = TShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.expand.default",
             .op_class = OpClass::kView,
             .schema = {Self(), Arg("size", ArgKind::kIntList),
                        KwArg("implicit", ArgKind::kBool, Attr::Bool(false))},
             .num_outputs = 1,
             .shape = ExpandShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.unsqueeze.default",
             .op_class = OpClass::kView,
             .schema = {Self(), Arg("dim", ArgKind::kInt)},
             .num_outputs = 1,
             .shape = UnsqueezeShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.squeeze.default",
             .op_class = OpClass::kView,
             .schema = {Self()},
             .num_outputs = 1,
             .shape = SqueezeShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.squeeze.dim",
             .op_class = OpClass::kView,
             .schema = {Self(), Arg("dim", ArgKind::kInt)},
             .num_outputs = 1,
             .shape = SqueezeShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.squeeze.dims",
             .op_class = OpClass::kView,
             .schema = {Self(), Arg("dim", ArgKind::kIntList)},
             .num_outputs = 1,
             .shape = SqueezeShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.alias.default",
             .op_class = OpClass::kView,
             .schema = {Self()},
             .num_outputs = 1,
             .shape = CloneShape,
             .dtype = SameDTypeAsSelf});
  // Functional copy_: src broadcast to self's shape, in self's dtype.
  table.Add({.name = "aten.copy.default",
             .op_class = OpClass::kData,
             .schema = {Self(), Arg("src", ArgKind::kTensor),
                        ops::ArgDefault("non_blocking", ArgKind::kBool,
                                        Attr::Bool(false))},
             .num_outputs = 1,
             .shape = CopyShape,
             .dtype = SameDTypeAsSelf});
  // Multi-output views: one output per piece.
  table.Add({.name = "aten.split.Tensor",
             .op_class = OpClass::kView,
             .schema = {Self(), Arg("split_size", ArgKind::kInt),
                        ops::ArgDefault("dim", ArgKind::kInt, Attr::Int(0))},
             .num_outputs = kVariableOutputs,
             .shape = SplitShape,
             .dtype = SplitDType});
  table.Add({.name = "aten.split_with_sizes.default",
             .op_class = OpClass::kView,
             .schema = {Self(), Arg("split_sizes", ArgKind::kIntList),
                        ops::ArgDefault("dim", ArgKind::kInt, Attr::Int(0))},
             .num_outputs = kVariableOutputs,
             .shape = SplitShape,
             .dtype = SplitDType});
  table.Add(
      {.name = "aten.unbind.int",
       .op_class = OpClass::kView,
       .schema = {Self(), ops::ArgDefault("dim", ArgKind::kInt, Attr::Int(0))},
       .num_outputs = kVariableOutputs,
       .shape = SplitShape,
       .dtype = SplitDType});
  table.Add({.name = "aten.as_strided.default",
             .op_class = OpClass::kView,
             .schema = {Self(), Arg("size", ArgKind::kIntList),
                        Arg("stride", ArgKind::kIntList),
                        ops::ArgDefault("storage_offset", ArgKind::kOptionalInt,
                                        Attr::None())},
             .num_outputs = 1,
             .shape = AsStridedShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.as_strided_scatter.default",
             .op_class = OpClass::kData,
             .schema = {Self(), Arg("src", ArgKind::kTensor),
                        Arg("size", ArgKind::kIntList),
                        Arg("stride", ArgKind::kIntList),
                        ops::ArgDefault("storage_offset", ArgKind::kOptionalInt,
                                        Attr::None())},
             .num_outputs = 1,
             .shape = AsStridedScatterShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.repeat.default",
             .op_class = OpClass::kData,
             .schema = {Self(), Arg("repeats", ArgKind::kIntList)},
             .num_outputs = 1,
             .shape = RepeatShape,
             .dtype = SameDTypeAsSelf});
  // lift_fresh_copy: a copy of a constant the graph captured (a tensor
  // literal in forward); values are immutable, so a clone.
  table.Add({.name = "aten.lift_fresh_copy.default",
             .op_class = OpClass::kData,
             .schema = {Self()},
             .num_outputs = 1,
             .shape = CloneShape,
             .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.clone.default",
             .op_class = OpClass::kData,
             .schema = {Self(), KwArg("memory_format", ArgKind::kIgnored,
                                      Attr::None())},
             .num_outputs = 1,
             .shape = CloneShape,
             .dtype = SameDTypeAsSelf});
}

}  // namespace kiln
