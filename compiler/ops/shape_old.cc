// Views and data movement (view, reshape, permute, transpose, expand,
// squeeze/unsqueeze, slice, select, clone, cat) and creation ops (full,
// scalar_tensor, arange).
//
// In the graph these are value transformations (graphs are functional).
// Reference semantics build real strided views over the input's storage, so
// the evaluator exercises the same index arithmetic the loop IR must get
// right; reshape of a non-contiguous value copies, as PyTorch's does.
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "compiler/ops/legacy.h"

namespace kiln {
namespace {

using ops::Arg;
using ops::ArgDefault;
using ops::KwArg;
using Shapes = std::vector<std::vector<SymExpr>>;

std::vector<int64_t> ConcreteInts(const std::vector<SymExpr>& v) {
  std::vector<int64_t> out;
  for (const SymExpr& e : v) out.push_back(e.AsConstant().value_or(0));
  return out;
}

// Registers an op whose dtype is its first argument's.
void AddSameDType(OpRegistry& r, std::string name, OpClass cls,
                  std::vector<ArgSpec> schema, ShapeRule shape,
                  ReferenceFn ref, LowerFn lower = nullptr) {
  OpDef def;
  def.name = std::move(name);
  def.op_class = cls;
  def.schema = std::move(schema);
  def.shape = std::move(shape);
  def.dtype = [](const OpContext& ctx) -> absl::StatusOr<std::vector<DType>> {
    return std::vector<DType>{ctx.type(0).dtype};
  };
  def.reference = std::move(ref);
  def.lower = std::move(lower);
  r.Add(std::move(def));
}

std::vector<HostTensor> One(HostTensor t) {
  return std::vector<HostTensor>{std::move(t)};
}

// ---- view / reshape ----

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

absl::StatusOr<std::vector<HostTensor>> ViewRef(const RefContext& ctx) {
  HostTensor c = ctx.tensors[0].IsContiguous() ? ctx.tensors[0]
                                               : ctx.tensors[0].Contiguous();
  const std::vector<int64_t>& sizes = ctx.out_sizes[0];
  std::vector<int64_t> strides(sizes.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    strides[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  return One(HostTensor::View(c, sizes, strides, c.offset()));
}

// ---- permute / transpose / t ----

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

HostTensor Permuted(const HostTensor& t, const std::vector<int>& perm) {
  std::vector<int64_t> sizes, strides;
  for (int p : perm) {
    sizes.push_back(t.sizes()[p]);
    strides.push_back(t.strides()[p]);
  }
  return HostTensor::View(t, sizes, strides, t.offset());
}

int Wrap(int64_t d, int rank) {
  return static_cast<int>(d < 0 ? d + std::max(rank, 1) : d);
}

// The transposition permutation (identity for rank 0).
std::vector<int> TransposePerm(int rank, int a, int b) {
  std::vector<int> perm(rank);
  for (int i = 0; i < rank; ++i) perm[i] = i;
  if (rank > 0) std::swap(perm[a], perm[b]);
  return perm;
}

// ---- slice / select ----

// PyTorch's slice bounds on a dim of concrete size n.
struct SliceBounds {
  int64_t start, length;
};
SliceBounds ClampSlice(int64_t n, std::optional<int64_t> start,
                       std::optional<int64_t> end, int64_t step) {
  int64_t s = start.value_or(0),
          e = end.value_or(std::numeric_limits<int64_t>::max());
  if (s < 0) s += n;
  if (e < 0) e += n;
  s = std::clamp<int64_t>(s, 0, n);
  e = std::clamp<int64_t>(e, s, n);
  return {s, (e - s + step - 1) / step};
}
std::optional<int64_t> OptInt(const Attr& a) {
  if (a.is_none()) return std::nullopt;
  return a.i;
}


// ---- lowering helpers ----

absl::StatusOr<std::vector<LoweredValue>> Values(LoweredValue v) {
  return std::vector<LoweredValue>{std::move(v)};
}

LoweredValue PermuteValue(const LoweredValue& v, const std::vector<int>& perm) {
  std::vector<Expr> j(perm.size());
  std::vector<SymExpr> sizes(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) {
    j[perm[k]] = ir::Var(static_cast<int>(k));
    sizes[k] = v.sizes[perm[k]];
  }
  return LowerContext::Remap(v, j, sizes);
}

// view/reshape as an index map. Size-1 dims are dropped on both sides; the
// rest are matched into groups with equal element counts (a flatten or an
// unflatten is one group), and only within a group does the map need a
// division or modulus. Groups that cannot be matched (symbolic sizes that
// don't divide) fall back to one group over all dims.
absl::StatusOr<std::vector<LoweredValue>> LowerView(LowerContext& ctx) {
  const LoweredValue& v = ctx.value(0);
  const std::vector<SymExpr>& out = ctx.out_type().sizes;
  std::vector<int> in_dims, out_dims;  // non-1 dims
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    if (v.sizes[d] != SymExpr(1)) in_dims.push_back(static_cast<int>(d));
  }
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] != SymExpr(1)) out_dims.push_back(static_cast<int>(d));
  }
  std::vector<Expr> j(v.sizes.size(), ir::IntConst(0));
  // Emits the map for one group: in_dims[a0, a1) <- out_dims[b0, b1).
  auto emit = [&](size_t a0, size_t a1, size_t b0, size_t b1) {
    Expr flat = ir::IntConst(0);
    for (size_t b = b0; b < b1; ++b) {
      flat = ir::Add(ir::Mul(flat, ir::FromSym(out[out_dims[b]])), ir::Var(out_dims[b]));
    }
    SymExpr stride(1);
    for (size_t a = a1; a-- > a0;) {
      Expr e = ir::FloorDiv(flat, ir::FromSym(stride));
      if (a != a0) e = ir::Mod(e, ir::FromSym(v.sizes[in_dims[a]]));
      if (a1 - a0 == 1 && b1 - b0 == 1) e = ir::Var(out_dims[b0]);
      j[in_dims[a]] = e;
      stride = stride * v.sizes[in_dims[a]];
    }
  };
  size_t a = 0, b = 0;
  bool grouped = true;
  while (a < in_dims.size() && b < out_dims.size()) {
    size_t a1 = a + 1, b1 = b + 1;
    SymExpr pa = v.sizes[in_dims[a]], pb = out[out_dims[b]];
    while (pa != pb) {
      if (SymExpr::DivExact(pb, pa) && a1 < in_dims.size()) {
        pa = pa * v.sizes[in_dims[a1++]];
      } else if (SymExpr::DivExact(pa, pb) && b1 < out_dims.size()) {
        pb = pb * out[out_dims[b1++]];
      } else {
        grouped = false;
        break;
      }
    }
    if (!grouped) break;
    emit(a, a1, b, b1);
    a = a1;
    b = b1;
  }
  if (!grouped || a != in_dims.size() || b != out_dims.size()) {
    emit(0, in_dims.size(), 0, out_dims.size());
  }
  return Values(LowerContext::Remap(v, j, out));
}

LoweredValue PointwiseValue(LowerContext& ctx, Expr body) {
  LoopNode node;
  node.kind = LoopNode::Kind::kPointwise;
  node.dtype = ctx.out_type().dtype;
  node.sizes = ctx.out_type().sizes;
  node.body = ir::Cast(std::move(body), node.dtype);
  return ctx.AddNode(std::move(node));
}

}  // namespace

void RegisterShapeOps(OpRegistry& r) {
  const Attr none = Attr::None();
  auto self = [] { return Arg("self", ArgKind::kTensor); };

  for (const char* name : {"aten.view.default", "aten.reshape.default",
                           "aten._unsafe_view.default"}) {
    AddSameDType(r, name, OpClass::kView,
                 {self(), Arg("size", ArgKind::kIntList)}, ViewShape, ViewRef,
      LowerView);
  }

  AddSameDType(
      r, "aten.permute.default", OpClass::kView,
      {self(), Arg("dims", ArgKind::kIntList)},
      [](const OpContext& ctx) -> absl::StatusOr<Shapes> {
        auto perm = PermutationOf(ctx, ctx.arg(1).ints, ctx.type(0).rank());
        if (!perm.ok()) return perm.status();
        std::vector<SymExpr> out;
        for (int p : *perm) out.push_back(ctx.type(0).sizes[p]);
        return Shapes{out};
      },
      [](const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
        const int rank = ctx.tensors[0].rank();
        std::vector<int> perm;
        for (const SymExpr& e : ctx.arg(1).ints)
          perm.push_back(Wrap(*e.AsConstant(), rank));
        return One(Permuted(ctx.tensors[0], perm));
      },
      [](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
        const int rank = static_cast<int>(ctx.value(0).sizes.size());
        std::vector<int> perm;
        for (const SymExpr& e : ctx.arg(1).ints) perm.push_back(Wrap(*e.AsConstant(), rank));
        return Values(PermuteValue(ctx.value(0), perm));
      });

  AddSameDType(
      r, "aten.transpose.int", OpClass::kView,
      {self(), Arg("dim0", ArgKind::kInt), Arg("dim1", ArgKind::kInt)},
      [](const OpContext& ctx) -> absl::StatusOr<Shapes> {
        const int rank = ctx.type(0).rank();
        auto a = ctx.WrapDim(ctx.arg(1).i, rank);
        if (!a.ok()) return a.status();
        auto b = ctx.WrapDim(ctx.arg(2).i, rank);
        if (!b.ok()) return b.status();
        std::vector<SymExpr> out = ctx.type(0).sizes;
        if (rank > 0) std::swap(out[*a], out[*b]);
        return Shapes{out};
      },
      [](const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
        const int rank = ctx.tensors[0].rank();
        return One(Permuted(ctx.tensors[0],
                            TransposePerm(rank, Wrap(ctx.arg(1).i, rank),
                                          Wrap(ctx.arg(2).i, rank))));
      },
      [](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
        const int rank = static_cast<int>(ctx.value(0).sizes.size());
        return Values(PermuteValue(
            ctx.value(0), TransposePerm(rank, Wrap(ctx.arg(1).i, rank), Wrap(ctx.arg(2).i, rank))));
      });

  AddSameDType(
      r, "aten.t.default", OpClass::kView, {self()},
      [](const OpContext& ctx) -> absl::StatusOr<Shapes> {
        std::vector<SymExpr> out = ctx.type(0).sizes;
        if (out.size() > 2) {
          return ctx.Invalid(absl::StrCat(
              "t() expects a tensor of rank <= 2, got rank ", out.size()));
        }
        std::reverse(out.begin(), out.end());
        return Shapes{out};
      },
      [](const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
        const int rank = ctx.tensors[0].rank();
        return One(Permuted(ctx.tensors[0], rank == 2
                                                ? std::vector<int>{1, 0}
                                                : TransposePerm(rank, 0, 0)));
      },
      [](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
        const int rank = static_cast<int>(ctx.value(0).sizes.size());
        return Values(PermuteValue(ctx.value(0), rank == 2 ? std::vector<int>{1, 0}
                                                           : TransposePerm(rank, 0, 0)));
      });

  AddSameDType(
      r, "aten.expand.default", OpClass::kView,
      {self(), Arg("size", ArgKind::kIntList),
       KwArg("implicit", ArgKind::kBool, Attr::Bool(false))},
      [](const OpContext& ctx) -> absl::StatusOr<Shapes> {
        const std::vector<SymExpr>& in = ctx.type(0).sizes;
        const std::vector<SymExpr>& req = ctx.arg(1).ints;
        if (req.size() < in.size()) {
          return ctx.Invalid(absl::StrCat(
              "the number of sizes (", req.size(),
              ") must be at least the tensor's rank (", in.size(), ")"));
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
              return ctx.Invalid(
                  absl::StrCat("invalid size ", *c, " at dim ", i));
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
      },
      [](const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
        return One(ops::BroadcastTo(ctx.tensors[0], ctx.out_sizes[0]));
      },
      [](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
        const LoweredValue& v = ctx.value(0);
        const std::vector<SymExpr>& out = ctx.out_type().sizes;
        const size_t lead = out.size() - v.sizes.size();
        std::vector<Expr> j;
        for (size_t d = 0; d < v.sizes.size(); ++d) {
          const bool expanded = v.sizes[d] == SymExpr(1) && out[lead + d] != SymExpr(1);
          j.push_back(expanded ? ir::IntConst(0) : ir::Var(static_cast<int>(lead + d)));
        }
        return Values(LowerContext::Remap(v, j, out));
      });

  AddSameDType(
      r, "aten.unsqueeze.default", OpClass::kView,
      {self(), Arg("dim", ArgKind::kInt)},
      [](const OpContext& ctx) -> absl::StatusOr<Shapes> {
        std::vector<SymExpr> out = ctx.type(0).sizes;
        auto d = ctx.WrapDim(ctx.arg(1).i, static_cast<int>(out.size()) + 1);
        if (!d.ok()) return d.status();
        out.insert(out.begin() + *d, SymExpr(1));
        return Shapes{out};
      },
      [](const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
        const HostTensor& t = ctx.tensors[0];
        const int d = Wrap(ctx.arg(1).i, t.rank() + 1);
        std::vector<int64_t> sizes = t.sizes(), strides = t.strides();
        const int64_t stride = d < t.rank() ? sizes[d] * strides[d] : 1;
        sizes.insert(sizes.begin() + d, 1);
        strides.insert(strides.begin() + d, stride);
        return One(HostTensor::View(t, sizes, strides, t.offset()));
      },
      [](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
        const LoweredValue& v = ctx.value(0);
        const int rank = static_cast<int>(v.sizes.size());
        const int d = Wrap(ctx.arg(1).i, rank + 1);
        std::vector<Expr> j;
        for (int k = 0; k <= rank; ++k) {
          if (k != d) j.push_back(ir::Var(k));
        }
        return Values(LowerContext::Remap(v, j, ctx.out_type().sizes));
      });

  // squeeze: only static size-1 dims go; a symbolic size is >= 2.
  struct SqueezeVariant {
    const char* name;
    std::vector<ArgSpec> schema;
  };
  const SqueezeVariant squeezes[] = {
      {"aten.squeeze.default", {self()}},
      {"aten.squeeze.dim", {self(), Arg("dim", ArgKind::kInt)}},
      {"aten.squeeze.dims", {self(), Arg("dim", ArgKind::kIntList)}},
  };
  for (const SqueezeVariant& v : squeezes) {
    auto selected =
        [](const Node& node, int rank,
           const OpContext* ctx) -> absl::StatusOr<std::vector<bool>> {
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
          d = Wrap(d, rank);
        }
        if (rank > 0) sel[d] = true;
      }
      return sel;
    };
    AddSameDType(
        r, v.name, OpClass::kView, v.schema,
        [selected](const OpContext& ctx) -> absl::StatusOr<Shapes> {
          const std::vector<SymExpr>& in = ctx.type(0).sizes;
          auto sel = selected(ctx.node(), static_cast<int>(in.size()), &ctx);
          if (!sel.ok()) return sel.status();
          std::vector<SymExpr> out;
          for (size_t d = 0; d < in.size(); ++d) {
            if (!((*sel)[d] && in[d] == SymExpr(1))) out.push_back(in[d]);
          }
          return Shapes{out};
        },
        [selected](
            const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
          // Concrete size 1 happens only where the graph's size is a static
          // 1 (symbols are >= 2), so this drops exactly what the shape rule
          // did.
          const HostTensor& t = ctx.tensors[0];
          std::vector<bool> sel = *selected(ctx.node, t.rank(), nullptr);
          std::vector<int64_t> sizes, strides;
          for (int d = 0; d < t.rank(); ++d) {
            if (sel[d] && t.sizes()[d] == 1) continue;
            sizes.push_back(t.sizes()[d]);
            strides.push_back(t.strides()[d]);
          }
          return One(HostTensor::View(t, sizes, strides, t.offset()));
        },
      [selected](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
          const LoweredValue& v = ctx.value(0);
          const int rank = static_cast<int>(v.sizes.size());
          std::vector<bool> sel = *selected(ctx.node(), rank, nullptr);
          std::vector<Expr> j;
          int k = 0;
          for (int d = 0; d < rank; ++d) {
            if (sel[d] && v.sizes[d] == SymExpr(1)) {
              j.push_back(ir::IntConst(0));
            } else {
              j.push_back(ir::Var(k++));
            }
          }
          return Values(LowerContext::Remap(v, j, ctx.out_type().sizes));
        });
  }

  AddSameDType(
      r, "aten.slice.Tensor", OpClass::kView,
      {self(), ArgDefault("dim", ArgKind::kInt, Attr::Int(0)),
       ArgDefault("start", ArgKind::kOptionalInt, none),
       ArgDefault("end", ArgKind::kOptionalInt, none),
       ArgDefault("step", ArgKind::kInt, Attr::Int(1))},
      [](const OpContext& ctx) -> absl::StatusOr<Shapes> {
        std::vector<SymExpr> out = ctx.type(0).sizes;
        auto d = ctx.WrapDim(ctx.arg(1).i, static_cast<int>(out.size()));
        if (!d.ok()) return d.status();
        if (out.empty())
          return ctx.Invalid("slice() cannot be applied to a 0-dim tensor");
        const int64_t step = ctx.arg(4).i;
        if (step <= 0)
          return ctx.Invalid(
              absl::StrCat("slice step must be positive, got ", step));
        const std::optional<int64_t> start = OptInt(ctx.arg(2)),
                                     end = OptInt(ctx.arg(3));
        if (auto n = out[*d].AsConstant()) {
          out[*d] = SymExpr(ClampSlice(*n, start, end, step).length);
          return Shapes{out};
        }
        // A symbolic size s >= 2: `start` in [0, 2] to the end, step 1.
        const int64_t s = start.value_or(0);
        const bool to_end = !end || *end >= (int64_t{1} << 62);
        if (step != 1 || !to_end || s < 0 || s > kMinSymbolValue) {
          return ctx.Invalid(
              absl::StrCat("slice of symbolic dim ", *d, " (",
                           out[*d].ToString(ctx.graph().SymbolNames()),
                           ") supports only start in [0, ", kMinSymbolValue,
                           "], no end and step 1"));
        }
        out[*d] = out[*d] - SymExpr(s);
        return Shapes{out};
      },
      [](const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
        const HostTensor& t = ctx.tensors[0];
        const int d = Wrap(ctx.arg(1).i, t.rank());
        const int64_t step = ctx.arg(4).i;
        SliceBounds b = ClampSlice(t.sizes()[d], OptInt(ctx.arg(2)),
                                   OptInt(ctx.arg(3)), step);
        std::vector<int64_t> sizes = t.sizes(), strides = t.strides();
        sizes[d] = b.length;
        const int64_t offset = t.offset() + b.start * strides[d];
        strides[d] *= step;
        return One(HostTensor::View(t, sizes, strides, offset));
      },
      [](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
        const LoweredValue& v = ctx.value(0);
        const int rank = static_cast<int>(v.sizes.size());
        const int d = Wrap(ctx.arg(1).i, rank);
        const int64_t step = ctx.arg(4).i;
        int64_t start = OptInt(ctx.arg(2)).value_or(0);
        if (auto n = v.sizes[d].AsConstant()) {
          start = ClampSlice(*n, OptInt(ctx.arg(2)), OptInt(ctx.arg(3)), step).start;
        }
        std::vector<Expr> j = IdentityIndex(rank);
        j[d] = ir::Add(ir::IntConst(start), ir::Mul(ir::Var(d), ir::IntConst(step)));
        return Values(LowerContext::Remap(v, j, ctx.out_type().sizes));
      });

  AddSameDType(
      r, "aten.select.int", OpClass::kView,
      {self(), Arg("dim", ArgKind::kInt), Arg("index", ArgKind::kInt)},
      [](const OpContext& ctx) -> absl::StatusOr<Shapes> {
        std::vector<SymExpr> out = ctx.type(0).sizes;
        if (out.empty())
          return ctx.Invalid("select() cannot be applied to a 0-dim tensor");
        auto d = ctx.WrapDim(ctx.arg(1).i, static_cast<int>(out.size()));
        if (!d.ok()) return d.status();
        const int64_t index = ctx.arg(2).i;
        // A symbolic size is at least 2, so [-2, 1] is always in range.
        const int64_t n = out[*d].AsConstant().value_or(kMinSymbolValue);
        if (index < -n || index >= n) {
          return ctx.Invalid(absl::StrCat(
              "index ", index, " is out of range for dim ", *d, " of size ",
              out[*d].ToString(ctx.graph().SymbolNames())));
        }
        out.erase(out.begin() + *d);
        return Shapes{out};
      },
      [](const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
        const HostTensor& t = ctx.tensors[0];
        const int d = Wrap(ctx.arg(1).i, t.rank());
        int64_t index = ctx.arg(2).i;
        if (index < 0) index += t.sizes()[d];
        std::vector<int64_t> sizes = t.sizes(), strides = t.strides();
        const int64_t offset = t.offset() + index * strides[d];
        sizes.erase(sizes.begin() + d);
        strides.erase(strides.begin() + d);
        return One(HostTensor::View(t, sizes, strides, offset));
      },
      [](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
        const LoweredValue& v = ctx.value(0);
        const int rank = static_cast<int>(v.sizes.size());
        const int d = Wrap(ctx.arg(1).i, rank);
        const int64_t index = ctx.arg(2).i;
        std::vector<Expr> j;
        for (int k = 0, o = 0; k < rank; ++k) {
          if (k != d) {
            j.push_back(ir::Var(o++));
          } else if (index >= 0) {
            j.push_back(ir::IntConst(index));
          } else {  // from the end; the size may be symbolic
            j.push_back(ir::Add(ir::FromSym(v.sizes[d]), ir::IntConst(index)));
          }
        }
        return Values(LowerContext::Remap(v, j, ctx.out_type().sizes));
      });

  AddSameDType(
      r, "aten.clone.default", OpClass::kData,
      {self(), KwArg("memory_format", ArgKind::kIgnored, none)},
      [](const OpContext& ctx) -> absl::StatusOr<Shapes> {
        return Shapes{ctx.type(0).sizes};
      },
      [](const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
        return One(ctx.tensors[0].Contiguous());
      },
      [](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
        return Values(ctx.value(0));  // values are immutable: a clone is the value
      });

  // cat: PyTorch skips legacy empty 1-D tensors (shape [0]).
  {
    OpDef def;
    def.name = "aten.cat.default";
    def.op_class = OpClass::kData;
    def.schema = {Arg("tensors", ArgKind::kTensorList),
                  ArgDefault("dim", ArgKind::kInt, Attr::Int(0))};
    auto skipped = [](const TensorType& t) {
      return t.rank() == 1 && t.sizes[0] == SymExpr(0);
    };
    def.shape = [skipped](const OpContext& ctx) -> absl::StatusOr<Shapes> {
      const std::vector<ValueId>& ts = ctx.arg(0).tensors;
      if (ts.empty())
        return ctx.Invalid("cat expects a non-empty list of tensors");
      const TensorType* first = nullptr;
      for (ValueId v : ts) {
        if (!skipped(ctx.value_type(v))) {
          first = &ctx.value_type(v);
          break;
        }
      }
      if (!first) return Shapes{{SymExpr(0)}};
      if (first->rank() == 0)
        return ctx.Invalid("zero-dimensional tensors cannot be concatenated");
      auto d = ctx.WrapDim(ctx.arg(1).i, first->rank());
      if (!d.ok()) return d.status();
      std::vector<SymExpr> out = first->sizes;
      out[*d] = SymExpr(0);
      for (size_t k = 0; k < ts.size(); ++k) {
        const TensorType& t = ctx.value_type(ts[k]);
        if (skipped(t)) continue;
        if (t.rank() != first->rank()) {
          return ctx.Invalid(absl::StrCat("tensor ", k, " has rank ", t.rank(),
                                          ", expected ", first->rank()));
        }
        for (int i = 0; i < t.rank(); ++i) {
          if (i != *d && t.sizes[i] != first->sizes[i]) {
            return ctx.Invalid(absl::StrCat(
                "tensor ", k, " has size ",
                t.sizes[i].ToString(ctx.graph().SymbolNames()), " in dim ", i,
                ", expected ",
                first->sizes[i].ToString(ctx.graph().SymbolNames())));
          }
        }
        out[*d] = out[*d] + t.sizes[*d];
      }
      return Shapes{out};
    };
    def.dtype = [](const OpContext& ctx) -> absl::StatusOr<std::vector<DType>> {
      ResultTypeState state;
      for (ValueId v : ctx.arg(0).tensors)
        state.AddTensor(ctx.value_type(v).dtype, false);
      return std::vector<DType>{state.Result()};
    };
    def.reference =
        [](const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
      HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
      if (out.numel() == 0) return One(std::move(out));
      const int d = Wrap(ctx.arg(1).i, out.rank());
      int64_t base = 0;
      for (const HostTensor& t : ctx.tensor_lists[0]) {
        if (t.rank() == 1 && t.sizes()[0] == 0) continue;
        ops::ForEachIndex(t.sizes(), [&](const std::vector<int64_t>& index) {
          std::vector<int64_t> o = index;
          o[d] += base;
          if (IsFloating(out.dtype()))
            out.SetDouble(o, t.GetDouble(index));
          else
            out.SetInt(o, t.GetInt(index));
        });
        base += t.sizes()[d];
      }
      return One(std::move(out));
    };
    def.lower = [skipped](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
      const TensorType& out = ctx.out_type();
      if (out.rank() == 1 && out.sizes[0] == SymExpr(0)) return Values(PointwiseValue(ctx, ir::Const(0, out.dtype)));
      const int d = Wrap(ctx.arg(1).i, out.rank());
      // A chain of selects on the concatenated dim, last piece innermost.
      Expr body;
      SymExpr offset(0);
      std::vector<std::pair<SymExpr, Expr>> pieces;  // (end offset, value)
      for (ValueId t : ctx.arg(0).tensors) {
        const LoweredValue& v = ctx.value_of(t);
        if (v.sizes.size() == 1 && v.sizes[0] == SymExpr(0)) continue;
        std::vector<Expr> idx = IdentityIndex(out.rank());
        idx[d] = ir::Add(ir::Var(d), ir::Mul(ir::IntConst(-1), ir::FromSym(offset)));
        offset = offset + v.sizes[d];
        pieces.emplace_back(offset, ir::Cast(LowerContext::Read(v, idx), out.dtype));
      }
      body = pieces.back().second;
      for (size_t k = pieces.size() - 1; k-- > 0;) {
        Expr in_piece = ir::Binary(ExprOp::kLt, ir::Var(d), ir::FromSym(pieces[k].first), DType::kBool);
        body = ir::Select(in_piece, pieces[k].second, body);
      }
      return Values(PointwiseValue(ctx, body));
    };
    r.Add(std::move(def));
  }

  // ---- creation ----
  auto factory = [](std::vector<ArgSpec> head) {
    head.push_back(KwArg("dtype", ArgKind::kOptionalDType, Attr::None()));
    for (ArgSpec& a : ops::FactoryKwArgs()) head.push_back(a);
    return head;
  };
  auto scalar_default_dtype = [](const Attr& s) {
    return s.kind == Attr::Kind::kFloat ? kDefaultFloat : s.ScalarKind();
  };
  auto fill = [](HostTensor& out, const Attr& value) {
    for (int64_t l = 0; l < out.numel(); ++l) {
      if (value.kind == Attr::Kind::kFloat)
        out.SetDoubleAt(l, value.f);
      else
        out.SetIntAt(l, value.kind == Attr::Kind::kBool ? value.b : value.i);
    }
  };
  {
    OpDef def;
    def.name = "aten.full.default";
    def.op_class = OpClass::kCreation;
    def.schema = factory(
        {Arg("size", ArgKind::kIntList), Arg("fill_value", ArgKind::kScalar)});
    def.shape = [](const OpContext& ctx) -> absl::StatusOr<Shapes> {
      for (const SymExpr& e : ctx.arg(0).ints) {
        if (auto c = e.AsConstant(); c && *c < 0)
          return ctx.Invalid(absl::StrCat("negative size ", *c));
      }
      return Shapes{ctx.arg(0).ints};
    };
    def.dtype =
        [scalar_default_dtype](
            const OpContext& ctx) -> absl::StatusOr<std::vector<DType>> {
      return std::vector<DType>{ctx.arg(2).is_none()
                                    ? scalar_default_dtype(ctx.arg(1))
                                    : ctx.arg(2).dtype};
    };
    def.reference =
        [fill](
            const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
      HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
      fill(out, ctx.arg(1));
      return One(std::move(out));
    };
    def.lower = [](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
      const Attr& v = ctx.arg(1);
      const DType dt = ctx.out_type().dtype;
      return Values(PointwiseValue(ctx, IsFloating(dt) || v.kind == Attr::Kind::kFloat
                                            ? ir::Const(v.ScalarAsDouble(), IsFloating(dt) ? dt : DType::kFloat32)
                                            : ir::IntConst(v.kind == Attr::Kind::kBool ? v.b : v.i, DType::kInt64)));
    };
    r.Add(std::move(def));
  }
  {
    OpDef def;
    def.name = "aten.scalar_tensor.default";
    def.op_class = OpClass::kCreation;
    def.schema = factory({Arg("s", ArgKind::kScalar)});
    def.shape = [](const OpContext&) -> absl::StatusOr<Shapes> {
      return Shapes{{}};
    };
    def.dtype = [](const OpContext& ctx) -> absl::StatusOr<std::vector<DType>> {
      return std::vector<DType>{ctx.arg(1).is_none() ? kDefaultFloat
                                                     : ctx.arg(1).dtype};
    };
    def.reference =
        [fill](
            const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
      HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], {});
      fill(out, ctx.arg(0));
      return One(std::move(out));
    };
    def.lower = [](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
      const Attr& v = ctx.arg(0);
      const DType dt = ctx.out_type().dtype;
      return Values(PointwiseValue(ctx, IsFloating(dt) || v.kind == Attr::Kind::kFloat
                                            ? ir::Const(v.ScalarAsDouble(), IsFloating(dt) ? dt : DType::kFloat32)
                                            : ir::IntConst(v.kind == Attr::Kind::kBool ? v.b : v.i, DType::kInt64)));
    };
    r.Add(std::move(def));
  }
  // arange(end), arange(start, end), arange(start, end, step).
  struct ArangeVariant {
    const char* name;
    std::vector<ArgSpec> head;
    int start, end, step;
  };
  const ArangeVariant aranges[] = {
      {"aten.arange.default", {Arg("end", ArgKind::kScalar)}, -1, 0, -1},
      {"aten.arange.start",
       {Arg("start", ArgKind::kScalar), Arg("end", ArgKind::kScalar)},
       0,
       1,
       -1},
      {"aten.arange.start_step",
       {Arg("start", ArgKind::kScalar), Arg("end", ArgKind::kScalar),
        ArgDefault("step", ArgKind::kScalar, Attr::Int(1))},
       0,
       1,
       2},
  };
  for (const ArangeVariant& v : aranges) {
    const int si = v.start, ei = v.end, pi = v.step;
    const int dtype_arg = static_cast<int>(v.head.size());
    auto params = [si, ei, pi](const Node& n) {
      const double start = si >= 0 ? n.args[si].ScalarAsDouble() : 0;
      const double end = n.args[ei].ScalarAsDouble();
      const double step = pi >= 0 ? n.args[pi].ScalarAsDouble() : 1;
      return std::tuple(start, end, step);
    };
    OpDef def;
    def.name = v.name;
    def.op_class = OpClass::kCreation;
    def.schema = factory(v.head);
    def.shape = [params](const OpContext& ctx) -> absl::StatusOr<Shapes> {
      auto [start, end, step] = params(ctx.node());
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
    };
    def.dtype =
        [si, ei, pi, dtype_arg](
            const OpContext& ctx) -> absl::StatusOr<std::vector<DType>> {
      if (!ctx.arg(dtype_arg).is_none())
        return std::vector<DType>{ctx.arg(dtype_arg).dtype};
      bool any_float = false;
      for (int i : {si, ei, pi}) {
        if (i >= 0 && ctx.arg(i).kind == Attr::Kind::kFloat) any_float = true;
      }
      return std::vector<DType>{any_float ? kDefaultFloat : DType::kInt64};
    };
    def.reference =
        [params](
            const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
      auto [start, end, step] = params(ctx.node);
      HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
      for (int64_t i = 0; i < out.numel(); ++i) {
        out.SetDoubleAt(i, start + static_cast<double>(i) * step);
      }
      return One(std::move(out));
    };
    def.lower = [params](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
      auto [start, end, step] = params(ctx.node());
      (void)end;
      // Computed in double-free float: start + i * step, as the reference.
      const Expr i = ir::Cast(ir::Var(0), DType::kFloat32);
      Expr v = ir::Binary(ExprOp::kAdd, ir::Const(start, DType::kFloat32),
                          ir::Binary(ExprOp::kMul, i, ir::Const(step, DType::kFloat32), DType::kFloat32),
                          DType::kFloat32);
      if (!IsFloating(ctx.out_type().dtype) && start == std::floor(start) && step == std::floor(step)) {
        v = ir::Add(ir::IntConst(static_cast<int64_t>(start)),
                    ir::Mul(ir::Var(0), ir::IntConst(static_cast<int64_t>(step))));
      }
      return Values(PointwiseValue(ctx, v));
    };
    r.Add(std::move(def));
  }
}

}  // namespace kiln
