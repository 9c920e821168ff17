// Composite ops of op set v1: _softmax, _log_softmax and native_layer_norm.
// Their references compute in double with the textbook formulas (softmax
// with the max subtracted); the lowering decomposes them into reductions
// and pointwise ops.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "compiler/ops/legacy.h"

namespace kiln {
namespace {

using ops::Arg;
using Shapes = std::vector<std::vector<SymExpr>>;

// Calls fn(row_values_indices) for each "row" along `dim`: the list of
// multi-indices sharing all other coordinates.
void ForEachRow(
    const std::vector<int64_t>& sizes, const std::vector<bool>& reduced,
    const std::function<void(const std::vector<std::vector<int64_t>>&)>& fn) {
  std::vector<int64_t> outer = sizes, inner(sizes.size(), 1);
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (reduced[d]) {
      outer[d] = 1;
      inner[d] = sizes[d];
    }
  }
  ops::ForEachIndex(outer, [&](const std::vector<int64_t>& o) {
    std::vector<std::vector<int64_t>> row;
    ops::ForEachIndex(inner, [&](const std::vector<int64_t>& i) {
      std::vector<int64_t> idx(sizes.size());
      for (size_t d = 0; d < sizes.size(); ++d)
        idx[d] = reduced[d] ? i[d] : o[d];
      row.push_back(std::move(idx));
    });
    fn(row);
  });
}

void AddSoftmax(OpRegistry& r, const char* name, bool log) {
  OpDef def;
  def.name = name;
  def.op_class = OpClass::kComposite;
  def.schema = {Arg("self", ArgKind::kTensor), Arg("dim", ArgKind::kInt),
                Arg("half_to_float", ArgKind::kBool)};
  def.shape = [](const OpContext& ctx) -> absl::StatusOr<Shapes> {
    auto d = ctx.WrapDim(ctx.arg(1).i, ctx.type(0).rank());
    if (!d.ok()) return d.status();
    return Shapes{ctx.type(0).sizes};
  };
  def.dtype = [](const OpContext& ctx) -> absl::StatusOr<std::vector<DType>> {
    const DType in = ctx.type(0).dtype;
    if (!IsFloating(in)) {
      return ctx.Invalid(
          absl::StrCat("needs a floating point input, got ", DTypeName(in)));
    }
    if (ctx.arg(2).b) {
      // As CUDA's host_softmax ("conversion is supported for Half type
      // only") and torch._decomp's _softmax: float16 only, not bfloat16.
      if (in != DType::kFloat16) {
        return ctx.Invalid(absl::StrCat(
            "half_to_float=True needs a float16 input, got ", DTypeName(in)));
      }
      return std::vector<DType>{DType::kFloat32};
    }
    return std::vector<DType>{in};
  };
  def.reference =
      [log](const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
    const HostTensor& in = ctx.tensors[0];
    HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
    std::vector<bool> reduced(in.rank(), false);
    if (in.rank() > 0) {
      const int64_t d = ctx.arg(1).i;
      reduced[d < 0 ? d + in.rank() : d] = true;
    }
    ForEachRow(
        in.sizes(), reduced, [&](const std::vector<std::vector<int64_t>>& row) {
          double mx = -INFINITY;
          for (const auto& i : row) mx = std::max(mx, in.GetDouble(i));
          // An all -inf row: PyTorch gives NaN (exp(-inf - -inf)); keep that.
          double sum = 0;
          for (const auto& i : row) sum += std::exp(in.GetDouble(i) - mx);
          for (const auto& i : row) {
            const double x = in.GetDouble(i) - mx;
            out.SetDouble(i, log ? x - std::log(sum) : std::exp(x) / sum);
          }
        });
    return std::vector<HostTensor>{std::move(out)};
  };
  def.lower = [log](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
    const LoweredValue& in = ctx.value(0);
    const int rank = static_cast<int>(in.sizes.size());
    std::vector<bool> reduced(rank, false);
    if (rank > 0) {
      const int64_t d = ctx.arg(1).i;
      reduced[d < 0 ? d + rank : d] = true;
    }
    const DType f32 = DType::kFloat32;
    const Expr x = ir::Cast(LowerContext::ReadBroadcast(in, in.sizes), f32);
    auto mx = ops::LowerReductionOver(ctx, in, reduced, true, ReduceKind::kMax, f32, f32, x, nullptr);
    if (!mx.ok()) return mx.status();
    const Expr shifted = ir::Binary(ExprOp::kSub, x, ops::ReadKept((*mx)[0], reduced), f32);
    const Expr e = ir::Unary(ExprOp::kExp, shifted, f32);
    auto sum = ops::LowerReductionOver(ctx, in, reduced, true, ReduceKind::kSum, f32, f32, e, nullptr);
    if (!sum.ok()) return sum.status();
    const Expr denom = ops::ReadKept((*sum)[0], reduced);
    const Expr out = log ? ir::Binary(ExprOp::kSub, shifted, ir::Unary(ExprOp::kLog, denom, f32), f32)
                         : ir::Binary(ExprOp::kDiv, e, denom, f32);
    LoopNode node;
    node.kind = LoopNode::Kind::kPointwise;
    node.dtype = ctx.out_type().dtype;
    node.sizes = in.sizes;
    node.body = ir::Cast(out, node.dtype);
    return std::vector<LoweredValue>{ctx.AddNode(std::move(node))};
  };
  r.Add(std::move(def));
}

void AddLayerNorm(OpRegistry& r) {
  OpDef def;
  def.name = "aten.native_layer_norm.default";
  def.op_class = OpClass::kComposite;
  def.num_outputs = 3;
  def.schema = {Arg("input", ArgKind::kTensor),
                Arg("normalized_shape", ArgKind::kIntList),
                Arg("weight", ArgKind::kOptionalTensor),
                Arg("bias", ArgKind::kOptionalTensor),
                Arg("eps", ArgKind::kFloat)};
  def.shape = [](const OpContext& ctx) -> absl::StatusOr<Shapes> {
    const std::vector<SymExpr>& in = ctx.type(0).sizes;
    const std::vector<SymExpr>& norm = ctx.arg(1).ints;
    if (norm.empty()) return ctx.Invalid("normalized_shape must not be empty");
    if (norm.size() > in.size()) {
      return ctx.Invalid(absl::StrCat("normalized_shape has ", norm.size(),
                                      " dims but the input has rank ",
                                      in.size()));
    }
    const size_t axis = in.size() - norm.size();
    for (size_t i = 0; i < norm.size(); ++i) {
      if (norm[i] != in[axis + i]) {
        return ctx.Invalid(absl::StrCat(
            "normalized_shape does not match the input's trailing dims (dim ",
            axis + i, ")"));
      }
    }
    for (int w : {2, 3}) {
      if (ctx.arg(w).is_none()) continue;
      if (ctx.type(w).sizes != norm) {
        return ctx.Invalid(absl::StrCat(w == 2 ? "weight" : "bias",
                                        " must have shape normalized_shape"));
      }
    }
    std::vector<SymExpr> stat(in.begin(), in.begin() + axis);
    stat.resize(in.size(), SymExpr(1));
    return Shapes{in, stat, stat};
  };
  // mean/rstd are float32 for half inputs (PyTorch's CUDA behaviour; Kiln
  // targets GPUs first) and the input's dtype otherwise.
  def.dtype = [](const OpContext& ctx) -> absl::StatusOr<std::vector<DType>> {
    const DType in = ctx.type(0).dtype;
    if (!IsFloating(in)) {
      return ctx.Invalid(
          absl::StrCat("needs a floating point input, got ", DTypeName(in)));
    }
    for (int w : {2, 3}) {
      if (!ctx.arg(w).is_none() && ctx.type(w).dtype != in) {
        return ctx.Invalid(absl::StrCat(
            w == 2 ? "weight" : "bias", " dtype ", DTypeName(ctx.type(w).dtype),
            " differs from input dtype ", DTypeName(in)));
      }
    }
    return std::vector<DType>{in, DType::kFloat32, DType::kFloat32};
  };
  def.reference =
      [](const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
    const HostTensor& in = ctx.tensors[0];
    const size_t norm_rank = ctx.arg(1).ints.size();
    const size_t axis = in.rank() - norm_rank;
    const double eps = ctx.arg(4).ScalarAsDouble();
    const bool has_w = !ctx.arg(2).is_none(), has_b = !ctx.arg(3).is_none();
    HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
    HostTensor mean = HostTensor::Empty(ctx.out_dtypes[1], ctx.out_sizes[1]);
    HostTensor rstd = HostTensor::Empty(ctx.out_dtypes[2], ctx.out_sizes[2]);
    std::vector<bool> reduced(in.rank(), false);
    for (size_t d = axis; d < static_cast<size_t>(in.rank()); ++d)
      reduced[d] = true;
    int64_t row_index = 0;
    ForEachRow(in.sizes(), reduced,
               [&](const std::vector<std::vector<int64_t>>& row) {
                 const double n = static_cast<double>(row.size());
                 double m = 0;
                 for (const auto& i : row) m += in.GetDouble(i);
                 m /= n;
                 double var = 0;
                 for (const auto& i : row)
                   var += (in.GetDouble(i) - m) * (in.GetDouble(i) - m);
                 var /= n;
                 const double rs = 1.0 / std::sqrt(var + eps);
                 for (const auto& i : row) {
                   std::vector<int64_t> widx(i.begin() + axis, i.end());
                   double y = (in.GetDouble(i) - m) * rs;
                   if (has_w) y *= ctx.tensors[2].GetDouble(widx);
                   if (has_b) y += ctx.tensors[3].GetDouble(widx);
                   out.SetDouble(i, y);
                 }
                 mean.SetDoubleAt(row_index, m);
                 rstd.SetDoubleAt(row_index, rs);
                 ++row_index;
               });
    return std::vector<HostTensor>{std::move(out), std::move(mean),
                                   std::move(rstd)};
  };
  // Two passes per row (mean, then variance about it): numerically sound
  // where E[x^2] - E[x]^2 is not. Fusion keeps all of it in one row kernel.
  def.lower = [](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
    const LoweredValue& in = ctx.value(0);
    const int rank = static_cast<int>(in.sizes.size());
    const int axis = rank - static_cast<int>(ctx.arg(1).ints.size());
    std::vector<bool> reduced(rank, false);
    for (int d = axis; d < rank; ++d) reduced[d] = true;
    const DType f32 = DType::kFloat32;
    auto div = [f32](Expr acc, Expr count) {
      return ir::Binary(ExprOp::kDiv, acc, ir::Cast(count, f32), f32);
    };
    const Expr x = ir::Cast(LowerContext::ReadBroadcast(in, in.sizes), f32);
    auto mean = ops::LowerReductionOver(ctx, in, reduced, true, ReduceKind::kSum, f32, f32, x, div);
    if (!mean.ok()) return mean.status();
    const Expr dev = ir::Binary(ExprOp::kSub, x, ops::ReadKept((*mean)[0], reduced), f32);
    auto var = ops::LowerReductionOver(ctx, in, reduced, true, ReduceKind::kSum, f32, f32,
                                       ir::Binary(ExprOp::kMul, dev, dev, f32), div);
    if (!var.ok()) return var.status();
    const LoweredValue& v = (*var)[0];
    LoopNode rstd;
    rstd.kind = LoopNode::Kind::kPointwise;
    rstd.dtype = ctx.out_type(2).dtype;
    rstd.sizes = v.sizes;
    rstd.body = ir::Cast(
        ir::Unary(ExprOp::kRsqrt,
                  ir::Binary(ExprOp::kAdd, LowerContext::Read(v, IdentityIndex(rank)),
                             ir::Const(ctx.arg(4).ScalarAsDouble(), f32), f32),
                  f32),
        rstd.dtype);
    LoweredValue rstd_value = ctx.AddNode(std::move(rstd));
    Expr y = ir::Binary(ExprOp::kMul, dev, ir::Cast(ops::ReadKept(rstd_value, reduced), f32), f32);
    if (ctx.is_tensor(2)) {
      y = ir::Binary(ExprOp::kMul, y, ir::Cast(LowerContext::ReadBroadcast(ctx.value(2), in.sizes), f32), f32);
    }
    if (ctx.is_tensor(3)) {
      y = ir::Binary(ExprOp::kAdd, y, ir::Cast(LowerContext::ReadBroadcast(ctx.value(3), in.sizes), f32), f32);
    }
    LoopNode out;
    out.kind = LoopNode::Kind::kPointwise;
    out.dtype = ctx.out_type(0).dtype;
    out.sizes = in.sizes;
    out.body = ir::Cast(y, out.dtype);
    LoweredValue out_value = ctx.AddNode(std::move(out));
    LoweredValue mean_value = (*mean)[0];
    return std::vector<LoweredValue>{out_value, mean_value, rstd_value};
  };
  r.Add(std::move(def));
}

}  // namespace

void RegisterCompositeOps(OpRegistry& r) {
  AddSoftmax(r, "aten._softmax.default", /*log=*/false);
  AddSoftmax(r, "aten._log_softmax.default", /*log=*/true);
  AddLayerNorm(r);
}

}  // namespace kiln
