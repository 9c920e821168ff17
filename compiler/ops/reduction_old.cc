// Reductions of op set v1 over any set of dims, with keepdim: sum, mean,
// prod, amax, amin, var (correction), argmax, argmin, any, all.
//
// Reference semantics gather, for each output element, the input values it
// reduces (in row-major order of the reduced dims) and fold them in double
// (floating outputs) or wrapping int64 (integral outputs).
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "compiler/ops/legacy.h"

namespace kiln {
namespace {

using ops::Arg;
using ops::ArgDefault;
using ops::KwArg;

enum class Reduce : uint8_t {
  kSum,
  kMean,
  kProd,
  kMax,
  kMin,
  kVar,
  kArgMax,
  kArgMin,
  kAny,
  kAll
};

struct ReductionOp {
  std::string name;
  Reduce kind;
  std::vector<ArgSpec> schema;
  int dims_arg = -1;     // -1: reduce all dims
  int keepdim_arg = -1;  // -1: keepdim = false
  int dtype_arg = -1;    // -1: no dtype argument
  int correction_arg = -1;
};

bool KeepDim(const Node& node, const ReductionOp& op) {
  return op.keepdim_arg >= 0 && node.args[op.keepdim_arg].b;
}

// The dims argument as a list attr (an int dim or None become lists).
Attr DimsAttr(const Node& node, const ReductionOp& op) {
  if (op.dims_arg < 0) return Attr::None();
  const Attr& a = node.args[op.dims_arg];
  if (a.kind == Attr::Kind::kInt) return Attr::Ints({SymExpr(a.i)});
  return a;
}

absl::StatusOr<DType> OutDType(const OpContext& ctx, const ReductionOp& op) {
  const DType in = ctx.type(0).dtype;
  const bool has_dtype = op.dtype_arg >= 0 && !ctx.arg(op.dtype_arg).is_none();
  const DType requested = has_dtype ? ctx.arg(op.dtype_arg).dtype : in;
  switch (op.kind) {
    case Reduce::kSum:
    case Reduce::kProd:
      if (has_dtype) return requested;
      return IsFloating(in) ? in : DType::kInt64;
    case Reduce::kMean:
      if (!IsFloating(requested)) {
        return ctx.Invalid(
            absl::StrCat("could not infer output dtype: input dtype must be "
                         "floating point, got ",
                         DTypeName(requested)));
      }
      return requested;
    case Reduce::kVar:
      if (!IsFloating(in)) {
        return ctx.Invalid(absl::StrCat(
            "var needs a floating point input, got ", DTypeName(in)));
      }
      return in;
    case Reduce::kMax:
    case Reduce::kMin:
      return in;
    case Reduce::kArgMax:
    case Reduce::kArgMin:
      if (in == DType::kBool)
        return ctx.Invalid("not implemented for bool inputs");
      return DType::kInt64;
    case Reduce::kAny:
    case Reduce::kAll:
      return DType::kBool;
  }
  return in;
}

bool NeedsNonEmpty(Reduce k) {
  return k == Reduce::kMax || k == Reduce::kMin || k == Reduce::kArgMax ||
         k == Reduce::kArgMin;
}

// Folds one output element's values.
double FoldFloat(Reduce kind, const std::vector<double>& v, double correction) {
  switch (kind) {
    case Reduce::kSum: {
      double s = 0;
      for (double x : v) s += x;
      return s;
    }
    case Reduce::kMean: {
      double s = 0;
      for (double x : v) s += x;
      return s / static_cast<double>(v.size());
    }
    case Reduce::kProd: {
      double p = 1;
      for (double x : v) p *= x;
      return p;
    }
    case Reduce::kMax: {
      double m = -INFINITY;
      for (double x : v) {
        if (std::isnan(x)) return x;
        m = std::max(m, x);
      }
      return m;
    }
    case Reduce::kMin: {
      double m = INFINITY;
      for (double x : v) {
        if (std::isnan(x)) return x;
        m = std::min(m, x);
      }
      return m;
    }
    case Reduce::kVar: {
      double mean = 0;
      for (double x : v) mean += x;
      mean /= static_cast<double>(v.size());
      double ss = 0;
      for (double x : v) ss += (x - mean) * (x - mean);
      const double divisor =
          std::max(0.0, static_cast<double>(v.size()) - correction);
      return ss / divisor;
    }
    case Reduce::kArgMax:
    case Reduce::kArgMin: {
      // The first extreme; NaN counts as the extreme on both sides.
      size_t best = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        if (std::isnan(v[i])) return static_cast<double>(i);
        if (kind == Reduce::kArgMax ? v[i] > v[best] : v[i] < v[best]) best = i;
      }
      return static_cast<double>(best);
    }
    case Reduce::kAny: {
      for (double x : v)
        if (x != 0) return 1;
      return 0;
    }
    case Reduce::kAll: {
      for (double x : v)
        if (x == 0) return 0;
      return 1;
    }
  }
  return 0;
}

int64_t FoldInt(Reduce kind, const std::vector<int64_t>& v) {
  auto wrap = [](uint64_t x) { return static_cast<int64_t>(x); };
  switch (kind) {
    case Reduce::kSum: {
      uint64_t s = 0;
      for (int64_t x : v) s += static_cast<uint64_t>(x);
      return wrap(s);
    }
    case Reduce::kProd: {
      uint64_t p = 1;
      for (int64_t x : v) p *= static_cast<uint64_t>(x);
      return wrap(p);
    }
    case Reduce::kMax: {
      int64_t m = std::numeric_limits<int64_t>::min();
      for (int64_t x : v) m = std::max(m, x);
      return m;
    }
    case Reduce::kMin: {
      int64_t m = std::numeric_limits<int64_t>::max();
      for (int64_t x : v) m = std::min(m, x);
      return m;
    }
    case Reduce::kArgMax:
    case Reduce::kArgMin: {
      size_t best = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        if (kind == Reduce::kArgMax ? v[i] > v[best] : v[i] < v[best]) best = i;
      }
      return static_cast<int64_t>(best);
    }
    case Reduce::kAny: {
      for (int64_t x : v)
        if (x != 0) return 1;
      return 0;
    }
    case Reduce::kAll: {
      for (int64_t x : v)
        if (x == 0) return 0;
      return 1;
    }
    default:
      return 0;  // mean/var are floating only
  }
}

// The reduced-dims mask of a node from its (validated) dims argument.
std::vector<bool> ReducedMask(const Node& node, const ReductionOp& op, int rank) {
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

}  // namespace

namespace ops {
absl::StatusOr<std::vector<LoweredValue>> LowerReductionOver(
    LowerContext& ctx, const LoweredValue& in, const std::vector<bool>& reduced, bool keepdim,
    ReduceKind kind, DType compute, DType out_dtype, Expr body_override,
    std::function<Expr(Expr acc, Expr count)> finalize) {
  const std::vector<SymExpr>& space = in.sizes;
  LoopNode node;
  node.kind = LoopNode::Kind::kReduction;
  node.dtype = out_dtype;
  node.reduce = kind;
  node.reduce_sizes = space;
  node.reduced = reduced;
  node.keepdim = keepdim;
  node.sizes = ops::ReducedShape(space, reduced, keepdim);
  node.body = body_override ? body_override
                            : ir::Cast(LowerContext::ReadBroadcast(in, space), compute);
  node.acc_dtype = IsFloating(compute) ? DType::kFloat32
                   : (kind == ReduceKind::kAny || kind == ReduceKind::kAll) ? DType::kBool
                   : IsArgReduce(kind) ? compute
                                                                                   : DType::kInt64;
  if (finalize) {
    SymExpr count(1);
    for (size_t d = 0; d < space.size(); ++d) {
      if (reduced[d]) count = count * space[d];
    }
    node.finalize = finalize(ir::Acc(0, node.acc_dtype), ir::FromSym(count));
  }
  return std::vector<LoweredValue>{ctx.AddNode(std::move(node))};
}

Expr ReadKept(const LoweredValue& r, const std::vector<bool>& reduced) {
  std::vector<Expr> idx;
  for (size_t d = 0; d < reduced.size(); ++d) {
    idx.push_back(reduced[d] ? ir::IntConst(0) : ir::Var(static_cast<int>(d)));
  }
  return LowerContext::Read(r, idx);
}
}  // namespace ops

namespace {
using ops::LowerReductionOver;
using ops::ReadKept;

absl::StatusOr<std::vector<LoweredValue>> LowerReduction(LowerContext& ctx, const ReductionOp& op) {
  const LoweredValue& in = ctx.value(0);
  const DType out = ctx.out_type().dtype;
  const std::vector<bool> reduced = ReducedMask(ctx.node(), op, static_cast<int>(in.sizes.size()));
  const bool keepdim = KeepDim(ctx.node(), op);
  auto float_div = [](Expr acc, Expr count) {
    return ir::Binary(ExprOp::kDiv, acc, ir::Cast(count, DType::kFloat32), DType::kFloat32);
  };
  switch (op.kind) {
    case Reduce::kSum:
      return LowerReductionOver(ctx, in, reduced, keepdim, ReduceKind::kSum, out, out, nullptr, nullptr);
    case Reduce::kProd:
      return LowerReductionOver(ctx, in, reduced, keepdim, ReduceKind::kProd, out, out, nullptr, nullptr);
    case Reduce::kMean:
      return LowerReductionOver(ctx, in, reduced, keepdim, ReduceKind::kSum, out, out, nullptr, float_div);
    case Reduce::kMax:
    case Reduce::kMin:
      return LowerReductionOver(ctx, in, reduced, keepdim,
                                op.kind == Reduce::kMax ? ReduceKind::kMax : ReduceKind::kMin,
                                in.dtype, out, nullptr, nullptr);
    case Reduce::kArgMax:
    case Reduce::kArgMin:
      return LowerReductionOver(ctx, in, reduced, keepdim,
                                op.kind == Reduce::kArgMax ? ReduceKind::kArgMax : ReduceKind::kArgMin,
                                in.dtype, out, nullptr, nullptr);
    case Reduce::kAny:
    case Reduce::kAll:
      return LowerReductionOver(ctx, in, reduced, keepdim,
                                op.kind == Reduce::kAny ? ReduceKind::kAny : ReduceKind::kAll,
                                DType::kBool, out, nullptr, nullptr);
    case Reduce::kVar: {
      // Two passes over each row, numerically sound: the mean first, then
      // the sum of squared deviations from it.
      auto mean = LowerReductionOver(ctx, in, reduced, /*keepdim=*/true, ReduceKind::kSum,
                                     DType::kFloat32, DType::kFloat32, nullptr, float_div);
      if (!mean.ok()) return mean.status();
      const Expr x = ir::Cast(LowerContext::ReadBroadcast(in, in.sizes), DType::kFloat32);
      const Expr dev = ir::Binary(ExprOp::kSub, x, ReadKept((*mean)[0], reduced), DType::kFloat32);
      const Expr sq = ir::Binary(ExprOp::kMul, dev, dev, DType::kFloat32);
      double correction = 1;
      if (op.correction_arg >= 0 && !ctx.arg(op.correction_arg).is_none()) {
        correction = ctx.arg(op.correction_arg).ScalarAsDouble();
      }
      auto finalize = [correction](Expr acc, Expr count) {
        Expr n = ir::Binary(ExprOp::kSub, ir::Cast(count, DType::kFloat32),
                            ir::Const(correction, DType::kFloat32), DType::kFloat32);
        n = ir::Binary(ExprOp::kMax, n, ir::Const(0, DType::kFloat32), DType::kFloat32);
        return ir::Binary(ExprOp::kDiv, acc, n, DType::kFloat32);
      };
      return LowerReductionOver(ctx, in, reduced, keepdim, ReduceKind::kSum, DType::kFloat32, out, sq,
                                finalize);
    }
  }
  return ctx.Unimplemented("unknown reduction");
}

void AddReduction(OpRegistry& registry, ReductionOp op) {
  auto shared = std::make_shared<ReductionOp>(std::move(op));
  OpDef def;
  def.name = shared->name;
  def.op_class = OpClass::kReduction;
  def.schema = shared->schema;
  def.shape = [shared](const OpContext& ctx)
      -> absl::StatusOr<std::vector<std::vector<SymExpr>>> {
    const TensorType& in = ctx.type(0);
    auto reduced =
        ops::ReducedDims(ctx, DimsAttr(ctx.node(), *shared), in.rank());
    if (!reduced.ok()) return reduced.status();
    if (NeedsNonEmpty(shared->kind)) {
      for (int d = 0; d < in.rank(); ++d) {
        if ((*reduced)[d] && in.sizes[d] == SymExpr(0)) {
          return ctx.Invalid(
              absl::StrCat("cannot reduce over dim ", d,
                           " of size 0: the operation has no identity"));
        }
      }
    }
    return std::vector<std::vector<SymExpr>>{
        ops::ReducedShape(in.sizes, *reduced, KeepDim(ctx.node(), *shared))};
  };
  def.dtype =
      [shared](const OpContext& ctx) -> absl::StatusOr<std::vector<DType>> {
    auto d = OutDType(ctx, *shared);
    if (!d.ok()) return d.status();
    return std::vector<DType>{*d};
  };
  def.reference =
      [shared](
          const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
    const HostTensor& in = ctx.tensors[0];
    const DType out_dtype = ctx.out_dtypes[0];
    // Reduced mask from the concrete rank (dims were validated already).
    std::vector<bool> reduced(in.rank(), false);
    const Attr dims = DimsAttr(ctx.node, *shared);
    if (dims.is_none() || dims.ints.empty()) {
      std::fill(reduced.begin(), reduced.end(), true);
    } else {
      for (const SymExpr& e : dims.ints) {
        int64_t d = *e.AsConstant();
        if (in.rank() == 0) continue;
        reduced[d < 0 ? d + in.rank() : d] = true;
      }
    }
    // Keepdim-shaped output index space; its row-major order is the same
    // with or without the kept size-1 dims.
    std::vector<int64_t> keep_sizes = in.sizes();
    for (int d = 0; d < in.rank(); ++d) {
      if (reduced[d]) keep_sizes[d] = 1;
    }
    int64_t out_numel = 1;
    for (int64_t s : keep_sizes) out_numel *= s;
    const bool float_fold = IsFloating(in.dtype()) || IsFloating(out_dtype);
    // sum/prod with a dtype argument cast the input first.
    const bool cast_first = shared->kind == Reduce::kSum ||
                            shared->kind == Reduce::kProd ||
                            shared->kind == Reduce::kMean;
    std::vector<std::vector<double>> fbuckets(float_fold ? out_numel : 0);
    std::vector<std::vector<int64_t>> ibuckets(float_fold ? 0 : out_numel);
    ops::ForEachIndex(in.sizes(), [&](const std::vector<int64_t>& index) {
      int64_t o = 0;
      for (int d = 0; d < in.rank(); ++d)
        o = o * keep_sizes[d] + (reduced[d] ? 0 : index[d]);
      if (float_fold) {
        double v = in.GetDouble(index);
        if (cast_first) v = RoundToDType(v, out_dtype);
        fbuckets[o].push_back(v);
      } else {
        ibuckets[o].push_back(in.GetInt(index));
      }
    });
    double correction = 1;
    if (shared->correction_arg >= 0 &&
        !ctx.arg(shared->correction_arg).is_none()) {
      correction = ctx.arg(shared->correction_arg).ScalarAsDouble();
    }
    HostTensor out = HostTensor::Empty(out_dtype, ctx.out_sizes[0]);
    for (int64_t o = 0; o < out_numel; ++o) {
      if (float_fold) {
        const double v = FoldFloat(shared->kind, fbuckets[o], correction);
        if (IsFloating(out_dtype)) {
          out.SetDoubleAt(o, v);
        } else {
          out.SetIntAt(o, CastDoubleToInt(v, out_dtype));
        }
      } else {
        out.SetIntAt(o, FoldInt(shared->kind, ibuckets[o]));
      }
    }
    return std::vector<HostTensor>{std::move(out)};
  };
  def.lower = [shared](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
    return LowerReduction(ctx, *shared);
  };
  registry.Add(std::move(def));
}

}  // namespace

void RegisterReductionOps(OpRegistry& r) {
  const Attr none = Attr::None();
  const Attr no = Attr::Bool(false);
  auto self = [] { return Arg("self", ArgKind::kTensor); };
  auto dtype_kw = [&] { return KwArg("dtype", ArgKind::kOptionalDType, none); };
  auto dim_list = [&] { return Arg("dim", ArgKind::kOptionalIntList); };
  auto keepdim = [&] { return ArgDefault("keepdim", ArgKind::kBool, no); };

  AddReduction(
      r, {"aten.sum.default", Reduce::kSum, {self(), dtype_kw()}, -1, -1, 1});
  AddReduction(r, {"aten.sum.dim_IntList",
                   Reduce::kSum,
                   {self(), dim_list(), keepdim(), dtype_kw()},
                   1,
                   2,
                   3});
  AddReduction(
      r, {"aten.mean.default", Reduce::kMean, {self(), dtype_kw()}, -1, -1, 1});
  AddReduction(r, {"aten.mean.dim",
                   Reduce::kMean,
                   {self(), dim_list(), keepdim(), dtype_kw()},
                   1,
                   2,
                   3});
  AddReduction(
      r, {"aten.prod.default", Reduce::kProd, {self(), dtype_kw()}, -1, -1, 1});
  AddReduction(r, {"aten.prod.dim_int",
                   Reduce::kProd,
                   {self(), Arg("dim", ArgKind::kInt), keepdim(), dtype_kw()},
                   1,
                   2,
                   3});
  for (auto [name, kind] : {std::pair{"aten.amax.default", Reduce::kMax},
                            std::pair{"aten.amin.default", Reduce::kMin}}) {
    AddReduction(r,
                 {name,
                  kind,
                  {self(), ArgDefault("dim", ArgKind::kIntList, Attr::Ints({})),
                   keepdim()},
                  1,
                  2});
  }
  AddReduction(r, {"aten.var.correction",
                   Reduce::kVar,
                   {self(), ArgDefault("dim", ArgKind::kOptionalIntList, none),
                    KwArg("correction", ArgKind::kOptionalScalar, none),
                    KwArg("keepdim", ArgKind::kBool, no)},
                   1,
                   3,
                   -1,
                   2});
  for (auto [name, kind] :
       {std::pair{"aten.argmax.default", Reduce::kArgMax},
        std::pair{"aten.argmin.default", Reduce::kArgMin}}) {
    AddReduction(
        r, {name,
            kind,
            {self(), ArgDefault("dim", ArgKind::kOptionalInt, none), keepdim()},
            1,
            2});
  }
  for (auto [base, kind] : {std::pair{"aten.any", Reduce::kAny},
                            std::pair{"aten.all", Reduce::kAll}}) {
    AddReduction(r, {absl::StrCat(base, ".default"), kind, {self()}});
    AddReduction(r, {absl::StrCat(base, ".dim"),
                     kind,
                     {self(), Arg("dim", ArgKind::kInt), keepdim()},
                     1,
                     2});
    AddReduction(r,
                 {absl::StrCat(base, ".dims"),
                  kind,
                  {self(), ArgDefault("dim", ArgKind::kOptionalIntList, none),
                   keepdim()},
                  1,
                  2});
  }
}

}  // namespace kiln
