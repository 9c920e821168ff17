// Signatures of the ops that read or write through a data-dependent index:
// embedding, index_select, gather, index.Tensor, masked_fill,
// constant_pad_nd, the loss nll_loss_forward/backward, and the scatters
// embedding_dense_backward, scatter_add, scatter, index_put, cumsum, and
// flip (cumsum's backward; a view reading index n - 1 - i). Their
// reference semantics and lowerings are
// compiler/ops/gather_scatter_reference.cc and gather_scatter_lowering.cc.
//
// Index tensors may be int32 or int64 everywhere (PyTorch takes only int64
// for gather; Kiln is the more lenient). Index values are data, so the
// shape rules cannot check their range: the lowerings clamp them (see
// gather_scatter_lowering.cc).
#include "graph/ops/gather_scatter.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/ops/signature_util.h"
#include "graph/ops/views.h"

namespace kiln {
namespace ops {

std::vector<PadPair> PadPairs(const std::vector<int64_t>& pad, int rank) {
  std::vector<PadPair> out(rank);
  for (size_t i = 0; 2 * i + 1 < pad.size(); ++i)
    out[rank - 1 - i] = PadPair{pad[2 * i], pad[2 * i + 1]};
  return out;
}

}  // namespace ops

namespace {

using ops::Arg;
using ops::ArgDefault;
using ops::SameDTypeAsSelf;

absl::Status CheckIndexDType(const OpContext& ctx, int i,
                             absl::string_view what) {
  const DType d = ctx.type(i).dtype;
  if (d != DType::kInt32 && d != DType::kInt64) {
    return ctx.Invalid(absl::StrCat(
        what, " must be an int32 or int64 tensor, got ", DTypeName(d)));
  }
  return absl::OkStatus();
}

// embedding(weight [V, D], indices [...]) -> [..., D].
absl::StatusOr<Shapes> EmbeddingShape(const OpContext& ctx) {
  if (ctx.type(0).rank() != 2) return ctx.Invalid("'weight' must be 2-D");
  if (auto s = CheckIndexDType(ctx, 1, "'indices'"); !s.ok()) return s;
  std::vector<SymExpr> out = ctx.type(1).sizes;
  out.push_back(ctx.type(0).sizes[1]);
  return Shapes{out};
}

// index_select(self, dim, index): index is a vector (or a 0-dim tensor).
absl::StatusOr<Shapes> IndexSelectShape(const OpContext& ctx) {
  std::vector<SymExpr> out = ctx.type(0).sizes;
  auto d = ctx.WrapDim(ctx.arg(1).i, static_cast<int>(out.size()));
  if (!d.ok()) return d.status();
  if (auto s = CheckIndexDType(ctx, 2, "index_select(): 'index'"); !s.ok())
    return s;
  if (ctx.type(2).rank() > 1)
    return ctx.Invalid("index_select(): Index is supposed to be a vector");
  if (out.empty()) return Shapes{out};
  out[*d] = NumElements(ctx.type(2).sizes);
  return Shapes{out};
}

// gather(self, dim, index): the result has index's shape; index has self's
// rank and is no larger than self in the other dims.
absl::StatusOr<Shapes> GatherShape(const OpContext& ctx) {
  const TensorType& self = ctx.type(0);
  const TensorType& index = ctx.type(2);
  auto d = ctx.WrapDim(ctx.arg(1).i, self.rank());
  if (!d.ok()) return d.status();
  if (auto s = CheckIndexDType(ctx, 2, "gather(): 'index'"); !s.ok()) return s;
  if (std::max(index.rank(), 1) != std::max(self.rank(), 1)) {
    return ctx.Invalid(
        "Index tensor must have the same number of dimensions as input "
        "tensor");
  }
  for (int k = 0; k < index.rank(); ++k) {
    if (k == *d || index.sizes[k] == self.sizes[k]) continue;
    auto i = index.sizes[k].AsConstant();
    auto n = self.sizes[k].AsConstant();
    const int64_t bound = n.value_or(kMinSymbolValue);
    if (!i || *i > bound) {
      return ctx.Invalid(absl::StrCat(
          "Size does not match at dimension ", k,
          " expected index to be no larger than self apart from dimension ",
          *d));
    }
  }
  return Shapes{index.sizes};
}

// index.Tensor(self, indices): k integer index tensors on dims 0..k-1,
// broadcast together; the result is their shape followed by self's
// remaining dims. Boolean masks (data-dependent shapes) are not taken.
absl::StatusOr<Shapes> IndexTensorShape(const OpContext& ctx) {
  const TensorType& self = ctx.type(0);
  const std::vector<ValueId>& ts = ctx.arg(1).tensors;
  if (ts.empty()) return ctx.Invalid("index expects at least one index tensor");
  if (static_cast<int>(ts.size()) > self.rank()) {
    return ctx.Invalid(absl::StrCat("too many indices for tensor of dimension ",
                                    self.rank(), " (got ", ts.size(), ")"));
  }
  std::vector<SymExpr> b;
  for (ValueId v : ts) {
    const TensorType& t = ctx.value_type(v);
    if (t.dtype == DType::kBool) {
      return ctx.Invalid(
          "boolean mask indices have a data-dependent shape; not supported");
    }
    if (t.dtype != DType::kInt32 && t.dtype != DType::kInt64) {
      return ctx.Invalid(
          absl::StrCat("tensors used as indices must be int32 or int64, got ",
                       DTypeName(t.dtype)));
    }
    auto bb = ops::Broadcast(ctx, b, t.sizes);
    if (!bb.ok()) return bb.status();
    b = *std::move(bb);
  }
  for (size_t d = ts.size(); d < self.sizes.size(); ++d)
    b.push_back(self.sizes[d]);
  return Shapes{b};
}

// masked_fill(self, mask, value): self and mask broadcast; self's dtype.
absl::StatusOr<Shapes> MaskedFillShape(const OpContext& ctx) {
  if (ctx.type(1).dtype != DType::kBool) {
    return ctx.Invalid(absl::StrCat(
        "masked_fill only supports boolean masks, but got mask with dtype ",
        DTypeName(ctx.type(1).dtype)));
  }
  if (ctx.is_tensor(2) && ctx.type(2).rank() != 0) {
    return ctx.Invalid(absl::StrCat(
        "masked_fill only supports a 0-dimensional value tensor, but got "
        "tensor with ",
        ctx.type(2).rank(), " dimension(s)"));
  }
  auto out = ops::Broadcast(ctx, ctx.type(0).sizes, ctx.type(1).sizes);
  if (!out.ok()) return out.status();
  return Shapes{*out};
}

// constant_pad_nd(self, pad, value): pad pairs from the last dim backwards;
// negative pads crop.
absl::StatusOr<Shapes> ConstantPadShape(const OpContext& ctx) {
  std::vector<SymExpr> out = ctx.type(0).sizes;
  const int rank = static_cast<int>(out.size());
  std::vector<int64_t> pad;
  for (const SymExpr& p : ctx.arg(1).ints) {
    auto c = ops::StaticInt(ctx, p, "pad");
    if (!c.ok()) return c.status();
    pad.push_back(*c);
  }
  if (pad.size() % 2 != 0)
    return ctx.Invalid("Length of pad must be even but instead it equals " +
                       std::to_string(pad.size()));
  if (static_cast<int>(pad.size()) > 2 * rank) {
    return ctx.Invalid(absl::StrCat(
        "Length of pad should be no more than twice the number of dimensions "
        "of the input. Pad length is ",
        pad.size(), " while the input has ", rank, " dimensions."));
  }
  const std::vector<ops::PadPair> pp = ops::PadPairs(pad, rank);
  for (int d = 0; d < rank; ++d) {
    const SymExpr n = out[d] + SymExpr(pp[d].before + pp[d].after);
    const int64_t least = out[d].AsConstant().value_or(kMinSymbolValue) +
                          pp[d].before + pp[d].after;
    // A symbolic size is only known to be >= kMinSymbolValue.
    if (least < 0) {
      return ctx.Invalid(absl::StrCat(
          "The input size ", out[d].ToString(ctx.graph().SymbolNames()),
          ", plus negative padding ", pp[d].before, " and ", pp[d].after,
          " resulted in a negative output size (dim ", d, ")"));
    }
    out[d] = n;
  }
  return Shapes{out};
}

// nll_loss_forward(self [N, C] or [C], target [N] or [], weight [C]?,
// reduction, ignore_index) -> (output, total_weight).
absl::StatusOr<Shapes> NllLossForwardShape(const OpContext& ctx) {
  const TensorType& self = ctx.type(0);
  const TensorType& target = ctx.type(1);
  if (self.rank() < 1 || self.rank() > 2)
    return ctx.Invalid("input tensor should be 1D or 2D");
  if (target.rank() > 1) {
    return ctx.Invalid(
        "0D or 1D target tensor expected, multi-target not supported");
  }
  if (auto s = CheckIndexDType(ctx, 1, "nll_loss: 'target'"); !s.ok()) return s;
  if (self.rank() == 2 &&
      (target.rank() != 1 || target.sizes[0] != self.sizes[0])) {
    return ctx.Invalid("size mismatch between input batch size and target");
  }
  if (self.rank() == 1 && target.rank() != 0)
    return ctx.Invalid("1D input takes a 0D target");
  const SymExpr classes = self.sizes.back();
  if (!ctx.arg(2).is_none()) {
    const TensorType& w = ctx.type(2);
    if (w.rank() != 1 || w.sizes[0] != classes) {
      return ctx.Invalid(
          "weight tensor should be defined either for all classes or no "
          "classes");
    }
  }
  const int64_t r = ctx.arg(3).i;
  if (r < 0 || r > 2) return ctx.Invalid(absl::StrCat("invalid reduction ", r));
  std::vector<SymExpr> out;
  if (r == static_cast<int64_t>(ops::LossReduction::kNone) && self.rank() == 2)
    out = {self.sizes[0]};
  return Shapes{out, {}};
}

absl::StatusOr<std::vector<DType>> NllLossForwardDType(const OpContext& ctx) {
  const DType d = ctx.type(0).dtype;
  if (!IsFloating(d)) return ctx.Invalid("nll_loss expects a floating input");
  if (!ctx.arg(2).is_none() && ctx.type(2).dtype != d)
    return ctx.Invalid("weight must have the input's dtype");
  return std::vector<DType>{d, d};
}

// nll_loss_backward(grad_output, self, target, weight?, reduction,
// ignore_index, total_weight) -> grad_input of self's shape.
absl::StatusOr<Shapes> NllLossBackwardShape(const OpContext& ctx) {
  const TensorType& g = ctx.type(0);
  const TensorType& self = ctx.type(1);
  const TensorType& target = ctx.type(2);
  if (self.rank() < 1 || self.rank() > 2)
    return ctx.Invalid("input tensor should be 1D or 2D");
  if (auto s = CheckIndexDType(ctx, 2, "nll_loss_backward: 'target'"); !s.ok())
    return s;
  if (self.rank() == 2 &&
      (target.rank() != 1 || target.sizes[0] != self.sizes[0]))
    return ctx.Invalid("size mismatch between input batch size and target");
  if (self.rank() == 1 && target.rank() != 0)
    return ctx.Invalid("1D input takes a 0D target");
  if (!ctx.arg(3).is_none()) {
    const TensorType& w = ctx.type(3);
    if (w.rank() != 1 || w.sizes[0] != self.sizes.back())
      return ctx.Invalid("weight tensor should be defined for all classes");
  }
  const int64_t r = ctx.arg(4).i;
  if (r < 0 || r > 2) return ctx.Invalid(absl::StrCat("invalid reduction ", r));
  const bool none =
      r == static_cast<int64_t>(ops::LossReduction::kNone) && self.rank() == 2;
  if (none ? (g.rank() != 1 || g.sizes[0] != self.sizes[0]) : g.rank() != 0) {
    return ctx.Invalid(
        "grad_output must have the shape of nll_loss_forward's output");
  }
  if (ctx.type(6).rank() != 0)
    return ctx.Invalid("total_weight must be a 0-dim tensor");
  return Shapes{self.sizes};
}

absl::StatusOr<std::vector<DType>> SecondArgDType(const OpContext& ctx) {
  if (!IsFloating(ctx.type(1).dtype))
    return ctx.Invalid("nll_loss_backward expects a floating input");
  return std::vector<DType>{ctx.type(1).dtype};
}

// embedding_dense_backward(grad_output [..., D], indices [...],
// num_weights, padding_idx, scale_grad_by_freq) -> [num_weights, D].
absl::StatusOr<Shapes> EmbeddingBackwardShape(const OpContext& ctx) {
  const TensorType& g = ctx.type(0);
  const TensorType& idx = ctx.type(1);
  if (auto s = CheckIndexDType(ctx, 1, "'indices'"); !s.ok()) return s;
  if (g.rank() != idx.rank() + 1)
    return ctx.Invalid("grad_output must have the indices' dims and one more");
  for (int d = 0; d < idx.rank(); ++d) {
    if (g.sizes[d] != idx.sizes[d])
      return ctx.Invalid(
          "grad_output's leading dims must be the indices' shape");
  }
  if (ctx.arg(2).i < 0) return ctx.Invalid("num_weights must be >= 0");
  return Shapes{{SymExpr(ctx.arg(2).i), g.sizes.back()}};
}

absl::StatusOr<std::vector<DType>> FloatingSelfDType(const OpContext& ctx) {
  if (!IsFloating(ctx.type(0).dtype))
    return ctx.Invalid("expects a floating grad_output");
  return std::vector<DType>{ctx.type(0).dtype};
}

// scatter / scatter_add (self, dim, index, src|value): self's shape; index
// has self's rank and is no larger than src (or, but in dim, self).
absl::StatusOr<Shapes> ScatterShape(const OpContext& ctx) {
  const TensorType& self = ctx.type(0);
  const TensorType& index = ctx.type(2);
  auto d = ctx.WrapDim(ctx.arg(1).i, self.rank());
  if (!d.ok()) return d.status();
  if (index.dtype != DType::kInt64 && index.dtype != DType::kInt32)
    return ctx.Invalid("scatter(): Expected dtype int64 or int32 for index");
  if (std::max(index.rank(), 1) != std::max(self.rank(), 1)) {
    return ctx.Invalid(
        "Index tensor must have the same number of dimensions as self "
        "tensor");
  }
  const bool src = ctx.is_tensor(3);
  if (src && std::max(ctx.type(3).rank(), 1) != std::max(self.rank(), 1)) {
    return ctx.Invalid(
        "Index tensor must have the same number of dimensions as src tensor");
  }
  auto no_larger = [](const SymExpr& i, const SymExpr& n) {
    if (i == n) return true;
    auto ci = i.AsConstant();
    return ci && *ci <= n.AsConstant().value_or(kMinSymbolValue);
  };
  for (int k = 0; k < index.rank(); ++k) {
    if ((k != *d && !no_larger(index.sizes[k], self.sizes[k])) ||
        (src && !no_larger(index.sizes[k], ctx.type(3).sizes[k]))) {
      return ctx.Invalid(absl::StrCat("Expected index ", k,
                                      " to be no larger than self apart from "
                                      "dimension ",
                                      *d,
                                      " and to be no larger size than src"));
    }
  }
  return Shapes{self.sizes};
}

// index_put(self, indices, values, accumulate): self's shape; values
// broadcast to the indexed shape (as index.Tensor's result).
absl::StatusOr<Shapes> IndexPutShape(const OpContext& ctx) {
  auto indexed = IndexTensorShape(ctx);
  if (!indexed.ok()) return indexed.status();
  const std::vector<SymExpr>& v = ctx.type(2).sizes;
  const std::vector<SymExpr>& b = (*indexed)[0];
  auto bb = ops::Broadcast(ctx, b, v);
  if (!bb.ok()) return bb.status();
  if (*bb != b) {
    return ctx.Invalid(
        "shape mismatch: value tensor cannot be broadcast to indexing result");
  }
  return Shapes{ctx.type(0).sizes};
}

// cumsum(self, dim, dtype?): integral and bool inputs give int64.
absl::StatusOr<Shapes> CumsumShape(const OpContext& ctx) {
  auto d = ctx.WrapDim(ctx.arg(1).i, ctx.type(0).rank());
  if (!d.ok()) return d.status();
  return Shapes{ctx.type(0).sizes};
}

// flip(self, dims): self's shape; dims distinct.
absl::StatusOr<Shapes> FlipShape(const OpContext& ctx) {
  const int rank = ctx.type(0).rank();
  std::vector<bool> seen(std::max(rank, 1), false);
  for (const SymExpr& e : ctx.arg(1).ints) {
    auto c = ops::StaticInt(ctx, e, "dims");
    if (!c.ok()) return c.status();
    auto d = ctx.WrapDim(*c, rank);
    if (!d.ok()) return d.status();
    if (seen[*d])
      return ctx.Invalid(absl::StrCat(
          "dim ", *d, " appears multiple times in the list of dims"));
    seen[*d] = true;
  }
  return Shapes{ctx.type(0).sizes};
}

absl::StatusOr<std::vector<DType>> CumsumDType(const OpContext& ctx) {
  if (!ctx.arg(2).is_none()) return std::vector<DType>{ctx.arg(2).dtype};
  const DType d = ctx.type(0).dtype;
  return std::vector<DType>{IsFloating(d) ? d : DType::kInt64};
}

}  // namespace

void RegisterGatherScatterSignatures(OpSignatures& table) {
  table.Add(
      {.name = "aten.embedding.default",
       .op_class = OpClass::kData,
       .schema = {Arg("weight", ArgKind::kTensor),
                  Arg("indices", ArgKind::kTensor),
                  ArgDefault("padding_idx", ArgKind::kInt, Attr::Int(-1)),
                  ArgDefault("scale_grad_by_freq", ArgKind::kBool,
                             Attr::Bool(false)),
                  ArgDefault("sparse", ArgKind::kBool, Attr::Bool(false))},
       .shape = EmbeddingShape,
       .dtype = SameDTypeAsSelf});
  table.Add(
      {.name = "aten.index_select.default",
       .op_class = OpClass::kData,
       .schema = {Arg("self", ArgKind::kTensor), Arg("dim", ArgKind::kInt),
                  Arg("index", ArgKind::kTensor)},
       .shape = IndexSelectShape,
       .dtype = SameDTypeAsSelf});
  table.Add(
      {.name = "aten.gather.default",
       .op_class = OpClass::kData,
       .schema = {Arg("self", ArgKind::kTensor), Arg("dim", ArgKind::kInt),
                  Arg("index", ArgKind::kTensor),
                  ArgDefault("sparse_grad", ArgKind::kBool, Attr::Bool(false))},
       .shape = GatherShape,
       .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.index.Tensor",
             .op_class = OpClass::kData,
             .schema = {Arg("self", ArgKind::kTensor),
                        Arg("indices", ArgKind::kTensorList)},
             .shape = IndexTensorShape,
             .dtype = SameDTypeAsSelf});
  table.Add(
      {.name = "aten.masked_fill.Scalar",
       .op_class = OpClass::kPointwise,
       .schema = {Arg("self", ArgKind::kTensor), Arg("mask", ArgKind::kTensor),
                  Arg("value", ArgKind::kScalar)},
       .shape = MaskedFillShape,
       .dtype = SameDTypeAsSelf});
  table.Add(
      {.name = "aten.masked_fill.Tensor",
       .op_class = OpClass::kPointwise,
       .schema = {Arg("self", ArgKind::kTensor), Arg("mask", ArgKind::kTensor),
                  Arg("value", ArgKind::kTensor)},
       .shape = MaskedFillShape,
       .dtype = SameDTypeAsSelf});
  table.Add(
      {.name = "aten.constant_pad_nd.default",
       .op_class = OpClass::kData,
       .schema = {Arg("input", ArgKind::kTensor), Arg("pad", ArgKind::kIntList),
                  ArgDefault("value", ArgKind::kScalar, Attr::Int(0))},
       .shape = ConstantPadShape,
       .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.nll_loss_forward.default",
             .op_class = OpClass::kComposite,
             .schema = {Arg("self", ArgKind::kTensor),
                        Arg("target", ArgKind::kTensor),
                        Arg("weight", ArgKind::kOptionalTensor),
                        Arg("reduction", ArgKind::kInt),
                        Arg("ignore_index", ArgKind::kInt)},
             .num_outputs = 2,
             .shape = NllLossForwardShape,
             .dtype = NllLossForwardDType});
  table.Add({.name = "aten.nll_loss_backward.default",
             .op_class = OpClass::kComposite,
             .schema = {Arg("grad_output", ArgKind::kTensor),
                        Arg("self", ArgKind::kTensor),
                        Arg("target", ArgKind::kTensor),
                        Arg("weight", ArgKind::kOptionalTensor),
                        Arg("reduction", ArgKind::kInt),
                        Arg("ignore_index", ArgKind::kInt),
                        Arg("total_weight", ArgKind::kTensor)},
             .shape = NllLossBackwardShape,
             .dtype = SecondArgDType});
  table.Add({.name = "aten.embedding_dense_backward.default",
             .op_class = OpClass::kComposite,
             .schema = {Arg("grad_output", ArgKind::kTensor),
                        Arg("indices", ArgKind::kTensor),
                        Arg("num_weights", ArgKind::kInt),
                        Arg("padding_idx", ArgKind::kInt),
                        Arg("scale_grad_by_freq", ArgKind::kBool)},
             .shape = EmbeddingBackwardShape,
             .dtype = FloatingSelfDType});
  table.Add(
      {.name = "aten.scatter_add.default",
       .op_class = OpClass::kComposite,
       .schema = {Arg("self", ArgKind::kTensor), Arg("dim", ArgKind::kInt),
                  Arg("index", ArgKind::kTensor), Arg("src", ArgKind::kTensor)},
       .shape = ScatterShape,
       .dtype = SameDTypeAsSelf});
  table.Add(
      {.name = "aten.scatter.src",
       .op_class = OpClass::kComposite,
       .schema = {Arg("self", ArgKind::kTensor), Arg("dim", ArgKind::kInt),
                  Arg("index", ArgKind::kTensor), Arg("src", ArgKind::kTensor)},
       .shape = ScatterShape,
       .dtype = SameDTypeAsSelf});
  table.Add(
      {.name = "aten.scatter.value",
       .op_class = OpClass::kComposite,
       .schema = {Arg("self", ArgKind::kTensor), Arg("dim", ArgKind::kInt),
                  Arg("index", ArgKind::kTensor),
                  Arg("value", ArgKind::kScalar)},
       .shape = ScatterShape,
       .dtype = SameDTypeAsSelf});
  table.Add(
      {.name = "aten.index_put.default",
       .op_class = OpClass::kComposite,
       .schema = {Arg("self", ArgKind::kTensor),
                  Arg("indices", ArgKind::kTensorList),
                  Arg("values", ArgKind::kTensor),
                  ArgDefault("accumulate", ArgKind::kBool, Attr::Bool(false))},
       .shape = IndexPutShape,
       .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.flip.default",
             .op_class = OpClass::kView,
             .schema = {Arg("self", ArgKind::kTensor),
                        Arg("dims", ArgKind::kIntList)},
             .shape = FlipShape,
             .dtype = SameDTypeAsSelf});
  table.Add(
      {.name = "aten.cumsum.default",
       .op_class = OpClass::kReduction,
       .schema = {Arg("self", ArgKind::kTensor), Arg("dim", ArgKind::kInt),
                  ops::KwArg("dtype", ArgKind::kOptionalDType, Attr::None())},
       .shape = CumsumShape,
       .dtype = CumsumDType});
}

}  // namespace kiln
