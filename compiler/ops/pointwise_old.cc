// Pointwise ops of op set v1: unary, binary (Tensor and Scalar overloads),
// comparisons, logical and bitwise ops, where/clamp/casts and activations.
//
// Every entry is a PointwiseOp: its schema, which arguments are operands,
// how the compute dtype is chosen, and the element function in the
// floating domain (double) and, where the op is defined on integers, in the
// integral domain (int64, wrapping).
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "compiler/ops/legacy.h"

namespace kiln {
namespace {

using ops::Arg;
using ops::ArgDefault;
using ops::FloatFn;
using ops::IntFn;
using ops::KwArg;

enum class Promotion : uint8_t {
  kResultType,  // compute and output: result_type of the operands
  kIntToFloat,  // as kResultType, then integral/bool -> default float
  kBoolOutput,  // compute: result_type; output bool (comparisons, logical)
  kFloatOnly,   // compute: result_type, which must be floating
};

struct PointwiseOp {
  std::string name;
  std::vector<ArgSpec> schema;
  std::vector<int> operands;  // argument positions combined elementwise
  Promotion promotion = Promotion::kResultType;
  bool allow_bool = true;  // may the compute dtype be bool?
  // Element functions for a node (they may read the node's other args).
  std::function<FloatFn(const Node&)> float_fn;
  std::function<IntFn(const Node&)> int_fn;  // null: no integral compute
  // Op-specific checks after the compute dtype is known.
  std::function<absl::Status(const OpContext&, DType compute)> check;
  // How many leading `operands` take part in type promotion (-1: all);
  // where's condition does not.
  int promoted_operands = -1;
  // div's rounding_mode: when this argument is None the op is true division
  // and integral inputs compute in the default float dtype.
  int true_division_if_none_arg = -1;
  // Element function when the compute dtype is bool (default: int_fn).
  std::function<IntFn(const Node&)> bool_fn;
  // Loop-IR lowering: the element expression over operand expressions
  // already converted to the compute dtype. The result is cast to the
  // output dtype by AddPointwise.
  std::function<Expr(const std::vector<Expr>& x, DType compute, const Node& node)> lower;
};

// Lowerings for the common shapes of element function.
std::function<Expr(const std::vector<Expr>&, DType, const Node&)> Un(ExprOp op) {
  return [op](const std::vector<Expr>& x, DType compute, const Node&) {
    return ir::Unary(op, x[0], compute);
  };
}
std::function<Expr(const std::vector<Expr>&, DType, const Node&)> Bin(ExprOp op) {
  return [op](const std::vector<Expr>& x, DType compute, const Node&) {
    return ir::Binary(op, x[0], x[1], compute);
  };
}
std::function<Expr(const std::vector<Expr>&, DType, const Node&)> Logical(ExprOp op) {
  return [op](const std::vector<Expr>& x, DType, const Node&) {
    return ir::Binary(op, ir::Cast(x[0], DType::kBool), ir::Cast(x[1], DType::kBool), DType::kBool);
  };
}
std::function<Expr(const std::vector<Expr>&, DType, const Node&)> Compare(ExprOp op) {
  return [op](const std::vector<Expr>& x, DType, const Node&) {
    return ir::Binary(op, x[0], x[1], DType::kBool);
  };
}

// The dtype the element function computes in. `tensor_dtype(i)` gives the
// dtype of tensor argument i and whether it is zero-dim.
template <typename TensorDType>
DType ComputeDType(const PointwiseOp& op, const Node& node,
                   TensorDType tensor_dtype) {
  ResultTypeState state;
  const int n = op.promoted_operands < 0 ? static_cast<int>(op.operands.size())
                                         : op.promoted_operands;
  for (int k = 0; k < n; ++k) {
    const Attr& a = node.args[op.operands[k]];
    if (a.kind == Attr::Kind::kTensor) {
      auto [dtype, zero_dim] = tensor_dtype(op.operands[k]);
      state.AddTensor(dtype, zero_dim);
    } else if (a.is_scalar()) {
      state.AddScalar(a.ScalarKind());
    }
  }
  DType d = state.Result();
  const bool true_division = op.true_division_if_none_arg >= 0 &&
                             node.args[op.true_division_if_none_arg].is_none();
  if ((op.promotion == Promotion::kIntToFloat || true_division) &&
      !IsFloating(d)) {
    d = kDefaultFloat;
  }
  return d;
}

using LowerExprFn = std::function<Expr(const std::vector<Expr>&, DType, const Node&)>;

void AddPointwise(OpRegistry& registry, PointwiseOp op, LowerExprFn lower = nullptr) {
  if (lower) op.lower = std::move(lower);
  auto shared = std::make_shared<PointwiseOp>(std::move(op));
  OpDef def;
  def.name = shared->name;
  def.op_class = OpClass::kPointwise;
  def.schema = shared->schema;
  def.shape = [shared](const OpContext& ctx)
      -> absl::StatusOr<std::vector<std::vector<SymExpr>>> {
    auto s = ops::BroadcastArgs(ctx, shared->operands);
    if (!s.ok()) return s.status();
    return std::vector<std::vector<SymExpr>>{*std::move(s)};
  };
  def.dtype =
      [shared](const OpContext& ctx) -> absl::StatusOr<std::vector<DType>> {
    const DType compute = ComputeDType(*shared, ctx.node(), [&ctx](int i) {
      return std::pair(ctx.type(i).dtype, ctx.type(i).rank() == 0);
    });
    if (!IsFloating(compute) && !shared->int_fn) {
      return ctx.Invalid(absl::StrCat("not implemented for ",
                                      DTypeName(compute),
                                      " inputs (needs floating point)"));
    }
    if (IsFloating(compute) && !shared->float_fn) {
      return ctx.Invalid(absl::StrCat("not implemented for ", DTypeName(compute),
                                      " inputs (needs integral or bool)"));
    }
    if (compute == DType::kBool && !shared->allow_bool) {
      return ctx.Invalid("not implemented for bool inputs");
    }
    if (shared->promotion == Promotion::kFloatOnly && !IsFloating(compute)) {
      return ctx.Invalid(absl::StrCat("needs floating point inputs, got ",
                                      DTypeName(compute)));
    }
    if (shared->check) {
      absl::Status st = shared->check(ctx, compute);
      if (!st.ok()) return st;
    }
    const DType out =
        shared->promotion == Promotion::kBoolOutput ? DType::kBool : compute;
    return std::vector<DType>{out};
  };
  def.reference =
      [shared](
          const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
    const DType compute = ComputeDType(*shared, ctx.node, [&ctx](int i) {
      return std::pair(ctx.tensors[i].dtype(), ctx.tensors[i].rank() == 0);
    });
    FloatFn fd = shared->float_fn ? shared->float_fn(ctx.node) : FloatFn();
    IntFn fi = (compute == DType::kBool && shared->bool_fn)
                   ? shared->bool_fn(ctx.node)
               : shared->int_fn ? shared->int_fn(ctx.node)
                                : IntFn();
    return std::vector<HostTensor>{
        ops::Elementwise(ctx, shared->operands, compute, fd, fi)};
  };
  def.lower = [shared](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
    if (!shared->lower) return ctx.Unimplemented("no loop-IR lowering for this op yet");
    const DType compute = ComputeDType(*shared, ctx.node(), [&ctx](int i) {
      return std::pair(ctx.value(i).dtype, ctx.value(i).sizes.empty());
    });
    const TensorType& out = ctx.out_type();
    // float16/bfloat16 ops compute in float32 (PyTorch's opmath) from
    // operands converted to the compute dtype, and round once at the end:
    // each op's result is rounded, its internal steps (alpha * other,
    // gelu's polynomial) are not, as in eager PyTorch and the reference.
    const DType math =
        (compute == DType::kFloat16 || compute == DType::kBFloat16) ? DType::kFloat32 : compute;
    std::vector<Expr> x;
    for (int i : shared->operands) {
      Expr e = ctx.Operand(i, out.sizes, compute);
      x.push_back(math == compute ? e : ir::Cast(e, math));
    }
    LoopNode node;
    node.kind = LoopNode::Kind::kPointwise;
    node.dtype = out.dtype;
    node.sizes = out.sizes;
    node.body = ir::Cast(shared->lower(x, math, ctx.node()), out.dtype);
    return std::vector<LoweredValue>{ctx.AddNode(std::move(node))};
  };
  registry.Add(std::move(def));
}

// ---- element functions ----

using D1 = double (*)(double);
std::function<FloatFn(const Node&)> F1(D1 f) {
  return [f](const Node&) {
    return FloatFn([f](const double* a) { return f(a[0]); });
  };
}
using I1 = int64_t (*)(int64_t);
std::function<IntFn(const Node&)> I1Fn(I1 f) {
  return [f](const Node&) {
    return IntFn([f](const int64_t* a) { return f(a[0]); });
  };
}
template <typename F>
std::function<FloatFn(const Node&)> F2(F f) {
  return [f](const Node&) {
    return FloatFn([f](const double* a) { return f(a[0], a[1]); });
  };
}
template <typename F>
std::function<IntFn(const Node&)> I2(F f) {
  return [f](const Node&) {
    return IntFn([f](const int64_t* a) { return f(a[0], a[1]); });
  };
}

// Wrapping int64 arithmetic (no UB on overflow).
int64_t WrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) +
                              static_cast<uint64_t>(b));
}
int64_t WrapSub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) -
                              static_cast<uint64_t>(b));
}
int64_t WrapMul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) *
                              static_cast<uint64_t>(b));
}

// Integer division rounding toward zero. Division by zero yields 0 (PyTorch
// raises on CPU; Kiln's kernels must not trap) and INT64_MIN / -1 wraps.
int64_t TruncDiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  if (b == -1) return WrapSub(0, a);
  return a / b;
}
int64_t FloorDiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  if (b == -1) return WrapSub(0, a);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t TruncMod(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;
  return a % b;
}
int64_t FloorMod(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
double PyRemainder(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((b < 0) != (r < 0))) r += b;
  return r;
}
double DivFloor(double a, double b) {
  // PyTorch's div_floor_floating: floor of the true quotient, computed so
  // that it matches Python's // on exact cases.
  if (b == 0) return a / b;
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  double floordiv;
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, a / b);
  }
  return floordiv;
}
int64_t IntPow(int64_t base, int64_t exp) {
  if (exp < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exp & 1) ? -1 : 1;
    return 0;
  }
  int64_t result = 1;
  while (exp) {
    if (exp & 1) result = WrapMul(result, base);
    base = WrapMul(base, base);
    exp >>= 1;
  }
  return result;
}
double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double NanMax(double a, double b) {
  return (std::isnan(a) || std::isnan(b)) ? NAN : std::max(a, b);
}
double NanMin(double a, double b) {
  return (std::isnan(a) || std::isnan(b)) ? NAN : std::min(a, b);
}

// ---- schemas ----

std::vector<ArgSpec> UnarySchema() { return {Arg("self", ArgKind::kTensor)}; }
std::vector<ArgSpec> BinarySchema() {
  return {Arg("self", ArgKind::kTensor),
          Arg("other", ArgKind::kTensorOrScalar)};
}
std::vector<ArgSpec> BinaryScalarSchema() {
  return {Arg("self", ArgKind::kTensor), Arg("other", ArgKind::kScalar)};
}

absl::Status CheckAlpha(const OpContext& ctx, DType compute) {
  const Attr& alpha = ctx.arg(2);
  if (!IsFloating(compute) && alpha.kind == Attr::Kind::kFloat) {
    return ctx.Invalid(
        "for integral input tensors, argument alpha must not be a floating "
        "point number");
  }
  // PyTorch's alpha_check: a bool alpha needs a bool result; an int alpha
  // is fine for any result, bool included (True + True with alpha=1).
  if (compute != DType::kBool && alpha.kind == Attr::Kind::kBool) {
    return ctx.Invalid("a bool alpha is only supported for bool results");
  }
  return absl::OkStatus();
}

void RegisterUnary(OpRegistry& r) {
  struct FloatUnary {
    const char* name;
    D1 f;
    ExprOp op;
  };
  const FloatUnary float_unary[] = {
      {"exp", [](double x) { return std::exp(x); }, ExprOp::kExp},
      {"exp2", [](double x) { return std::exp2(x); }, ExprOp::kExp2},
      {"expm1", [](double x) { return std::expm1(x); }, ExprOp::kExpm1},
      {"log", [](double x) { return std::log(x); }, ExprOp::kLog},
      {"log2", [](double x) { return std::log2(x); }, ExprOp::kLog2},
      {"log1p", [](double x) { return std::log1p(x); }, ExprOp::kLog1p},
      {"sqrt", [](double x) { return std::sqrt(x); }, ExprOp::kSqrt},
      {"rsqrt", [](double x) { return 1.0 / std::sqrt(x); }, ExprOp::kRsqrt},
      {"reciprocal", [](double x) { return 1.0 / x; }, ExprOp::kReciprocal},
      {"sin", [](double x) { return std::sin(x); }, ExprOp::kSin},
      {"cos", [](double x) { return std::cos(x); }, ExprOp::kCos},
      {"tan", [](double x) { return std::tan(x); }, ExprOp::kTan},
      {"tanh", [](double x) { return std::tanh(x); }, ExprOp::kTanh},
      {"sigmoid", Sigmoid, ExprOp::kSigmoid},
      {"erf", [](double x) { return std::erf(x); }, ExprOp::kErf},
  };
  for (const FloatUnary& u : float_unary) {
    PointwiseOp op{absl::StrCat("aten.", u.name, ".default"),
                   UnarySchema(),
                   {0},
                   Promotion::kIntToFloat,
                   true,
                   F1(u.f),
                   nullptr,
                   nullptr};
    op.lower = Un(u.op);
    AddPointwise(r, std::move(op));
  }
  // Ops that keep integral dtypes (identity on integers where rounding).
  struct KeepUnary {
    const char* name;
    D1 f;
    I1 i;
    bool allow_bool;
    ExprOp op;
  };
  const KeepUnary keep_unary[] = {
      {"abs", [](double x) { return std::fabs(x); },
       [](int64_t x) { return x < 0 ? WrapSub(0, x) : x; }, false, ExprOp::kAbs},
      {"neg", [](double x) { return -x; },
       [](int64_t x) { return WrapSub(0, x); }, false, ExprOp::kNeg},
      {"relu", [](double x) { return std::isnan(x) ? x : (x > 0 ? x : 0.0); },
       [](int64_t x) { return x > 0 ? x : int64_t{0}; }, false, ExprOp::kRelu},
      {"floor", [](double x) { return std::floor(x); },
       [](int64_t x) { return x; }, false, ExprOp::kFloor},
      {"ceil", [](double x) { return std::ceil(x); },
       [](int64_t x) { return x; }, false, ExprOp::kCeil},
      // Round half to even, as torch.round.
      {"round", [](double x) { return std::nearbyint(x); },
       [](int64_t x) { return x; }, false, ExprOp::kRound},
      {"trunc", [](double x) { return std::trunc(x); },
       [](int64_t x) { return x; }, false, ExprOp::kTrunc},
      // (0 < x) - (x < 0): NaN gives 0, as PyTorch's sign kernel.
      {"sign", [](double x) { return static_cast<double>((0 < x) - (x < 0)); },
       [](int64_t x) { return static_cast<int64_t>((0 < x) - (x < 0)); }, true, ExprOp::kSign},
  };
  for (const KeepUnary& u : keep_unary) {
    PointwiseOp op{absl::StrCat("aten.", u.name, ".default"),
                   UnarySchema(),
                   {0},
                   Promotion::kResultType,
                   u.allow_bool,
                   F1(u.f),
                   I1Fn(u.i),
                   nullptr};
    op.lower = Un(u.op);
    AddPointwise(r, std::move(op));
  }
  PointwiseOp logical_not{"aten.logical_not.default",
                          UnarySchema(),
                          {0},
                          Promotion::kBoolOutput,
                          true,
                          F1([](double x) { return x == 0 ? 1.0 : 0.0; }),
                          I1Fn([](int64_t x) { return static_cast<int64_t>(x == 0); }),
                          nullptr};
  logical_not.lower = [](const std::vector<Expr>& x, DType, const Node&) {
    return ir::Unary(ExprOp::kNot, ir::Cast(x[0], DType::kBool), DType::kBool);
  };
  AddPointwise(r, std::move(logical_not));
  PointwiseOp isnan{"aten.isnan.default",
                    UnarySchema(),
                    {0},
                    Promotion::kBoolOutput,
                    true,
                    F1([](double x) { return std::isnan(x) ? 1.0 : 0.0; }),
                    I1Fn([](int64_t) { return int64_t{0}; }),
                    nullptr};
  isnan.lower = [](const std::vector<Expr>& x, DType compute, const Node&) {
    if (!IsFloating(compute)) return ir::IntConst(0, DType::kBool);
    return ir::Unary(ExprOp::kIsNan, x[0], DType::kBool);
  };
  AddPointwise(r, std::move(isnan));
  // bitwise_not: ~x on integers; on bool, logical not. Bool values reach
  // the element function as 0/1, where ~x would be nonzero for both.
  PointwiseOp bitwise_not{"aten.bitwise_not.default",
                          UnarySchema(),
                          {0},
                          Promotion::kResultType,
                          true,
                          nullptr,
                          nullptr,
                          nullptr};
  bitwise_not.int_fn = [](const Node&) {
    return IntFn([](const int64_t* a) { return ~a[0]; });
  };
  bitwise_not.bool_fn = [](const Node&) {
    return IntFn(
        [](const int64_t* a) { return static_cast<int64_t>(a[0] == 0); });
  };
  bitwise_not.check = [](const OpContext& ctx, DType compute) -> absl::Status {
    if (!IsIntegralOrBool(compute))
      return ctx.Invalid("needs integral or bool inputs");
    return absl::OkStatus();
  };
  bitwise_not.lower = [](const std::vector<Expr>& x, DType compute, const Node&) {
    return ir::Unary(compute == DType::kBool ? ExprOp::kNot : ExprOp::kBitNot, x[0], compute);
  };
  AddPointwise(r, bitwise_not);
}

// add/sub: self (+|-) alpha * other.
void RegisterAddSub(OpRegistry& r) {
  for (bool is_sub : {false, true}) {
    const char* base = is_sub ? "sub" : "add";
    const double sign = is_sub ? -1 : 1;
    for (bool scalar : {false, true}) {
      PointwiseOp op;
      op.name = absl::StrCat("aten.", base, scalar ? ".Scalar" : ".Tensor");
      op.schema = scalar ? BinaryScalarSchema() : BinarySchema();
      op.schema.push_back(KwArg("alpha", ArgKind::kScalar, Attr::Int(1)));
      op.operands = {0, 1};
      op.float_fn = [sign](const Node& n) {
        const double alpha = n.args[2].ScalarAsDouble();
        return FloatFn([sign, alpha](const double* a) {
          return a[0] + sign * alpha * a[1];
        });
      };
      op.int_fn = [is_sub](const Node& n) {
        const int64_t alpha =
            n.args[2].kind == Attr::Kind::kBool ? n.args[2].b : n.args[2].i;
        return IntFn([is_sub, alpha](const int64_t* a) {
          const int64_t t = WrapMul(alpha, a[1]);
          return is_sub ? WrapSub(a[0], t) : WrapAdd(a[0], t);
        });
      };
      // A bool result: alpha converts to bool first (PyTorch's
      // alpha_scalar.to<bool>()), so True + True * 2 is True.
      op.bool_fn = [](const Node& n) {
        const bool alpha = n.args[2].ScalarAsDouble() != 0;
        return IntFn([alpha](const int64_t* a) {
          return static_cast<int64_t>(a[0] != 0 || (alpha && a[1] != 0));
        });
      };
      op.check = [is_sub](const OpContext& ctx, DType compute) -> absl::Status {
        // PyTorch's sub_check rejects a bool operand on either side, not
        // only bool - bool (a wrapped True counts as a bool tensor).
        auto is_bool = [&ctx](int i) {
          return ctx.is_tensor(i) ? ctx.type(i).dtype == DType::kBool
                                  : ctx.arg(i).kind == Attr::Kind::kBool;
        };
        if (is_sub && (is_bool(0) || is_bool(1))) {
          return ctx.Invalid(
              "subtraction with a bool tensor is not supported; use "
              "logical_xor or logical_not");
        }
        return CheckAlpha(ctx, compute);
      };
      op.lower = [is_sub](const std::vector<Expr>& x, DType compute, const Node& n) {
        Expr other = x[1];
        const Attr& alpha = n.args[2];
        if (alpha.ScalarAsDouble() != 1) {
          Expr a = IsFloating(compute) ? ir::Const(alpha.ScalarAsDouble(), compute)
                                       : ir::IntConst(WrapInt(alpha.kind == Attr::Kind::kBool ? alpha.b : alpha.i,
                                                              compute),
                                                      compute);
          other = ir::Binary(ExprOp::kMul, a, other, compute);
        }
        return ir::Binary(is_sub ? ExprOp::kSub : ExprOp::kAdd, x[0], other, compute);
      };
      AddPointwise(r, op);
    }
  }
}

// pow(Tensor, Scalar): PyTorch raises "Integers to negative integer powers
// are not allowed." for an integral base with a negative int exponent.
absl::Status CheckIntegerPowExponent(const OpContext& ctx, DType compute) {
  const Attr& exponent = ctx.arg(1);
  if (!IsFloating(compute) && exponent.kind == Attr::Kind::kInt &&
      exponent.i < 0) {
    return ctx.Invalid("integers to negative integer powers are not allowed");
  }
  return absl::OkStatus();
}

void RegisterArithmetic(OpRegistry& r) {
  for (bool scalar : {false, true}) {
    const char* suffix = scalar ? ".Scalar" : ".Tensor";
    auto schema = scalar ? BinaryScalarSchema() : BinarySchema();
    AddPointwise(r, {absl::StrCat("aten.mul", suffix),
                     schema,
                     {0, 1},
                     Promotion::kResultType,
                     true,
                     F2([](double a, double b) { return a * b; }),
                     I2(WrapMul),
                     nullptr}, Bin(ExprOp::kMul));
    AddPointwise(r, {absl::StrCat("aten.div", suffix),
                     schema,
                     {0, 1},
                     Promotion::kIntToFloat,
                     true,
                     F2([](double a, double b) { return a / b; }),
                     nullptr,
                     nullptr}, Bin(ExprOp::kDiv));
    // div with rounding_mode: None (true division), "trunc" or "floor".
    PointwiseOp mode;
    mode.name =
        absl::StrCat("aten.div", scalar ? ".Scalar_mode" : ".Tensor_mode");
    mode.schema = schema;
    mode.schema.push_back(
        KwArg("rounding_mode", ArgKind::kOptionalString, Attr::None()));
    mode.operands = {0, 1};
    mode.allow_bool = false;
    mode.float_fn = [](const Node& n) {
      const std::string m = n.args[2].is_none() ? "" : n.args[2].str;
      if (m == "trunc")
        return FloatFn([](const double* a) { return std::trunc(a[0] / a[1]); });
      if (m == "floor")
        return FloatFn([](const double* a) { return DivFloor(a[0], a[1]); });
      return FloatFn([](const double* a) { return a[0] / a[1]; });
    };
    mode.int_fn = [](const Node& n) {
      const std::string m = n.args[2].is_none() ? "" : n.args[2].str;
      if (m == "trunc")
        return IntFn([](const int64_t* a) { return TruncDiv(a[0], a[1]); });
      return IntFn([](const int64_t* a) { return FloorDiv(a[0], a[1]); });
    };
    mode.check = [](const OpContext& ctx, DType compute) -> absl::Status {
      const Attr& m = ctx.arg(2);
      if (!m.is_none() && m.str != "trunc" && m.str != "floor") {
        return ctx.Invalid(absl::StrCat(
            "rounding_mode must be None, 'trunc' or 'floor', got '", m.str,
            "'"));
      }
      return absl::OkStatus();
    };
    mode.true_division_if_none_arg = 2;
    mode.lower = [](const std::vector<Expr>& x, DType compute, const Node& n) {
      const std::string m = n.args[2].is_none() ? "" : n.args[2].str;
      if (m == "floor") return ir::Binary(ExprOp::kFloorDiv, x[0], x[1], compute);
      Expr q = ir::Binary(ExprOp::kDiv, x[0], x[1], compute);  // ints: truncating
      if (m == "trunc" && IsFloating(compute)) q = ir::Unary(ExprOp::kTrunc, q, compute);
      return q;
    };
    AddPointwise(r, mode);

    AddPointwise(r, {absl::StrCat("aten.remainder", suffix),
                     schema,
                     {0, 1},
                     Promotion::kResultType,
                     false,
                     F2(PyRemainder),
                     I2(FloorMod),
                     nullptr}, Bin(ExprOp::kRemainder));
    AddPointwise(r, {absl::StrCat("aten.fmod", suffix),
                     schema,
                     {0, 1},
                     Promotion::kResultType,
                     false,
                     F2([](double a, double b) { return std::fmod(a, b); }),
                     I2(TruncMod),
                     nullptr}, Bin(ExprOp::kFmod));
    AddPointwise(r, {absl::StrCat("aten.bitwise_and", suffix),
                     schema,
                     {0, 1},
                     Promotion::kResultType,
                     true,
                     nullptr,
                     I2([](int64_t a, int64_t b) { return a & b; }),
                     nullptr}, Bin(ExprOp::kBitAnd));
    AddPointwise(r, {absl::StrCat("aten.bitwise_or", suffix),
                     schema,
                     {0, 1},
                     Promotion::kResultType,
                     true,
                     nullptr,
                     I2([](int64_t a, int64_t b) { return a | b; }),
                     nullptr}, Bin(ExprOp::kBitOr));
  }
  auto pow_f = F2([](double a, double b) { return std::pow(a, b); });
  AddPointwise(r, {"aten.pow.Tensor_Tensor",
                   {Arg("self", ArgKind::kTensor),
                    Arg("exponent", ArgKind::kTensorOrScalar)},
                   {0, 1},
                   Promotion::kResultType,
                   false,
                   pow_f,
                   I2(IntPow),
                   nullptr}, Bin(ExprOp::kPow));
  AddPointwise(
      r, {"aten.pow.Tensor_Scalar",
          {Arg("self", ArgKind::kTensor), Arg("exponent", ArgKind::kScalar)},
          {0, 1},
          Promotion::kResultType,
          false,
          pow_f,
          I2(IntPow),
          CheckIntegerPowExponent}, Bin(ExprOp::kPow));
  AddPointwise(
      r, {"aten.pow.Scalar",
          {Arg("self", ArgKind::kScalar), Arg("exponent", ArgKind::kTensor)},
          {0, 1},
          Promotion::kResultType,
          false,
          pow_f,
          I2(IntPow),
          nullptr}, Bin(ExprOp::kPow));
  std::vector<ArgSpec> tensor_pair = {Arg("self", ArgKind::kTensor),
                                      Arg("other", ArgKind::kTensor)};
  AddPointwise(r, {"aten.maximum.default",
                   tensor_pair,
                   {0, 1},
                   Promotion::kResultType,
                   true,
                   F2(NanMax),
                   I2([](int64_t a, int64_t b) { return std::max(a, b); }),
                   nullptr}, Bin(ExprOp::kMax));
  AddPointwise(r, {"aten.minimum.default",
                   tensor_pair,
                   {0, 1},
                   Promotion::kResultType,
                   true,
                   F2(NanMin),
                   I2([](int64_t a, int64_t b) { return std::min(a, b); }),
                   nullptr}, Bin(ExprOp::kMin));
  AddPointwise(r, {"aten.atan2.default",
                   tensor_pair,
                   {0, 1},
                   Promotion::kIntToFloat,
                   true,
                   F2([](double a, double b) { return std::atan2(a, b); }),
                   nullptr,
                   nullptr}, Bin(ExprOp::kAtan2));
  AddPointwise(
      r, {"aten.logical_and.default",
          tensor_pair,
          {0, 1},
          Promotion::kBoolOutput,
          true,
          F2([](double a, double b) { return (a != 0 && b != 0) ? 1.0 : 0.0; }),
          I2([](int64_t a, int64_t b) {
            return static_cast<int64_t>(a != 0 && b != 0);
          }),
          nullptr}, Logical(ExprOp::kAnd));
  AddPointwise(
      r, {"aten.logical_or.default",
          tensor_pair,
          {0, 1},
          Promotion::kBoolOutput,
          true,
          F2([](double a, double b) { return (a != 0 || b != 0) ? 1.0 : 0.0; }),
          I2([](int64_t a, int64_t b) {
            return static_cast<int64_t>(a != 0 || b != 0);
          }),
          nullptr}, Logical(ExprOp::kOr));
}

void RegisterComparisons(OpRegistry& r) {
  struct Cmp {
    const char* name;
    bool (*fd)(double, double);
    bool (*fi)(int64_t, int64_t);
    ExprOp op;
  };
  const Cmp cmps[] = {
      {"eq", [](double a, double b) { return a == b; },
       [](int64_t a, int64_t b) { return a == b; }, ExprOp::kEq},
      {"ne", [](double a, double b) { return a != b; },
       [](int64_t a, int64_t b) { return a != b; }, ExprOp::kNe},
      {"lt", [](double a, double b) { return a < b; },
       [](int64_t a, int64_t b) { return a < b; }, ExprOp::kLt},
      {"le", [](double a, double b) { return a <= b; },
       [](int64_t a, int64_t b) { return a <= b; }, ExprOp::kLe},
      {"gt", [](double a, double b) { return a > b; },
       [](int64_t a, int64_t b) { return a > b; }, ExprOp::kGt},
      {"ge", [](double a, double b) { return a >= b; },
       [](int64_t a, int64_t b) { return a >= b; }, ExprOp::kGe},
  };
  for (const Cmp& c : cmps) {
    for (bool scalar : {false, true}) {
      auto fd = c.fd;
      auto fi = c.fi;
      AddPointwise(
          r, {absl::StrCat("aten.", c.name, scalar ? ".Scalar" : ".Tensor"),
              scalar ? BinaryScalarSchema() : BinarySchema(),
              {0, 1},
              Promotion::kBoolOutput,
              true,
              F2([fd](double a, double b) { return fd(a, b) ? 1.0 : 0.0; }),
              I2([fi](int64_t a, int64_t b) {
                return static_cast<int64_t>(fi(a, b));
              }),
              nullptr},
          Compare(c.op));
    }
  }
}

absl::Status CheckBoolCondition(const OpContext& ctx, DType) {
  if (!ctx.is_tensor(0) || ctx.type(0).dtype != DType::kBool) {
    return ctx.Invalid("where expects a bool condition tensor");
  }
  return absl::OkStatus();
}

void RegisterSelection(OpRegistry& r) {
  // where(condition, self, other): the condition broadcasts but does not
  // take part in type promotion; operands 1 and 2 do.
  struct WhereVariant {
    const char* name;
    ArgKind self;
    ArgKind other;
  };
  const WhereVariant wheres[] = {
      {"aten.where.self", ArgKind::kTensorOrScalar, ArgKind::kTensorOrScalar},
      {"aten.where.ScalarSelf", ArgKind::kScalar, ArgKind::kTensor},
      {"aten.where.ScalarOther", ArgKind::kTensor, ArgKind::kScalar},
      {"aten.where.Scalar", ArgKind::kScalar, ArgKind::kScalar},
  };
  for (const WhereVariant& w : wheres) {
    PointwiseOp op{w.name,
                   {Arg("condition", ArgKind::kTensor), Arg("self", w.self),
                    Arg("other", w.other)},
                   {1, 2, 0},
                   Promotion::kResultType,
                   true,
                   nullptr,
                   nullptr,
                   CheckBoolCondition};
    op.promoted_operands = 2;
    // Operand 0 (listed last) is the condition; converting a bool to the
    // compute dtype keeps 0/1, so the element function can test it.
    op.float_fn = [](const Node&) {
      return FloatFn([](const double* a) { return a[2] != 0 ? a[0] : a[1]; });
    };
    op.int_fn = [](const Node&) {
      return IntFn([](const int64_t* a) { return a[2] != 0 ? a[0] : a[1]; });
    };
    op.lower = [](const std::vector<Expr>& x, DType, const Node&) {
      return ir::Select(ir::Cast(x[2], DType::kBool), x[0], x[1]);
    };
    AddPointwise(r, std::move(op));
  }
}

// clamp(self, min?, max?) with NaN propagation, as torch.clamp.
double ClampF(double x, double lo, double hi, bool has_lo, bool has_hi) {
  if (std::isnan(x)) return x;
  if (has_lo) {
    if (std::isnan(lo)) return lo;
    if (x < lo) x = lo;
  }
  if (has_hi) {
    if (std::isnan(hi)) return hi;
    if (x > hi) x = hi;
  }
  return x;
}

void RegisterClamp(OpRegistry& r) {
  for (bool tensor : {false, true}) {
    const ArgKind k =
        tensor ? ArgKind::kOptionalTensor : ArgKind::kOptionalScalar;
    PointwiseOp op{
        tensor ? "aten.clamp.Tensor" : "aten.clamp.default",
        {Arg("self", ArgKind::kTensor), ArgDefault("min", k, Attr::None()),
         ArgDefault("max", k, Attr::None())},
        {0, 1, 2},
        Promotion::kResultType,
        false,
        nullptr,
        nullptr,
        nullptr};
    op.check = [](const OpContext& ctx, DType) -> absl::Status {
      if (ctx.arg(1).is_none() && ctx.arg(2).is_none()) {
        return ctx.Invalid("at least one of 'min' or 'max' must not be None");
      }
      return absl::OkStatus();
    };
    op.float_fn = [](const Node& n) {
      const bool lo = !n.args[1].is_none(), hi = !n.args[2].is_none();
      return FloatFn([lo, hi](const double* a) {
        return ClampF(a[0], a[1], a[2], lo, hi);
      });
    };
    op.int_fn = [](const Node& n) {
      const bool lo = !n.args[1].is_none(), hi = !n.args[2].is_none();
      return IntFn([lo, hi](const int64_t* a) {
        int64_t x = a[0];
        if (lo && x < a[1]) x = a[1];
        if (hi && x > a[2]) x = a[2];
        return x;
      });
    };
    // max/min propagate NaN from either side, as ClampF does.
    op.lower = [](const std::vector<Expr>& x, DType compute, const Node& n) {
      Expr r = x[0];
      if (!n.args[1].is_none()) r = ir::Binary(ExprOp::kMax, r, x[1], compute);
      if (!n.args[2].is_none()) r = ir::Binary(ExprOp::kMin, r, x[2], compute);
      return r;
    };
    AddPointwise(r, std::move(op));
  }
  for (bool is_min : {true, false}) {
    PointwiseOp op{is_min ? "aten.clamp_min.default" : "aten.clamp_max.default",
                   {Arg("self", ArgKind::kTensor),
                    Arg(is_min ? "min" : "max", ArgKind::kScalar)},
                   {0, 1},
                   Promotion::kResultType,
                   false,
                   nullptr,
                   nullptr,
                   nullptr};
    op.float_fn = [is_min](const Node&) {
      return FloatFn([is_min](const double* a) {
        return ClampF(a[0], a[1], a[1], is_min, !is_min);
      });
    };
    op.int_fn = [is_min](const Node&) {
      return IntFn([is_min](const int64_t* a) {
        return is_min ? std::max(a[0], a[1]) : std::min(a[0], a[1]);
      });
    };
    op.lower = Bin(is_min ? ExprOp::kMax : ExprOp::kMin);
    AddPointwise(r, std::move(op));
  }
}

// Casts: the compute dtype is the target dtype; the element function is
// the identity (Elementwise's load/store conversions are the cast).
void RegisterCasts(OpRegistry& r) {
  struct CastOp {
    const char* name;
    std::vector<ArgSpec> schema;
    int dtype_arg;
  };
  std::vector<ArgSpec> to_copy = {
      Arg("self", ArgKind::kTensor),
      KwArg("dtype", ArgKind::kOptionalDType, Attr::None())};
  for (ArgSpec& a : ops::FactoryKwArgs()) to_copy.push_back(a);
  to_copy.push_back(
      KwArg("non_blocking", ArgKind::kIgnored, Attr::Bool(false)));
  to_copy.push_back(KwArg("memory_format", ArgKind::kIgnored, Attr::None()));
  const CastOp casts[] = {
      {"aten._to_copy.default", to_copy, 1},
      {"prims.convert_element_type.default",
       {Arg("a", ArgKind::kTensor), Arg("dtype", ArgKind::kOptionalDType)},
       1},
  };
  for (const CastOp& c : casts) {
    const int dtype_arg = c.dtype_arg;
    OpDef def;
    def.name = c.name;
    def.op_class = OpClass::kPointwise;
    def.schema = c.schema;
    def.shape = [](const OpContext& ctx)
        -> absl::StatusOr<std::vector<std::vector<SymExpr>>> {
      return std::vector<std::vector<SymExpr>>{ctx.type(0).sizes};
    };
    def.dtype =
        [dtype_arg](
            const OpContext& ctx) -> absl::StatusOr<std::vector<DType>> {
      const Attr& d = ctx.arg(dtype_arg);
      return std::vector<DType>{d.is_none() ? ctx.type(0).dtype : d.dtype};
    };
    def.reference =
        [](const RefContext& ctx) -> absl::StatusOr<std::vector<HostTensor>> {
      const DType to = ctx.out_dtypes[0];
      HostTensor out = HostTensor::Empty(to, ctx.out_sizes[0]);
      const HostTensor& in = ctx.tensors[0];
      for (int64_t l = 0; l < out.numel(); ++l) {
        if (IsFloating(in.dtype())) {
          out.SetDoubleAt(l, in.GetDoubleAt(l));  // rounds or converts
        } else {
          out.SetIntAt(l, in.GetIntAt(l));
        }
      }
      return std::vector<HostTensor>{std::move(out)};
    };
    def.lower = [](LowerContext& ctx) -> absl::StatusOr<std::vector<LoweredValue>> {
      const TensorType& out = ctx.out_type();
      LoopNode node;
      node.kind = LoopNode::Kind::kPointwise;
      node.dtype = out.dtype;
      node.sizes = out.sizes;
      node.body = ir::Cast(LowerContext::ReadBroadcast(ctx.value(0), out.sizes), out.dtype);
      return std::vector<LoweredValue>{ctx.AddNode(std::move(node))};
    };
    r.Add(std::move(def));
  }
}

// lerp as an expression, in the same two-sided form as the reference.
Expr LerpExpr(Expr s, Expr e, Expr w, DType c) {
  auto sub = [c](Expr a, Expr b) { return ir::Binary(ExprOp::kSub, a, b, c); };
  auto mul = [c](Expr a, Expr b) { return ir::Binary(ExprOp::kMul, a, b, c); };
  Expr diff = sub(e, s);
  Expr low = ir::Binary(ExprOp::kAdd, s, mul(w, diff), c);
  Expr high = sub(e, mul(diff, sub(ir::Const(1, c), w)));
  Expr small = ir::Binary(ExprOp::kLt, ir::Unary(ExprOp::kAbs, w, c), ir::Const(0.5, c), DType::kBool);
  return ir::Select(small, low, high);
}

// lerp, as PyTorch's lerp meta functions: `end` must have self's dtype; a
// tensor `weight` may differ only if it promotes into self's dtype (it is
// converted to it), so the result has self's dtype.
absl::Status CheckLerpDTypes(const OpContext& ctx, DType) {
  const DType self = ctx.type(0).dtype;
  if (ctx.type(1).dtype != self) {
    return ctx.Invalid(absl::StrCat("expected dtype ", DTypeName(self),
                                    " for `end` but got dtype ",
                                    DTypeName(ctx.type(1).dtype)));
  }
  if (ctx.is_tensor(2) && PromoteTypes(self, ctx.type(2).dtype) != self) {
    return ctx.Invalid(absl::StrCat("`weight` dtype ",
                                    DTypeName(ctx.type(2).dtype),
                                    " does not promote into `input` dtype ",
                                    DTypeName(self)));
  }
  return absl::OkStatus();
}

void RegisterActivations(OpRegistry& r) {
  PointwiseOp gelu{
      "aten.gelu.default",
      {Arg("self", ArgKind::kTensor),
       KwArg("approximate", ArgKind::kString, Attr::String("none"))},
      {0},
      Promotion::kFloatOnly,
      false,
      nullptr,
      nullptr,
      nullptr};
  gelu.check = [](const OpContext& ctx, DType) -> absl::Status {
    const std::string& m = ctx.arg(1).str;
    if (m != "none" && m != "tanh") {
      return ctx.Invalid(
          absl::StrCat("approximate must be 'none' or 'tanh', got '", m, "'"));
    }
    return absl::OkStatus();
  };
  gelu.float_fn = [](const Node& n) {
    if (n.args[1].str == "tanh") {
      return FloatFn([](const double* a) {
        const double x = a[0];
        const double k = std::sqrt(2.0 / M_PI);
        return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
      });
    }
    return FloatFn([](const double* a) {
      return 0.5 * a[0] * (1.0 + std::erf(a[0] / std::sqrt(2.0)));
    });
  };
  gelu.lower = [](const std::vector<Expr>& x, DType c, const Node& n) {
    auto k = [c](double v) { return ir::Const(v, c); };
    auto mul = [c](Expr a, Expr b) { return ir::Binary(ExprOp::kMul, a, b, c); };
    auto add = [c](Expr a, Expr b) { return ir::Binary(ExprOp::kAdd, a, b, c); };
    Expr inner;
    if (n.args[1].str == "tanh") {
      Expr cube = mul(mul(x[0], x[0]), x[0]);
      inner = ir::Unary(ExprOp::kTanh,
                        mul(k(std::sqrt(2.0 / M_PI)), add(x[0], mul(k(0.044715), cube))), c);
    } else {
      inner = ir::Unary(ExprOp::kErf, mul(x[0], k(M_SQRT1_2)), c);
    }
    return mul(mul(k(0.5), x[0]), add(k(1.0), inner));
  };
  AddPointwise(r, std::move(gelu));

  PointwiseOp leaky{
      "aten.leaky_relu.default",
      {Arg("self", ArgKind::kTensor),
       ArgDefault("negative_slope", ArgKind::kScalar, Attr::Float(0.01))},
      {0},
      Promotion::kFloatOnly,
      false,
      nullptr,
      nullptr,
      nullptr};
  leaky.float_fn = [](const Node& n) {
    const double slope = n.args[1].ScalarAsDouble();
    return FloatFn(
        [slope](const double* a) { return a[0] > 0 ? a[0] : a[0] * slope; });
  };
  leaky.lower = [](const std::vector<Expr>& x, DType c, const Node& n) {
    Expr scaled = ir::Binary(ExprOp::kMul, x[0], ir::Const(n.args[1].ScalarAsDouble(), c), c);
    return ir::Select(ir::Binary(ExprOp::kGt, x[0], ir::Const(0, c), DType::kBool), x[0], scaled);
  };
  AddPointwise(r, std::move(leaky));

  PointwiseOp hardtanh{"aten.hardtanh.default",
                       {Arg("self", ArgKind::kTensor),
                        ArgDefault("min_val", ArgKind::kScalar, Attr::Int(-1)),
                        ArgDefault("max_val", ArgKind::kScalar, Attr::Int(1))},
                       {0},
                       Promotion::kResultType,
                       false,
                       nullptr,
                       nullptr,
                       nullptr};
  hardtanh.float_fn = [](const Node& n) {
    const double lo = n.args[1].ScalarAsDouble(),
                 hi = n.args[2].ScalarAsDouble();
    return FloatFn(
        [lo, hi](const double* a) { return ClampF(a[0], lo, hi, true, true); });
  };
  hardtanh.int_fn = [](const Node& n) {
    const int64_t lo = static_cast<int64_t>(n.args[1].ScalarAsDouble());
    const int64_t hi = static_cast<int64_t>(n.args[2].ScalarAsDouble());
    return IntFn([lo, hi](const int64_t* a) {
      return std::min(std::max(a[0], lo), hi);
    });
  };
  hardtanh.lower = [](const std::vector<Expr>& x, DType c, const Node& n) {
    auto bound = [c](const Attr& a) {
      return IsFloating(c) ? ir::Const(a.ScalarAsDouble(), c)
                           : ir::IntConst(static_cast<int64_t>(a.ScalarAsDouble()), c);
    };
    return ir::Binary(ExprOp::kMin, ir::Binary(ExprOp::kMax, x[0], bound(n.args[1]), c),
                      bound(n.args[2]), c);
  };
  AddPointwise(r, std::move(hardtanh));

  AddPointwise(r, {"aten.silu.default",
                   UnarySchema(),
                   {0},
                   Promotion::kFloatOnly,
                   false,
                   F1([](double x) { return x / (1.0 + std::exp(-x)); }),
                   nullptr,
                   nullptr},
               [](const std::vector<Expr>& x, DType c, const Node&) {
                 return ir::Binary(ExprOp::kMul, x[0], ir::Unary(ExprOp::kSigmoid, x[0], c), c);
               });

  // lerp: self + weight * (end - self), in PyTorch's two-sided form for
  // accuracy near weight = 1.
  auto lerp = [](double s, double e, double w) {
    return std::fabs(w) < 0.5 ? s + w * (e - s) : e - (e - s) * (1 - w);
  };
  PointwiseOp lerp_scalar{
      "aten.lerp.Scalar",
      {Arg("self", ArgKind::kTensor), Arg("end", ArgKind::kTensor),
       Arg("weight", ArgKind::kScalar)},
      {0, 1},
      Promotion::kFloatOnly,
      false,
      nullptr,
      nullptr,
      nullptr};
  lerp_scalar.float_fn = [lerp](const Node& n) {
    const double w = n.args[2].ScalarAsDouble();
    return FloatFn([lerp, w](const double* a) { return lerp(a[0], a[1], w); });
  };
  lerp_scalar.lower = [](const std::vector<Expr>& x, DType c, const Node& n) {
    return LerpExpr(x[0], x[1], ir::Const(n.args[2].ScalarAsDouble(), c), c);
  };
  lerp_scalar.check = CheckLerpDTypes;
  AddPointwise(r, std::move(lerp_scalar));
  PointwiseOp lerp_tensor{
      "aten.lerp.Tensor",
      {Arg("self", ArgKind::kTensor), Arg("end", ArgKind::kTensor),
       Arg("weight", ArgKind::kTensor)},
      {0, 1, 2},
      Promotion::kFloatOnly,
      false,
      nullptr,
      nullptr,
      nullptr};
  lerp_tensor.float_fn = [lerp](const Node&) {
    return FloatFn([lerp](const double* a) { return lerp(a[0], a[1], a[2]); });
  };
  lerp_tensor.lower = [](const std::vector<Expr>& x, DType c, const Node&) {
    return LerpExpr(x[0], x[1], x[2], c);
  };
  lerp_tensor.check = CheckLerpDTypes;
  lerp_tensor.promoted_operands = 2;  // weight converts to self's dtype
  AddPointwise(r, std::move(lerp_tensor));
}

}  // namespace

void RegisterPointwiseOps(OpRegistry& registry) {
  RegisterUnary(registry);
  RegisterAddSub(registry);
  RegisterArithmetic(registry);
  RegisterComparisons(registry);
  RegisterSelection(registry);
  RegisterClamp(registry);
  RegisterCasts(registry);
  RegisterActivations(registry);
}

}  // namespace kiln
