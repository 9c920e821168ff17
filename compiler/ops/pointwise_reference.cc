// Reference semantics of the pointwise ops (signatures:
// graph/ops/pointwise.cc).
//
// Each op is its element functions: in the floating domain (double) and,
// where the op is defined on integers, in the integral domain (int64,
// wrapping), and optionally a separate one for a bool compute dtype. The
// elementwise engine (reference_util.h's Elementwise) broadcasts the
// operands, converts them to the compute dtype (graph/ops/pointwise.h's
// ComputeDType) and stores each result rounded to the output dtype.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"
#include "graph/ops/pointwise.h"

namespace kiln {
namespace ops {
namespace {

// The element functions of a node (they may read the node's other args).
using FloatFnFor = FloatFn (*)(const Node& node);
using IntFnFor = IntFn (*)(const Node& node);

struct PointwiseElementFns {
  const char* name;
  FloatFnFor float_fn = nullptr;  // floating compute; null: none
  IntFnFor int_fn = nullptr;      // integral compute; null: none
  IntFnFor bool_fn = nullptr;     // bool compute (null: int_fn)
};

// Element functions that do not read the node.
template <double (*F)(double)>
FloatFn Float1(const Node&) {
  return [](const double* a) { return F(a[0]); };
}
template <double (*F)(double, double)>
FloatFn Float2(const Node&) {
  return [](const double* a) { return F(a[0], a[1]); };
}
template <int64_t (*F)(int64_t)>
IntFn Int1(const Node&) {
  return [](const int64_t* a) { return F(a[0]); };
}
template <int64_t (*F)(int64_t, int64_t)>
IntFn Int2(const Node&) {
  return [](const int64_t* a) { return F(a[0], a[1]); };
}
// Comparisons (std::equal_to<> ...): 1 or 0.
template <typename Cmp>
FloatFn CompareFloat(const Node&) {
  return [](const double* a) { return Cmp()(a[0], a[1]) ? 1.0 : 0.0; };
}
template <typename Cmp>
IntFn CompareInt(const Node&) {
  return
      [](const int64_t* a) { return static_cast<int64_t>(Cmp()(a[0], a[1])); };
}

// ---- integer arithmetic ----

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

// ---- unary ops with floating results ----

double ExpFloat(double x) { return std::exp(x); }
double Exp2Float(double x) { return std::exp2(x); }
double Expm1Float(double x) { return std::expm1(x); }
double LogFloat(double x) { return std::log(x); }
double Log2Float(double x) { return std::log2(x); }
double Log1pFloat(double x) { return std::log1p(x); }
double SqrtFloat(double x) { return std::sqrt(x); }
double RsqrtFloat(double x) { return 1.0 / std::sqrt(x); }
double ReciprocalFloat(double x) { return 1.0 / x; }
double SinFloat(double x) { return std::sin(x); }
double CosFloat(double x) { return std::cos(x); }
double TanFloat(double x) { return std::tan(x); }
double TanhFloat(double x) { return std::tanh(x); }
double SigmoidFloat(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double ErfFloat(double x) { return std::erf(x); }

// ---- unary ops that keep integral dtypes ----

double AbsFloat(double x) { return std::fabs(x); }
int64_t AbsInt(int64_t x) { return x < 0 ? WrapSub(0, x) : x; }
double NegFloat(double x) { return -x; }
int64_t NegInt(int64_t x) { return WrapSub(0, x); }
double ReluFloat(double x) { return std::isnan(x) ? x : (x > 0 ? x : 0.0); }
int64_t ReluInt(int64_t x) { return x > 0 ? x : int64_t{0}; }
double FloorFloat(double x) { return std::floor(x); }
double CeilFloat(double x) { return std::ceil(x); }
// Round half to even, as torch.round.
double RoundFloat(double x) { return std::nearbyint(x); }
double TruncFloat(double x) { return std::trunc(x); }
// floor, ceil, round and trunc on integers.
int64_t IdentityInt(int64_t x) { return x; }
// (0 < x) - (x < 0): NaN gives 0, as PyTorch's sign kernel.
double SignFloat(double x) { return static_cast<double>((0 < x) - (x < 0)); }
int64_t SignInt(int64_t x) { return static_cast<int64_t>((0 < x) - (x < 0)); }

// ---- logical and bitwise unary ops ----

double LogicalNotFloat(double x) { return x == 0 ? 1.0 : 0.0; }
int64_t LogicalNotInt(int64_t x) { return static_cast<int64_t>(x == 0); }
double IsNanFloat(double x) { return std::isnan(x) ? 1.0 : 0.0; }
int64_t IsNanInt(int64_t) { return int64_t{0}; }
// bitwise_not: ~x on integers; on bool, logical not (LogicalNotInt). Bool
// values reach the element function as 0/1, where ~x would be nonzero for
// both.
int64_t BitwiseNotInt(int64_t x) { return ~x; }

// ---- add/sub: self (+|-) alpha * other ----

FloatFn AddSubFloat(const Node& n, double sign) {
  const double alpha = n.args[2].ScalarAsDouble();
  return [sign, alpha](const double* a) { return a[0] + sign * alpha * a[1]; };
}
FloatFn AddFloat(const Node& n) { return AddSubFloat(n, 1); }
FloatFn SubFloat(const Node& n) { return AddSubFloat(n, -1); }

IntFn AddSubInt(const Node& n, bool is_sub) {
  const int64_t alpha =
      n.args[2].kind == Attr::Kind::kBool ? n.args[2].b : n.args[2].i;
  return [is_sub, alpha](const int64_t* a) {
    const int64_t t = WrapMul(alpha, a[1]);
    return is_sub ? WrapSub(a[0], t) : WrapAdd(a[0], t);
  };
}
IntFn AddInt(const Node& n) { return AddSubInt(n, false); }
IntFn SubInt(const Node& n) { return AddSubInt(n, true); }

// A bool result: alpha converts to bool first (PyTorch's
// alpha_scalar.to<bool>()), so True + True * 2 is True.
IntFn AddBool(const Node& n) {
  const bool alpha = n.args[2].ScalarAsDouble() != 0;
  return [alpha](const int64_t* a) {
    return static_cast<int64_t>(a[0] != 0 || (alpha && a[1] != 0));
  };
}

// ---- binary arithmetic ----

double MulFloat(double a, double b) { return a * b; }
double DivFloat(double a, double b) { return a / b; }
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
double DivTrunc(double a, double b) { return std::trunc(a / b); }

// div with rounding_mode: None (true division), "trunc" or "floor".
std::string RoundingMode(const Node& n) {
  return n.args[2].is_none() ? "" : n.args[2].str;
}
FloatFn DivModeFloat(const Node& n) {
  const std::string m = RoundingMode(n);
  if (m == "trunc") return Float2<DivTrunc>(n);
  if (m == "floor") return Float2<DivFloor>(n);
  return Float2<DivFloat>(n);
}
IntFn DivModeInt(const Node& n) {
  const std::string m = RoundingMode(n);
  if (m == "trunc") return Int2<TruncDiv>(n);
  return Int2<FloorDiv>(n);
}

double PyRemainder(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((b < 0) != (r < 0))) r += b;
  return r;
}
double FmodFloat(double a, double b) { return std::fmod(a, b); }
int64_t BitwiseAndInt(int64_t a, int64_t b) { return a & b; }
int64_t BitwiseOrInt(int64_t a, int64_t b) { return a | b; }
double PowFloat(double a, double b) { return std::pow(a, b); }
double NanMax(double a, double b) {
  return (std::isnan(a) || std::isnan(b)) ? NAN : std::max(a, b);
}
double NanMin(double a, double b) {
  return (std::isnan(a) || std::isnan(b)) ? NAN : std::min(a, b);
}
int64_t MaxInt(int64_t a, int64_t b) { return std::max(a, b); }
int64_t MinInt(int64_t a, int64_t b) { return std::min(a, b); }
double Atan2Float(double a, double b) { return std::atan2(a, b); }
double LogicalAndFloat(double a, double b) {
  return (a != 0 && b != 0) ? 1.0 : 0.0;
}
int64_t LogicalAndInt(int64_t a, int64_t b) {
  return static_cast<int64_t>(a != 0 && b != 0);
}
double LogicalOrFloat(double a, double b) {
  return (a != 0 || b != 0) ? 1.0 : 0.0;
}
int64_t LogicalOrInt(int64_t a, int64_t b) {
  return static_cast<int64_t>(a != 0 || b != 0);
}

// ---- selection and clamping ----

// where: operand 0 (listed last) is the condition; converting a bool to the
// compute dtype keeps 0/1, so the element function can test it.
FloatFn WhereFloat(const Node&) {
  return [](const double* a) { return a[2] != 0 ? a[0] : a[1]; };
}
IntFn WhereInt(const Node&) {
  return [](const int64_t* a) { return a[2] != 0 ? a[0] : a[1]; };
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
FloatFn ClampFloat(const Node& n) {
  const bool lo = !n.args[1].is_none(), hi = !n.args[2].is_none();
  return [lo, hi](const double* a) { return ClampF(a[0], a[1], a[2], lo, hi); };
}
IntFn ClampInt(const Node& n) {
  const bool lo = !n.args[1].is_none(), hi = !n.args[2].is_none();
  return [lo, hi](const int64_t* a) {
    int64_t x = a[0];
    if (lo && x < a[1]) x = a[1];
    if (hi && x > a[2]) x = a[2];
    return x;
  };
}
double ClampMinFloat(double x, double lo) {
  return ClampF(x, lo, lo, true, false);
}
double ClampMaxFloat(double x, double hi) {
  return ClampF(x, hi, hi, false, true);
}

// ---- activations ----

FloatFn GeluFloat(const Node& n) {
  if (n.args[1].str == "tanh") {
    return [](const double* a) {
      const double x = a[0];
      const double k = std::sqrt(2.0 / M_PI);
      return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
    };
  }
  return [](const double* a) {
    return 0.5 * a[0] * (1.0 + std::erf(a[0] / std::sqrt(2.0)));
  };
}
FloatFn LeakyReluFloat(const Node& n) {
  const double slope = n.args[1].ScalarAsDouble();
  return [slope](const double* a) { return a[0] > 0 ? a[0] : a[0] * slope; };
}
FloatFn HardtanhFloat(const Node& n) {
  const double lo = n.args[1].ScalarAsDouble(), hi = n.args[2].ScalarAsDouble();
  return [lo, hi](const double* a) { return ClampF(a[0], lo, hi, true, true); };
}
IntFn HardtanhInt(const Node& n) {
  const int64_t lo = static_cast<int64_t>(n.args[1].ScalarAsDouble());
  const int64_t hi = static_cast<int64_t>(n.args[2].ScalarAsDouble());
  return
      [lo, hi](const int64_t* a) { return std::min(std::max(a[0], lo), hi); };
}
double SiluFloat(double x) { return x / (1.0 + std::exp(-x)); }

// Backward ops of activations: a[0] is grad_output, a[1] the saved input
// or output, with the textbook derivatives.
FloatFn ThresholdBackwardFloat(const Node& n) {
  const double t = n.args[2].ScalarAsDouble();
  return [t](const double* a) { return a[1] <= t ? 0.0 : a[0]; };
}
IntFn ThresholdBackwardInt(const Node& n) {
  const int64_t t = static_cast<int64_t>(n.args[2].ScalarAsDouble());
  return [t](const int64_t* a) { return a[1] <= t ? int64_t{0} : a[0]; };
}
FloatFn GeluBackwardFloat(const Node& n) {
  if (n.args[2].str == "tanh") {
    return [](const double* a) {
      const double x = a[1], k = std::sqrt(2.0 / M_PI), kappa = 0.044715;
      const double t = std::tanh(k * (x + kappa * x * x * x));
      const double dinner = k * (1 + 3 * kappa * x * x);
      return a[0] * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * dinner);
    };
  }
  return [](const double* a) {
    const double x = a[1];
    const double cdf = 0.5 * (1 + std::erf(x / std::sqrt(2.0)));
    const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    return a[0] * (cdf + x * pdf);
  };
}
double SigmoidBackwardFloat(double g, double y) { return g * (1 - y) * y; }
double TanhBackwardFloat(double g, double y) { return g * (1 - y * y); }
double SiluBackwardFloat(double g, double x) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return g * s * (1 + x * (1 - s));
}

// lerp: self + weight * (end - self), in PyTorch's two-sided form for
// accuracy near weight = 1.
double Lerp(double s, double e, double w) {
  return std::fabs(w) < 0.5 ? s + w * (e - s) : e - (e - s) * (1 - w);
}
FloatFn LerpScalarFloat(const Node& n) {
  const double w = n.args[2].ScalarAsDouble();
  return [w](const double* a) { return Lerp(a[0], a[1], w); };
}
FloatFn LerpTensorFloat(const Node&) {
  return [](const double* a) { return Lerp(a[0], a[1], a[2]); };
}

// ---- the table ----

constexpr PointwiseElementFns kPointwiseElementFns[] = {
    // Unary ops with floating results.
    {.name = "aten.exp.default", .float_fn = Float1<ExpFloat>},
    {.name = "aten.exp2.default", .float_fn = Float1<Exp2Float>},
    {.name = "aten.expm1.default", .float_fn = Float1<Expm1Float>},
    {.name = "aten.log.default", .float_fn = Float1<LogFloat>},
    {.name = "aten.log2.default", .float_fn = Float1<Log2Float>},
    {.name = "aten.log1p.default", .float_fn = Float1<Log1pFloat>},
    {.name = "aten.sqrt.default", .float_fn = Float1<SqrtFloat>},
    {.name = "aten.rsqrt.default", .float_fn = Float1<RsqrtFloat>},
    {.name = "aten.reciprocal.default", .float_fn = Float1<ReciprocalFloat>},
    {.name = "aten.sin.default", .float_fn = Float1<SinFloat>},
    {.name = "aten.cos.default", .float_fn = Float1<CosFloat>},
    {.name = "aten.tan.default", .float_fn = Float1<TanFloat>},
    {.name = "aten.tanh.default", .float_fn = Float1<TanhFloat>},
    {.name = "aten.sigmoid.default", .float_fn = Float1<SigmoidFloat>},
    {.name = "aten.erf.default", .float_fn = Float1<ErfFloat>},
    // Unary ops that keep integral dtypes.
    {.name = "aten.abs.default",
     .float_fn = Float1<AbsFloat>,
     .int_fn = Int1<AbsInt>},
    {.name = "aten.neg.default",
     .float_fn = Float1<NegFloat>,
     .int_fn = Int1<NegInt>},
    {.name = "aten.relu.default",
     .float_fn = Float1<ReluFloat>,
     .int_fn = Int1<ReluInt>},
    {.name = "aten.floor.default",
     .float_fn = Float1<FloorFloat>,
     .int_fn = Int1<IdentityInt>},
    {.name = "aten.ceil.default",
     .float_fn = Float1<CeilFloat>,
     .int_fn = Int1<IdentityInt>},
    {.name = "aten.round.default",
     .float_fn = Float1<RoundFloat>,
     .int_fn = Int1<IdentityInt>},
    {.name = "aten.trunc.default",
     .float_fn = Float1<TruncFloat>,
     .int_fn = Int1<IdentityInt>},
    {.name = "aten.sign.default",
     .float_fn = Float1<SignFloat>,
     .int_fn = Int1<SignInt>},
    {.name = "aten.logical_not.default",
     .float_fn = Float1<LogicalNotFloat>,
     .int_fn = Int1<LogicalNotInt>},
    {.name = "aten.isnan.default",
     .float_fn = Float1<IsNanFloat>,
     .int_fn = Int1<IsNanInt>},
    {.name = "aten.bitwise_not.default",
     .int_fn = Int1<BitwiseNotInt>,
     .bool_fn = Int1<LogicalNotInt>},
    // add/sub.
    {.name = "aten.add.Tensor",
     .float_fn = AddFloat,
     .int_fn = AddInt,
     .bool_fn = AddBool},
    {.name = "aten.add.Scalar",
     .float_fn = AddFloat,
     .int_fn = AddInt,
     .bool_fn = AddBool},
    {.name = "aten.sub.Tensor",
     .float_fn = SubFloat,
     .int_fn = SubInt,
     .bool_fn = AddBool},
    {.name = "aten.sub.Scalar",
     .float_fn = SubFloat,
     .int_fn = SubInt,
     .bool_fn = AddBool},
    // Binary arithmetic.
    {.name = "aten.mul.Tensor",
     .float_fn = Float2<MulFloat>,
     .int_fn = Int2<WrapMul>},
    {.name = "aten.mul.Scalar",
     .float_fn = Float2<MulFloat>,
     .int_fn = Int2<WrapMul>},
    {.name = "aten.div.Tensor", .float_fn = Float2<DivFloat>},
    {.name = "aten.div.Scalar", .float_fn = Float2<DivFloat>},
    {.name = "aten.div.Tensor_mode",
     .float_fn = DivModeFloat,
     .int_fn = DivModeInt},
    {.name = "aten.div.Scalar_mode",
     .float_fn = DivModeFloat,
     .int_fn = DivModeInt},
    {.name = "aten.remainder.Tensor",
     .float_fn = Float2<PyRemainder>,
     .int_fn = Int2<FloorMod>},
    {.name = "aten.remainder.Scalar",
     .float_fn = Float2<PyRemainder>,
     .int_fn = Int2<FloorMod>},
    {.name = "aten.fmod.Tensor",
     .float_fn = Float2<FmodFloat>,
     .int_fn = Int2<TruncMod>},
    {.name = "aten.fmod.Scalar",
     .float_fn = Float2<FmodFloat>,
     .int_fn = Int2<TruncMod>},
    {.name = "aten.bitwise_and.Tensor", .int_fn = Int2<BitwiseAndInt>},
    {.name = "aten.bitwise_and.Scalar", .int_fn = Int2<BitwiseAndInt>},
    {.name = "aten.bitwise_or.Tensor", .int_fn = Int2<BitwiseOrInt>},
    {.name = "aten.bitwise_or.Scalar", .int_fn = Int2<BitwiseOrInt>},
    {.name = "aten.pow.Tensor_Tensor",
     .float_fn = Float2<PowFloat>,
     .int_fn = Int2<IntPow>},
    {.name = "aten.pow.Tensor_Scalar",
     .float_fn = Float2<PowFloat>,
     .int_fn = Int2<IntPow>},
    {.name = "aten.pow.Scalar",
     .float_fn = Float2<PowFloat>,
     .int_fn = Int2<IntPow>},
    {.name = "aten.maximum.default",
     .float_fn = Float2<NanMax>,
     .int_fn = Int2<MaxInt>},
    {.name = "aten.minimum.default",
     .float_fn = Float2<NanMin>,
     .int_fn = Int2<MinInt>},
    {.name = "aten.atan2.default", .float_fn = Float2<Atan2Float>},
    {.name = "aten.logical_and.default",
     .float_fn = Float2<LogicalAndFloat>,
     .int_fn = Int2<LogicalAndInt>},
    {.name = "aten.logical_or.default",
     .float_fn = Float2<LogicalOrFloat>,
     .int_fn = Int2<LogicalOrInt>},
    // Comparisons.
    {.name = "aten.eq.Tensor",
     .float_fn = CompareFloat<std::equal_to<>>,
     .int_fn = CompareInt<std::equal_to<>>},
    {.name = "aten.eq.Scalar",
     .float_fn = CompareFloat<std::equal_to<>>,
     .int_fn = CompareInt<std::equal_to<>>},
    {.name = "aten.ne.Tensor",
     .float_fn = CompareFloat<std::not_equal_to<>>,
     .int_fn = CompareInt<std::not_equal_to<>>},
    {.name = "aten.ne.Scalar",
     .float_fn = CompareFloat<std::not_equal_to<>>,
     .int_fn = CompareInt<std::not_equal_to<>>},
    {.name = "aten.lt.Tensor",
     .float_fn = CompareFloat<std::less<>>,
     .int_fn = CompareInt<std::less<>>},
    {.name = "aten.lt.Scalar",
     .float_fn = CompareFloat<std::less<>>,
     .int_fn = CompareInt<std::less<>>},
    {.name = "aten.le.Tensor",
     .float_fn = CompareFloat<std::less_equal<>>,
     .int_fn = CompareInt<std::less_equal<>>},
    {.name = "aten.le.Scalar",
     .float_fn = CompareFloat<std::less_equal<>>,
     .int_fn = CompareInt<std::less_equal<>>},
    {.name = "aten.gt.Tensor",
     .float_fn = CompareFloat<std::greater<>>,
     .int_fn = CompareInt<std::greater<>>},
    {.name = "aten.gt.Scalar",
     .float_fn = CompareFloat<std::greater<>>,
     .int_fn = CompareInt<std::greater<>>},
    {.name = "aten.ge.Tensor",
     .float_fn = CompareFloat<std::greater_equal<>>,
     .int_fn = CompareInt<std::greater_equal<>>},
    {.name = "aten.ge.Scalar",
     .float_fn = CompareFloat<std::greater_equal<>>,
     .int_fn = CompareInt<std::greater_equal<>>},
    // Selection and clamping.
    {.name = "aten.where.self", .float_fn = WhereFloat, .int_fn = WhereInt},
    {.name = "aten.where.ScalarSelf",
     .float_fn = WhereFloat,
     .int_fn = WhereInt},
    {.name = "aten.where.ScalarOther",
     .float_fn = WhereFloat,
     .int_fn = WhereInt},
    {.name = "aten.where.Scalar", .float_fn = WhereFloat, .int_fn = WhereInt},
    {.name = "aten.clamp.default", .float_fn = ClampFloat, .int_fn = ClampInt},
    {.name = "aten.clamp.Tensor", .float_fn = ClampFloat, .int_fn = ClampInt},
    {.name = "aten.clamp_min.default",
     .float_fn = Float2<ClampMinFloat>,
     .int_fn = Int2<MaxInt>},
    {.name = "aten.clamp_max.default",
     .float_fn = Float2<ClampMaxFloat>,
     .int_fn = Int2<MinInt>},
    // Activations.
    {.name = "aten.gelu.default", .float_fn = GeluFloat},
    {.name = "aten.leaky_relu.default", .float_fn = LeakyReluFloat},
    {.name = "aten.hardtanh.default",
     .float_fn = HardtanhFloat,
     .int_fn = HardtanhInt},
    {.name = "aten.silu.default", .float_fn = Float1<SiluFloat>},
    {.name = "aten.threshold_backward.default",
     .float_fn = ThresholdBackwardFloat,
     .int_fn = ThresholdBackwardInt},
    {.name = "aten.gelu_backward.default", .float_fn = GeluBackwardFloat},
    {.name = "aten.sigmoid_backward.default",
     .float_fn = Float2<SigmoidBackwardFloat>},
    {.name = "aten.tanh_backward.default",
     .float_fn = Float2<TanhBackwardFloat>},
    {.name = "aten.silu_backward.default",
     .float_fn = Float2<SiluBackwardFloat>},
    {.name = "aten.lerp.Scalar", .float_fn = LerpScalarFloat},
    {.name = "aten.lerp.Tensor", .float_fn = LerpTensorFloat},
};

// ---- the rules ----

absl::StatusOr<std::vector<HostTensor>> PointwiseReference(
    const PointwiseSignature& op, const PointwiseElementFns& fns,
    const RefContext& ctx) {
  const DType compute = ComputeDType(op, ctx.node, [&ctx](int i) {
    return std::pair(ctx.tensors[i].dtype(), ctx.tensors[i].rank() == 0);
  });
  FloatFn fd = fns.float_fn ? fns.float_fn(ctx.node) : FloatFn();
  IntFn fi = (compute == DType::kBool && fns.bool_fn) ? fns.bool_fn(ctx.node)
             : fns.int_fn                             ? fns.int_fn(ctx.node)
                                                      : IntFn();
  return std::vector<HostTensor>{
      Elementwise(ctx, op.operands, compute, fd, fi)};
}

// Casts: the element function is the identity; HostTensor's load and store
// conversions are the cast.
absl::StatusOr<std::vector<HostTensor>> CastReference(const RefContext& ctx) {
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
}

// The signature of `fns`' op, which must agree with it on the compute
// dtypes it supports; a mismatch is a programming error and aborts.
const PointwiseSignature& SignatureOf(const PointwiseElementFns& fns) {
  const PointwiseSignature* op = FindPointwiseSignature(fns.name);
  if (op == nullptr || op->float_compute != (fns.float_fn != nullptr) ||
      op->int_compute != (fns.int_fn != nullptr)) {
    std::fprintf(stderr,
                 "kiln: pointwise reference of %s does not match its "
                 "signature\n",
                 fns.name);
    std::abort();
  }
  return *op;
}

}  // namespace
}  // namespace ops

void RegisterPointwiseReferences(OpReferences& table) {
  for (const ops::PointwiseElementFns& fns : ops::kPointwiseElementFns) {
    const ops::PointwiseSignature* op = &ops::SignatureOf(fns);
    const ops::PointwiseElementFns* f = &fns;
    table.Add(fns.name, [op, f](const RefContext& ctx) {
      return ops::PointwiseReference(*op, *f, ctx);
    });
  }
  table.Add("aten._to_copy.default", ops::CastReference);
  table.Add("prims.convert_element_type.default", ops::CastReference);
}

}  // namespace kiln
