// Loop-IR lowerings of the pointwise ops (signatures:
// graph/ops/pointwise.cc).
//
// Each op is its element expression (a PointwiseExprFn) over operand
// expressions already converted to the compute dtype (graph/ops/
// pointwise.h's ComputeDType; float16/bfloat16 compute in float32).
// LowerPointwise wraps it in one pointwise loop node whose body is cast to
// the output dtype.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"
#include "graph/host_tensor.h"
#include "graph/ops/pointwise.h"

namespace kiln {
namespace ops {
namespace {

// The element expression over the operand expressions `x` (in `operands`
// order), computing in `compute`.
using PointwiseExprFn = Expr (*)(const std::vector<Expr>& x, DType compute,
                                 const Node& node);

struct PointwiseLowering {
  const char* name;
  PointwiseExprFn expr;
};

// ---- the common shapes of element expression ----

template <ExprOp kOp>
Expr LowerUnary(const std::vector<Expr>& x, DType compute, const Node&) {
  return ir::Unary(kOp, x[0], compute);
}
template <ExprOp kOp>
Expr LowerBinary(const std::vector<Expr>& x, DType compute, const Node&) {
  return ir::Binary(kOp, x[0], x[1], compute);
}
// and/or of the operands converted to bool.
template <ExprOp kOp>
Expr LowerLogical(const std::vector<Expr>& x, DType, const Node&) {
  return ir::Binary(kOp, ir::Cast(x[0], DType::kBool),
                    ir::Cast(x[1], DType::kBool), DType::kBool);
}
template <ExprOp kOp>
Expr LowerCompare(const std::vector<Expr>& x, DType, const Node&) {
  return ir::Binary(kOp, x[0], x[1], DType::kBool);
}

// ---- unary ops ----

Expr LowerLogicalNot(const std::vector<Expr>& x, DType, const Node&) {
  return ir::Unary(ExprOp::kNot, ir::Cast(x[0], DType::kBool), DType::kBool);
}

Expr LowerIsNan(const std::vector<Expr>& x, DType compute, const Node&) {
  if (!IsFloating(compute)) return ir::IntConst(0, DType::kBool);
  return ir::Unary(ExprOp::kIsNan, x[0], DType::kBool);
}

// ~x on integers, logical not on bool.
Expr LowerBitwiseNot(const std::vector<Expr>& x, DType compute, const Node&) {
  return ir::Unary(compute == DType::kBool ? ExprOp::kNot : ExprOp::kBitNot,
                   x[0], compute);
}

// ---- add/sub: self (+|-) alpha * other ----

Expr LowerAddSub(const std::vector<Expr>& x, DType compute, const Node& n,
                 bool is_sub) {
  Expr other = x[1];
  const Attr& alpha = n.args[2];
  if (alpha.ScalarAsDouble() != 1) {
    Expr a =
        IsFloating(compute)
            ? ir::Const(alpha.ScalarAsDouble(), compute)
            : ir::IntConst(
                  WrapInt(alpha.kind == Attr::Kind::kBool ? alpha.b : alpha.i,
                          compute),
                  compute);
    other = ir::Binary(ExprOp::kMul, a, other, compute);
  }
  return ir::Binary(is_sub ? ExprOp::kSub : ExprOp::kAdd, x[0], other, compute);
}
Expr LowerAdd(const std::vector<Expr>& x, DType compute, const Node& n) {
  return LowerAddSub(x, compute, n, /*is_sub=*/false);
}
Expr LowerSub(const std::vector<Expr>& x, DType compute, const Node& n) {
  return LowerAddSub(x, compute, n, /*is_sub=*/true);
}

// ---- div with rounding_mode ----

Expr LowerDivMode(const std::vector<Expr>& x, DType compute, const Node& n) {
  const std::string m = n.args[2].is_none() ? "" : n.args[2].str;
  if (m == "floor") return ir::Binary(ExprOp::kFloorDiv, x[0], x[1], compute);
  Expr q = ir::Binary(ExprOp::kDiv, x[0], x[1], compute);  // ints: truncating
  if (m == "trunc" && IsFloating(compute)) {
    q = ir::Unary(ExprOp::kTrunc, q, compute);
  }
  return q;
}

// ---- selection and clamping ----

// Operand 0 (listed last) is where's condition.
Expr LowerWhere(const std::vector<Expr>& x, DType, const Node&) {
  return ir::Select(ir::Cast(x[2], DType::kBool), x[0], x[1]);
}

// max/min propagate NaN from either side, as the reference's clamp does.
Expr LowerClamp(const std::vector<Expr>& x, DType compute, const Node& n) {
  Expr r = x[0];
  if (!n.args[1].is_none()) r = ir::Binary(ExprOp::kMax, r, x[1], compute);
  if (!n.args[2].is_none()) r = ir::Binary(ExprOp::kMin, r, x[2], compute);
  return r;
}

// ---- activations ----

Expr LowerGelu(const std::vector<Expr>& x, DType c, const Node& n) {
  auto k = [c](double v) { return ir::Const(v, c); };
  auto mul = [c](Expr a, Expr b) { return ir::Binary(ExprOp::kMul, a, b, c); };
  auto add = [c](Expr a, Expr b) { return ir::Binary(ExprOp::kAdd, a, b, c); };
  Expr inner;
  if (n.args[1].str == "tanh") {
    Expr cube = mul(mul(x[0], x[0]), x[0]);
    inner = ir::Unary(
        ExprOp::kTanh,
        mul(k(std::sqrt(2.0 / M_PI)), add(x[0], mul(k(0.044715), cube))), c);
  } else {
    inner = ir::Unary(ExprOp::kErf, mul(x[0], k(M_SQRT1_2)), c);
  }
  return mul(mul(k(0.5), x[0]), add(k(1.0), inner));
}

Expr LowerLeakyRelu(const std::vector<Expr>& x, DType c, const Node& n) {
  Expr scaled = ir::Binary(ExprOp::kMul, x[0],
                           ir::Const(n.args[1].ScalarAsDouble(), c), c);
  return ir::Select(
      ir::Binary(ExprOp::kGt, x[0], ir::Const(0, c), DType::kBool), x[0],
      scaled);
}

Expr LowerHardtanh(const std::vector<Expr>& x, DType c, const Node& n) {
  auto bound = [c](const Attr& a) {
    return IsFloating(c)
               ? ir::Const(a.ScalarAsDouble(), c)
               : ir::IntConst(static_cast<int64_t>(a.ScalarAsDouble()), c);
  };
  return ir::Binary(ExprOp::kMin,
                    ir::Binary(ExprOp::kMax, x[0], bound(n.args[1]), c),
                    bound(n.args[2]), c);
}

Expr LowerSilu(const std::vector<Expr>& x, DType c, const Node&) {
  return ir::Binary(ExprOp::kMul, x[0], ir::Unary(ExprOp::kSigmoid, x[0], c),
                    c);
}

// ---- backward ops of activations (x[0] is grad_output) ----

// grad where self > threshold, else 0 (NaN self passes grad, as ATen's
// `self <= threshold ? 0 : grad`).
Expr LowerThresholdBackward(const std::vector<Expr>& x, DType c,
                            const Node& n) {
  const Expr threshold =
      IsFloating(c)
          ? ir::Const(n.args[2].ScalarAsDouble(), c)
          : ir::IntConst(static_cast<int64_t>(n.args[2].ScalarAsDouble()), c);
  return ir::Select(ir::Binary(ExprOp::kLe, x[1], threshold, DType::kBool),
                    IsFloating(c) ? ir::Const(0, c) : ir::IntConst(0, c),
                    x[0]);
}

// ATen's GeluBackwardKernel: grad * (cdf + x * pdf), or for tanh the
// derivative of 0.5 x (1 + tanh(inner)).
Expr LowerGeluBackward(const std::vector<Expr>& x, DType c, const Node& n) {
  auto k = [c](double v) { return ir::Const(v, c); };
  auto mul = [c](Expr a, Expr b) { return ir::Binary(ExprOp::kMul, a, b, c); };
  auto add = [c](Expr a, Expr b) { return ir::Binary(ExprOp::kAdd, a, b, c); };
  auto sub = [c](Expr a, Expr b) { return ir::Binary(ExprOp::kSub, a, b, c); };
  const Expr& g = x[0];
  const Expr& v = x[1];
  if (n.args[2].str == "tanh") {
    const double beta = std::sqrt(2.0 / M_PI), kappa = 0.044715;
    Expr sq = mul(v, v);
    Expr inner = mul(k(beta), add(v, mul(k(kappa), mul(sq, v))));
    Expr t = ir::Unary(ExprOp::kTanh, inner, c);
    Expr left = mul(k(0.5), v);
    Expr left_d = mul(k(0.5), add(k(1), t));
    Expr right_d = mul(mul(left, sub(k(1), mul(t, t))),
                       mul(k(beta), add(k(1), mul(k(3 * kappa), sq))));
    return mul(g, add(left_d, right_d));
  }
  Expr cdf = mul(k(0.5), add(k(1), ir::Unary(ExprOp::kErf,
                                             mul(v, k(M_SQRT1_2)), c)));
  Expr pdf = mul(k(0.5 * M_2_SQRTPI * M_SQRT1_2),
                 ir::Unary(ExprOp::kExp, mul(k(-0.5), mul(v, v)), c));
  return mul(g, add(cdf, mul(v, pdf)));
}

// grad * (1 - y) * y.
Expr LowerSigmoidBackward(const std::vector<Expr>& x, DType c, const Node&) {
  return ir::Binary(
      ExprOp::kMul,
      ir::Binary(ExprOp::kMul, x[0],
                 ir::Binary(ExprOp::kSub, ir::Const(1, c), x[1], c), c),
      x[1], c);
}

// grad * (1 - y * y).
Expr LowerTanhBackward(const std::vector<Expr>& x, DType c, const Node&) {
  return ir::Binary(
      ExprOp::kMul, x[0],
      ir::Binary(ExprOp::kSub, ir::Const(1, c),
                 ir::Binary(ExprOp::kMul, x[1], x[1], c), c),
      c);
}

// grad * s * (1 + x * (1 - s)), s = sigmoid(x).
Expr LowerSiluBackward(const std::vector<Expr>& x, DType c, const Node&) {
  auto mul = [c](Expr a, Expr b) { return ir::Binary(ExprOp::kMul, a, b, c); };
  Expr s = ir::Unary(ExprOp::kSigmoid, x[1], c);
  Expr one = ir::Const(1, c);
  return mul(mul(x[0], s),
             ir::Binary(ExprOp::kAdd, one,
                        mul(x[1], ir::Binary(ExprOp::kSub, one, s, c)), c));
}

// lerp as an expression, in the same two-sided form as the reference.
Expr LerpExpr(Expr s, Expr e, Expr w, DType c) {
  auto sub = [c](Expr a, Expr b) { return ir::Binary(ExprOp::kSub, a, b, c); };
  auto mul = [c](Expr a, Expr b) { return ir::Binary(ExprOp::kMul, a, b, c); };
  Expr diff = sub(e, s);
  Expr low = ir::Binary(ExprOp::kAdd, s, mul(w, diff), c);
  Expr high = sub(e, mul(diff, sub(ir::Const(1, c), w)));
  Expr small = ir::Binary(ExprOp::kLt, ir::Unary(ExprOp::kAbs, w, c),
                          ir::Const(0.5, c), DType::kBool);
  return ir::Select(small, low, high);
}
Expr LowerLerpScalar(const std::vector<Expr>& x, DType c, const Node& n) {
  return LerpExpr(x[0], x[1], ir::Const(n.args[2].ScalarAsDouble(), c), c);
}
Expr LowerLerpTensor(const std::vector<Expr>& x, DType c, const Node&) {
  return LerpExpr(x[0], x[1], x[2], c);
}

// ---- the table ----

constexpr PointwiseLowering kPointwiseLowerings[] = {
    // Unary ops with floating results.
    {"aten.exp.default", LowerUnary<ExprOp::kExp>},
    {"aten.exp2.default", LowerUnary<ExprOp::kExp2>},
    {"aten.expm1.default", LowerUnary<ExprOp::kExpm1>},
    {"aten.log.default", LowerUnary<ExprOp::kLog>},
    {"aten.log2.default", LowerUnary<ExprOp::kLog2>},
    {"aten.log1p.default", LowerUnary<ExprOp::kLog1p>},
    {"aten.sqrt.default", LowerUnary<ExprOp::kSqrt>},
    {"aten.rsqrt.default", LowerUnary<ExprOp::kRsqrt>},
    {"aten.reciprocal.default", LowerUnary<ExprOp::kReciprocal>},
    {"aten.sin.default", LowerUnary<ExprOp::kSin>},
    {"aten.cos.default", LowerUnary<ExprOp::kCos>},
    {"aten.tan.default", LowerUnary<ExprOp::kTan>},
    {"aten.tanh.default", LowerUnary<ExprOp::kTanh>},
    {"aten.sigmoid.default", LowerUnary<ExprOp::kSigmoid>},
    {"aten.erf.default", LowerUnary<ExprOp::kErf>},
    // Unary ops that keep integral dtypes.
    {"aten.abs.default", LowerUnary<ExprOp::kAbs>},
    {"aten.neg.default", LowerUnary<ExprOp::kNeg>},
    {"aten.relu.default", LowerUnary<ExprOp::kRelu>},
    {"aten.floor.default", LowerUnary<ExprOp::kFloor>},
    {"aten.ceil.default", LowerUnary<ExprOp::kCeil>},
    {"aten.round.default", LowerUnary<ExprOp::kRound>},
    {"aten.trunc.default", LowerUnary<ExprOp::kTrunc>},
    {"aten.sign.default", LowerUnary<ExprOp::kSign>},
    {"aten.logical_not.default", LowerLogicalNot},
    {"aten.isnan.default", LowerIsNan},
    {"aten.bitwise_not.default", LowerBitwiseNot},
    // add/sub.
    {"aten.add.Tensor", LowerAdd},
    {"aten.add.Scalar", LowerAdd},
    {"aten.sub.Tensor", LowerSub},
    {"aten.sub.Scalar", LowerSub},
    // Binary arithmetic.
    {"aten.mul.Tensor", LowerBinary<ExprOp::kMul>},
    {"aten.mul.Scalar", LowerBinary<ExprOp::kMul>},
    {"aten.div.Tensor", LowerBinary<ExprOp::kDiv>},
    {"aten.div.Scalar", LowerBinary<ExprOp::kDiv>},
    {"aten.div.Tensor_mode", LowerDivMode},
    {"aten.div.Scalar_mode", LowerDivMode},
    {"aten.remainder.Tensor", LowerBinary<ExprOp::kRemainder>},
    {"aten.remainder.Scalar", LowerBinary<ExprOp::kRemainder>},
    {"aten.fmod.Tensor", LowerBinary<ExprOp::kFmod>},
    {"aten.fmod.Scalar", LowerBinary<ExprOp::kFmod>},
    {"aten.bitwise_and.Tensor", LowerBinary<ExprOp::kBitAnd>},
    {"aten.bitwise_and.Scalar", LowerBinary<ExprOp::kBitAnd>},
    {"aten.bitwise_or.Tensor", LowerBinary<ExprOp::kBitOr>},
    {"aten.bitwise_or.Scalar", LowerBinary<ExprOp::kBitOr>},
    {"aten.pow.Tensor_Tensor", LowerBinary<ExprOp::kPow>},
    {"aten.pow.Tensor_Scalar", LowerBinary<ExprOp::kPow>},
    {"aten.pow.Scalar", LowerBinary<ExprOp::kPow>},
    {"aten.maximum.default", LowerBinary<ExprOp::kMax>},
    {"aten.minimum.default", LowerBinary<ExprOp::kMin>},
    {"aten.atan2.default", LowerBinary<ExprOp::kAtan2>},
    {"aten.logical_and.default", LowerLogical<ExprOp::kAnd>},
    {"aten.logical_or.default", LowerLogical<ExprOp::kOr>},
    // Comparisons.
    {"aten.eq.Tensor", LowerCompare<ExprOp::kEq>},
    {"aten.eq.Scalar", LowerCompare<ExprOp::kEq>},
    {"aten.ne.Tensor", LowerCompare<ExprOp::kNe>},
    {"aten.ne.Scalar", LowerCompare<ExprOp::kNe>},
    {"aten.lt.Tensor", LowerCompare<ExprOp::kLt>},
    {"aten.lt.Scalar", LowerCompare<ExprOp::kLt>},
    {"aten.le.Tensor", LowerCompare<ExprOp::kLe>},
    {"aten.le.Scalar", LowerCompare<ExprOp::kLe>},
    {"aten.gt.Tensor", LowerCompare<ExprOp::kGt>},
    {"aten.gt.Scalar", LowerCompare<ExprOp::kGt>},
    {"aten.ge.Tensor", LowerCompare<ExprOp::kGe>},
    {"aten.ge.Scalar", LowerCompare<ExprOp::kGe>},
    // Selection and clamping.
    {"aten.where.self", LowerWhere},
    {"aten.where.ScalarSelf", LowerWhere},
    {"aten.where.ScalarOther", LowerWhere},
    {"aten.where.Scalar", LowerWhere},
    {"aten.clamp.default", LowerClamp},
    {"aten.clamp.Tensor", LowerClamp},
    {"aten.clamp_min.default", LowerBinary<ExprOp::kMax>},
    {"aten.clamp_max.default", LowerBinary<ExprOp::kMin>},
    // Activations.
    {"aten.gelu.default", LowerGelu},
    {"aten.leaky_relu.default", LowerLeakyRelu},
    {"aten.hardtanh.default", LowerHardtanh},
    {"aten.silu.default", LowerSilu},
    {"aten.threshold_backward.default", LowerThresholdBackward},
    {"aten.gelu_backward.default", LowerGeluBackward},
    {"aten.sigmoid_backward.default", LowerSigmoidBackward},
    {"aten.tanh_backward.default", LowerTanhBackward},
    {"aten.silu_backward.default", LowerSiluBackward},
    {"aten.lerp.Scalar", LowerLerpScalar},
    {"aten.lerp.Tensor", LowerLerpTensor},
};

// ---- the rules ----

// relu and tanh-gelu of a value of the same dtype may become a library
// call's epilogue (compiler/gemm_epilogue.h).
void MarkActivation(LowerContext& ctx, const LoweredValue& result) {
  const std::string& op = ctx.node().op->name;
  GemmEpilogue kind = GemmEpilogue::kNone;
  if (op == "aten.relu.default") {
    kind = GemmEpilogue::kRelu;
  } else if (op == "aten.gelu.default" && ctx.node().args[1].str == "tanh") {
    kind = GemmEpilogue::kGeluTanh;
  }
  if (kind == GemmEpilogue::kNone || ctx.value(0).dtype != result.dtype) return;
  ctx.MarkEpilogue(result, kind, ctx.value(0));
}

// One pointwise loop node over the output's sizes computing `expr`.
absl::StatusOr<std::vector<LoweredValue>> LowerPointwise(
    const PointwiseSignature& op, PointwiseExprFn expr, LowerContext& ctx) {
  const DType compute = ComputeDType(op, ctx.node(), [&ctx](int i) {
    return std::pair(ctx.value(i).dtype, ctx.value(i).sizes.empty());
  });
  const TensorType& out = ctx.out_type();
  // float16/bfloat16 ops compute in float32 (PyTorch's opmath) from
  // operands converted to the compute dtype, and round once at the end:
  // each op's result is rounded, its internal steps (alpha * other,
  // gelu's polynomial) are not, as in eager PyTorch and the reference.
  const DType math = (compute == DType::kFloat16 || compute == DType::kBFloat16)
                         ? DType::kFloat32
                         : compute;
  std::vector<Expr> x;
  for (int i : op.operands) {
    Expr e = ctx.Operand(i, out.sizes, compute);
    x.push_back(math == compute ? e : ir::Cast(e, math));
  }
  LoopNode node;
  node.kind = LoopNode::Kind::kPointwise;
  node.dtype = out.dtype;
  node.sizes = out.sizes;
  node.body = ir::Cast(expr(x, math, ctx.node()), out.dtype);
  const LoweredValue result = ctx.AddNode(std::move(node));
  MarkActivation(ctx, result);
  return std::vector<LoweredValue>{result};
}

// Casts: the input read broadcast to the output, cast to its dtype.
absl::StatusOr<std::vector<LoweredValue>> LowerCast(LowerContext& ctx) {
  return std::vector<LoweredValue>{ops::PointwiseOutput(
      ctx, LowerContext::ReadBroadcast(ctx.value(0), ctx.out_type().sizes))};
}

// The signature of `lowering`'s op; none is a programming error and aborts.
const PointwiseSignature& SignatureOf(const PointwiseLowering& lowering) {
  const PointwiseSignature* op = FindPointwiseSignature(lowering.name);
  if (op == nullptr) {
    std::fprintf(stderr, "kiln: pointwise lowering of %s has no signature\n",
                 lowering.name);
    std::abort();
  }
  return *op;
}

}  // namespace
}  // namespace ops

void RegisterPointwiseLowerings(OpLowerings& table) {
  for (const ops::PointwiseLowering& l : ops::kPointwiseLowerings) {
    const ops::PointwiseSignature* op = &ops::SignatureOf(l);
    const ops::PointwiseExprFn expr = l.expr;
    table.Add(l.name, [op, expr](LowerContext& ctx) {
      return ops::LowerPointwise(*op, expr, ctx);
    });
  }
  table.Add("aten._to_copy.default", ops::LowerCast);
  table.Add("prims.convert_element_type.default", ops::LowerCast);
}

}  // namespace kiln
