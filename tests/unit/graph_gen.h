// Seeded generators of random *valid* kiln.v1.Graphs (pointwise chains and
// DAGs with broadcasting, scalar operands and reductions over random dims),
// and of request rewrites that must not change meaning: renaming values,
// renaming and reordering symbols, and reordering independent nodes.
//
// With GraphGenOptions::full_op_set, graphs over all of op set v1 whose
// compiled results must match the reference evaluator (see OpSetGen below,
// used by tests/unit/random_graph_test.cc).
//
// Property tests (the guard key's, the compiler's against the reference
// evaluator) draw many graphs from here; a failing seed reproduces the
// graph exactly. Randomness uses std::mt19937_64 and plain modulo rather
// than std::*_distribution, whose output differs between standard libraries.
//
// Header-only so any test target can include it without a library.
#ifndef KILN_TESTS_UNIT_GRAPH_GEN_H_
#define KILN_TESTS_UNIT_GRAPH_GEN_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::graph_gen {

struct GraphGenOptions {
  int max_inputs = 3;
  int max_nodes = 12;
  int max_rank = 3;
  int max_symbols = 2;     // dynamic dims drawn at most this many times
  bool reductions = true;  // sum.dim_IntList / mean.dim / amax
  // Input dtypes are drawn from these. Ops are chosen so that any mix
  // (bool and integer included) stays valid under PyTorch's rules.
  std::vector<v1::DType> dtypes = {v1::FLOAT32};

  // Draws from all of op set v1 instead (RandomOpSetGraph below): every
  // pointwise op and overload, reductions, composites, views, creation ops,
  // cat, mixed dtypes and non-contiguous inputs, with values kept
  // numerically tame so that compiled code can be checked against the
  // reference evaluator. The fields above still apply (max_* and dtypes).
  bool full_op_set = false;
  // full_op_set: the largest value a test binds to a symbol (sizes drive
  // the bounds on reduction sums and products).
  int64_t max_symbol_value = 8;
  // full_op_set: the share of inputs (percent) declared with
  // non-contiguous strides (permuted, padded, stride 0).
  int noncontiguous_percent = 35;
  // full_op_set: seeds below this draw only the ops Kiln had before issue
  // 17 (alias, copy, the *_like and empty ops), with the same graphs as
  // then: artifact_digest_test records the artifacts of seeds 0..199. Seeds
  // from here on draw those ops too.
  uint64_t first_issue17_seed = 200;
  // full_op_set: seeds from here on also draw the convolutions
  // (convolution, convolution_backward; issue 16) when extern_ops is set;
  // earlier seeds keep their graphs.
  uint64_t first_conv_seed = 2500;
  // full_op_set: seeds from here on draw the random ops too (issue 17.3:
  // native_dropout and its backward, rand/randn(_like), bernoulli), with a
  // seed input; earlier seeds keep their graphs.
  uint64_t first_random_seed = 3000;
  // full_op_set: seeds from here on draw the sort family too (issue 17.2:
  // sort, sort.stable, topk, and topk's backward scatter); earlier seeds
  // keep their graphs.
  uint64_t first_sort_seed = 3200;
  // full_op_set: seeds from here on draw kiln.attention_dropout (and its
  // backward) for a float32 attention now and then; earlier seeds keep
  // their graphs.
  uint64_t first_attention_dropout_seed = 2500;
  // full_op_set: draw the matrix products (mm, addmm, bmm, baddbmm), which
  // CUDA targets do not compile until their cuBLASLt extern call exists.
  bool extern_ops = true;
};

namespace internal {

// One size of a generated shape: a symbol name, or a static value.
struct GenDim {
  std::string symbol;
  int64_t value = 0;
  bool operator==(const GenDim& o) const {
    return symbol == o.symbol && value == o.value;
  }
  bool IsOne() const { return symbol.empty() && value == 1; }
};
using GenShape = std::vector<GenDim>;

// What ops a value can feed, by dtype category.
enum class Category { kBool, kInt, kFloat };

inline Category CategoryOf(v1::DType d) {
  switch (d) {
    case v1::BOOL:
      return Category::kBool;
    case v1::INT32:
    case v1::INT64:
      return Category::kInt;
    default:
      return Category::kFloat;
  }
}

struct GenValue {
  std::string name;
  GenShape shape;
  Category category;
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  // Uniform in [0, n) for n > 0.
  int Below(int n) {
    return static_cast<int>(engine_() % static_cast<uint64_t>(n));
  }
  bool Chance(int percent) { return Below(100) < percent; }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[Below(static_cast<int>(v.size()))];
  }
  uint64_t Next() { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

// PyTorch broadcasting: right-aligned, each pair equal or one a static 1.
inline bool Broadcast(const GenShape& a, const GenShape& b, GenShape* out) {
  const size_t rank = std::max(a.size(), b.size());
  GenShape r(rank);
  for (size_t i = 0; i < rank; ++i) {
    const GenDim* x = i < a.size() ? &a[a.size() - 1 - i] : nullptr;
    const GenDim* y = i < b.size() ? &b[b.size() - 1 - i] : nullptr;
    if (x == nullptr || x->IsOne()) {
      r[rank - 1 - i] = y != nullptr ? *y : *x;
    } else if (y == nullptr || y->IsOne() || *x == *y) {
      r[rank - 1 - i] = *x;
    } else {
      return false;
    }
  }
  *out = std::move(r);
  return true;
}

inline void AddDims(v1::TensorMeta* meta, const GenShape& shape) {
  for (const GenDim& d : shape) {
    v1::Dim* dim = meta->add_sizes();
    if (d.symbol.empty()) {
      dim->set_value(d.value);
    } else {
      dim->set_symbol(d.symbol);
    }
  }
}

// Row-major strides in the wire form (value times symbols).
inline void AddContiguousStrides(v1::TensorMeta* meta, const GenShape& shape) {
  std::vector<v1::Stride> strides(shape.size());
  int64_t value = 1;
  std::vector<std::string> symbols;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    strides[d].set_value(value);
    for (const std::string& s : symbols) strides[d].add_symbols(s);
    if (shape[d].symbol.empty()) {
      value *= shape[d].value;
    } else {
      symbols.push_back(shape[d].symbol);
    }
  }
  for (v1::Stride& s : strides) *meta->add_strides() = std::move(s);
}

inline v1::Node* AddNode(v1::Graph* g, const std::string& op,
                         const std::string& out) {
  v1::Node* n = g->add_nodes();
  n->set_op(op);
  n->add_outputs(out);
  return n;
}

inline void AddRef(v1::Node* n, const std::string& name) {
  n->add_args()->set_ref(name);
}

// ---- The op set v1 generator (GraphGenOptions::full_op_set) ----
//
// Graphs over every op the registry lowers, with values kept numerically
// tame so that the compiled code must agree with the reference evaluator
// within tests/unit/numerics.h's per-dtype tolerances. The generator tracks,
// per value, bounds on its numbers (OpValue) and only emits an op when the
// result stays comparable:
//
//  * Magnitudes stay bounded (floats below ~1e3, int32 below 2^20, int64
//    below 2^40): no overflow to inf, no integer wrap-around (int32 sums
//    overflowing differ between accumulating in int64 and in int32), and
//    no float16 range trouble. Inputs are as testing::FillRandom draws them:
//    floats in [-2, 2], ints in [-8, 8], bools.
//  * Each value carries `err`, a bound on |compiled - reference|: 0 means
//    both sides compute the same bits (inputs, views, casts of exact
//    values, neg/abs/relu/max/min/clamp/where, and + - * / of exact
//    operands, which are correctly rounded in either precision). An inexact
//    op adds one rounding difference of its dtype (float16/bfloat16: one
//    ulp; float32: four ulps for vectorised libm) times the result's
//    magnitude, and propagates its operands' err through its Lipschitz
//    bound. An op is emitted only if the propagated error stays below a
//    quarter of its output dtype's atol: otherwise a near-zero result
//    (cancellation) could legitimately differ by more than the tolerance.
//  * Ops that are discontinuous (floor/ceil/round/trunc/sign, comparisons,
//    logical ops and casts of floats to int/bool, remainder/fmod, div with
//    rounding_mode, argmax/argmin, any/all, float conditions of where) only
//    take bit-exact operands: a last-bit difference must not flip them.
//    Float div with rounding_mode additionally takes integral operands
//    (|x| <= 64), so a quotient is never within float rounding of an
//    integer without being one.
//  * Singularities are kept away: division, reciprocal, rsqrt and log take
//    operands bounded away from zero (|x| >= 0.1; the generator builds them
//    as abs(x) + c when needed), tan/exp/pow get bounded arguments, prod
//    reduces few small values. Negative operands of log/sqrt/pow give NaN
//    on both sides; NaN is only ever made from bit-exact (or sign-stable)
//    operands, so both sides agree on where it is.
//  * Empty tensors (size-0 dims) are not generated; the per-op suites cover
//    them.
struct OpValue {
  std::string name;
  GenShape shape;
  v1::DType dtype = v1::FLOAT32;
  double mag = 0;         // bound on |x| over the finite elements
  double lo = 0;          // bound on |x| from below (0: may be zero)
  double err = 0;         // bound on |compiled - reference|; 0: same bits
  bool integral = false;  // every element is an integer
  bool nonneg = false;    // every element is >= 0 (or NaN)
  bool exact() const { return err == 0; }
  bool zero_dim() const { return shape.empty(); }
};

inline bool IsFloatDType(v1::DType d) {
  return d == v1::FLOAT32 || d == v1::FLOAT16 || d == v1::BFLOAT16;
}
inline bool IsIntDType(v1::DType d) { return d == v1::INT32 || d == v1::INT64; }

// torch.promote_types over Kiln's dtypes (mirrors graph/dtype.cc).
inline v1::DType PromoteDTypes(v1::DType a, v1::DType b) {
  if (a == b) return a;
  if (a == v1::BOOL) return b;
  if (b == v1::BOOL) return a;
  const bool fa = IsFloatDType(a), fb = IsFloatDType(b);
  if (fa && fb) return v1::FLOAT32;
  if (fa) return a;
  if (fb) return b;
  return v1::INT64;
}

// PyTorch's result_type: dimensioned tensors, then zero-dim tensors, then
// Python scalars, a lower class winning only with a higher category.
class ResultType {
 public:
  void Tensor(const OpValue& v) { Add(v.zero_dim() ? &zero_ : &dim_, v.dtype); }
  // kind: 'f' float, 'i' int, 'b' bool Python scalar.
  void Scalar(char kind) {
    Add(&wrapped_, kind == 'f'   ? v1::FLOAT32
                   : kind == 'i' ? v1::INT64
                                 : v1::BOOL);
  }
  v1::DType Result() const {
    const v1::DType r = Combine(dim_, Combine(zero_, wrapped_));
    return r == kNone ? v1::FLOAT32 : r;
  }

 private:
  static constexpr v1::DType kNone = v1::DTYPE_UNSPECIFIED;
  static void Add(v1::DType* acc, v1::DType d) {
    *acc = *acc == kNone ? d : PromoteDTypes(*acc, d);
  }
  static v1::DType Combine(v1::DType higher, v1::DType lower) {
    if (higher == kNone) return lower;
    if (lower == kNone) return higher;
    if (IsFloatDType(higher)) return higher;
    if (higher == v1::BOOL || IsFloatDType(lower))
      return PromoteDTypes(higher, lower);
    return higher;
  }
  v1::DType dim_ = kNone, zero_ = kNone, wrapped_ = kNone;
};

// numerics.h's atol per dtype (0 for exact dtypes).
inline double AtolOf(v1::DType d) {
  switch (d) {
    case v1::FLOAT32:
      return 2e-4;
    case v1::FLOAT16:
      return 2e-3;
    case v1::BFLOAT16:
      return 1e-2;
    default:
      return 0;
  }
}
// One rounding difference of an inexact op, relative to the magnitude.
inline double UlpOf(v1::DType d) {
  switch (d) {
    case v1::FLOAT32:
      return 4 * std::ldexp(1.0, -23);
    case v1::FLOAT16:
      return std::ldexp(1.0, -10) + std::ldexp(1.0, -21);
    case v1::BFLOAT16:
      return std::ldexp(1.0, -7) + std::ldexp(1.0, -21);
    default:
      return 0;
  }
}
// Integers a float dtype holds exactly.
inline double ExactIntLimit(v1::DType d) {
  switch (d) {
    case v1::FLOAT32:
      return 1 << 24;
    case v1::FLOAT16:
      return 2048;
    case v1::BFLOAT16:
      return 256;
    default:
      return 1e18;
  }
}
inline double MagLimit(v1::DType d) {
  switch (d) {
    case v1::INT32:
      return 1 << 20;
    case v1::INT64:
      return std::ldexp(1.0, 40);
    case v1::BOOL:
      return 1;
    default:
      return 1000;
  }
}
inline bool IsPow2(double x) {
  if (x == 0) return false;
  int e;
  return std::frexp(std::fabs(x), &e) == 0.5;
}

// An argument under construction: a tensor, a Python scalar or an attribute.
struct Operand {
  const OpValue* tensor = nullptr;  // null for a scalar
  double scalar = 0;
  char kind = 'f';  // scalar kind: 'f', 'i' or 'b'
  // Stats of the operand as a value (scalars are exact).
  double mag() const { return tensor ? tensor->mag : std::fabs(scalar); }
  double lo() const { return tensor ? tensor->lo : std::fabs(scalar); }
  double err() const { return tensor ? tensor->err : 0; }
  bool exact() const { return err() == 0; }
  bool integral() const {
    return tensor ? tensor->integral : scalar == std::floor(scalar);
  }
  bool nonneg() const { return tensor ? tensor->nonneg : scalar >= 0; }
};

class OpSetGen {
 public:
  OpSetGen(uint64_t seed, const GraphGenOptions& o)
      : rng_(seed),
        o_(o),
        issue17_(seed >= o.first_issue17_seed),
        conv_(seed >= o.first_conv_seed),
        random_(issue17_ && seed >= o.first_random_seed),
        sort_(issue17_ && seed >= o.first_sort_seed),
        attention_dropout_(conv_ && seed >= o.first_attention_dropout_seed) {}

  v1::Graph Build();

 private:
  // ---- values and nodes ----
  const OpValue& Pick() { return values_[rng_.Below(values_.size())]; }
  std::string Fresh() { return absl::StrCat("v", next_++); }
  v1::Node* Node(const std::string& op, const std::string& out) {
    ++op_count_;
    return AddNode(&g_, op, out);
  }
  static void Ref(v1::Node* n, const std::string& name) { AddRef(n, name); }
  static void Scalar(v1::Node* n, const Operand& s,
                     const std::string& kw = "") {
    v1::Argument* a = n->add_args();
    if (!kw.empty()) a->set_name(kw);
    if (s.kind == 'f') {
      a->set_f(s.scalar);
    } else if (s.kind == 'i') {
      a->set_i(static_cast<int64_t>(s.scalar));
    } else {
      a->set_b(s.scalar != 0);
    }
  }
  static void Arg(v1::Node* n, const Operand& x, const std::string& kw = "") {
    if (x.tensor) {
      v1::Argument* a = n->add_args();
      if (!kw.empty()) a->set_name(kw);
      a->set_ref(x.tensor->name);
    } else {
      Scalar(n, x, kw);
    }
  }
  static void Int(v1::Node* n, int64_t v, const std::string& kw = "") {
    v1::Argument* a = n->add_args();
    if (!kw.empty()) a->set_name(kw);
    a->set_i(v);
  }
  static void Bool(v1::Node* n, bool v, const std::string& kw = "") {
    v1::Argument* a = n->add_args();
    if (!kw.empty()) a->set_name(kw);
    a->set_b(v);
  }
  static void Str(v1::Node* n, const std::string& v,
                  const std::string& kw = "") {
    v1::Argument* a = n->add_args();
    if (!kw.empty()) a->set_name(kw);
    a->set_str(v);
  }
  static void DTypeArg(v1::Node* n, v1::DType d, const std::string& kw = "") {
    v1::Argument* a = n->add_args();
    if (!kw.empty()) a->set_name(kw);
    a->set_dtype(d);
  }
  static void Ints(v1::Node* n, const std::vector<int64_t>& v,
                   const std::string& kw = "") {
    v1::Argument* a = n->add_args();
    if (!kw.empty()) a->set_name(kw);
    v1::IntList* l = a->mutable_ints();
    for (int64_t x : v) l->add_values(x);
  }
  // A size list that may hold symbols (a DimList) or, when all static and
  // half the time, an IntList.
  void Sizes(v1::Node* n, const GenShape& shape, const std::string& kw = "") {
    bool dynamic = false;
    for (const GenDim& d : shape) dynamic |= !d.symbol.empty();
    v1::Argument* a = n->add_args();
    if (!kw.empty()) a->set_name(kw);
    if (!dynamic && rng_.Chance(50)) {
      v1::IntList* l = a->mutable_ints();
      for (const GenDim& d : shape) l->add_values(d.value);
      return;
    }
    v1::DimList* l = a->mutable_dims();
    for (const GenDim& d : shape) {
      v1::Dim* x = l->add_values();
      if (d.symbol.empty()) {
        x->set_value(d.value);
      } else {
        x->set_symbol(d.symbol);
      }
    }
  }
  int64_t MaxSize(const GenDim& d) const {
    return d.symbol.empty() ? d.value : o_.max_symbol_value;
  }
  int64_t MaxNumel(const GenShape& s) const {
    int64_t n = 1;
    for (const GenDim& d : s) n *= MaxSize(d);
    return n;
  }
  // Spells dim d of a rank-r value, negative half the time.
  int64_t Dim(int d, int r) { return rng_.Chance(40) ? d - r : d; }

  // Adds `v` (already emitted) to the pool when its numbers stay tame.
  const OpValue* Keep(OpValue v) {
    values_.push_back(std::move(v));
    return &values_.back();
  }
  // Whether an op with output dtype `out` may propagate `err` to it.
  static bool ErrOk(double err, v1::DType out) {
    if (!IsFloatDType(out)) return err == 0;
    return err <= 0.25 * AtolOf(out);
  }
  static bool MagOk(double mag, v1::DType d) {
    return std::isfinite(mag) && mag <= MagLimit(d);
  }
  // The result of an inexact float op: propagated error plus one rounding.
  static double Inexact(double prop, double mag, v1::DType d) {
    return prop + UlpOf(d) * std::max(mag, 1e-30);
  }
  // The stats of `from` converted to `to` into `v` (Cast and copy).
  static bool CastStats(const OpValue& from, v1::DType to, OpValue& v);

  // Builds `abs(v) + c` (|x| >= c > 0), for denominators and logs.
  const OpValue* MakePositive(const OpValue& v);
  // A new graph input (used also for layer_norm's weight and bias).
  const OpValue* NewInput(const GenShape& shape, v1::DType dtype);
  void AddStrides(v1::TensorMeta* meta, const GenShape& shape);
  // A value (from the pool or a new one) that broadcasts with `a`.
  const OpValue* Partner(const OpValue& a, bool allow_bool);
  // A random scalar operand of the given kind.
  Operand RandomScalar(char kind);

  // ---- op families; each returns false when it does not apply ----
  bool FloatUnary(const OpValue& a);
  bool KeepUnary(const OpValue& a);
  bool LogicalUnary(const OpValue& a);
  bool Arithmetic(const OpValue& a);
  bool Pow(const OpValue& a);
  bool Compare(const OpValue& a);
  bool Bitwise(const OpValue& a);
  bool Where(const OpValue& a);
  bool Clamp(const OpValue& a);
  bool Cast(const OpValue& a);
  bool Activation(const OpValue& a);
  bool Reduction(const OpValue& a);
  bool Composite(const OpValue& a);
  bool View(const OpValue& a);
  bool Cat(const OpValue& a);
  bool Creation();
  // alias, copy, full_like, zeros_like, ones_like, empty_like,
  // empty.memory_format, empty_strided (issue 17).
  bool AliasCopyOrLike(const OpValue& a);
  // Issue 17 item 4: norms, pooling, activation backward ops over fresh
  // inputs; their outputs go to sinks_.
  bool NormPool();
  // The floating dtypes of o_.dtypes, in their order.
  std::vector<v1::DType> FloatDTypes() const {
    std::vector<v1::DType> floats;
    for (v1::DType d : o_.dtypes) {
      if (IsFloatDType(d)) floats.push_back(d);
    }
    return floats;
  }
  // Issue 16: matrix products.
  bool Matmul(const OpValue& a);
  bool Conv();
  // Kiln's fused attention (kiln.attention, with its backward over the
  // forward's out and lse), drawn by a quarter of the Conv slots.
  bool Attention();
  // The gather/scatter family of issue 17.2 (embedding ... cumsum), over
  // static shapes, with index tensors made in range from int inputs.
  bool GatherScatter(const OpValue& a);
  // An int32/int64 index tensor of `shape` with values in [0, n) (or, when
  // `negative` and half the time, in [-n, 0)): remainder of a new int input.
  const OpValue* IndexValues(const GenShape& shape, int64_t n, bool negative);
  // A scalar operand fitting `dtype` (float, int or bool kind).
  Operand ScalarFor(v1::DType dtype);
  // Issue 17.3: the random ops, drawing from one seed input per graph,
  // each op its own stream (offset).
  bool Random(const OpValue& a);
  // Appends the seed (the graph's int64 0-dim seed input, made on first
  // use) and the next offset to `n`.
  void Seeded(v1::Node* n);
  // Issue 17.2: sort, sort.stable and topk along a static dim, and now and
  // then topk's backward (a scatter of the values into zeros).
  bool Sort(const OpValue& a);

  Rng rng_;
  const GraphGenOptions& o_;
  bool issue17_;                    // draw AliasCopyOrLike and NormPool too
  bool conv_;                       // draw Conv too
  bool random_;                     // draw Random too
  bool sort_;                       // draw Sort too
  bool attention_dropout_;          // Attention draws dropout too
  std::string seed_;                // the seed input, once made
  int streams_ = 0;                 // random ops so far (their offsets)
  std::vector<std::string> sinks_;  // returned, never reused
  v1::Graph g_;
  std::deque<OpValue> values_;  // stable addresses
  GenShape base_;
  int next_ = 0;
  int op_count_ = 0;
};

inline Operand OpSetGen::RandomScalar(char kind) {
  Operand s;
  s.kind = kind;
  if (kind == 'f') {
    // All but 0.1 are exact in every float dtype; 0.1 checks that both
    // sides round a scalar to the compute dtype the same way.
    s.scalar = rng_.Pick(
        std::vector<double>{0.5, 2.0, -1.5, 0.25, 3.0, -0.75, 1.25, 0.1});
  } else if (kind == 'i') {
    s.scalar = rng_.Pick(std::vector<double>{2, -3, 1, 0, 4, -1});
  } else {
    s.scalar = rng_.Chance(50) ? 1 : 0;
  }
  return s;
}

inline void OpSetGen::AddStrides(v1::TensorMeta* meta, const GenShape& shape) {
  const int r = static_cast<int>(shape.size());
  const int layout = rng_.Below(100);
  if (r == 0 || layout >= o_.noncontiguous_percent) {
    if (rng_.Chance(20)) AddContiguousStrides(meta, shape);
    return;
  }
  // Memory order (innermost last): a permutation, with some dims padded
  // (their outer neighbour's stride multiplied) or broadcast (stride 0).
  std::vector<int> order(r);
  for (int d = 0; d < r; ++d) order[d] = d;
  if (rng_.Chance(50)) {
    for (int i = r - 1; i > 0; --i)
      std::swap(order[i], order[rng_.Below(i + 1)]);
  }
  const bool pad = rng_.Chance(40), zero = rng_.Chance(30);
  std::vector<v1::Stride> strides(r);
  int64_t value = rng_.Chance(15) ? 2 : 1;  // every other element
  std::vector<std::string> symbols;
  for (int k = r - 1; k >= 0; --k) {
    const int d = order[k];
    if (zero && !shape[d].IsOne() && rng_.Chance(35)) {
      strides[d].set_value(0);
      continue;
    }
    strides[d].set_value(value);
    for (const std::string& s : symbols) strides[d].add_symbols(s);
    if (shape[d].symbol.empty()) {
      value *= std::max<int64_t>(shape[d].value, 1);
    } else {
      symbols.push_back(shape[d].symbol);
    }
    if (pad && rng_.Chance(50)) value *= 2;
  }
  for (v1::Stride& s : strides) *meta->add_strides() = std::move(s);
}

inline const OpValue* OpSetGen::NewInput(const GenShape& shape,
                                         v1::DType dtype) {
  v1::Input* in = g_.add_inputs();
  in->set_name(absl::StrCat("x", g_.inputs_size() - 1));
  v1::TensorMeta* meta = in->mutable_meta();
  meta->set_dtype(dtype);
  AddDims(meta, shape);
  AddStrides(meta, shape);
  meta->set_alignment(rng_.Pick(std::vector<int64_t>{0, 4, 16, 64}));
  meta->set_storage_offset(rng_.Below(4));
  meta->set_device(v1::CPU);
  OpValue v;
  v.name = in->name();
  v.shape = shape;
  v.dtype = dtype;
  // As testing::FillRandom draws them.
  if (IsFloatDType(dtype)) {
    v.mag = 2;
  } else if (IsIntDType(dtype)) {
    v.mag = 8;
    v.integral = true;
  } else {
    v.mag = 1;
    v.integral = true;
    v.nonneg = true;
  }
  return Keep(std::move(v));
}

inline const OpValue* OpSetGen::MakePositive(const OpValue& v) {
  if (v.dtype == v1::BOOL) return nullptr;
  if (v.lo >= 0.1 && v.nonneg) return &v;
  const std::string t = Fresh();
  v1::Node* n = Node("aten.abs.default", t);
  Ref(n, v.name);
  OpValue a = v;
  a.name = t;
  a.nonneg = true;
  const OpValue* abs = Keep(std::move(a));
  const std::string u = Fresh();
  Operand c;
  c.kind = IsFloatDType(v.dtype) && !rng_.Chance(30) ? 'f' : 'i';
  c.scalar = c.kind == 'f' ? rng_.Pick(std::vector<double>{0.5, 1.0}) : 1;
  n = Node(rng_.Chance(50) ? "aten.add.Tensor" : "aten.add.Scalar", u);
  Ref(n, t);
  Scalar(n, c);
  OpValue p = *abs;
  p.name = u;
  p.lo = c.scalar;
  p.mag = abs->mag + c.scalar;
  p.integral = abs->integral && c.kind == 'i';
  // An int scalar keeps an int tensor's dtype; a float one on ints gives
  // float32 (exact: the ints are small).
  if (!IsFloatDType(v.dtype) && c.kind == 'f') p.dtype = v1::FLOAT32;
  return Keep(std::move(p));
}

inline const OpValue* OpSetGen::Partner(const OpValue& a, bool allow_bool) {
  std::vector<const OpValue*> c;
  GenShape s;
  for (const OpValue& v : values_) {
    if (!allow_bool && v.dtype == v1::BOOL) continue;
    if (Broadcast(a.shape, v.shape, &s) && MaxNumel(s) <= 4096) c.push_back(&v);
  }
  if (c.empty()) return nullptr;
  return c[rng_.Below(static_cast<int>(c.size()))];
}

inline bool OpSetGen::FloatUnary(const OpValue& a_in) {
  static const char* kOps[] = {"exp",   "exp2", "expm1", "log",        "log2",
                               "log1p", "sqrt", "rsqrt", "reciprocal", "sin",
                               "cos",   "tan",  "tanh",  "sigmoid",    "erf"};
  const std::string op = kOps[rng_.Below(15)];
  const OpValue* a = &a_in;
  const bool needs_lo =
      op == "log" || op == "log2" || op == "rsqrt" || op == "reciprocal";
  if (needs_lo && (a->lo < 0.1 || (!a->nonneg && a->lo <= a->err))) {
    if (a->dtype == v1::BOOL || rng_.Chance(30)) return false;
    a = MakePositive(*a);
    if (!a) return false;
  }
  if (op == "log1p" && !a->nonneg && a->mag > 0.75) {
    if (a->dtype == v1::BOOL || rng_.Chance(50)) return false;
    a = MakePositive(*a);
    if (!a) return false;
  }
  // int and bool inputs compute in float32.
  const v1::DType out = IsFloatDType(a->dtype) ? a->dtype : v1::FLOAT32;
  const double M = a->mag, l = a->lo, e = a->err;
  double mag = 1, L = 1, lo = 0;
  bool nonneg = false, exact_op = false;
  if (op == "exp" || op == "expm1") {
    if (M > 6) return false;
    mag = L = std::exp(M);
    nonneg = op == "exp";
    lo = op == "exp" ? std::exp(-M) : 0;
  } else if (op == "exp2") {
    if (M > 8) return false;
    mag = std::exp2(M);
    L = mag * 0.7;
    nonneg = true;
    lo = std::exp2(-M);
  } else if (op == "log" || op == "log2") {
    const double k = op == "log" ? 1 : 1 / std::log(2.0);
    mag = k * std::max(std::fabs(std::log(l)), std::fabs(std::log(M)));
    L = k / l;
  } else if (op == "log1p") {
    if (a->nonneg) {
      mag = std::log1p(M);
      L = 1;
      nonneg = true;
    } else {
      mag = 1.4;
      L = 4;
    }
  } else if (op == "sqrt") {
    // Correctly rounded on both sides; NaN for negatives on both.
    exact_op = true;
    if (e > 0 && (l <= e || l < 0.01)) return false;
    mag = std::sqrt(M);
    L = e > 0 ? 0.5 / std::sqrt(l) : 0;
    nonneg = true;
    lo = std::sqrt(l);
  } else if (op == "rsqrt") {
    mag = 1 / std::sqrt(l);
    L = 0.5 * std::pow(l, -1.5);
    nonneg = true;
    lo = 1 / std::sqrt(M);
  } else if (op == "reciprocal") {
    exact_op = true;  // a correctly rounded division
    mag = 1 / l;
    L = 1 / (l * l);
    lo = 1 / M;
    nonneg = a->nonneg;
  } else if (op == "sin") {
    mag = std::min(M, 1.0);
  } else if (op == "cos") {
    mag = 1;
  } else if (op == "tan") {
    if (M > 1.2) return false;
    mag = std::tan(M);
    L = 1 + mag * mag;
  } else if (op == "tanh") {
    mag = std::min(M, 1.0);
  } else if (op == "sigmoid") {
    L = 0.25;
    nonneg = true;
    lo = 1 / (1 + std::exp(M));
  } else {  // erf
    mag = std::min(1.0, 1.13 * M);
    L = 1.13;
  }
  const double prop = L * e;
  if (!ErrOk(prop, out) || !MagOk(mag, out)) return false;
  const std::string name = Fresh();
  v1::Node* n = Node(absl::StrCat("aten.", op, ".default"), name);
  Ref(n, a->name);
  OpValue v;
  v.name = name;
  v.shape = a->shape;
  v.dtype = out;
  v.mag = mag;
  v.lo = lo;
  v.nonneg = nonneg;
  v.err = (exact_op && e == 0) ? 0 : Inexact(prop, mag, out);
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::KeepUnary(const OpValue& a) {
  static const char* kOps[] = {"abs",  "neg",   "relu",  "floor",
                               "ceil", "round", "trunc", "sign"};
  const std::string op = kOps[rng_.Below(8)];
  if (a.dtype == v1::BOOL && op != "sign") return false;
  const bool discontinuous = op != "abs" && op != "neg" && op != "relu";
  if (discontinuous && !a.exact()) return false;
  OpValue v = a;
  v.name = Fresh();
  if (op == "abs") {
    v.nonneg = true;
  } else if (op == "neg") {
    v.nonneg = a.mag == 0;
  } else if (op == "relu") {
    v.nonneg = true;
    v.lo = 0;
  } else if (op == "sign") {
    v.mag = std::min(a.mag, 1.0);
    v.integral = true;
    v.nonneg = a.nonneg;
    v.lo = a.lo > 0 ? 1 : 0;
  } else {
    v.mag = std::ceil(a.mag) + 1;
    v.lo = 0;
    v.integral = true;
  }
  Ref(Node(absl::StrCat("aten.", op, ".default"), v.name), a.name);
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::LogicalUnary(const OpValue& a) {
  const int k = rng_.Below(3);
  OpValue v;
  v.name = Fresh();
  v.shape = a.shape;
  if (k == 0) {
    if (!a.exact()) return false;
    Ref(Node("aten.logical_not.default", v.name), a.name);
    v.dtype = v1::BOOL;
    v.mag = 1;
  } else if (k == 1) {
    // NaNs are only ever made from bit-exact operands: both sides agree.
    Ref(Node("aten.isnan.default", v.name), a.name);
    v.dtype = v1::BOOL;
    v.mag = 1;
  } else {
    if (IsFloatDType(a.dtype)) return false;
    Ref(Node("aten.bitwise_not.default", v.name), a.name);
    v.dtype = a.dtype;
    v.mag = a.mag + 1;
  }
  v.integral = true;
  v.nonneg = v.dtype == v1::BOOL;
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::Arithmetic(const OpValue& a_in) {
  static const char* kOps[] = {"add",      "sub",       "mul",  "div",
                               "div_mode", "remainder", "fmod", "pow",
                               "maximum",  "minimum",   "atan2"};
  const std::string op = kOps[rng_.Below(11)];
  const bool tensor_pair = op == "maximum" || op == "minimum" || op == "atan2";
  if (op == "pow") return Pow(a_in);
  const bool scalar_overload = !tensor_pair && rng_.Chance(30);
  const OpValue* a = &a_in;
  Operand x{a}, y;
  if (tensor_pair || (!scalar_overload && rng_.Chance(70))) {
    y.tensor = Partner(*a, true);
    if (!y.tensor) return false;
  } else {
    y = RandomScalar(rng_.Chance(55) ? 'f' : (rng_.Chance(85) ? 'i' : 'b'));
  }
  const bool divides =
      op == "div" || op == "div_mode" || op == "remainder" || op == "fmod";
  std::string mode;  // div_mode: "", "trunc" or "floor"
  if (op == "div_mode")
    mode = rng_.Pick(std::vector<std::string>{"", "trunc", "floor"});
  auto compute = [&] {
    ResultType rt;
    rt.Tensor(*x.tensor);
    if (y.tensor) {
      rt.Tensor(*y.tensor);
    } else {
      rt.Scalar(y.kind);
    }
    return rt.Result();
  };
  v1::DType c = compute();
  // Denominators: true division needs |y| >= 0.1; floor/trunc division of
  // floats needs integral |y| >= 1. Integer division by zero is defined
  // (0, Kiln's semantics; PyTorch raises) and kept.
  const bool true_div = op == "div" || (op == "div_mode" && mode.empty());
  if (divides) {
    const bool int_div = !IsFloatDType(c) && !true_div;
    const double need = (op == "div_mode" && !mode.empty()) ? 1 : 0.1;
    if (!int_div && (y.lo() < need || (!y.nonneg() && y.lo() <= y.err()))) {
      if (!y.tensor) {
        y.scalar = y.kind == 'f' ? 0.5 : 2;
        if (y.kind == 'b') y.kind = 'i';
      } else {
        if (rng_.Chance(30)) return false;
        y.tensor = MakePositive(*y.tensor);
        if (!y.tensor || y.lo() < need) return false;
      }
      c = compute();
    }
  }
  auto bool_operand = [](const Operand& o) {
    return o.tensor ? o.tensor->dtype == v1::BOOL : o.kind == 'b';
  };
  // Operands convert to the compute dtype exactly (ints are small).
  for (const Operand* o : {&x, &y}) {
    if (o->tensor && IsFloatDType(c) && !IsFloatDType(o->tensor->dtype) &&
        o->mag() > ExactIntLimit(c))
      return false;
  }
  const double Ma = x.mag(), My = y.mag(), ea = x.err(), ey = y.err();
  const bool both_exact = ea == 0 && ey == 0;
  OpValue v;
  v.name = Fresh();
  if (!Broadcast(a->shape, y.tensor ? y.tensor->shape : GenShape{}, &v.shape))
    return false;
  v.dtype = c;
  Operand alpha;
  bool has_alpha = false;
  double prop = 0;
  bool exact = both_exact;
  if (op == "add" || op == "sub") {
    if (op == "sub" && (bool_operand(x) || bool_operand(y))) return false;
    if (rng_.Chance(25)) {
      has_alpha = true;
      alpha =
          IsFloatDType(c) && rng_.Chance(60)
              ? Operand{nullptr,
                        rng_.Pick(std::vector<double>{2.0, 0.5, 1.5, -0.25}),
                        'f'}
              : Operand{nullptr, rng_.Pick(std::vector<double>{2, -1, 3}), 'i'};
    }
    const double al = has_alpha ? std::fabs(alpha.scalar) : 1;
    v.mag = c == v1::BOOL ? 1 : Ma + al * My;
    prop = ea + al * ey;
    exact = both_exact && (!has_alpha || IsPow2(alpha.scalar));
    v.integral =
        x.integral() && y.integral() && (!has_alpha || alpha.kind == 'i');
  } else if (op == "mul") {
    v.mag = Ma * My;
    prop = ea * My + ey * Ma + ea * ey;
    v.integral = x.integral() && y.integral();
  } else if (true_div) {
    if (!IsFloatDType(c)) v.dtype = c = v1::FLOAT32;
    if (op == "div_mode" && c == v1::BOOL) return false;
    const double l = y.lo();
    v.mag = Ma / l;
    prop = ea / l + ey * Ma / (l * l);
  } else if (op == "div_mode") {
    if (c == v1::BOOL || !both_exact) return false;
    if (IsFloatDType(c) &&
        (!x.integral() || !y.integral() || Ma > 64 || My > 64))
      return false;
    v.mag = Ma + 1;
    v.integral = true;
  } else if (op == "remainder" || op == "fmod") {
    if (c == v1::BOOL || !both_exact) return false;
    v.mag = op == "fmod" ? std::min(Ma, My) : My;
    v.integral = x.integral() && y.integral();
    v.nonneg = op == "fmod" ? x.nonneg() : y.nonneg();
  } else if (op == "maximum" || op == "minimum") {
    v.mag = std::max(Ma, My);
    prop = std::max(ea, ey);
    v.integral = x.integral() && y.integral();
    v.nonneg = op == "maximum" ? (x.nonneg() || y.nonneg())
                               : (x.nonneg() && y.nonneg());
  } else {  // atan2
    if (!both_exact) return false;
    if (!IsFloatDType(c)) v.dtype = c = v1::FLOAT32;
    v.mag = 3.15;
    exact = false;
  }
  if (!IsFloatDType(c)) {
    if (!both_exact) return false;
    exact = true;
  }
  if (!MagOk(v.mag, c) || !ErrOk(prop, c)) return false;
  v.err = exact ? 0 : Inexact(prop, v.mag, c);
  std::string name;
  if (op == "div_mode") {
    name = y.tensor || !scalar_overload ? "aten.div.Tensor_mode"
                                        : "aten.div.Scalar_mode";
  } else if (tensor_pair) {
    name = absl::StrCat("aten.", op, ".default");
  } else {
    name = absl::StrCat("aten.", op, scalar_overload ? ".Scalar" : ".Tensor");
  }
  v1::Node* n = Node(name, v.name);
  Arg(n, x);
  Arg(n, y);
  if (has_alpha) Scalar(n, alpha, "alpha");
  if (op == "div_mode") {
    if (!mode.empty()) {
      Str(n, mode, "rounding_mode");
    } else {
      n->add_args()->set_name("rounding_mode");
      n->mutable_args(n->args_size() - 1)->mutable_none();
    }
  }
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::Pow(const OpValue& a_in) {
  const int variant = rng_.Below(4);
  const OpValue* a = &a_in;
  OpValue v;
  v.name = Fresh();
  v.shape = a->shape;
  if (variant == 3) {
    // pow.Scalar(base, exponent tensor).
    Operand base{nullptr, rng_.Pick(std::vector<double>{2.0, 0.5, 1.5, 2, 3}),
                 'f'};
    if (base.scalar == 3 || rng_.Chance(30)) base.kind = 'i';
    if (base.kind == 'i') base.scalar = std::floor(base.scalar + 0.5);
    ResultType rt;
    rt.Scalar(base.kind);
    rt.Tensor(*a);
    const v1::DType c = rt.Result();
    if (c == v1::BOOL || a->mag > 6) return false;
    const double b = std::fabs(base.scalar);
    v.dtype = c;
    v.mag = std::max(std::pow(b, a->mag), std::pow(b, -a->mag));
    if (IsFloatDType(c)) {
      const double prop = v.mag * std::fabs(std::log(b)) * a->err;
      if (!ErrOk(prop, c)) return false;
      v.err = Inexact(prop, v.mag, c);
      v.nonneg = true;
    } else {
      if (!a->exact()) return false;
      v.integral = true;
      v.mag = std::pow(b, a->mag);
    }
    if (!MagOk(v.mag, c)) return false;
    v1::Node* n = Node("aten.pow.Scalar", v.name);
    Scalar(n, base);
    Ref(n, a->name);
    Keep(std::move(v));
    return true;
  }
  if (variant == 0) {
    // pow.Tensor_Tensor with a tensor exponent.
    const OpValue* b = Partner(*a, false);
    if (!b) return false;
    ResultType rt;
    rt.Tensor(*a);
    rt.Tensor(*b);
    const v1::DType c = rt.Result();
    if (c == v1::BOOL || !Broadcast(a->shape, b->shape, &v.shape)) return false;
    v.dtype = c;
    if (IsFloatDType(c)) {
      if (b->mag > 3 || a->mag > 4) return false;
      if (!a->nonneg || a->lo < 0.25) {
        if (a->dtype == v1::BOOL) return false;
        a = MakePositive(*a);
        if (!a || a->lo < 0.25 || a->mag > 4.5 ||
            !Broadcast(a->shape, b->shape, &v.shape))
          return false;
      }
      for (const OpValue* o : {a, b}) {
        if (!IsFloatDType(o->dtype) && o->mag > ExactIntLimit(c)) return false;
      }
      v.mag = std::max(std::pow(a->mag, b->mag), std::pow(a->lo, -b->mag));
      const double la = b->mag * v.mag / a->lo;
      const double lb = v.mag * std::max(std::fabs(std::log(a->mag)),
                                         std::fabs(std::log(a->lo)));
      const double prop = la * a->err + lb * b->err;
      if (!ErrOk(prop, c)) return false;
      v.err = Inexact(prop, v.mag, c);
      v.nonneg = true;
    } else {
      // Integer powers; negative exponents give 0 or +-1.
      if (!a->exact() || !b->exact() || b->mag > 4) return false;
      v.mag = std::pow(a->mag, b->mag);
      v.integral = true;
    }
    if (!MagOk(v.mag, c)) return false;
    v1::Node* n = Node("aten.pow.Tensor_Tensor", v.name);
    Ref(n, a->name);
    Ref(n, b->name);
    Keep(std::move(v));
    return true;
  }
  // A scalar exponent: Tensor_Scalar, or Tensor_Tensor with a wrapped one.
  Operand e;
  if (rng_.Chance(50)) {
    e = {nullptr,
         rng_.Pick(std::vector<double>{2.0, 0.5, 3.0, -1.0, 1.5, -0.5, 0.0}),
         'f'};
  } else {
    e = {nullptr, rng_.Pick(std::vector<double>{2, 3, 0, 1, -1}), 'i'};
  }
  ResultType rt;
  rt.Tensor(*a);
  rt.Scalar(e.kind);
  const v1::DType c = rt.Result();
  if (c == v1::BOOL) return false;
  v.dtype = c;
  const double p = e.scalar;
  if (IsFloatDType(c)) {
    if (!IsFloatDType(a->dtype) && a->mag > ExactIntLimit(c)) return false;
    const bool frac = p != std::floor(p);
    if (p < 0 || (frac && a->err > 0)) {
      if (a->lo < 0.1 || (!a->nonneg && a->lo <= a->err)) {
        if (a->dtype == v1::BOOL || rng_.Chance(30)) return false;
        a = MakePositive(*a);
        if (!a) return false;
        v.shape = a->shape;
      }
    }
    const double M = a->mag, l = a->lo;
    if (p >= 0) {
      v.mag = std::pow(M, p);
    } else {
      v.mag = std::pow(l, p);
    }
    double L = 0;
    if (a->err > 0) {
      L = std::fabs(p) *
          std::max(std::pow(M, p - 1), p < 1 ? std::pow(l, p - 1) : 0.0);
    }
    const double prop = L * a->err;
    if (!ErrOk(prop, c)) return false;
    v.err = (a->exact() && (p == 0 || p == 1)) ? 0 : Inexact(prop, v.mag, c);
    v.nonneg = p == 0 || p == 2 || frac || a->nonneg;
    v.integral = p == 0 || (a->integral && p == 1);
    if (p == 0) v.mag = 1;
  } else {
    if (!a->exact()) return false;
    if (variant == 2 && p < 0) return false;  // PyTorch raises
    v.mag = p < 0 ? 1 : std::pow(a->mag, p);
    v.integral = true;
  }
  if (!MagOk(v.mag, c)) return false;
  v1::Node* n =
      Node(variant == 2 ? "aten.pow.Tensor_Scalar" : "aten.pow.Tensor_Tensor",
           v.name);
  Ref(n, a->name);
  Scalar(n, e);
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::Compare(const OpValue& a) {
  static const char* kOps[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  const std::string op = kOps[rng_.Below(6)];
  if (!a.exact()) return false;
  const bool scalar_overload = rng_.Chance(35);
  Operand y;
  if (!scalar_overload && rng_.Chance(75)) {
    y.tensor = Partner(a, true);
    if (!y.tensor || !y.exact()) return false;
  } else {
    y = RandomScalar(rng_.Chance(50) ? 'f' : (rng_.Chance(80) ? 'i' : 'b'));
  }
  OpValue v;
  v.name = Fresh();
  if (!Broadcast(a.shape, y.tensor ? y.tensor->shape : GenShape{}, &v.shape))
    return false;
  v.dtype = v1::BOOL;
  v.mag = 1;
  v.integral = v.nonneg = true;
  v1::Node* n =
      Node(absl::StrCat("aten.", op, scalar_overload ? ".Scalar" : ".Tensor"),
           v.name);
  Ref(n, a.name);
  Arg(n, y);
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::Bitwise(const OpValue& a) {
  const int k = rng_.Below(4);
  OpValue v;
  v.name = Fresh();
  v.integral = true;
  if (k < 2) {
    // logical_and / logical_or: any dtypes, tensors only.
    if (!a.exact()) return false;
    const OpValue* b = Partner(a, true);
    if (!b || !b->exact() || !Broadcast(a.shape, b->shape, &v.shape))
      return false;
    v.dtype = v1::BOOL;
    v.mag = 1;
    v.nonneg = true;
    v1::Node* n =
        Node(k == 0 ? "aten.logical_and.default" : "aten.logical_or.default",
             v.name);
    Ref(n, a.name);
    Ref(n, b->name);
    Keep(std::move(v));
    return true;
  }
  // bitwise_and / bitwise_or on ints and bools.
  if (IsFloatDType(a.dtype)) return false;
  const bool scalar_overload = rng_.Chance(30);
  Operand y;
  if (!scalar_overload && rng_.Chance(70)) {
    const OpValue* b = Partner(a, true);
    if (!b || IsFloatDType(b->dtype)) return false;
    y.tensor = b;
  } else {
    y = RandomScalar(rng_.Chance(70) ? 'i' : 'b');
  }
  ResultType rt;
  rt.Tensor(a);
  if (y.tensor) {
    rt.Tensor(*y.tensor);
  } else {
    rt.Scalar(y.kind);
  }
  v.dtype = rt.Result();
  if (!Broadcast(a.shape, y.tensor ? y.tensor->shape : GenShape{}, &v.shape))
    return false;
  // |a & b|, |a | b| <= 2 max(|a|, |b|) in two's complement.
  v.mag = v.dtype == v1::BOOL ? 1 : 2 * std::max(a.mag, y.mag()) + 1;
  v.nonneg = v.dtype == v1::BOOL;
  const std::string base = k == 2 ? "bitwise_and" : "bitwise_or";
  v1::Node* n =
      Node(absl::StrCat("aten.", base, scalar_overload ? ".Scalar" : ".Tensor"),
           v.name);
  Ref(n, a.name);
  Arg(n, y);
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::Where(const OpValue& a) {
  // The condition: a bool value that broadcasts, or a fresh comparison.
  const OpValue* cond = nullptr;
  std::vector<const OpValue*> bools;
  GenShape s;
  for (const OpValue& v : values_) {
    if (v.dtype == v1::BOOL && Broadcast(a.shape, v.shape, &s))
      bools.push_back(&v);
  }
  if (!bools.empty() && rng_.Chance(70)) {
    cond = bools[rng_.Below(static_cast<int>(bools.size()))];
  } else {
    const OpValue* src = Partner(a, true);
    if (!src || !src->exact()) return false;
    OpValue c;
    c.name = Fresh();
    c.shape = src->shape;
    c.dtype = v1::BOOL;
    c.mag = 1;
    c.integral = c.nonneg = true;
    v1::Node* n =
        Node(rng_.Chance(50) ? "aten.gt.Scalar" : "aten.le.Scalar", c.name);
    Ref(n, src->name);
    Scalar(n, RandomScalar(IsFloatDType(src->dtype) ? 'f' : 'i'));
    cond = Keep(std::move(c));
  }
  const int variant = rng_.Below(4);  // self, ScalarSelf, ScalarOther, Scalar
  Operand x, y;
  if (variant == 0 || variant == 2) {
    x.tensor = &a;
  } else {
    x = RandomScalar(rng_.Chance(60) ? 'f' : 'i');
  }
  if (variant == 0 && rng_.Chance(70)) {
    y.tensor = Partner(a, true);
    if (!y.tensor) return false;
  } else if (variant == 1) {
    y.tensor = &a;
  } else {
    y = RandomScalar(rng_.Chance(60) ? 'f' : 'i');
  }
  ResultType rt;
  for (const Operand* o : {&x, &y}) {
    if (o->tensor) {
      rt.Tensor(*o->tensor);
    } else {
      rt.Scalar(o->kind);
    }
  }
  OpValue v;
  v.name = Fresh();
  v.dtype = rt.Result();
  GenShape xy;
  if (!Broadcast(x.tensor ? x.tensor->shape : GenShape{},
                 y.tensor ? y.tensor->shape : GenShape{}, &xy) ||
      !Broadcast(cond->shape, xy, &v.shape))
    return false;
  for (const Operand* o : {&x, &y}) {
    if (o->tensor && IsFloatDType(v.dtype) && !IsFloatDType(o->tensor->dtype) &&
        o->mag() > ExactIntLimit(v.dtype))
      return false;
  }
  const double prop = std::max(x.err(), y.err());
  v.mag = std::max(x.mag(), y.mag());
  if (!ErrOk(prop, v.dtype) || !MagOk(v.mag, v.dtype)) return false;
  v.err = prop;
  v.integral = x.integral() && y.integral();
  v.nonneg = x.nonneg() && y.nonneg();
  static const char* kNames[] = {"aten.where.self", "aten.where.ScalarSelf",
                                 "aten.where.ScalarOther", "aten.where.Scalar"};
  v1::Node* n = Node(kNames[variant], v.name);
  Ref(n, cond->name);
  Arg(n, x);
  Arg(n, y);
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::Clamp(const OpValue& a) {
  if (a.dtype == v1::BOOL) return false;
  const int variant = rng_.Below(4);  // default, Tensor, clamp_min, clamp_max
  Operand lo, hi;
  bool has_lo = true, has_hi = true;
  auto bound = [&](Operand* o) {
    if (variant == 1) {
      o->tensor = Partner(a, false);
      return o->tensor != nullptr;
    }
    *o = RandomScalar(rng_.Chance(60) ? 'f' : 'i');
    return true;
  };
  if (variant == 2) {
    has_hi = false;
  } else if (variant == 3) {
    has_lo = false;
  } else if (rng_.Chance(40)) {
    (rng_.Chance(50) ? has_lo : has_hi) = false;
  }
  if ((has_lo && !bound(&lo)) || (has_hi && !bound(&hi))) return false;
  ResultType rt;
  rt.Tensor(a);
  for (const Operand* o : {&lo, &hi}) {
    if ((o == &lo && !has_lo) || (o == &hi && !has_hi)) continue;
    if (o->tensor) {
      rt.Tensor(*o->tensor);
    } else {
      rt.Scalar(o->kind);
    }
  }
  OpValue v = a;
  v.name = Fresh();
  v.dtype = rt.Result();
  if (v.dtype == v1::BOOL) return false;
  double prop = a.err;
  for (const Operand* o : {&lo, &hi}) {
    if ((o == &lo && !has_lo) || (o == &hi && !has_hi)) continue;
    if (o->tensor && !Broadcast(v.shape, o->tensor->shape, &v.shape))
      return false;
    if (o->tensor && IsFloatDType(v.dtype) && !IsFloatDType(o->tensor->dtype) &&
        o->mag() > ExactIntLimit(v.dtype))
      return false;
    prop = std::max(prop, o->err());
    v.mag = std::max(v.mag, o->mag());
    v.integral = v.integral && o->integral();
  }
  if (IsFloatDType(v.dtype) && !IsFloatDType(a.dtype) &&
      a.mag > ExactIntLimit(v.dtype))
    return false;
  if (!ErrOk(prop, v.dtype) || !MagOk(v.mag, v.dtype)) return false;
  v.err = prop;
  v.lo = 0;
  v.nonneg = (has_lo && lo.nonneg()) || (a.nonneg && (!has_hi || hi.nonneg()));
  static const char* kNames[] = {"aten.clamp.default", "aten.clamp.Tensor",
                                 "aten.clamp_min.default",
                                 "aten.clamp_max.default"};
  v1::Node* n = Node(kNames[variant], v.name);
  Ref(n, a.name);
  if (variant >= 2) {
    Arg(n, variant == 2 ? lo : hi);
  } else if (!has_lo) {
    // min=None: positional None or max by keyword.
    if (rng_.Chance(50)) {
      n->add_args()->mutable_none();
      Arg(n, hi);
    } else {
      Arg(n, hi, "max");
    }
  } else {
    Arg(n, lo);
    if (has_hi) Arg(n, hi);
  }
  Keep(std::move(v));
  return true;
}

// The stats of `from` converted to `to`, into `v` (a copy of `from`);
// false when the conversion is not numerically tame (a discontinuous
// truncation of an inexact value, an out-of-range magnitude). Shared by
// Cast and copy.
inline bool OpSetGen::CastStats(const OpValue& from, v1::DType to,
                                OpValue& v) {
  if (IsFloatDType(from.dtype) && !IsFloatDType(to)) {
    // Truncation and != 0 are discontinuous.
    if (!from.exact() || from.mag > MagLimit(to)) return false;
    v.mag = to == v1::BOOL ? 1 : std::floor(from.mag);
    v.integral = true;
    v.lo = to == v1::BOOL ? 0 : std::floor(from.lo);
    if (to == v1::BOOL) v.nonneg = true;
  } else if (IsFloatDType(to)) {
    if (!IsFloatDType(from.dtype) && from.mag > ExactIntLimit(to))
      return false;
    if (!ErrOk(from.err, to) || !MagOk(from.mag, to)) return false;
    // Rounding to a narrower dtype is the same on both sides for exact
    // values; an inexact one may round either way.
    if (from.err > 0) v.err = Inexact(from.err, from.mag, to);
    if (to != v1::FLOAT32 && from.mag > ExactIntLimit(to)) v.integral = false;
  } else {
    if (to != v1::BOOL && from.mag > MagLimit(to)) return false;
    if (to == v1::BOOL) {
      v.mag = 1;
      v.nonneg = true;
      v.lo = 0;
    }
  }
  return true;
}

inline bool OpSetGen::Cast(const OpValue& a) {
  const v1::DType to = rng_.Pick(o_.dtypes);
  OpValue v = a;
  v.name = Fresh();
  v.dtype = to;
  if (!CastStats(a, to, v)) return false;
  v1::Node* n;
  if (rng_.Chance(75)) {
    n = Node("aten._to_copy.default", v.name);
    Ref(n, a.name);
    DTypeArg(n, to, "dtype");
    if (rng_.Chance(30)) {
      n->add_args()->set_name("layout");
      n->mutable_args(n->args_size() - 1)->mutable_none();
      Bool(n, false, "non_blocking");
    }
  } else {
    n = Node("prims.convert_element_type.default", v.name);
    Ref(n, a.name);
    DTypeArg(n, to);
  }
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::Activation(const OpValue& a) {
  const int k = rng_.Below(6);  // gelu leaky_relu hardtanh silu lerp.S lerp.T
  OpValue v = a;
  v.name = Fresh();
  v.lo = 0;
  if (k == 2) {
    // hardtanh keeps ints (not bool); the bounds do not promote.
    if (a.dtype == v1::BOOL) return false;
    static const double kBounds[][2] = {{-1, 1}, {-0.5, 2}, {0, 6}, {-2, 0.5}};
    const int b = rng_.Below(4);
    const bool defaults = rng_.Chance(30);
    const double lo = defaults ? -1 : kBounds[b][0],
                 hi = defaults ? 1 : kBounds[b][1];
    v.mag = std::min(a.mag, std::max(std::fabs(lo), std::fabs(hi)));
    v.nonneg = lo >= 0;
    if (!IsFloatDType(a.dtype)) v.integral = true;
    v1::Node* n = Node("aten.hardtanh.default", v.name);
    Ref(n, a.name);
    if (!defaults) {
      const bool as_int =
          lo == std::floor(lo) && hi == std::floor(hi) && rng_.Chance(50);
      Scalar(n, {nullptr, lo, as_int ? 'i' : 'f'});
      Scalar(n, {nullptr, hi, as_int ? 'i' : 'f'});
    }
    Keep(std::move(v));
    return true;
  }
  if (!IsFloatDType(a.dtype)) return false;  // the rest need floats
  const v1::DType d = a.dtype;
  v.integral = false;
  v.nonneg = false;
  v1::Node* n = nullptr;
  double prop = 0;
  bool exact = false;
  if (k == 0 || k == 3) {
    v.mag = std::max(a.mag, 0.3);
    prop = 1.13 * a.err;
    if (!ErrOk(prop, d)) return false;
    n = Node(k == 0 ? "aten.gelu.default" : "aten.silu.default", v.name);
    Ref(n, a.name);
    if (k == 0) {
      const int m = rng_.Below(3);
      if (m > 0) Str(n, m == 1 ? "none" : "tanh", "approximate");
    }
  } else if (k == 1) {
    const bool dflt = rng_.Chance(30);
    const double slope =
        dflt ? 0.01 : rng_.Pick(std::vector<double>{0.2, 0.5, -0.5, 0.01});
    v.mag = a.mag * std::max(1.0, std::fabs(slope));
    prop = a.err * std::max(1.0, std::fabs(slope));
    exact = a.exact() && IsPow2(slope);
    if (!ErrOk(prop, d) || !MagOk(v.mag, d)) return false;
    n = Node("aten.leaky_relu.default", v.name);
    Ref(n, a.name);
    if (!dflt) Scalar(n, {nullptr, slope, 'f'});
  } else {
    // lerp: end of self's dtype; a tensor weight promotes into self's.
    const OpValue* end = nullptr;
    std::vector<const OpValue*> ends;
    GenShape s;
    for (const OpValue& o : values_) {
      if (o.dtype == d && Broadcast(a.shape, o.shape, &s)) ends.push_back(&o);
    }
    if (ends.empty()) return false;
    end = ends[rng_.Below(static_cast<int>(ends.size()))];
    if (!Broadcast(a.shape, end->shape, &v.shape)) return false;
    const double span = a.mag + end->mag;
    const OpValue* w = nullptr;
    double weight = rng_.Pick(std::vector<double>{0.25, 0.5, 0.75, -0.5, 1.5});
    if (k == 4) {
      v.mag = std::max(a.mag, end->mag) + std::fabs(weight) * span;
      prop = (std::fabs(1 - weight) + std::fabs(weight)) *
             std::max(a.err, end->err);
    } else {
      std::vector<const OpValue*> ws;
      for (const OpValue& o : values_) {
        if (PromoteDTypes(d, o.dtype) == d && o.mag <= 2 &&
            Broadcast(v.shape, o.shape, &s))
          ws.push_back(&o);
      }
      if (ws.empty()) return false;
      w = ws[rng_.Below(static_cast<int>(ws.size()))];
      if (!Broadcast(v.shape, w->shape, &v.shape)) return false;
      v.mag = std::max(a.mag, end->mag) + w->mag * span;
      prop = (1 + 2 * w->mag) * std::max(a.err, end->err) + span * w->err;
    }
    if (!ErrOk(prop, d) || !MagOk(v.mag, d) || MaxNumel(v.shape) > 4096)
      return false;
    n = Node(k == 4 ? "aten.lerp.Scalar" : "aten.lerp.Tensor", v.name);
    Ref(n, a.name);
    Ref(n, end->name);
    if (k == 4) {
      Scalar(n, {nullptr, weight, 'f'});
    } else {
      Ref(n, w->name);
    }
  }
  v.err = exact ? 0 : Inexact(prop, v.mag, d);
  Keep(std::move(v));
  return true;
}

inline bool IsCompound(const GenDim& d) {
  return d.symbol.find_first_of("*+-#") != std::string::npos;
}

inline bool OpSetGen::Reduction(const OpValue& a) {
  static const char* kOps[] = {"sum", "mean",   "prod",   "amax", "amin",
                               "var", "argmax", "argmin", "any",  "all"};
  const std::string op = kOps[rng_.Below(10)];
  const int r = static_cast<int>(a.shape.size());
  const bool fa = IsFloatDType(a.dtype);
  // Which dims: one (int-dim overloads), a subset, or all.
  const bool single = op == "prod" || op == "argmax" || op == "argmin" ||
                      ((op == "any" || op == "all") && rng_.Chance(40));
  bool all = r == 0 || rng_.Chance(single ? 25 : 20);
  std::vector<bool> reduced(r, all);
  if (!all) {
    if (single) {
      reduced[rng_.Below(r)] = true;
    } else {
      bool any = false;
      for (int d = 0; d < r; ++d) any |= (reduced[d] = rng_.Chance(50));
      if (!any) reduced[rng_.Below(r)] = true;
    }
  }
  int64_t n_max = 1, n_min = 1;
  int first = -1;
  for (int d = 0; d < r; ++d) {
    if (!reduced[d]) continue;
    if (first < 0) first = d;
    n_max *= MaxSize(a.shape[d]);
    n_min *= a.shape[d].symbol.empty() ? a.shape[d].value : 1;
  }
  const bool keepdim = rng_.Chance(40);
  OpValue v;
  v.name = Fresh();
  for (int d = 0; d < r; ++d) {
    if (!reduced[d]) {
      v.shape.push_back(a.shape[d]);
    } else if (keepdim && !all) {
      v.shape.push_back(GenDim{"", 1});
    } else if (keepdim) {
      v.shape.push_back(GenDim{"", 1});
    }
  }
  // Overloads that reduce everything drop keepdim (sum.default ...).
  std::string name;
  v1::DType dtype_kw = v1::DTYPE_UNSPECIFIED;
  double prop = 0;
  bool exact = true;
  if (op == "sum" || op == "mean" || op == "prod") {
    if (op == "prod" &&
        std::pow(std::max(a.mag, 1.0), n_max) > (fa ? 300 : 1e9))
      return false;
    if (op == "mean" && !fa) {
      dtype_kw = rng_.Chance(70) ? v1::FLOAT32 : v1::FLOAT16;
      if (std::find(o_.dtypes.begin(), o_.dtypes.end(), dtype_kw) ==
          o_.dtypes.end())
        return false;
    } else if (rng_.Chance(25)) {
      dtype_kw = fa ? v1::FLOAT32
                    : rng_.Pick(std::vector<v1::DType>{v1::INT64, v1::FLOAT32});
    }
    v.dtype = dtype_kw != v1::DTYPE_UNSPECIFIED ? dtype_kw
                                                : (fa ? a.dtype : v1::INT64);
    if (IsFloatDType(v.dtype) && !fa && a.mag > ExactIntLimit(v.dtype))
      return false;
    const double n = static_cast<double>(n_max);
    if (op == "sum") {
      v.mag = n * a.mag;
      prop = n * a.err;
    } else if (op == "mean") {
      v.mag = a.mag;
      prop = a.err;
    } else {
      v.mag = std::pow(a.mag, n);
      prop = n * std::pow(std::max(a.mag, 1.0), n - 1) * a.err;
    }
    exact = !IsFloatDType(v.dtype);
    v.integral = exact;
    v.nonneg = a.nonneg;
    const bool dims_overload = !all || rng_.Chance(50);
    if (!dims_overload) {
      v.shape.clear();
      name = absl::StrCat("aten.", op, ".default");
    } else {
      name = op == "sum"    ? "aten.sum.dim_IntList"
             : op == "mean" ? "aten.mean.dim"
                            : "aten.prod.dim_int";
      if (op == "prod" && r == 0) return false;
      if (op == "prod" && all && r > 1) return false;
    }
  } else if (op == "amax" || op == "amin") {
    v.dtype = a.dtype;
    v.mag = a.mag;
    prop = a.err;
    exact = a.exact();
    v.integral = a.integral;
    v.nonneg = a.nonneg;
    name = absl::StrCat("aten.", op, ".default");
  } else if (op == "var") {
    if (!fa) return false;
    const double corr =
        rng_.Pick(std::vector<double>{-1, 0, 1, 2});  // -1: None
    const double c = corr < 0 ? 1 : corr;
    if (static_cast<double>(n_min) <= c) return false;
    v.dtype = a.dtype;
    const double scale =
        static_cast<double>(n_max) / (static_cast<double>(n_min) - c);
    v.mag = a.mag * a.mag * scale;
    prop = 4 * a.mag * a.err * scale;
    exact = false;
    v.nonneg = true;
    if (!ErrOk(prop, v.dtype) || !MagOk(v.mag, v.dtype)) return false;
    v.err = Inexact(prop, v.mag, v.dtype) +
            n_max * a.mag * a.mag * std::ldexp(1.0, -22);
    v1::Node* n = Node("aten.var.correction", v.name);
    Ref(n, a.name);
    if (all && rng_.Chance(50)) {
      if (rng_.Chance(50)) n->add_args()->mutable_none();
    } else {
      std::vector<int64_t> dims;
      for (int d = 0; d < r; ++d) {
        if (reduced[d]) dims.push_back(Dim(d, r));
      }
      Ints(n, dims);
    }
    if (corr >= 0) {
      Scalar(n, {nullptr, corr, rng_.Chance(70) ? 'i' : 'f'}, "correction");
    }
    if (keepdim || rng_.Chance(30)) Bool(n, keepdim, "keepdim");
    if (!keepdim) {
      v.shape.clear();
      for (int d = 0; d < r; ++d) {
        if (!reduced[d]) v.shape.push_back(a.shape[d]);
      }
    }
    Keep(std::move(v));
    return true;
  } else if (op == "argmax" || op == "argmin") {
    if (a.dtype == v1::BOOL || !a.exact()) return false;
    v.dtype = v1::INT64;
    v.mag = static_cast<double>(n_max);
    v.integral = v.nonneg = true;
    name = absl::StrCat("aten.", op, ".default");
  } else {  // any / all
    if (!a.exact()) return false;
    v.dtype = v1::BOOL;
    v.mag = 1;
    v.integral = v.nonneg = true;
    name = absl::StrCat("aten.", op,
                        all && !keepdim && rng_.Chance(50)
                            ? ".default"
                            : (single ? ".dim" : ".dims"));
    if (name == "aten.any.default" || name == "aten.all.default")
      v.shape.clear();
    if (single && all && r != 1) return false;
  }
  if (IsFloatDType(v.dtype)) {
    if (!ErrOk(prop, v.dtype)) return false;
  } else if (prop > 0) {
    return false;
  }
  if (!MagOk(v.mag, v.dtype)) return false;
  v.err = exact ? 0
                : Inexact(prop, v.mag, v.dtype) +
                      (op == "sum" ? n_max * a.mag * std::ldexp(1.0, -22) : 0);
  v1::Node* n = Node(name, v.name);
  Ref(n, a.name);
  const bool drops_dims = absl::EndsWith(name, ".default") && op != "amax" &&
                          op != "amin" && op != "argmax" && op != "argmin";
  if (!drops_dims) {
    if (single && !all) {
      Int(n, Dim(first, r));
    } else if (single) {
      // argmax/argmin with dim=None (flattened); any.dim over rank 1.
      if (op == "argmax" || op == "argmin") {
        if (rng_.Chance(50) || keepdim) n->add_args()->mutable_none();
        if (!keepdim) v.shape.clear();
      } else {
        Int(n, Dim(0, r));
      }
    } else if (all && (op == "amax" || op == "amin") && rng_.Chance(50) &&
               !keepdim) {
      // dim defaults to [] (all).
    } else if (all && rng_.Chance(40)) {
      Ints(n, {});
    } else {
      std::vector<int64_t> dims;
      for (int d = 0; d < r; ++d) {
        if (reduced[d]) dims.push_back(Dim(d, r));
      }
      Ints(n, dims);
    }
    if (keepdim || rng_.Chance(30)) {
      if (n->args_size() == 1) {
        Bool(n, keepdim, "keepdim");
      } else {
        Bool(n, keepdim, rng_.Chance(50) ? "keepdim" : "");
      }
    }
  } else {
    v.shape.clear();
  }
  if (dtype_kw != v1::DTYPE_UNSPECIFIED) DTypeArg(n, dtype_kw, "dtype");
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::Composite(const OpValue& a) {
  if (!IsFloatDType(a.dtype)) return false;
  const int r = static_cast<int>(a.shape.size());
  if (rng_.Chance(60)) {
    const bool log = rng_.Chance(50);
    const int d = r == 0 ? 0 : rng_.Below(r);
    const bool h2f = a.dtype == v1::FLOAT16 && rng_.Chance(40);
    OpValue v = a;
    v.name = Fresh();
    v.dtype = h2f ? v1::FLOAT32 : a.dtype;
    const double n = r == 0 ? 1 : static_cast<double>(MaxSize(a.shape[d]));
    const double prop = 2 * a.err;
    v.mag = log ? 2 * a.mag + std::log(n) + 1 : 1;
    v.lo = 0;
    v.nonneg = !log;
    v.integral = false;
    if (!ErrOk(prop, v.dtype) || !MagOk(v.mag, v.dtype)) return false;
    v.err = Inexact(prop, v.mag, v.dtype);
    v1::Node* n2 = Node(
        log ? "aten._log_softmax.default" : "aten._softmax.default", v.name);
    Ref(n2, a.name);
    Int(n2, r == 0 ? (rng_.Chance(50) ? 0 : -1) : Dim(d, r));
    Bool(n2, h2f);
    Keep(std::move(v));
    return true;
  }
  // native_layer_norm over the last k dims.
  if (r == 0) return false;
  const int k = 1 + rng_.Below(std::min(r, 2));
  const GenShape norm(a.shape.end() - k, a.shape.end());
  for (const GenDim& d : norm) {
    if (IsCompound(d)) return false;
  }
  const double eps = rng_.Chance(50) ? 1e-5 : 1e-3;
  const double n = static_cast<double>(MaxNumel(norm));
  const double rs = 1 / std::sqrt(eps);
  auto affine = [&](double max_mag) -> const OpValue* {
    if (!rng_.Chance(60)) return nullptr;
    std::vector<const OpValue*> c;
    for (const OpValue& o : values_) {
      if (o.shape == norm && o.dtype == a.dtype && o.mag <= max_mag)
        c.push_back(&o);
    }
    if (!c.empty() && rng_.Chance(50))
      return c[rng_.Below(static_cast<int>(c.size()))];
    return NewInput(norm, a.dtype);
  };
  const OpValue* w = affine(4);
  const OpValue* b = affine(100);
  const double mw = w ? w->mag : 1, mb = b ? b->mag : 0;
  OpValue y = a, mean = a, rstd = a;
  y.name = Fresh();
  y.mag = std::sqrt(n) * mw + mb;
  const double prop =
      a.err * 2 * rs * mw + (w ? w->err * std::sqrt(n) : 0) + (b ? b->err : 0);
  if (!ErrOk(prop, a.dtype) || !MagOk(y.mag, a.dtype)) return false;
  // float32 math inside: the mean's rounding, amplified by rstd.
  y.err = Inexact(prop, y.mag, a.dtype) +
          std::ldexp(1.0, -20) * a.mag * rs * std::sqrt(n) * mw;
  y.lo = 0;
  y.nonneg = y.integral = false;
  GenShape stat(a.shape.begin(), a.shape.end() - k);
  stat.resize(a.shape.size(), GenDim{"", 1});
  mean.name = Fresh();
  mean.shape = stat;
  mean.dtype = v1::FLOAT32;
  mean.err = Inexact(a.err, a.mag, v1::FLOAT32);
  mean.lo = 0;
  mean.nonneg = mean.integral = false;
  rstd.name = Fresh();
  rstd.shape = stat;
  rstd.dtype = v1::FLOAT32;
  rstd.mag = rs;
  rstd.lo = 1 / std::sqrt(a.mag * a.mag + eps);
  rstd.nonneg = true;
  rstd.integral = false;
  rstd.err = Inexact(a.err * a.mag * std::pow(eps, -1.5), rs, v1::FLOAT32);
  v1::Node* node = Node("aten.native_layer_norm.default", y.name);
  node->add_outputs(mean.name);
  node->add_outputs(rstd.name);
  Ref(node, a.name);
  Sizes(node, norm);
  for (const OpValue* o : {w, b}) {
    if (o) {
      Ref(node, o->name);
    } else {
      node->add_args()->mutable_none();
    }
  }
  node->add_args()->set_f(eps);
  Keep(std::move(y));
  if (ErrOk(0, mean.dtype)) Keep(std::move(mean));
  Keep(std::move(rstd));
  return true;
}

// mm / addmm (a of rank 2) or bmm / baddbmm (rank 3) of a floating value
// with a new input B of k x n (read in place, sometimes through a transpose
// of an n x k input), and for the biased forms a bias broadcast to the
// product, with beta 0 (bias ignored), 1 or 0.5 and alpha 1 or 0.5.
inline bool OpSetGen::Matmul(const OpValue& a) {
  const int r = static_cast<int>(a.shape.size());
  if (!o_.extern_ops || !IsFloatDType(a.dtype) || (r != 2 && r != 3))
    return false;
  // New inputs take plain sizes only (not cat's compound ones).
  for (const GenDim& d : a.shape) {
    if (IsCompound(d)) return false;
  }
  const GenDim& k = a.shape[r - 1];
  const GenDim n =
      rng_.Chance(30) ? a.shape[r - 2] : GenDim{"", 1 + rng_.Below(7)};
  GenShape b_shape(a.shape.begin(), a.shape.end() - 2);
  b_shape.push_back(k);
  b_shape.push_back(n);
  const OpValue* b = nullptr;
  std::string b_name;
  if (rng_.Chance(40)) {
    // B as the transpose of an n x k input: read in place, column-major.
    GenShape t_shape = b_shape;
    std::swap(t_shape[r - 2], t_shape[r - 1]);
    const OpValue* t = NewInput(t_shape, a.dtype);
    b_name = Fresh();
    v1::Node* tn = Node("aten.transpose.int", b_name);
    Ref(tn, t->name);
    Int(tn, -1);
    Int(tn, -2);
    b = t;
  } else {
    b = NewInput(b_shape, a.dtype);
    b_name = b->name;
  }
  const bool biased = rng_.Chance(50);
  const double alpha = biased && rng_.Chance(30) ? 0.5 : 1;
  const double beta = !biased ? 0 : rng_.Pick(std::vector<double>{0, 0.5, 1});
  const OpValue* bias = nullptr;
  if (biased) {
    GenShape bias_shape = {n};
    if (rng_.Chance(40)) bias_shape.insert(bias_shape.begin(), a.shape[r - 2]);
    bias = NewInput(bias_shape, a.dtype);
  }
  OpValue v = a;
  v.name = Fresh();
  v.shape = b_shape;
  v.shape[r - 2] = a.shape[r - 2];
  const double kk = static_cast<double>(std::max<int64_t>(1, MaxSize(k)));
  const double bias_mag = bias ? std::fabs(beta) * bias->mag : 0;
  v.mag = std::fabs(alpha) * kk * a.mag * b->mag + bias_mag;
  // The operands' errors, then float32 accumulation (at most k roundings
  // of partial sums up to the product's magnitude) and the bias's.
  const double prop =
      std::fabs(alpha) * kk * (a.err * b->mag + b->err * a.mag) +
      kk * std::ldexp(1.0, -23) * v.mag +
      (bias ? std::fabs(beta) * bias->err : 0);
  if (!ErrOk(prop, a.dtype) || !MagOk(v.mag, a.dtype)) return false;
  v.err = Inexact(prop, v.mag, a.dtype);
  v.lo = 0;
  v.nonneg = v.integral = false;
  const char* op = r == 2
                       ? (biased ? "aten.addmm.default" : "aten.mm.default")
                       : (biased ? "aten.baddbmm.default" : "aten.bmm.default");
  v1::Node* node = Node(op, v.name);
  if (biased) Ref(node, bias->name);
  Ref(node, a.name);
  Ref(node, b_name);
  if (biased) {
    if (beta != 1) Scalar(node, Operand{nullptr, beta, 'f'}, "beta");
    if (alpha != 1) Scalar(node, Operand{nullptr, alpha, 'f'}, "alpha");
  }
  Keep(std::move(v));
  return true;
}

// convolution or convolution_backward over fresh float inputs of small
// static sizes: 1 to 3 spatial dims, stride, padding, dilation, groups,
// transposed with output_padding, a bias or none, and for the backward op
// an output_mask; all outputs returned.
inline bool OpSetGen::Conv() {
  if (!o_.extern_ops) return false;
  if (rng_.Chance(25)) return Attention();
  const std::vector<v1::DType> floats = FloatDTypes();
  if (floats.empty()) return false;
  const v1::DType dt = rng_.Pick(floats);
  const int dims = 1 + rng_.Below(3);
  const int64_t groups = 1 + rng_.Below(2);
  const bool transposed = rng_.Chance(30);
  const int64_t c = groups * (1 + rng_.Below(3));
  const int64_t o = groups * (1 + rng_.Below(3));
  std::vector<int64_t> in, kernel, stride, pad, dil, out_pad, out;
  for (int d = 0; d < dims; ++d) {
    kernel.push_back(1 + rng_.Below(dims == 3 ? 2 : 3));
    stride.push_back(1 + rng_.Below(2));
    dil.push_back(1 + rng_.Below(2));
    pad.push_back(rng_.Below(2));
    const int64_t span = dil[d] * (kernel[d] - 1);
    in.push_back(std::max<int64_t>(1, span + 1 - 2 * pad[d]) +
                 rng_.Below(dims == 3 ? 2 : 4));
    out_pad.push_back(transposed ? rng_.Below(static_cast<int>(
                                       std::max(stride[d], dil[d])))
                                 : 0);
    out.push_back(transposed ? (in[d] - 1) * stride[d] - 2 * pad[d] + span +
                                   out_pad[d] + 1
                             : (in[d] + 2 * pad[d] - span - 1) / stride[d] + 1);
    if (out.back() < 1) return false;
  }
  const int64_t n = 1 + rng_.Below(2);
  auto shape = [](std::vector<int64_t> head, const std::vector<int64_t>& s) {
    head.insert(head.end(), s.begin(), s.end());
    GenShape g;
    for (int64_t v : head) g.push_back(GenDim{"", v});
    return g;
  };
  const std::string x = NewInput(shape({n, c}, in), dt)->name;
  const std::string w =
      NewInput(shape(transposed ? std::vector<int64_t>{c, o / groups}
                                : std::vector<int64_t>{o, c / groups},
                     kernel),
               dt)
          ->name;
  const bool biased = rng_.Chance(50);
  const bool backward = rng_.Chance(40);
  v1::Node* node;
  if (backward) {
    const std::string gy = NewInput(shape({n, o}, out), dt)->name;
    node = Node("aten.convolution_backward.default", Fresh());
    for (int k = 1; k < 3; ++k) node->add_outputs(Fresh());
    Ref(node, gy);
    Ref(node, x);
    Ref(node, w);
    if (biased) {
      Ints(node, {o});
    } else {
      node->add_args()->mutable_none();
    }
  } else {
    const std::string b = biased ? NewInput(shape({o}, {}), dt)->name : "";
    node = Node("aten.convolution.default", Fresh());
    Ref(node, x);
    Ref(node, w);
    if (biased) {
      Ref(node, b);
    } else {
      node->add_args()->mutable_none();
    }
  }
  Ints(node, stride);
  Ints(node, pad);
  Ints(node, dil);
  Bool(node, transposed);
  Ints(node, out_pad);
  Int(node, groups);
  if (backward) {
    static const std::vector<int64_t> kMasks[] = {
        {1, 1, 1}, {1, 1, 0}, {0, 1, 1}, {1, 0, 0}};
    Ints(node, kMasks[rng_.Below(4)]);
  }
  for (const std::string& name : node->outputs()) sinks_.push_back(name);
  return true;
}

// kiln.attention over fresh inputs of small static sizes: causal or not,
// a scale, an additive bias of [B or 1, H or 1, L or 1, S] or none; in
// float32 half the time followed by kiln.attention_backward over the
// forward's out and lse (a half-precision backward's gradients sum what
// the dtype rounded, beyond the per-element tolerance: ops_attention_test
// checks them against the largest gradient). Where attention_dropout_, a
// float32 attention is kiln.attention_dropout half the time (float32:
// Kiln's kernels draw the reference's Philox mask on every target, where a
// library would draw its own), its backward taking the forward's rng.
inline bool OpSetGen::Attention() {
  const std::vector<v1::DType> floats = FloatDTypes();
  if (floats.empty()) return false;
  const v1::DType dt = rng_.Pick(floats);
  const int64_t b = 1 + rng_.Below(2), h = 1 + rng_.Below(3),
                l = 1 + rng_.Below(6), s = 1 + rng_.Below(6),
                e = 1 + rng_.Below(8), ev = 1 + rng_.Below(8);
  auto shape = [](std::initializer_list<int64_t> dims) {
    GenShape g;
    for (int64_t v : dims) g.push_back(GenDim{"", v});
    return g;
  };
  const std::string q = NewInput(shape({b, h, l, e}), dt)->name;
  const std::string k = NewInput(shape({b, h, s, e}), dt)->name;
  const std::string v = NewInput(shape({b, h, s, ev}), dt)->name;
  std::string bias;
  if (rng_.Chance(40)) {
    bias = NewInput(shape({rng_.Chance(50) ? b : 1, rng_.Chance(50) ? h : 1,
                           rng_.Chance(50) ? l : 1, s}),
                    dt)
               ->name;
  }
  const bool causal = rng_.Chance(50);
  const double scale = 0.25 + 0.25 * rng_.Below(4);
  auto add_bias = [&](v1::Node* n) {
    if (bias.empty()) {
      n->add_args()->mutable_none();
    } else {
      Ref(n, bias);
    }
  };
  const bool dropout =
      attention_dropout_ && dt == v1::FLOAT32 && rng_.Chance(50);
  const double p = dropout ? 0.2 * (1 + rng_.Below(4)) : 0.0;
  v1::Node* fwd = Node(
      dropout ? "kiln.attention_dropout.default" : "kiln.attention.default",
      Fresh());
  const std::string out = fwd->outputs(0), lse = Fresh();
  fwd->add_outputs(lse);
  const std::string pair = dropout ? Fresh() : "";
  if (dropout) fwd->add_outputs(pair);
  Ref(fwd, q);
  Ref(fwd, k);
  Ref(fwd, v);
  add_bias(fwd);
  Bool(fwd, causal);
  fwd->add_args()->set_f(scale);
  if (dropout) {
    fwd->add_args()->set_f(p);
    Seeded(fwd);
    sinks_.push_back(pair);
  }
  sinks_.push_back(out);
  sinks_.push_back(lse);
  if (dt != v1::FLOAT32 || rng_.Chance(50)) return true;
  const std::string grad_out = NewInput(shape({b, h, l, ev}), dt)->name;
  // With a bias, half the time the backward that gives its gradient.
  const bool bias_grad = !bias.empty() && rng_.Chance(50);
  const std::string backward = absl::StrCat(
      dropout ? "kiln.attention_dropout_backward" : "kiln.attention_backward",
      bias_grad ? "_dbias" : "", ".default");
  v1::Node* bwd = Node(backward, Fresh());
  for (int i = 0; i < (bias_grad ? 3 : 2); ++i) bwd->add_outputs(Fresh());
  Ref(bwd, grad_out);
  Ref(bwd, q);
  Ref(bwd, k);
  Ref(bwd, v);
  add_bias(bwd);
  Ref(bwd, out);
  Ref(bwd, lse);
  Bool(bwd, causal);
  bwd->add_args()->set_f(scale);
  if (dropout) {
    bwd->add_args()->set_f(p);
    Ref(bwd, pair);
  }
  for (const std::string& name : bwd->outputs()) sinks_.push_back(name);
  return true;
}

// The size of `shape`'s dims d in [from, to) multiplied, as a GenDim.
inline GenDim ProductDim(const GenShape& shape, size_t from, size_t to,
                         int64_t max_symbol) {
  int64_t p = 1, max = 1;
  std::vector<std::string> parts;
  for (size_t d = from; d < to; ++d) {
    const GenDim& g = shape[d];
    if (g.symbol.empty()) {
      p *= g.value;
      max *= g.value;
    } else {
      parts.push_back(g.symbol);
      max *= IsCompound(g) ? g.value : max_symbol;
    }
  }
  if (parts.empty()) return GenDim{"", p};
  if (parts.size() == 1 && p == 1 && !IsCompound(GenDim{parts[0], 0}))
    return GenDim{parts[0], 0};
  std::sort(parts.begin(), parts.end());
  std::string name = absl::StrJoin(parts, "*");
  if (p != 1) absl::StrAppend(&name, "*", p);
  return GenDim{name, max};
}

inline bool OpSetGen::View(const OpValue& a) {
  const int r = static_cast<int>(a.shape.size());
  OpValue v = a;
  v.name = Fresh();
  const int k = rng_.Below(11);
  v1::Node* n = nullptr;
  if (k <= 1) {
    // view / reshape / _unsafe_view: flatten, merge, split, add or drop 1s.
    GenShape out;
    const int how = rng_.Below(4);
    if (how == 0 || r == 0) {
      out = {ProductDim(a.shape, 0, r, o_.max_symbol_value)};
    } else if (how == 1) {
      if (r < 2) return false;
      const int i = rng_.Below(r - 1);
      out.assign(a.shape.begin(), a.shape.begin() + i);
      out.push_back(ProductDim(a.shape, i, i + 2, o_.max_symbol_value));
      out.insert(out.end(), a.shape.begin() + i + 2, a.shape.end());
    } else if (how == 2) {
      std::vector<int> splittable;
      for (int d = 0; d < r; ++d) {
        const int64_t s = a.shape[d].value;
        if (a.shape[d].symbol.empty() && s >= 4 && (s % 2 == 0 || s % 3 == 0))
          splittable.push_back(d);
      }
      if (splittable.empty()) return false;
      const int d = splittable[rng_.Below(static_cast<int>(splittable.size()))];
      const int64_t s = a.shape[d].value, f = s % 2 == 0 ? 2 : 3;
      out.assign(a.shape.begin(), a.shape.begin() + d);
      if (rng_.Chance(50)) {
        out.push_back(GenDim{"", f});
        out.push_back(GenDim{"", s / f});
      } else {
        out.push_back(GenDim{"", s / f});
        out.push_back(GenDim{"", f});
      }
      out.insert(out.end(), a.shape.begin() + d + 1, a.shape.end());
    } else {
      out = a.shape;
      std::vector<int> ones;
      for (int d = 0; d < r; ++d) {
        if (a.shape[d].IsOne()) ones.push_back(d);
      }
      if (!ones.empty() && rng_.Chance(50)) {
        out.erase(out.begin() +
                  ones[rng_.Below(static_cast<int>(ones.size()))]);
      } else {
        out.insert(out.begin() + rng_.Below(r + 1), GenDim{"", 1});
      }
    }
    // Spell it: compound sizes as -1 (at most one), maybe one static as -1.
    int infer = -1;
    for (size_t d = 0; d < out.size(); ++d) {
      if (IsCompound(out[d])) {
        if (infer >= 0) return false;
        infer = static_cast<int>(d);
      }
    }
    if (infer < 0 && !out.empty() && rng_.Chance(30)) {
      const int d = rng_.Below(static_cast<int>(out.size()));
      if (out[d].symbol.empty()) infer = d;
    }
    n = Node(rng_.Pick(std::vector<std::string>{"aten.view.default",
                                                "aten.reshape.default",
                                                "aten._unsafe_view.default"}),
             v.name);
    Ref(n, a.name);
    GenShape spelled = out;
    if (infer >= 0) spelled[infer] = GenDim{"", -1};
    Sizes(n, spelled);
    v.shape = out;
  } else if (k == 2) {
    std::vector<int> perm(r);
    for (int d = 0; d < r; ++d) perm[d] = d;
    for (int i = r - 1; i > 0; --i) std::swap(perm[i], perm[rng_.Below(i + 1)]);
    n = Node("aten.permute.default", v.name);
    Ref(n, a.name);
    std::vector<int64_t> dims;
    v.shape.clear();
    for (int p : perm) {
      dims.push_back(Dim(p, r));
      v.shape.push_back(a.shape[p]);
    }
    Ints(n, dims);
  } else if (k == 3) {
    if (r > 2 || rng_.Chance(50)) {
      const int d0 = r == 0 ? 0 : rng_.Below(r),
                d1 = r == 0 ? 0 : rng_.Below(r);
      n = Node("aten.transpose.int", v.name);
      Ref(n, a.name);
      Int(n, r == 0 ? 0 : Dim(d0, r));
      Int(n, r == 0 ? -1 : Dim(d1, r));
      if (r > 0) std::swap(v.shape[d0], v.shape[d1]);
    } else {
      n = Node("aten.t.default", v.name);
      Ref(n, a.name);
      std::reverse(v.shape.begin(), v.shape.end());
    }
  } else if (k == 4) {
    // expand: size-1 dims to sizes of the base shape, new leading dims.
    GenShape out;
    GenShape spelled;
    const int lead = r < 4 && rng_.Chance(40) ? 1 : 0;
    const int total = r + lead;
    for (int i = 0; i < total; ++i) {
      const int from_end = total - i;  // aligned with base_'s dims
      const GenDim* b = from_end <= static_cast<int>(base_.size())
                            ? &base_[base_.size() - from_end]
                            : nullptr;
      if (i < lead) {
        GenDim g = b && !b->IsOne() ? *b : GenDim{"", 3};
        out.push_back(g);
        spelled.push_back(g);
        continue;
      }
      const GenDim& have = a.shape[i - lead];
      if (have.IsOne() && rng_.Chance(70)) {
        GenDim g = b ? *b : GenDim{"", 2};
        out.push_back(g);
        spelled.push_back(g);
      } else {
        out.push_back(have);
        spelled.push_back(IsCompound(have) || rng_.Chance(40) ? GenDim{"", -1}
                                                              : have);
      }
    }
    if (out == a.shape && rng_.Chance(50)) return false;
    if (MaxNumel(out) > 4096) return false;
    n = Node("aten.expand.default", v.name);
    Ref(n, a.name);
    Sizes(n, spelled);
    if (rng_.Chance(20)) Bool(n, false, "implicit");
    v.shape = out;
  } else if (k == 5) {
    if (r >= 5) return false;
    const int d = rng_.Below(r + 1);
    n = Node("aten.unsqueeze.default", v.name);
    Ref(n, a.name);
    Int(n, rng_.Chance(40) ? d - r - 1 : d);
    v.shape.insert(v.shape.begin() + d, GenDim{"", 1});
  } else if (k == 6) {
    const int variant = rng_.Below(3);
    std::vector<bool> sel(r, variant == 0);
    if (variant == 0) {
      n = Node("aten.squeeze.default", v.name);
      Ref(n, a.name);
    } else if (variant == 1) {
      if (r == 0) return false;
      const int d = rng_.Below(r);
      sel[d] = true;
      n = Node("aten.squeeze.dim", v.name);
      Ref(n, a.name);
      Int(n, Dim(d, r));
    } else {
      std::vector<int64_t> dims;
      for (int d = 0; d < r; ++d) {
        if (rng_.Chance(50)) {
          sel[d] = true;
          dims.push_back(Dim(d, r));
        }
      }
      n = Node("aten.squeeze.dims", v.name);
      Ref(n, a.name);
      Ints(n, dims);
    }
    v.shape.clear();
    for (int d = 0; d < r; ++d) {
      if (!(sel[d] && a.shape[d].IsOne())) v.shape.push_back(a.shape[d]);
    }
  } else if (k == 7) {
    if (r == 0) return false;
    const int d = rng_.Below(r);
    const GenDim& dim = a.shape[d];
    if (IsCompound(dim)) return false;
    std::optional<int64_t> start, end;
    int64_t step = 1;
    if (!dim.symbol.empty()) {
      if (rng_.Chance(70)) start = rng_.Below(2);
      if (rng_.Chance(50)) end = std::numeric_limits<int64_t>::max();
      const int64_t s = start.value_or(0);
      v.shape[d] = s == 0 ? dim
                          : GenDim{absl::StrCat(dim.symbol, "-", s),
                                   o_.max_symbol_value - s};
    } else {
      const int64_t size = dim.value;
      step = rng_.Pick(std::vector<int64_t>{1, 1, 2, 3});
      if (rng_.Chance(70)) start = rng_.Below(2 * size + 1) - size;
      const int e = rng_.Below(4);
      if (e == 1) end = std::numeric_limits<int64_t>::max();
      if (e >= 2) end = rng_.Below(2 * size + 3) - size;
      // PyTorch's clamping of the bounds.
      int64_t s = start.value_or(0),
              en = end.value_or(std::numeric_limits<int64_t>::max());
      if (s < 0) s += size;
      if (en < 0) en += size;
      s = std::clamp<int64_t>(s, 0, size);
      en = std::clamp<int64_t>(en, s, size);
      const int64_t len = (en - s + step - 1) / step;
      if (len < 1) return false;
      v.shape[d] = GenDim{"", len};
    }
    n = Node("aten.slice.Tensor", v.name);
    Ref(n, a.name);
    const bool spell_all = step != 1 || rng_.Chance(40);
    if (d != 0 || start || end || spell_all || rng_.Chance(50))
      Int(n, Dim(d, r));
    if (start || end || spell_all) {
      if (start) {
        Int(n, *start);
      } else {
        n->add_args()->mutable_none();
      }
    }
    if (end || spell_all) {
      if (end) {
        Int(n, *end);
      } else {
        n->add_args()->mutable_none();
      }
    }
    if (spell_all) Int(n, step);
  } else if (k == 8) {
    if (r == 0) return false;
    const int d = rng_.Below(r);
    const GenDim& dim = a.shape[d];
    if (IsCompound(dim)) return false;
    const int64_t size = dim.symbol.empty() ? dim.value : 2;
    const int64_t index = rng_.Below(2 * size) - size;
    n = Node("aten.select.int", v.name);
    Ref(n, a.name);
    Int(n, Dim(d, r));
    Int(n, index);
    v.shape.erase(v.shape.begin() + d);
  } else {
    n = Node("aten.clone.default", v.name);
    Ref(n, a.name);
    if (rng_.Chance(20)) {
      n->add_args()->set_name("memory_format");
      n->mutable_args(n->args_size() - 1)->mutable_none();
    }
  }
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::Cat(const OpValue& a) {
  const int r = static_cast<int>(a.shape.size());
  if (r == 0) return false;
  const int d = rng_.Below(r);
  std::vector<const OpValue*> c;
  for (const OpValue& o : values_) {
    if (static_cast<int>(o.shape.size()) != r) continue;
    bool ok = true;
    for (int i = 0; i < r; ++i) ok &= i == d || o.shape[i] == a.shape[i];
    if (ok) c.push_back(&o);
  }
  std::vector<const OpValue*> pieces = {&a};
  const int extra = 1 + rng_.Below(2);
  for (int i = 0; i < extra; ++i) {
    pieces.push_back(c[rng_.Below(static_cast<int>(c.size()))]);
  }
  std::shuffle(pieces.begin(), pieces.end(), std::mt19937_64(rng_.Next()));
  OpValue v = a;
  v.name = Fresh();
  v1::DType dtype = pieces[0]->dtype;
  for (const OpValue* p : pieces) dtype = PromoteDTypes(dtype, p->dtype);
  v.dtype = dtype;
  int64_t static_sum = 0, max_sum = 0;
  bool dynamic = false;
  double prop = 0;
  for (const OpValue* p : pieces) {
    const GenDim& g = p->shape[d];
    dynamic |= !g.symbol.empty();
    static_sum += g.symbol.empty() ? g.value : 0;
    max_sum += MaxSize(g);
    if (IsFloatDType(dtype) && !IsFloatDType(p->dtype) &&
        p->mag > ExactIntLimit(dtype))
      return false;
    v.mag = std::max(v.mag, p->mag);
    v.lo = std::min(v.lo, p->lo);
    prop = std::max(prop, p->err);
    v.integral = v.integral && p->integral;
    v.nonneg = v.nonneg && p->nonneg;
  }
  if (!MagOk(v.mag, dtype) || !ErrOk(prop, dtype)) return false;
  v.err = prop;
  v.shape[d] = dynamic ? GenDim{absl::StrCat("cat#", v.name), max_sum}
                       : GenDim{"", static_sum};
  if (MaxNumel(v.shape) > 4096) return false;
  v1::Node* n = Node("aten.cat.default", v.name);
  v1::ValueList* list = n->add_args()->mutable_refs();
  for (const OpValue* p : pieces) list->add_values(p->name);
  if (d != 0 || rng_.Chance(50)) Int(n, Dim(d, r));
  Keep(std::move(v));
  return true;
}

// Issue 17 item 4: one norm, pooling or activation-backward op over fresh
// graph inputs (exact on both sides, so only the op's own float32 math
// differs from the reference), its outputs returned and not reused.
inline bool OpSetGen::NormPool() {
  const std::vector<v1::DType> floats = FloatDTypes();
  if (floats.empty()) return false;
  const v1::DType dt = rng_.Pick(floats);
  auto size = [this](int lo, int hi) {
    return GenDim{"", lo + rng_.Below(hi - lo + 1)};
  };
  auto in = [this](const GenShape& s, v1::DType d) {
    return NewInput(s, d)->name;
  };
  auto positive = [this](const GenShape& s, v1::DType d) {
    return MakePositive(*NewInput(s, d))->name;
  };
  auto none = [](v1::Node* n) { n->add_args()->mutable_none(); };
  auto mask = [this](v1::Node* n, bool all) {
    Ints(n,
         all ? std::vector<int64_t>{1, 1, 1} : std::vector<int64_t>{1, 0, 0});
  };
  // A node with `outputs` outputs, all returned.
  auto node = [this](const std::string& op, int outputs) {
    v1::Node* n = Node(op, Fresh());
    for (int o = 1; o < outputs; ++o) n->add_outputs(Fresh());
    for (const std::string& o : n->outputs()) sinks_.push_back(o);
    return n;
  };
  const int kind = rng_.Below(9);
  if (kind == 0) {
    const GenShape s = {size(1, 4), size(1, 6)};
    static const char* const kOps[] = {
        "aten.threshold_backward.default", "aten.gelu_backward.default",
        "aten.sigmoid_backward.default", "aten.tanh_backward.default",
        "aten.silu_backward.default"};
    const int k = rng_.Below(5);
    const std::string g = in(s, dt), x = in(s, dt);
    v1::Node* n = node(kOps[k], 1);
    Ref(n, g);
    Ref(n, x);
    if (k == 0) Scalar(n, Operand{nullptr, 0.25, 'f'});
    if (k == 1 && rng_.Chance(50)) Str(n, "tanh", "approximate");
    return true;
  }
  if (kind == 1) {
    const GenShape s = {size(1, 4), size(1, 7)};
    const std::string g = in(s, dt), y = in(s, dt);
    v1::Node* n =
        node(rng_.Chance(50) ? "aten._softmax_backward_data.default"
                             : "aten._log_softmax_backward_data.default",
             1);
    Ref(n, g);
    Ref(n, y);
    Int(n, rng_.Below(2) - 1);  // -1 or 0
    DTypeArg(n, dt);
    return true;
  }
  if (kind == 2) {
    const GenShape s = {size(1, 3), size(1, 4), size(1, 5)};
    const int k = 1 + rng_.Below(2);
    const GenShape norm(s.end() - k, s.end());
    GenShape stat(s.begin(), s.end() - k);
    stat.resize(3, GenDim{"", 1});
    const bool affine = rng_.Chance(50);
    const std::string g = in(s, dt), x = in(s, dt),
                      mean = in(stat, v1::FLOAT32),
                      rstd = positive(stat, v1::FLOAT32);
    const std::string w = affine ? in(norm, dt) : "",
                      b = affine ? in(norm, dt) : "";
    v1::Node* n = node("aten.native_layer_norm_backward.default", 3);
    Ref(n, g);
    Ref(n, x);
    Sizes(n, norm);
    Ref(n, mean);
    Ref(n, rstd);
    for (const std::string& p : {w, b}) {
      if (affine) {
        Ref(n, p);
      } else {
        none(n);
      }
    }
    mask(n, affine);
    return true;
  }
  // [N, C, L] with N * L >= 2.
  const GenDim c = size(1, 4);
  const GenShape s = {size(1, 3), c, size(2, 4)};
  const GenShape ch = {c};
  const bool affine = rng_.Chance(60);
  const std::string w = affine ? in(ch, dt) : "", b = affine ? in(ch, dt) : "";
  auto affine_args = [&](v1::Node* n) {
    for (const std::string& p : {w, b}) {
      if (affine) {
        Ref(n, p);
      } else {
        none(n);
      }
    }
  };
  if (kind == 3) {
    const std::string x = in(s, dt), rm = in(ch, v1::FLOAT32),
                      rv = positive(ch, v1::FLOAT32);
    const int variant = rng_.Below(3);
    if (variant == 2) {
      v1::Node* n = node("aten._native_batch_norm_legit.no_stats", 3);
      Ref(n, x);
      affine_args(n);
      Bool(n, true);
      n->add_args()->set_f(0.1);
      n->add_args()->set_f(1e-5);
      return true;
    }
    v1::Node* n =
        node(variant == 0 ? "aten._native_batch_norm_legit_functional.default"
                          : "aten._native_batch_norm_legit_no_training.default",
             variant == 0 ? 5 : 3);
    Ref(n, x);
    affine_args(n);
    Ref(n, rm);
    Ref(n, rv);
    if (variant == 0) Bool(n, rng_.Chance(80));
    n->add_args()->set_f(0.1);
    n->add_args()->set_f(1e-5);
    return true;
  }
  if (kind == 4) {
    const std::string g = in(s, dt), x = in(s, dt), rm = in(ch, v1::FLOAT32),
                      rv = positive(ch, v1::FLOAT32), sm = in(ch, v1::FLOAT32),
                      si = positive(ch, v1::FLOAT32);
    v1::Node* n = node("aten.native_batch_norm_backward.default", 3);
    Ref(n, g);
    Ref(n, x);
    if (affine) {
      Ref(n, w);
    } else {
      none(n);
    }
    Ref(n, rm);
    Ref(n, rv);
    Ref(n, sm);
    Ref(n, si);
    Bool(n, rng_.Chance(70));
    n->add_args()->set_f(1e-5);
    mask(n, true);
    return true;
  }
  if (kind == 5) {
    // group norm: C = group * cg.
    const int64_t group = 1 + rng_.Below(3), cg = 1 + rng_.Below(2);
    const int64_t nn = 1 + rng_.Below(2), h = 1 + rng_.Below(3),
                  ww = 2 + rng_.Below(2);
    const GenShape gs = {GenDim{"", nn}, GenDim{"", group * cg}, GenDim{"", h},
                         GenDim{"", ww}};
    const GenShape gc = {GenDim{"", group * cg}};
    const std::string x = in(gs, dt);
    const std::string gw = affine ? in(gc, dt) : "",
                      gb = affine ? in(gc, dt) : "";
    auto tail = [&](v1::Node* n) {
      Int(n, nn);
      Int(n, group * cg);
      Int(n, h * ww);
      Int(n, group);
    };
    if (rng_.Chance(50)) {
      v1::Node* n = node("aten.native_group_norm.default", 3);
      Ref(n, x);
      for (const std::string& p : {gw, gb}) {
        if (affine) {
          Ref(n, p);
        } else {
          none(n);
        }
      }
      tail(n);
      n->add_args()->set_f(1e-5);
      return true;
    }
    const GenShape stat = {GenDim{"", nn}, GenDim{"", group}};
    const std::string g = in(gs, dt), mean = in(stat, dt),
                      rstd = positive(stat, dt);
    v1::Node* n = node("aten.native_group_norm_backward.default", 3);
    Ref(n, g);
    Ref(n, x);
    Ref(n, mean);
    Ref(n, rstd);
    if (affine) {
      Ref(n, gw);
    } else {
      none(n);
    }
    tail(n);
    mask(n, affine);
    return true;
  }
  // Pooling over [N?, C, H, W] with static H, W >= 3.
  GenShape ps = {size(1, 2), GenDim{"", 3 + rng_.Below(3)},
                 GenDim{"", 3 + rng_.Below(3)}};
  if (rng_.Chance(50)) ps.insert(ps.begin(), size(1, 2));
  const int64_t h = ps[ps.size() - 2].value, wd = ps.back().value;
  const std::string x = in(ps, dt);
  const bool ceil = rng_.Chance(30);
  auto pooled = [&](int64_t k, int64_t st, int64_t pad, int64_t dil) {
    GenShape o(ps.begin(), ps.end() - 2);
    for (int64_t n : {h, wd}) {
      int64_t num = n + 2 * pad - dil * (k - 1) - 1 + (ceil ? st - 1 : 0);
      int64_t out = num / st + 1;
      if (ceil && (out - 1) * st >= n + pad) --out;
      o.push_back(GenDim{"", out});
    }
    return o;
  };
  if (kind == 6) {
    const int64_t k = 2 + rng_.Below(2), st = 1 + rng_.Below(2),
                  pad = rng_.Below(2), dil = 1 + rng_.Below(k == 2 ? 2 : 1);
    {
      v1::Node* n = node("aten.max_pool2d_with_indices.default", 2);
      Ref(n, x);
      Ints(n, {k, k});
      Ints(n, {st, st});
      Ints(n, {pad, pad});
      Ints(n, {dil, dil});
      Bool(n, ceil);
      const std::string ind = n->outputs(1);
      v1::Node* b = node("aten.max_pool2d_with_indices_backward.default", 1);
      Ref(b, in(pooled(k, st, pad, dil), dt));
      Ref(b, x);
      Ints(b, {k, k});
      Ints(b, {st, st});
      Ints(b, {pad, pad});
      Ints(b, {dil, dil});
      Bool(b, ceil);
      Ref(b, ind);
      return true;
    }
  }
  if (kind == 7) {
    const int64_t k = 2 + rng_.Below(2), st = 1 + rng_.Below(2),
                  pad = rng_.Below(2);
    const bool cip = rng_.Chance(50);
    if (rng_.Chance(50)) {
      v1::Node* n = node("aten.avg_pool2d.default", 1);
      Ref(n, x);
      Ints(n, {k, k});
      Ints(n, {st, st});
      Ints(n, {pad, pad});
      Bool(n, ceil);
      Bool(n, cip);
      return true;
    }
    v1::Node* n = node("aten.avg_pool2d_backward.default", 1);
    Ref(n, in(pooled(k, st, pad, 1), dt));
    Ref(n, x);
    Ints(n, {k, k});
    Ints(n, {st, st});
    Ints(n, {pad, pad});
    Bool(n, ceil);
    Bool(n, cip);
    none(n);
    return true;
  }
  const int64_t oh = 1 + rng_.Below(static_cast<int>(h)),
                ow = 1 + rng_.Below(static_cast<int>(wd));
  if (rng_.Chance(50)) {
    v1::Node* n = node("aten._adaptive_avg_pool2d.default", 1);
    Ref(n, x);
    Ints(n, {oh, ow});
    return true;
  }
  GenShape gs(ps.begin(), ps.end() - 2);
  gs.push_back(GenDim{"", oh});
  gs.push_back(GenDim{"", ow});
  v1::Node* n = node("aten._adaptive_avg_pool2d_backward.default", 1);
  Ref(n, in(gs, dt));
  Ref(n, x);
  return true;
}

inline void OpSetGen::Seeded(v1::Node* n) {
  if (seed_.empty()) {
    v1::Input* in = g_.add_inputs();
    seed_ = absl::StrCat("x", g_.inputs_size() - 1);
    in->set_name(seed_);
    in->mutable_meta()->set_dtype(v1::INT64);
    in->mutable_meta()->set_device(v1::CPU);
  }
  v1::Argument* a = n->add_args();
  a->set_name("seed");
  a->set_ref(seed_);
  Int(n, streams_++, "offset");
}

inline bool OpSetGen::Sort(const OpValue& a) {
  const int r = static_cast<int>(a.shape.size());
  const int d = r == 0 ? 0 : rng_.Below(r);
  if (r > 0 && (!a.shape[d].symbol.empty() || IsCompound(a.shape[d])))
    return false;
  const int64_t n = r == 0 ? 1 : a.shape[d].value;
  const int kind = rng_.Below(3);  // sort, sort.stable, topk
  if (kind == 2 && a.dtype == v1::BOOL) return false;
  const bool descending = rng_.Chance(50);
  // Sorted values are a's elements (the k-th smallest moves by at most
  // a's err); the indices are exact only when a is (equal values then
  // tie the same way on both sides).
  OpValue values = a;
  values.name = Fresh();
  OpValue indices;
  indices.name = Fresh();
  indices.dtype = v1::INT64;
  indices.mag = static_cast<double>(std::max<int64_t>(n - 1, 0));
  indices.integral = indices.nonneg = true;
  int64_t k = n;
  v1::Node* node = nullptr;
  if (kind == 2) {
    // k >= 1: the other families do not take empty values (k = 0 is in
    // ops_sort_test.cc).
    if (n == 0) return false;
    k = 1 + rng_.Below(static_cast<int>(n));
    if (r > 0) values.shape[d] = GenDim{"", k};
    node = Node("aten.topk.default", values.name);
    Ref(node, a.name);
    Int(node, k);
    // dim, largest, sorted given or not (dim must be given unless it is
    // the last).
    int args = rng_.Below(4);
    if (d + 1 < r) args = std::max(args, 1);
    if (args >= 1 || !descending) Int(node, Dim(d, std::max(r, 1)));
    if (args >= 2 || !descending) Bool(node, descending);
    if (args >= 3) Bool(node, rng_.Chance(50));
  } else if (kind == 1) {
    node = Node("aten.sort.stable", values.name);
    Ref(node, a.name);
    if (rng_.Chance(70)) Bool(node, rng_.Chance(50), "stable");
    Int(node, Dim(d, std::max(r, 1)), "dim");
    if (descending || rng_.Chance(50)) Bool(node, descending, "descending");
  } else {
    node = Node("aten.sort.default", values.name);
    Ref(node, a.name);
    if (descending || rng_.Chance(50)) {
      Int(node, Dim(d, std::max(r, 1)));
      Bool(node, descending);
    } else if (d + 1 != r && r > 0) {
      Int(node, Dim(d, r));
    } else if (rng_.Chance(50)) {
      Int(node, -1);
    }
  }
  node->add_outputs(indices.name);
  indices.shape = values.shape;
  const bool exact = a.exact();
  Keep(values);
  if (!exact) return true;
  const OpValue* kept = Keep(indices);
  // topk's backward as AOTAutograd writes it: the values scattered into
  // zeros of a's shape (distinct indices per row: no two sources collide).
  bool static_shape = r > 0 && k > 0;
  for (const GenDim& g : a.shape)
    static_shape = static_shape && g.symbol.empty() && !IsCompound(g);
  if (kind == 2 && static_shape && rng_.Chance(40)) {
    OpValue grad = values;
    grad.name = Fresh();
    grad.shape = a.shape;
    grad.lo = 0;
    grad.nonneg = values.nonneg;
    v1::Node* z = Node("aten.full.default", Fresh());
    const std::string zeros = z->outputs(0);
    Sizes(z, a.shape);
    Int(z, 0);
    DTypeArg(z, a.dtype, "dtype");
    v1::Node* s = Node("aten.scatter.src", grad.name);
    Ref(s, zeros);
    Int(s, Dim(d, r));
    Ref(s, kept->name);
    Ref(s, values.name);
    Keep(std::move(grad));
  }
  return true;
}

inline bool OpSetGen::Random(const OpValue& a) {
  const int k = rng_.Below(7);
  const bool fa = IsFloatDType(a.dtype);
  OpValue v;
  v.name = Fresh();
  v.shape = a.shape;
  v.dtype = fa ? a.dtype : v1::FLOAT32;
  if (k <= 1) {
    // rand / randn over a's sizes (a DimList when dynamic), or rand_like /
    // randn_like of a float a; dtype given or not.
    // A size list cannot spell a compound size (cat's): then *_like only.
    bool compound = false;
    for (const GenDim& g : a.shape) compound |= IsCompound(g);
    if (compound && !fa) return false;
    const bool like = fa && (compound || rng_.Chance(50));
    const bool normal = k == 1;
    v1::Node* n = Node(absl::StrCat(normal ? "aten.randn" : "aten.rand",
                                    like ? "_like" : "", ".default"),
                       v.name);
    if (like) {
      Ref(n, a.name);
    } else {
      Sizes(n, a.shape);
      v.dtype = v1::FLOAT32;
    }
    if (rng_.Chance(50)) {
      v.dtype = rng_.Pick(std::vector<v1::DType>{v1::FLOAT32, v1::FLOAT16,
                                                 v1::BFLOAT16});
      DTypeArg(n, v.dtype, "dtype");
    }
    Seeded(n);
    // Uniforms are exact on both sides; normals differ by the kernels'
    // float32 log/cos (a few float32 ulps of |z| <= 5.8).
    v.mag = normal ? 6 : 1;
    v.nonneg = !normal;
    v.err = normal ? Inexact(8 * UlpOf(v1::FLOAT32) * 6, 6, v.dtype) : 0;
    Keep(std::move(v));
    return true;
  }
  if (k == 2) {
    // bernoulli.p of any a: 0/1 in a's dtype.
    v.dtype = a.dtype;
    v1::Node* n = Node("aten.bernoulli.p", v.name);
    Ref(n, a.name);
    if (rng_.Chance(70)) {
      Scalar(n, Operand{nullptr,
                        rng_.Pick(std::vector<double>{0.0, 0.3, 0.5, 1.0}),
                        'f'});
    }
    Seeded(n);
    v.mag = 1;
    v.integral = v.nonneg = true;
    Keep(std::move(v));
    return true;
  }
  if (k == 3) {
    // bernoulli.default over exact probabilities: a rand_like of a float a.
    if (!fa) return false;
    const std::string p = Fresh();
    v1::Node* n = Node("aten.rand_like.default", p);
    Ref(n, a.name);
    Seeded(n);
    n = Node("aten.bernoulli.default", v.name);
    Ref(n, p);
    Seeded(n);
    v.mag = 1;
    v.integral = v.nonneg = true;
    Keep(std::move(v));
    return true;
  }
  if (!fa) return false;
  const double p = rng_.Pick(std::vector<double>{0.1, 0.5, 0.25});
  const double scale = 1 / (1 - p);
  if (k <= 5) {
    // native_dropout: (a * mask * scale, mask); train true, None or false.
    const int train = rng_.Below(4);  // 0, 1: true; 2: None; 3: false
    const bool drops = train < 3;
    v.mag = a.mag * (drops ? scale : 1);
    v.err = drops && !a.exact() ? Inexact(a.err * scale, v.mag, a.dtype)
                                : a.err;
    v.lo = 0;
    v.nonneg = a.nonneg;
    if (!MagOk(v.mag, v.dtype) || !ErrOk(v.err, v.dtype)) return false;
    const std::string mask = Fresh();
    v1::Node* n = Node("aten.native_dropout.default", v.name);
    n->add_outputs(mask);
    Ref(n, a.name);
    Scalar(n, Operand{nullptr, p, 'f'});
    if (train == 2) {
      n->add_args()->mutable_none();
    } else {
      Bool(n, train < 2);
    }
    Seeded(n);
    Keep(std::move(v));
    OpValue m;
    m.name = mask;
    m.shape = a.shape;
    m.dtype = v1::BOOL;
    m.mag = 1;
    m.integral = m.nonneg = true;
    Keep(std::move(m));
    return true;
  }
  // native_dropout_backward(a, mask, scale) with a mask from a bool value
  // of the pool of a's shape, else a new bool input.
  v.mag = a.mag * scale;
  v.err = a.exact() ? 0 : Inexact(a.err * scale, v.mag, a.dtype);
  v.nonneg = a.nonneg;
  if (!MagOk(v.mag, v.dtype) || !ErrOk(v.err, v.dtype)) return false;
  const OpValue* mask = nullptr;
  for (const OpValue& c : values_) {
    if (c.dtype == v1::BOOL && c.exact() && c.shape == a.shape) mask = &c;
  }
  if (mask == nullptr) {
    // A new input cannot have a compound size (cat's).
    for (const GenDim& g : a.shape) {
      if (IsCompound(g)) return false;
    }
    mask = NewInput(a.shape, v1::BOOL);
  }
  v1::Node* n = Node("aten.native_dropout_backward.default", v.name);
  Ref(n, a.name);
  Ref(n, mask->name);
  Scalar(n, Operand{nullptr, scale, 'f'});
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::Creation() {
  const int k = rng_.Below(3);
  OpValue v;
  v.name = Fresh();
  if (k == 2) {
    // arange over a size of the base shape, so that it broadcasts.
    std::vector<int64_t> sizes;
    for (const GenDim& g : base_) {
      if (g.symbol.empty() && g.value > 1) sizes.push_back(g.value);
    }
    const int64_t len = sizes.empty() ? 1 + rng_.Below(8) : rng_.Pick(sizes);
    const int variant = rng_.Below(3);
    Operand start{nullptr, 0, 'i'}, step{nullptr, 1, 'i'};
    if (variant >= 1)
      start =
          rng_.Chance(60)
              ? Operand{nullptr, static_cast<double>(rng_.Below(5) - 2), 'i'}
              : Operand{nullptr, -1.5, 'f'};
    if (variant == 2)
      step =
          rng_.Chance(50)
              ? Operand{nullptr, rng_.Pick(std::vector<double>{1, 2, -1}), 'i'}
              : Operand{nullptr,
                        rng_.Pick(std::vector<double>{0.5, 0.25, -0.5}), 'f'};
    const double end_value =
        start.scalar + static_cast<double>(len) * step.scalar;
    const bool float_end = start.kind == 'f' || step.kind == 'f';
    Operand end{nullptr, end_value, float_end ? 'f' : 'i'};
    v1::DType dtype =
        start.kind == 'f' || step.kind == 'f' ? v1::FLOAT32 : v1::INT64;
    const bool explicit_dtype = rng_.Chance(40);
    if (explicit_dtype) {
      dtype = rng_.Pick(o_.dtypes);
      if (dtype == v1::BOOL) return false;
    }
    v.shape = {GenDim{"", len}};
    v.dtype = dtype;
    const double last =
        start.scalar + static_cast<double>(len - 1) * step.scalar;
    v.mag = std::max(std::fabs(start.scalar), std::fabs(last)) + 1;
    v.integral = !float_end || !IsFloatDType(dtype);
    v.nonneg = start.scalar >= 0 && last >= 0;
    static const char* kNames[] = {"aten.arange.default", "aten.arange.start",
                                   "aten.arange.start_step"};
    v1::Node* n = Node(kNames[variant], v.name);
    if (variant >= 1) Scalar(n, start);
    Scalar(n, end);
    if (variant == 2) Scalar(n, step);
    if (explicit_dtype) DTypeArg(n, dtype, "dtype");
    Keep(std::move(v));
    return true;
  }
  Operand fill =
      RandomScalar(rng_.Chance(50) ? 'f' : (rng_.Chance(70) ? 'i' : 'b'));
  v1::DType dtype = fill.kind == 'f'   ? v1::FLOAT32
                    : fill.kind == 'i' ? v1::INT64
                                       : v1::BOOL;
  if (k == 1) dtype = v1::FLOAT32;  // scalar_tensor's default
  const bool explicit_dtype = rng_.Chance(50);
  if (explicit_dtype) dtype = rng_.Pick(o_.dtypes);
  v.dtype = dtype;
  double value = fill.scalar;
  if (!IsFloatDType(dtype))
    value = dtype == v1::BOOL ? (value != 0) : std::trunc(value);
  v.mag = std::fabs(value);
  v.lo = std::fabs(value);
  v.integral = value == std::floor(value);
  v.nonneg = value >= 0;
  if (k == 0) {
    for (const GenDim& g : base_) {
      if (rng_.Chance(70))
        v.shape.push_back(rng_.Chance(20) ? GenDim{"", 1} : g);
    }
    for (const GenDim& g : v.shape) {
      if (IsCompound(g)) return false;
    }
    v1::Node* n = Node("aten.full.default", v.name);
    Sizes(n, v.shape);
    Scalar(n, fill);
    if (explicit_dtype) DTypeArg(n, dtype, "dtype");
  } else {
    v1::Node* n = Node("aten.scalar_tensor.default", v.name);
    Scalar(n, fill);
    if (explicit_dtype) DTypeArg(n, dtype, "dtype");
  }
  Keep(std::move(v));
  return true;
}

inline bool OpSetGen::AliasCopyOrLike(const OpValue& a) {
  const int k = rng_.Below(16);
  if (k == 15) {
    // repeat: each dim repeated 1-2 times, maybe one new leading dim.
    for (const GenDim& g : a.shape) {
      if (IsCompound(g)) return false;
    }
    OpValue v = a;
    v.name = Fresh();
    std::vector<int64_t> repeats;
    v.shape.clear();
    if (a.shape.empty() || rng_.Chance(30)) {
      repeats.push_back(1 + rng_.Below(2));
      v.shape.push_back(GenDim{"", repeats.back()});
    }
    for (const GenDim& g : a.shape) {
      const int64_t r = g.symbol.empty() && rng_.Chance(40) ? 2 : 1;
      repeats.push_back(r);
      v.shape.push_back(r == 1 ? g : GenDim{"", g.value * r});
    }
    v1::Node* n = Node("aten.repeat.default", v.name);
    Ref(n, a.name);
    Ints(n, repeats);
    Keep(std::move(v));
    return true;
  }
  if (k >= 13) {
    // as_strided / as_strided_scatter of a (static sizes): a view of a's
    // row-major elements of rank 1 to 3, strides nested innermost first
    // with gaps, its dims in a random order; as_strided may also repeat
    // elements (stride 0, or a stride below the inner span).
    int64_t numel = 1;
    for (const GenDim& g : a.shape) {
      if (!g.symbol.empty() || IsCompound(g)) return false;
      numel *= g.value;
    }
    if (numel == 0) return false;
    const bool scatter = k == 14;
    const int rank = 1 + rng_.Below(3);
    std::vector<int64_t> sizes(rank), strides(rank);
    int64_t stride = 1 + rng_.Below(2), extent = 1;
    for (int d = rank; d-- > 0;) {
      sizes[d] = 1 + rng_.Below(4);
      strides[d] = stride;
      if (!scatter && rng_.Chance(15)) strides[d] = rng_.Below(stride + 1);
      extent += (sizes[d] - 1) * strides[d];
      stride = std::max(stride, strides[d]) * sizes[d] + rng_.Below(2);
    }
    if (extent > numel) return false;
    for (int d = rank - 1; d > 0; --d) {  // a random dim order
      const int e = rng_.Below(d + 1);
      std::swap(sizes[d], sizes[e]);
      std::swap(strides[d], strides[e]);
    }
    const int64_t offset = rng_.Below(numel - extent + 1);
    OpValue v = a;
    v.name = Fresh();
    v1::Node* n = Node(
        scatter ? "aten.as_strided_scatter.default" : "aten.as_strided.default",
        v.name);
    Ref(n, a.name);
    if (scatter) {
      GenShape src_shape;
      for (int64_t s : sizes) src_shape.push_back(GenDim{"", s});
      const OpValue* src = NewInput(src_shape, a.dtype);
      Ref(n, src->name);
      v.mag = std::max(a.mag, src->mag);
      v.err = std::max(a.err, src->err);
      v.lo = std::min(a.lo, src->lo);
      v.integral = a.integral && src->integral;
      v.nonneg = a.nonneg && src->nonneg;
    } else {
      v.shape.clear();
      for (int64_t s : sizes) v.shape.push_back(GenDim{"", s});
    }
    Ints(n, sizes);
    Ints(n, strides);
    if (offset != 0 || rng_.Chance(50))
      Int(n, offset, rng_.Chance(30) ? "storage_offset" : "");
    Keep(std::move(v));
    return true;
  }
  if (k >= 11) {
    // slice_scatter / select_scatter of a new input into a along a static
    // dim: values of a and of the input, no arithmetic.
    const int r = static_cast<int>(a.shape.size());
    if (r == 0) return false;
    for (const GenDim& g : a.shape) {
      if (IsCompound(g)) return false;
    }
    const int d = rng_.Below(r);
    const GenDim& dim = a.shape[d];
    if (!dim.symbol.empty() || dim.value == 0) return false;
    const int64_t size = dim.value;
    GenShape src_shape = a.shape;
    OpValue v = a;
    v.name = Fresh();
    const OpValue* src = nullptr;
    if (k == 11) {
      const int64_t start = rng_.Below(size), step = 1 + rng_.Below(2);
      const int64_t end = start + 1 + rng_.Below(size - start);
      src_shape[d] = GenDim{"", (end - start + step - 1) / step};
      src = NewInput(src_shape, a.dtype);
      v1::Node* n = Node("aten.slice_scatter.default", v.name);
      Ref(n, a.name);
      Ref(n, src->name);
      Int(n, Dim(d, r));
      Int(n, start);
      Int(n, end);
      Int(n, step);
    } else {
      const int64_t index = rng_.Below(size) - (rng_.Chance(30) ? size : 0);
      src_shape.erase(src_shape.begin() + d);
      src = NewInput(src_shape, a.dtype);
      v1::Node* n = Node("aten.select_scatter.default", v.name);
      Ref(n, a.name);
      Ref(n, src->name);
      Int(n, Dim(d, r));
      Int(n, index);
    }
    v.mag = std::max(a.mag, src->mag);
    v.err = std::max(a.err, src->err);
    v.lo = std::min(a.lo, src->lo);
    v.integral = a.integral && src->integral;
    v.nonneg = a.nonneg && src->nonneg;
    Keep(std::move(v));
    return true;
  }
  if (k >= 8) {
    // split.Tensor, split_with_sizes, unbind.int along a static dim: one
    // output per piece, each a view of a (same stats).
    const int r = static_cast<int>(a.shape.size());
    if (r == 0) return false;
    const int d = rng_.Below(r);
    const GenDim& dim = a.shape[d];
    if (!dim.symbol.empty() || IsCompound(dim)) return false;
    const int64_t size = dim.value;
    std::vector<int64_t> pieces;
    v1::Node* n;
    if (k == 8) {
      const int64_t split = 1 + rng_.Below(size);
      for (int64_t at = 0; at < size; at += split)
        pieces.push_back(std::min(split, size - at));
      n = Node("aten.split.Tensor", Fresh());
      Ref(n, a.name);
      Int(n, split);
    } else if (k == 9) {
      for (int64_t left = size; left > 0;) {
        const int64_t p = 1 + rng_.Below(left);
        pieces.push_back(p);
        left -= p;
      }
      n = Node("aten.split_with_sizes.default", Fresh());
      Ref(n, a.name);
      Ints(n, pieces);
    } else {
      if (size > 8) return false;
      pieces.assign(size, 1);
      n = Node("aten.unbind.int", Fresh());
      Ref(n, a.name);
    }
    if (d != 0 || rng_.Chance(50))
      Int(n, Dim(d, r), rng_.Chance(30) ? "dim" : "");
    for (size_t o = 0; o < pieces.size(); ++o) {
      OpValue v = a;
      v.name = o == 0 ? n->outputs(0) : Fresh();
      if (o > 0) n->add_outputs(v.name);
      if (k == 10) {
        v.shape.erase(v.shape.begin() + d);
      } else {
        v.shape[d] = GenDim{"", pieces[o]};
      }
      Keep(std::move(v));
    }
    return true;
  }
  OpValue v = a;
  v.name = Fresh();
  if (k == 0) {
    v1::Node* n = Node(
        rng_.Chance(25) ? "aten.lift_fresh_copy.default" : "aten.alias.default",
        v.name);
    Ref(n, a.name);
    Keep(std::move(v));
    return true;
  }
  if (k == 1) {
    // copy(self=a, src=b): b broadcasts to a's shape; the result is b's
    // values in a's dtype (Cast's conditions).
    std::vector<const OpValue*> srcs;
    for (const OpValue& b : values_) {
      if (b.shape.size() > a.shape.size()) continue;
      const size_t lead = a.shape.size() - b.shape.size();
      bool fits = true;
      for (size_t d = 0; d < b.shape.size(); ++d) {
        fits &= b.shape[d].IsOne() || b.shape[d] == a.shape[lead + d];
      }
      if (fits) srcs.push_back(&b);
    }
    const OpValue& b = *srcs[rng_.Below(srcs.size())];
    const v1::DType to = a.dtype;
    v = b;
    v.name = Fresh();
    v.shape = a.shape;
    v.dtype = to;
    if (!CastStats(b, to, v)) return false;
    v1::Node* n = Node("aten.copy.default", v.name);
    Ref(n, a.name);
    Ref(n, b.name);
    if (rng_.Chance(20)) Bool(n, false, "non_blocking");
    Keep(std::move(v));
    return true;
  }
  // Factories: a's shape (the *_like ops) or a sub-shape of the base shape
  // (empty, empty_strided); zeros for the empty ops.
  double value = k == 4 ? 1 : 0;
  Operand fill;
  if (k == 2) {
    fill = RandomScalar(rng_.Chance(50) ? 'f' : (rng_.Chance(70) ? 'i' : 'b'));
    value = fill.scalar;
  }
  v1::DType dtype = k >= 6 ? v1::FLOAT32 : a.dtype;
  const bool explicit_dtype = rng_.Chance(50);
  if (explicit_dtype) dtype = rng_.Pick(o_.dtypes);
  v.dtype = dtype;
  if (!IsFloatDType(dtype))
    value = dtype == v1::BOOL ? (value != 0) : std::trunc(value);
  v.mag = std::fabs(value);
  v.lo = std::fabs(value);
  v.err = 0;
  v.integral = value == std::floor(value);
  v.nonneg = value >= 0;
  static const char* kNames[] = {
      "aten.full_like.default",   "aten.zeros_like.default",
      "aten.ones_like.default",   "aten.empty_like.default",
      "aten.empty.memory_format", "aten.empty_strided.default"};
  v1::Node* n;
  if (k < 6) {
    n = Node(kNames[k - 2], v.name);
    Ref(n, a.name);
    if (k == 2) Scalar(n, fill);
  } else {
    v.shape.clear();
    for (const GenDim& g : base_) {
      if (rng_.Chance(70))
        v.shape.push_back(rng_.Chance(20) ? GenDim{"", 1} : g);
    }
    for (const GenDim& g : v.shape) {
      if (IsCompound(g)) return false;
    }
    n = Node(kNames[k - 2], v.name);
    Sizes(n, v.shape);
    if (k == 7) {
      std::vector<int64_t> strides(v.shape.size());
      int64_t stride = 1;
      for (size_t d = v.shape.size(); d-- > 0;) {
        strides[d] = stride;
        stride *= MaxSize(v.shape[d]);
      }
      Ints(n, strides);
    }
  }
  if (explicit_dtype) DTypeArg(n, dtype, "dtype");
  if (k != 7 && rng_.Chance(20)) {
    n->add_args()->set_name("memory_format");
    n->mutable_args(n->args_size() - 1)->mutable_none();
  }
  Keep(std::move(v));
  return true;
}

inline Operand OpSetGen::ScalarFor(v1::DType dtype) {
  return RandomScalar(IsFloatDType(dtype) ? 'f'
                      : dtype == v1::BOOL ? 'b'
                                          : 'i');
}

inline const OpValue* OpSetGen::IndexValues(const GenShape& shape, int64_t n,
                                            bool negative) {
  const OpValue* x =
      NewInput(shape, rng_.Chance(50) ? v1::INT64 : v1::INT32);
  OpValue r = *x;
  r.name = Fresh();
  r.mag = static_cast<double>(n - 1);
  r.nonneg = true;
  v1::Node* node = Node("aten.remainder.Scalar", r.name);
  Ref(node, x->name);
  Int(node, n);
  const OpValue* idx = Keep(std::move(r));
  if (!negative || rng_.Chance(50)) return idx;
  OpValue m = *idx;
  m.name = Fresh();
  m.mag = static_cast<double>(n);
  m.nonneg = false;
  node = Node("aten.sub.Scalar", m.name);
  Ref(node, idx->name);
  Int(node, n);
  return Keep(std::move(m));
}

inline bool OpSetGen::GatherScatter(const OpValue& a) {
  const int r = static_cast<int>(a.shape.size());
  for (const GenDim& d : a.shape) {
    if (!d.symbol.empty() || IsCompound(d) || d.value == 0) return false;
  }
  auto size = [&](int d) { return a.shape[d].value; };
  auto small = [&]() { return GenDim{"", 1 + rng_.Below(4)}; };
  const bool fp = IsFloatDType(a.dtype);
  const double ulp = UlpOf(a.dtype);
  // Stats of a copy of elements of a and of `o` (a scalar or tensor).
  auto merged = [&](const Operand& o) {
    OpValue v = a;
    v.name = Fresh();
    v.mag = std::max(a.mag, o.mag());
    v.lo = 0;
    v.err = std::max(a.err, o.err());
    v.integral = a.integral && o.integral();
    v.nonneg = a.nonneg && o.nonneg();
    return v;
  };
  // Stats of sums of up to k terms of magnitude `mag` (err `err` each) in
  // dtype d, accumulated in float32 and rounded once.
  auto summed = [&](OpValue& v, double k, double mag, double err) {
    // As Reduction's sums: propagated error, one rounding, and the float32
    // accumulator's.
    v.mag = mag;
    v.lo = 0;
    if (!IsFloatDType(v.dtype)) {
      v.err = 0;
      return v.mag <= 1e9;
    }
    if (!ErrOk(k * err, v.dtype) || !MagOk(v.mag, v.dtype)) return false;
    v.err = Inexact(k * err, mag, v.dtype) + mag * std::ldexp(1.0, -22);
    return true;
  };
  int k = rng_.Below(16);
  // The losses need a float32 [N, C]: take them more often when it is one.
  if (r == 2 && a.dtype == v1::FLOAT32 && rng_.Chance(30))
    k = 7 + rng_.Below(2);
  if (k == 0) {  // embedding
    if (r != 2) return false;
    GenShape is;
    for (int i = rng_.Below(3); i > 0; --i) is.push_back(small());
    const OpValue* idx = IndexValues(is, size(0), true);
    OpValue v = a;
    v.name = Fresh();
    v.shape = is;
    v.shape.push_back(a.shape[1]);
    v1::Node* n = Node("aten.embedding.default", v.name);
    Ref(n, a.name);
    Ref(n, idx->name);
    if (rng_.Chance(30)) Int(n, -1);
    Keep(std::move(v));
    return true;
  }
  if (k == 1 || k == 2) {  // index_select, gather
    if (r == 0) return false;
    const int d = rng_.Below(r);
    OpValue v = a;
    v.name = Fresh();
    GenShape is;
    if (k == 1) {
      if (rng_.Chance(80)) is.push_back(small());
      v.shape[d] = is.empty() ? GenDim{"", 1} : is[0];
    } else {
      for (int i = 0; i < r; ++i)
        is.push_back(i == d ? small()
                            : GenDim{"", 1 + rng_.Below(static_cast<int>(size(i)))});
      v.shape = is;
    }
    const OpValue* idx = IndexValues(is, size(d), true);
    v1::Node* n = Node(k == 1 ? "aten.index_select.default"
                              : "aten.gather.default",
                       v.name);
    Ref(n, a.name);
    Int(n, Dim(d, r));
    Ref(n, idx->name);
    Keep(std::move(v));
    return true;
  }
  if (k == 3 || k == 13) {  // index.Tensor, index_put
    if (r == 0) return false;
    const int count = 1 + rng_.Below(std::min(r, 2));
    const GenDim m = small();
    std::vector<const OpValue*> idx;
    GenShape b = {m};
    for (int j = 0; j < count; ++j) {
      GenShape is = {m};
      if (count == 2 && j == 0 && rng_.Chance(50)) {
        is = {m, GenDim{"", 1}};
        b = {m, m};
      }
      idx.push_back(IndexValues(is, size(j), true));
    }
    GenShape indexed = b;
    indexed.insert(indexed.end(), a.shape.begin() + count, a.shape.end());
    if (MaxNumel(indexed) > 4096) return false;
    if (k == 3) {
      OpValue v = a;
      v.name = Fresh();
      v.shape = indexed;
      v1::Node* n = Node("aten.index.Tensor", v.name);
      Ref(n, a.name);
      v1::ValueList* list = n->add_args()->mutable_refs();
      for (const OpValue* t : idx) list->add_values(t->name);
      Keep(std::move(v));
      return true;
    }
    if (a.dtype == v1::BOOL) return false;
    const OpValue* vals =
        NewInput(rng_.Chance(20) ? GenShape{} : indexed, a.dtype);
    const bool accumulate = rng_.Chance(50);
    Operand o;
    o.tensor = vals;
    OpValue v = merged(o);
    if (accumulate &&
        !summed(v, static_cast<double>(MaxNumel(b)),
                a.mag + static_cast<double>(MaxNumel(b)) * vals->mag,
                std::max(a.err, vals->err)))
      return false;
    v1::Node* n = Node("aten.index_put.default", v.name);
    Ref(n, a.name);
    v1::ValueList* list = n->add_args()->mutable_refs();
    for (const OpValue* t : idx) list->add_values(t->name);
    Ref(n, vals->name);
    if (accumulate || rng_.Chance(50)) Bool(n, accumulate);
    Keep(std::move(v));
    return true;
  }
  if (k == 4 || k == 5 || k == 6) {  // masked_fill, constant_pad_nd
    Operand c = ScalarFor(a.dtype);
    if (k == 5) c.tensor = NewInput({}, a.dtype);
    OpValue v = merged(c);
    if (k != 6) {
      const OpValue* mask = NewInput(a.shape, v1::BOOL);
      v1::Node* n = Node(k == 4 ? "aten.masked_fill.Scalar"
                                : "aten.masked_fill.Tensor",
                         v.name);
      Ref(n, a.name);
      Ref(n, mask->name);
      Arg(n, c);
      Keep(std::move(v));
      return true;
    }
    if (r == 0) return false;
    std::vector<int64_t> pad;
    const int dims = 1 + rng_.Below(r);
    for (int i = 0; i < dims; ++i) {
      const int d = r - 1 - i;
      int64_t before = rng_.Below(4) - 1, after = rng_.Below(4) - 1;
      if (size(d) + before + after < 1) before = after = 0;
      pad.push_back(before);
      pad.push_back(after);
      v.shape[d] = GenDim{"", size(d) + before + after};
    }
    if (MaxNumel(v.shape) > 4096) return false;
    v1::Node* n = Node("aten.constant_pad_nd.default", v.name);
    Ref(n, a.name);
    Ints(n, pad);
    if (rng_.Chance(70)) Scalar(n, c);
    Keep(std::move(v));
    return true;
  }
  if (k == 7 || k == 8) {  // nll_loss_forward / backward over a [N, C]
    if (r != 2 || a.dtype != v1::FLOAT32) return false;
    const int64_t batch = size(0), classes = size(1);
    const OpValue* target = IndexValues({a.shape[0]}, classes, false);
    const int reduction = rng_.Below(3);
    const OpValue* weight =
        reduction != 1 && rng_.Chance(30) ? NewInput({a.shape[1]}, v1::FLOAT32)
                                          : nullptr;
    const double wmag = weight ? weight->mag : 1;
    const int ignore = rng_.Chance(50) ? -100 : rng_.Below(static_cast<int>(classes));
    OpValue v = a;
    v.name = Fresh();
    v.integral = v.nonneg = false;
    if (k == 7) {
      v.shape = reduction == 0 ? GenShape{a.shape[0]} : GenShape{};
      const double terms = reduction == 0 ? 1 : static_cast<double>(batch);
      if (!summed(v, terms, terms * a.mag * wmag, a.err * wmag)) return false;
      if (reduction == 1) {
        // Mean over the non-ignored samples (at least one unless all are).
        if (ignore != -100) return false;
        v.mag = a.mag;
        v.err = v.err / static_cast<double>(batch) + 2 * ulp * a.mag;
      }
      OpValue tw = v;
      tw.name = Fresh();
      tw.shape = {};
      if (!summed(tw, static_cast<double>(batch),
                  static_cast<double>(batch) * wmag, 0))
        return false;
      v1::Node* n = Node("aten.nll_loss_forward.default", v.name);
      n->add_outputs(tw.name);
      Ref(n, a.name);
      Ref(n, target->name);
      if (weight) {
        Ref(n, weight->name);
      } else {
        n->add_args()->mutable_none();
      }
      Int(n, reduction);
      Int(n, ignore);
      Keep(std::move(v));
      Keep(std::move(tw));
      return true;
    }
    const OpValue* grad =
        NewInput(reduction == 0 ? GenShape{a.shape[0]} : GenShape{},
                 v1::FLOAT32);
    const OpValue* total = NewInput({}, v1::FLOAT32);
    if (reduction == 1) total = MakePositive(*total);
    if (!total || total->dtype != v1::FLOAT32) return false;
    v.mag = grad->mag * wmag / (reduction == 1 ? total->lo : 1);
    v.lo = 0;
    v.err = 3 * ulp * v.mag;
    if (!MagOk(v.mag, v.dtype) || !ErrOk(v.err, v.dtype)) return false;
    v1::Node* n = Node("aten.nll_loss_backward.default", v.name);
    Ref(n, grad->name);
    Ref(n, a.name);
    Ref(n, target->name);
    if (weight) {
      Ref(n, weight->name);
    } else {
      n->add_args()->mutable_none();
    }
    Int(n, reduction);
    Int(n, ignore);
    Ref(n, total->name);
    Keep(std::move(v));
    return true;
  }
  if (k == 9) {  // embedding_dense_backward of a grad [..., D]
    if (r < 1 || !fp) return false;
    const GenShape is(a.shape.begin(), a.shape.end() - 1);
    const int64_t num = 1 + rng_.Below(6);
    const OpValue* idx = IndexValues(is, num, false);
    const double t = static_cast<double>(MaxNumel(is));
    OpValue v = a;
    v.name = Fresh();
    v.shape = {GenDim{"", num}, a.shape.back()};
    v.integral = v.nonneg = false;
    const bool scale = rng_.Chance(30);
    if (!summed(v, t, t * a.mag, a.err)) return false;
    if (scale) v.err += 2 * ulp * v.mag;
    v1::Node* n = Node("aten.embedding_dense_backward.default", v.name);
    Ref(n, a.name);
    Ref(n, idx->name);
    Int(n, num);
    Int(n, rng_.Chance(50) ? -1 : rng_.Below(static_cast<int>(num)));
    Bool(n, scale);
    Keep(std::move(v));
    return true;
  }
  if (k >= 10 && k <= 12) {  // scatter_add, scatter.src, scatter.value
    if (r == 0 || a.dtype == v1::BOOL) return false;
    const int d = rng_.Below(r);
    GenShape is;
    for (int i = 0; i < r; ++i)
      is.push_back(i == d ? small() : GenDim{"", 1 + rng_.Below(static_cast<int>(size(i)))});
    const OpValue* idx = IndexValues(is, size(d), true);
    Operand src = ScalarFor(a.dtype);
    if (k != 12) src.tensor = NewInput(is, a.dtype);
    OpValue v = merged(src);
    if (k == 10) {
      const double hits = static_cast<double>(is[d].value);
      if (!summed(v, hits, a.mag + hits * src.mag(),
                  std::max(a.err, src.err())))
        return false;
    }
    v1::Node* n = Node(k == 10   ? "aten.scatter_add.default"
                       : k == 11 ? "aten.scatter.src"
                                 : "aten.scatter.value",
                       v.name);
    Ref(n, a.name);
    Int(n, Dim(d, r));
    Ref(n, idx->name);
    Arg(n, src);
    Keep(std::move(v));
    return true;
  }
  if (k == 15) {  // flip: a view (same stats)
    std::vector<int64_t> dims;
    for (int d = 0; d < r; ++d) {
      if (rng_.Chance(50)) dims.push_back(Dim(d, r));
    }
    OpValue v = a;
    v.name = Fresh();
    v1::Node* n = Node("aten.flip.default", v.name);
    Ref(n, a.name);
    Ints(n, dims);
    Keep(std::move(v));
    return true;
  }
  // cumsum: ints and bools sum in int64.
  if (r == 0) return false;
  const int d = rng_.Below(r);
  OpValue v = a;
  v.name = Fresh();
  v.dtype = fp ? a.dtype : v1::INT64;
  const double n = static_cast<double>(size(d));
  if (!summed(v, n, n * a.mag, a.err)) return false;
  v.integral = a.integral;
  v.nonneg = a.nonneg;
  v1::Node* node = Node("aten.cumsum.default", v.name);
  Ref(node, a.name);
  Int(node, Dim(d, r));
  Keep(std::move(v));
  return true;
}

inline v1::Graph OpSetGen::Build() {
  // The shape inputs broadcast to: small, so that the reference evaluator
  // stays fast; now and then one long dim for vector loops and their tails.
  const int rank =
      rng_.Chance(5) ? 0 : 1 + rng_.Below(std::max(1, o_.max_rank));
  int symbols = 0;
  for (int attempt = 0; attempt < 20; ++attempt) {
    base_.clear();
    symbols = 0;
    g_.clear_symbols();
    for (int d = 0; d < rank; ++d) {
      GenDim dim;
      if (symbols < o_.max_symbols && rng_.Chance(30)) {
        dim.symbol = absl::StrCat("s", symbols++);
        v1::Symbol* s = g_.add_symbols();
        s->set_name(dim.symbol);
        if (rng_.Chance(25)) s->set_max_value(64 + rng_.Below(1000));
        if (rng_.Chance(20))
          s->set_multiple_of(rng_.Pick(std::vector<int64_t>{2, 4, 8}));
      } else if (rank <= 2 && rng_.Chance(10)) {
        dim.value = rng_.Pick(std::vector<int64_t>{17, 33, 67, 130});
      } else {
        dim.value = rng_.Pick(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 16});
      }
      base_.push_back(dim);
    }
    if (MaxNumel(base_) <= 512) break;
  }
  if (MaxNumel(base_) > 512) base_.assign(rank, GenDim{"", 2});
  const int num_inputs = 1 + rng_.Below(std::max(1, o_.max_inputs));
  for (int i = 0; i < num_inputs; ++i) {
    GenShape shape = base_;
    if (rng_.Chance(20) && rank > 0)
      shape.erase(shape.begin(), shape.begin() + rng_.Below(rank));
    for (GenDim& d : shape) {
      if (rng_.Chance(15)) d = GenDim{"", 1};
    }
    NewInput(shape, rng_.Pick(o_.dtypes));
  }
  // A symbol no input has would be unbound: declare only the used ones.
  {
    std::set<std::string> used;
    for (const v1::Input& in : g_.inputs()) {
      for (const v1::Dim& d : in.meta().sizes()) {
        if (d.kind_case() == v1::Dim::kSymbol) used.insert(d.symbol());
      }
    }
    auto* syms = g_.mutable_symbols();
    for (int i = syms->size() - 1; i >= 0; --i) {
      if (!used.count(syms->Get(i).name())) {
        // Drop the symbol from base_ too: sizes built from it later would
        // be unbound.
        for (GenDim& d : base_) {
          if (d.symbol == syms->Get(i).name()) d = GenDim{"", 2};
        }
        syms->DeleteSubrange(i, 1);
      }
    }
  }

  const int target = 1 + rng_.Below(std::max(1, o_.max_nodes));
  // 19: Conv (from first_conv_seed), 20: Random (from first_random_seed),
  // 21: Sort (from first_sort_seed).
  static const int kWeights[] = {12, 7,  4, 20, 6, 5,  5,  5, 7,  7,  12,
                                 4,  14, 3, 3,  6, 14, 6, 12, 8, 14, 8};
  // The families after the first 15 (AliasCopyOrLike, NormPool, Matmul,
  // GatherScatter) only where issue17_ (seeds from first_issue17_seed on),
  // and the last (Conv) only where conv_ (seeds from first_conv_seed on),
  // so that earlier seeds keep their graphs.
  // Families a seed does not draw weigh 0 (the draws of the others are the
  // same as when those families did not exist): 15..18 before
  // first_issue17_seed, Conv and Random outside their ranges.
  int weights[std::size(kWeights)];
  std::copy(std::begin(kWeights), std::end(kWeights), weights);
  if (!issue17_) std::fill(weights + 15, weights + 19, 0);
  if (!conv_) weights[19] = 0;
  if (!random_) weights[20] = 0;
  if (!sort_) weights[21] = 0;
  int total_weight = 0;
  for (int w : weights) total_weight += w;
  std::vector<std::string> produced;
  for (int attempt = 0; attempt < 40 * target && op_count_ < target;
       ++attempt) {
    // Mostly extend a recent value, so that chains get deep.
    const OpValue& a =
        rng_.Chance(50) ? values_[values_.size() - 1 -
                                  rng_.Below(std::min<int>(3, values_.size()))]
                        : Pick();
    int w = rng_.Below(total_weight), family = 0;
    while (w >= weights[family]) w -= weights[family++];
    const size_t before = values_.size();
    bool ok = false;
    switch (family) {
      case 0:
        ok = FloatUnary(a);
        break;
      case 1:
        ok = KeepUnary(a);
        break;
      case 2:
        ok = LogicalUnary(a);
        break;
      case 3:
        ok = Arithmetic(a);
        break;
      case 4:
        ok = Compare(a);
        break;
      case 5:
        ok = Bitwise(a);
        break;
      case 6:
        ok = Where(a);
        break;
      case 7:
        ok = Clamp(a);
        break;
      case 8:
        ok = Cast(a);
        break;
      case 9:
        ok = Activation(a);
        break;
      case 10:
        ok = Reduction(a);
        break;
      case 11:
        ok = Composite(a);
        break;
      case 12:
        ok = View(a);
        break;
      case 13:
        ok = Cat(a);
        break;
      case 15:
        ok = AliasCopyOrLike(a);
        break;
      case 16:
        ok = NormPool();
        break;
      case 17:
        ok = Matmul(a);
        break;
      case 18:
        ok = GatherScatter(a);
        break;
      case 19:
        ok = Conv();
        break;
      case 20:
        ok = Random(a);
        break;
      case 21:
        ok = Sort(a);
        break;
      default:
        ok = Creation();
        break;
    }
    (void)ok;
    for (size_t i = before; i < values_.size(); ++i) {
      if (values_[i].name[0] == 'v') produced.push_back(values_[i].name);
    }
  }
  produced.insert(produced.begin(), sinks_.begin(), sinks_.end());
  if (produced.empty()) {
    v1::Node* n = Node("aten.clone.default", "v_clone");
    Ref(n, values_.front().name);
    produced.push_back("v_clone");
  }
  // Every node output that nothing reads is returned (so nothing is dead
  // code), plus the last value.
  std::set<std::string> read;
  for (const v1::Node& n : g_.nodes()) {
    for (const v1::Argument& arg : n.args()) {
      if (arg.kind_case() == v1::Argument::kRef) read.insert(arg.ref());
      if (arg.kind_case() == v1::Argument::kRefs) {
        for (const std::string& r : arg.refs().values()) read.insert(r);
      }
    }
  }
  for (const std::string& p : produced) {
    if (!read.count(p) || p == produced.back()) g_.add_outputs(p);
  }
  return std::move(g_);
}

// A random valid graph over all of op set v1 (see OpSetGen).
inline v1::Graph RandomOpSetGraph(uint64_t seed,
                                  const GraphGenOptions& options) {
  return OpSetGen(seed, options).Build();
}

}  // namespace internal

// A random valid graph. The same seed and options give the same graph.
inline v1::Graph RandomGraph(uint64_t seed,
                             const GraphGenOptions& options = {}) {
  using internal::Category;
  using internal::GenDim;
  using internal::GenShape;
  using internal::GenValue;
  if (options.full_op_set) return internal::RandomOpSetGraph(seed, options);
  internal::Rng rng(seed);
  v1::Graph g;

  // The full shape every input broadcasts to. Static sizes are distinct so a
  // test can change one size everywhere by value.
  const int rank = 1 + rng.Below(std::max(1, options.max_rank));
  std::vector<int64_t> statics = {2, 3, 4, 5, 6, 7, 8, 16};
  GenShape base;
  int symbols = 0;
  for (int d = 0; d < rank; ++d) {
    GenDim dim;
    if (symbols < options.max_symbols && rng.Chance(35)) {
      dim.symbol = absl::StrCat("s", symbols++);
      v1::Symbol* s = g.add_symbols();
      s->set_name(dim.symbol);
      if (rng.Chance(25)) s->set_max_value(64 + rng.Below(1000));
      if (rng.Chance(25))
        s->set_multiple_of(rng.Pick(std::vector<int64_t>{2, 4, 8}));
    } else {
      const int i = rng.Below(static_cast<int>(statics.size()));
      dim.value = statics[i];
      statics.erase(statics.begin() + i);
    }
    base.push_back(dim);
  }

  std::vector<GenValue> values;
  const int num_inputs = 1 + rng.Below(std::max(1, options.max_inputs));
  for (int i = 0; i < num_inputs; ++i) {
    GenShape shape = base;
    // Broadcasting inputs: leading dims dropped, some dims of size 1.
    if (rng.Chance(20))
      shape.erase(shape.begin(), shape.begin() + rng.Below(rank));
    for (GenDim& d : shape) {
      if (rng.Chance(15)) d = GenDim{"", 1};
    }
    const v1::DType dtype = rng.Pick(options.dtypes);
    v1::Input* in = g.add_inputs();
    in->set_name(absl::StrCat("x", i));
    v1::TensorMeta* meta = in->mutable_meta();
    meta->set_dtype(dtype);
    internal::AddDims(meta, shape);
    if (rng.Chance(30)) internal::AddContiguousStrides(meta, shape);
    meta->set_alignment(rng.Pick(std::vector<int64_t>{0, 4, 16, 64}));
    meta->set_storage_offset(rng.Below(4));
    meta->set_device(v1::CPU);
    values.push_back({in->name(), shape, internal::CategoryOf(dtype)});
  }

  // Ops valid for every dtype category (bool and ints promote to float).
  const std::vector<std::string> floating_unary = {
      "aten.sin.default", "aten.cos.default", "aten.exp.default",
      "aten.sigmoid.default", "aten.tanh.default"};
  // Ops valid for ints and floats, keeping the dtype.
  const std::vector<std::string> numeric_unary = {
      "aten.relu.default", "aten.neg.default", "aten.abs.default"};
  const std::vector<double> scalars = {0.5, 2.0, -1.25, 0.1, 3.0, 1e-3};

  const int num_nodes = 1 + rng.Below(std::max(1, options.max_nodes));
  for (int k = 0; k < num_nodes; ++k) {
    const std::string out = absl::StrCat("v", k);
    const GenValue& a = rng.Pick(values);
    const int kind = rng.Below(100);
    GenValue result{out, a.shape, a.category};
    if (kind < 40) {
      const bool numeric = a.category != Category::kBool && rng.Chance(40);
      v1::Node* n = internal::AddNode(
          &g, numeric ? rng.Pick(numeric_unary) : rng.Pick(floating_unary),
          out);
      internal::AddRef(n, a.name);
      if (!numeric) result.category = Category::kFloat;
    } else if (kind < 65) {
      // A tensor operand that broadcasts with `a`, if there is one.
      std::vector<int> partners;
      GenShape shape;
      for (int j = 0; j < static_cast<int>(values.size()); ++j) {
        if (internal::Broadcast(a.shape, values[j].shape, &shape)) {
          partners.push_back(j);
        }
      }
      const GenValue& b = values[rng.Pick(partners)];  // `a` itself qualifies
      internal::Broadcast(a.shape, b.shape, &result.shape);
      result.category = std::max(a.category, b.category);
      // sub is not defined for bool.
      std::vector<std::string> ops = {"aten.add.Tensor", "aten.mul.Tensor"};
      if (a.category != Category::kBool && b.category != Category::kBool) {
        ops.push_back("aten.sub.Tensor");
      }
      v1::Node* n = internal::AddNode(&g, rng.Pick(ops), out);
      internal::AddRef(n, a.name);
      internal::AddRef(n, b.name);
    } else if (kind < 85 || !options.reductions || a.shape.empty()) {
      std::vector<std::string> ops = {"aten.add.Tensor", "aten.mul.Tensor"};
      if (a.category != Category::kBool) ops.push_back("aten.sub.Tensor");
      v1::Node* n = internal::AddNode(&g, rng.Pick(ops), out);
      internal::AddRef(n, a.name);
      n->add_args()->set_f(rng.Pick(scalars));
      result.category = Category::kFloat;
    } else {
      const int r = static_cast<int>(a.shape.size());
      std::vector<int64_t> dims;
      for (int d = 0; d < r; ++d) {
        if (rng.Chance(50)) dims.push_back(d);
      }
      if (dims.empty()) dims.push_back(rng.Below(r));
      const bool keepdim = rng.Chance(50);
      std::vector<std::string> ops = {"aten.sum.dim_IntList"};
      if (a.category == Category::kFloat) ops.push_back("aten.mean.dim");
      if (a.category != Category::kBool) ops.push_back("aten.amax.default");
      const std::string op = rng.Pick(ops);
      v1::Node* n = internal::AddNode(&g, op, out);
      internal::AddRef(n, a.name);
      v1::IntList* list = n->add_args()->mutable_ints();
      // Dims are spelled negative half the time, as FX graphs often do.
      for (int64_t d : dims) list->add_values(rng.Chance(50) ? d - r : d);
      if (keepdim || rng.Chance(50)) {
        v1::Argument* kd = n->add_args();
        kd->set_name("keepdim");
        kd->set_b(keepdim);
      }
      GenShape shape;
      for (int d = 0; d < r; ++d) {
        const bool reduced =
            std::find(dims.begin(), dims.end(), d) != dims.end();
        if (!reduced) {
          shape.push_back(a.shape[d]);
        } else if (keepdim) {
          shape.push_back(GenDim{"", 1});
        }
      }
      result.shape = shape;
      if (op == "aten.sum.dim_IntList" && a.category == Category::kBool) {
        result.category = Category::kInt;
      }
    }
    values.push_back(std::move(result));
  }

  // The last value, and sometimes one or two other node outputs.
  g.add_outputs(values.back().name);
  for (int extra = rng.Below(3); extra > 0; --extra) {
    const std::string& name = values[num_inputs + rng.Below(num_nodes)].name;
    if (std::find(g.outputs().begin(), g.outputs().end(), name) ==
        g.outputs().end()) {
      g.add_outputs(name);
    }
  }
  return g;
}

// Visits every value name a node reads.
template <typename F>
void ForEachRef(v1::Node* node, F f) {
  for (v1::Argument& a : *node->mutable_args()) {
    if (a.kind_case() == v1::Argument::kRef) f(a.mutable_ref());
    if (a.kind_case() == v1::Argument::kRefs) {
      for (std::string& r : *a.mutable_refs()->mutable_values()) f(&r);
    }
  }
}

// The same graph with its nodes in a random topological order.
inline v1::Graph ShuffleNodes(const v1::Graph& graph, uint64_t seed) {
  internal::Rng rng(seed);
  const int n = graph.nodes_size();
  absl::flat_hash_map<std::string, int> producer;
  for (int i = 0; i < n; ++i) {
    for (const std::string& o : graph.nodes(i).outputs()) producer[o] = i;
  }
  std::vector<int> indegree(n, 0);
  std::vector<std::vector<int>> users(n);
  for (int i = 0; i < n; ++i) {
    v1::Node copy = graph.nodes(i);
    ForEachRef(&copy, [&](std::string* r) {
      auto it = producer.find(*r);
      if (it != producer.end()) {
        ++indegree[i];
        users[it->second].push_back(i);
      }
    });
  }
  std::vector<int> ready;
  for (int i = 0; i < n; ++i) {
    if (indegree[i] == 0) ready.push_back(i);
  }
  v1::Graph out = graph;
  out.clear_nodes();
  while (!ready.empty()) {
    const int k = rng.Below(static_cast<int>(ready.size()));
    const int i = ready[k];
    ready.erase(ready.begin() + k);
    *out.add_nodes() = graph.nodes(i);
    for (int u : users[i]) {
      if (--indegree[u] == 0) ready.push_back(u);
    }
  }
  return out;
}

// `name` after renaming; names the rename does not know (an invalid graph,
// as a fuzzer makes) stay as they are.
inline std::string Renamed(
    const absl::flat_hash_map<std::string, std::string>& rename,
    const std::string& name) {
  auto it = rename.find(name);
  return it == rename.end() ? name : it->second;
}

// The same graph with every value (inputs and node outputs) renamed.
inline v1::Graph RenameValues(const v1::Graph& graph, uint64_t seed) {
  internal::Rng rng(seed);
  absl::flat_hash_map<std::string, std::string> rename;
  auto fresh = [&](const std::string& old) {
    std::string name =
        absl::StrCat("val_", rng.Next() % 1000000, "_", rename.size());
    rename[old] = name;
    return name;
  };
  v1::Graph out = graph;
  for (v1::Input& in : *out.mutable_inputs()) in.set_name(fresh(in.name()));
  for (v1::Node& node : *out.mutable_nodes()) {
    ForEachRef(&node, [&](std::string* r) { *r = Renamed(rename, *r); });
    for (std::string& o : *node.mutable_outputs()) o = fresh(o);
  }
  for (std::string& o : *out.mutable_outputs()) o = Renamed(rename, o);
  return out;
}

// The same graph with every symbol renamed and the declarations shuffled (so
// symbol ids after import change too).
inline v1::Graph RenameSymbols(const v1::Graph& graph, uint64_t seed) {
  internal::Rng rng(seed);
  absl::flat_hash_map<std::string, std::string> rename;
  v1::Graph out = graph;
  for (v1::Symbol& s : *out.mutable_symbols()) {
    const std::string name =
        absl::StrCat("dyn", rng.Next() % 1000, "_", rename.size());
    rename[s.name()] = name;
    s.set_name(name);
  }
  auto* symbols = out.mutable_symbols();
  for (int i = symbols->size() - 1; i > 0; --i) {
    symbols->SwapElements(i, rng.Below(i + 1));
  }
  auto dim = [&](v1::Dim* d) {
    if (d->kind_case() == v1::Dim::kSymbol)
      d->set_symbol(Renamed(rename, d->symbol()));
  };
  for (v1::Input& in : *out.mutable_inputs()) {
    for (v1::Dim& d : *in.mutable_meta()->mutable_sizes()) dim(&d);
    for (v1::Stride& s : *in.mutable_meta()->mutable_strides()) {
      for (std::string& name : *s.mutable_symbols()) {
        name = Renamed(rename, name);
      }
    }
  }
  for (v1::Node& node : *out.mutable_nodes()) {
    for (v1::Argument& a : *node.mutable_args()) {
      if (a.kind_case() == v1::Argument::kDims) {
        for (v1::Dim& d : *a.mutable_dims()->mutable_values()) dim(&d);
      }
    }
  }
  return out;
}

}  // namespace kiln::graph_gen

#endif  // KILN_TESTS_UNIT_GRAPH_GEN_H_
