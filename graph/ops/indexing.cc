// Signatures of the indexing ops (data movement by index): slice, select,
// slice_scatter, select_scatter
// and cat. Their reference semantics and lowerings are
// compiler/ops/indexing_reference.cc and indexing_lowering.cc.
#include "graph/ops/indexing.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "graph/ops/signature_util.h"
#include "graph/ops/views.h"

namespace kiln {
namespace ops {

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

std::optional<SymSliceBounds> SymbolicSlice(const SymExpr& n,
                                            std::optional<int64_t> start,
                                            std::optional<int64_t> end,
                                            int64_t step) {
  if (step != 1) return std::nullopt;
  // A bound b in [-2, 2] that PyTorch never clamps: 0 <= b <= n, or
  // 0 <= n + b for a negative b, for every value of n's symbols.
  auto bound = [&](int64_t b) -> std::optional<SymExpr> {
    if (b >= 0 && b <= kMinSymbolValue &&
        (n - SymExpr(b)).NonNegativeFrom(kMinSymbolValue)) {
      return SymExpr(b);
    }
    if (b < 0 && b >= -kMinSymbolValue &&
        (n + SymExpr(b)).NonNegativeFrom(kMinSymbolValue)) {
      return n + SymExpr(b);
    }
    return std::nullopt;
  };
  std::optional<SymExpr> s = bound(start.value_or(0));
  std::optional<SymExpr> e = !end || *end >= (int64_t{1} << 62)
                                 ? std::optional<SymExpr>(n)
                                 : bound(*end);
  if (!s || !e) return std::nullopt;
  SymExpr length = *e - *s;
  if (!length.NonNegativeFrom(kMinSymbolValue)) return std::nullopt;
  return SymSliceBounds{*s, std::move(length)};
}

std::optional<int64_t> OptionalInt(const Attr& a) {
  if (a.is_none()) return std::nullopt;
  return a.i;
}

bool SkippedByCat(const std::vector<SymExpr>& sizes) {
  return sizes.size() == 1 && sizes[0] == SymExpr(0);
}

}  // namespace ops

namespace {

using ops::Arg;
using ops::ArgDefault;
using ops::OptionalInt;
using ops::SameDTypeAsSelf;

// slice: static dims clamp as PyTorch's; a symbolic dim takes only a start
// in [0, kMinSymbolValue] to the end, step 1.
// A slice to a symbolic end (a buffer cut to a dynamic length:
// position_ids[:, :seq_len]): an int start >= 0, step 1, and an end that
// is never below the start nor past the dim for any symbol value within
// its bounds (Symbol.max_value), so PyTorch never clamps it.
absl::StatusOr<SymExpr> SymbolicEndLength(const OpContext& ctx,
                                          const SymExpr& n) {
  const Attr& start = ctx.arg(2);
  const SymExpr& end = ctx.arg(3).ints[0];
  const auto names = ctx.graph().SymbolNames();
  if ((!start.is_none() && start.i < 0) || ctx.arg(4).i != 1) {
    return ctx.Invalid(
        "a slice to a symbolic end needs a start >= 0 and step 1");
  }
  const SymExpr length = end - SymExpr(start.is_none() ? 0 : start.i);
  if (!length.NonNegativeFrom(kMinSymbolValue)) {
    return ctx.Invalid(absl::StrCat("slice end ", end.ToString(names),
                                    " may be below its start"));
  }
  if (!(n - end).NonNegativeWithin(kMinSymbolValue,
                                   ctx.graph().SymbolMaxValues())) {
    return ctx.Invalid(absl::StrCat(
        "slice end ", end.ToString(names), " may pass the dim's size ",
        n.ToString(names), " (bound the symbols: Symbol.max_value)"));
  }
  return length;
}

absl::StatusOr<Shapes> SliceShape(const OpContext& ctx) {
  std::vector<SymExpr> out = ctx.type(0).sizes;
  auto d = ctx.WrapDim(ctx.arg(1).i, static_cast<int>(out.size()));
  if (!d.ok()) return d.status();
  if (out.empty())
    return ctx.Invalid("slice() cannot be applied to a 0-dim tensor");
  const int64_t step = ctx.arg(4).i;
  if (step <= 0)
    return ctx.Invalid(absl::StrCat("slice step must be positive, got ", step));
  if (ctx.arg(3).kind == Attr::Kind::kInts) {
    auto length = SymbolicEndLength(ctx, out[*d]);
    if (!length.ok()) return length.status();
    out[*d] = *std::move(length);
    return Shapes{out};
  }
  const std::optional<int64_t> start = OptionalInt(ctx.arg(2)),
                               end = OptionalInt(ctx.arg(3));
  if (auto n = out[*d].AsConstant()) {
    out[*d] = SymExpr(ops::ClampSlice(*n, start, end, step).length);
    return Shapes{out};
  }
  // A symbolic size: bounds that are polynomials (ops::SymbolicSlice).
  std::optional<ops::SymSliceBounds> b =
      ops::SymbolicSlice(out[*d], start, end, step);
  if (!b) {
    return ctx.Invalid(absl::StrCat(
        "slice of symbolic dim ", *d, " (",
        out[*d].ToString(ctx.graph().SymbolNames()),
        ") supports only step 1 and start/end in [-2, 2] (or no end) with a "
        "length that is never negative"));
  }
  out[*d] = b->length;
  return Shapes{out};
}

absl::StatusOr<Shapes> SelectShape(const OpContext& ctx) {
  std::vector<SymExpr> out = ctx.type(0).sizes;
  if (out.empty())
    return ctx.Invalid("select() cannot be applied to a 0-dim tensor");
  auto d = ctx.WrapDim(ctx.arg(1).i, static_cast<int>(out.size()));
  if (!d.ok()) return d.status();
  const int64_t index = ctx.arg(2).i;
  // A symbolic size is at least 2, so [-2, 1] is always in range.
  const int64_t n = out[*d].AsConstant().value_or(kMinSymbolValue);
  if (index < -n || index >= n) {
    return ctx.Invalid(
        absl::StrCat("index ", index, " is out of range for dim ", *d,
                     " of size ", out[*d].ToString(ctx.graph().SymbolNames())));
  }
  out.erase(out.begin() + *d);
  return Shapes{out};
}

// slice_scatter / select_scatter: self's shape; src must have the shape of
// the slice (select) of self that it replaces, and self's dtype.
absl::Status CheckScatterSource(const OpContext& ctx,
                                const std::vector<SymExpr>& expected) {
  if (ctx.type(1).dtype != ctx.type(0).dtype) {
    return ctx.Invalid(absl::StrCat("src has dtype ",
                                    DTypeName(ctx.type(1).dtype), ", self ",
                                    DTypeName(ctx.type(0).dtype)));
  }
  if (ctx.type(1).sizes != expected) {
    std::string want, got;
    for (const SymExpr& e : expected)
      absl::StrAppend(&want, want.empty() ? "" : ", ",
                      e.ToString(ctx.graph().SymbolNames()));
    for (const SymExpr& e : ctx.type(1).sizes)
      absl::StrAppend(&got, got.empty() ? "" : ", ",
                      e.ToString(ctx.graph().SymbolNames()));
    return ctx.Invalid(absl::StrCat("src has shape [", got,
                                    "], the slice it replaces [", want, "]"));
  }
  return absl::OkStatus();
}

// slice_scatter(self, src, dim, start, end, step): a symbolic dim as slice
// allows it (ops::SymbolicSlice), with a slice never empty.
absl::StatusOr<Shapes> SliceScatterShape(const OpContext& ctx) {
  std::vector<SymExpr> slice = ctx.type(0).sizes;
  if (slice.empty())
    return ctx.Invalid("slice_scatter() cannot be applied to a 0-dim tensor");
  auto d = ctx.WrapDim(ctx.arg(2).i, static_cast<int>(slice.size()));
  if (!d.ok()) return d.status();
  const int64_t step = ctx.arg(5).i;
  if (step <= 0)
    return ctx.Invalid(absl::StrCat("slice step must be positive, got ", step));
  auto n = slice[*d].AsConstant();
  if (!n) {
    std::optional<ops::SymSliceBounds> b = ops::SymbolicSlice(
        slice[*d], OptionalInt(ctx.arg(3)), OptionalInt(ctx.arg(4)), step);
    // The lowering reads src at a clamped position: src must not be empty.
    if (!b || !(b->length - SymExpr(1)).NonNegativeFrom(kMinSymbolValue)) {
      return ctx.Invalid(absl::StrCat(
          "slice_scatter along symbolic dim ", *d,
          " supports only step 1 and start/end in [-2, 2] (or no end) with "
          "a length that is never below 1"));
    }
    slice[*d] = b->length;
  } else {
    slice[*d] = SymExpr(ops::ClampSlice(*n, OptionalInt(ctx.arg(3)),
                                        OptionalInt(ctx.arg(4)), step)
                            .length);
  }
  if (absl::Status s = CheckScatterSource(ctx, slice); !s.ok()) return s;
  return Shapes{ctx.type(0).sizes};
}

// select_scatter(self, src, dim, index).
absl::StatusOr<Shapes> SelectScatterShape(const OpContext& ctx) {
  std::vector<SymExpr> sel = ctx.type(0).sizes;
  if (sel.empty())
    return ctx.Invalid("select_scatter() cannot be applied to a 0-dim tensor");
  auto d = ctx.WrapDim(ctx.arg(2).i, static_cast<int>(sel.size()));
  if (!d.ok()) return d.status();
  const int64_t index = ctx.arg(3).i;
  const int64_t n = sel[*d].AsConstant().value_or(kMinSymbolValue);
  if (index < -n || index >= n) {
    return ctx.Invalid(
        absl::StrCat("index ", index, " is out of range for dim ", *d,
                     " of size ", sel[*d].ToString(ctx.graph().SymbolNames())));
  }
  sel.erase(sel.begin() + *d);
  if (absl::Status s = CheckScatterSource(ctx, sel); !s.ok()) return s;
  return Shapes{ctx.type(0).sizes};
}

// cat: the inputs other than skipped ones have one rank and agree on every
// dim but `dim`, which adds up.
absl::StatusOr<Shapes> CatShape(const OpContext& ctx) {
  const std::vector<ValueId>& ts = ctx.arg(0).tensors;
  if (ts.empty()) return ctx.Invalid("cat expects a non-empty list of tensors");
  const TensorType* first = nullptr;
  for (ValueId v : ts) {
    if (!ops::SkippedByCat(ctx.value_type(v).sizes)) {
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
    if (ops::SkippedByCat(t.sizes)) continue;
    if (t.rank() != first->rank()) {
      return ctx.Invalid(absl::StrCat("tensor ", k, " has rank ", t.rank(),
                                      ", expected ", first->rank()));
    }
    for (int i = 0; i < t.rank(); ++i) {
      if (i != *d && t.sizes[i] != first->sizes[i]) {
        return ctx.Invalid(
            absl::StrCat("tensor ", k, " has size ",
                         t.sizes[i].ToString(ctx.graph().SymbolNames()),
                         " in dim ", i, ", expected ",
                         first->sizes[i].ToString(ctx.graph().SymbolNames())));
      }
    }
    out[*d] = out[*d] + t.sizes[*d];
  }
  return Shapes{out};
}

// cat: result_type of the inputs, all as dimensioned tensors.
absl::StatusOr<std::vector<DType>> CatDType(const OpContext& ctx) {
  ResultTypeState state;
  for (ValueId v : ctx.arg(0).tensors)
    state.AddTensor(ctx.value_type(v).dtype, false);
  return std::vector<DType>{state.Result()};
}

}  // namespace

void RegisterIndexingSignatures(OpSignatures& table) {
  table.Add(
      {.name = "aten.slice.Tensor",
       .op_class = OpClass::kView,
       .schema = {Arg("self", ArgKind::kTensor),
                  ArgDefault("dim", ArgKind::kInt, Attr::Int(0)),
                  ArgDefault("start", ArgKind::kOptionalInt, Attr::None()),
                  ArgDefault("end", ArgKind::kOptionalSymInt, Attr::None()),
                  ArgDefault("step", ArgKind::kInt, Attr::Int(1))},
       .num_outputs = 1,
       .shape = SliceShape,
       .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.select.int",
             .op_class = OpClass::kView,
             .schema = {Arg("self", ArgKind::kTensor),
                        Arg("dim", ArgKind::kInt), Arg("index", ArgKind::kInt)},
             .num_outputs = 1,
             .shape = SelectShape,
             .dtype = SameDTypeAsSelf});
  table.Add(
      {.name = "aten.slice_scatter.default",
       .op_class = OpClass::kData,
       .schema = {Arg("self", ArgKind::kTensor), Arg("src", ArgKind::kTensor),
                  ArgDefault("dim", ArgKind::kInt, Attr::Int(0)),
                  ArgDefault("start", ArgKind::kOptionalInt, Attr::None()),
                  ArgDefault("end", ArgKind::kOptionalInt, Attr::None()),
                  ArgDefault("step", ArgKind::kInt, Attr::Int(1))},
       .num_outputs = 1,
       .shape = SliceScatterShape,
       .dtype = SameDTypeAsSelf});
  table.Add(
      {.name = "aten.select_scatter.default",
       .op_class = OpClass::kData,
       .schema = {Arg("self", ArgKind::kTensor), Arg("src", ArgKind::kTensor),
                  Arg("dim", ArgKind::kInt), Arg("index", ArgKind::kInt)},
       .num_outputs = 1,
       .shape = SelectScatterShape,
       .dtype = SameDTypeAsSelf});
  table.Add({.name = "aten.cat.default",
             .op_class = OpClass::kData,
             .schema = {Arg("tensors", ArgKind::kTensorList),
                        ArgDefault("dim", ArgKind::kInt, Attr::Int(0))},
             .num_outputs = 1,
             .shape = CatShape,
             .dtype = CatDType});
}

}  // namespace kiln
