// The loop IR: what lowering produces and fusion and the code generators
// consume.
//
// A LoopGraph is a list of LoopNodes, one per computed tensor:
//   kInput      a graph input (strided, strides guarded)
//   kPointwise  value[v0..vn-1] = body, an expression over the index vars
//   kReduction  value[kept dims] = reduce over the reduced dims of body,
//               where body is over the vars of the reduction's input space
//   kScatter    value = body, then scatter_value added at scatter_index
//               for every position of a source space (an accumulating
//               scatter in linear time)
// Bodies read other nodes through Load(node, multi-index) expressions whose
// indices are themselves expressions over the vars: views never become
// nodes, they become the index expressions of the loads that read through
// them.
//
// After fusion (compiler/fuse.h) the program is a list of Kernels whose
// bodies read only materialised buffers (kLoadBuffer, flat element offsets)
// and the accumulators of reductions computed earlier in the same row
// (kAcc).
//
// Expressions are immutable and shared (std::shared_ptr<const ExprNode>).
// Thread-safety: immutable values; building is single-threaded.
#ifndef KILN_COMPILER_LOOP_IR_H_
#define KILN_COMPILER_LOOP_IR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "graph/dtype.h"
#include "graph/sym_expr.h"

namespace kiln {

enum class ExprOp : uint8_t {
  // Leaves.
  kConst,       // value f (floating dtypes) or i (integral/bool)
  kVar,         // index var `index` (int64)
  kSym,         // value of symbol `index` (int64)
  kLoad,        // node `index` at multi-index args (before fusion)
  kLoadBuffer,  // buffer slot `index` at flat element offset args[0]
  kAcc,         // finalized result of reduction stage `index` for this row
  // Unary (args[0]).
  kCast,  // to `dtype`
  kNeg,
  kAbs,
  kExp,
  kExp2,
  kExpm1,
  kLog,
  kLog2,
  kLog1p,
  kSqrt,
  kRsqrt,
  kReciprocal,
  kSin,
  kCos,
  kTan,
  kTanh,
  kSigmoid,
  kErf,
  kFloor,
  kCeil,
  kRound,
  kTrunc,
  kSign,
  kRelu,
  kNot,
  kBitNot,
  kIsNan,
  // Binary (args[0], args[1]).
  kAdd,
  kSub,
  kMul,
  kDiv,        // kDiv on integers truncates (0 on /0)
  kFloorDiv,   // floor division (integers and floats)
  kRemainder,  // Python-style modulus (sign of divisor)
  kFmod,       // C-style modulus (sign of dividend)
  kPow,
  kMax,
  kMin,  // kMax/kMin propagate NaN
  kAtan2,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kAnd,
  kOr,
  kBitAnd,
  kBitOr,
  // Ternary.
  kSelect,  // args[0] ? args[1] : args[2]
  // Random bits (support/philox.h): word `i` (0..3) of Philox4x32-10 for
  // key args[0] (seed), stream args[1] (offset) and counter args[2] (the
  // element's index), all int64; the value is the uint32 word as int64.
  kPhilox,
  // An index read from data, checked (issue 17.2): the value of args[0]
  // (the index, already clamped into its dim by the lowering, so no load
  // leaves its buffer); when args[1] (bool) holds, the kernel also records
  // a violation of check site `i` (LoopGraph::index_checks) with the
  // offending index args[2] (int64) in the program's error word, buffer
  // slot `index` (-1 before fusion). See IndexCheck. Evaluated wherever
  // its value is: an index a kernel computes but does not need (the other
  // arm of a select) is still checked; one no kernel computes (a gather
  // whose output is partly unused) is not.
  kCheck,
};

struct ExprNode;
using Expr = std::shared_ptr<const ExprNode>;

struct ExprNode {
  ExprOp op;
  DType dtype;  // the value's dtype (index math is int64)
  std::vector<Expr> args;
  double f = 0;
  int64_t i = 0;
  int index = 0;      // var / symbol / node / buffer / stage number
  uint64_t hash = 0;  // structural, computed at construction
};

// Construction with constant folding and the algebraic identities index
// arithmetic needs (x+0, x*1, x*0, x/1, x%1).
namespace ir {
Expr Const(double v, DType dtype);
Expr IntConst(int64_t v, DType dtype = DType::kInt64);
Expr Var(int index);
Expr Sym(int index);
Expr Load(int node, std::vector<Expr> index, DType dtype);
Expr LoadBuffer(int slot, Expr offset, DType dtype);
Expr Acc(int stage, DType dtype);
Expr Cast(Expr x, DType to);
Expr Unary(ExprOp op, Expr x, DType dtype);
Expr Binary(ExprOp op, Expr a, Expr b, DType dtype);
Expr Select(Expr cond, Expr a, Expr b);
// Word `word` (0..3) of Philox4x32-10(seed, offset, index) as int64 in
// [0, 2^32) (ExprOp::kPhilox).
Expr Philox(Expr seed, Expr offset, Expr index, int word);
// ExprOp::kCheck: `value`, recording site `site` with index `raw` when `bad`
// holds (folds to `value` when `bad` is constant false). `error_slot` is
// the error word's buffer slot, set by fusion.
Expr Check(Expr value, Expr bad, Expr raw, int site, int error_slot = -1);
// Index arithmetic on int64 expressions.
Expr Add(Expr a, Expr b);
Expr Mul(Expr a, Expr b);
Expr FloorDiv(Expr a, Expr b);
Expr Mod(Expr a, Expr b);
// A SymExpr as an int64 expression over kSym leaves.
Expr FromSym(const SymExpr& e);

bool Equal(const Expr& a, const Expr& b);
// The nodes `e` (null: none) reads with ExprOp::kLoad.
absl::flat_hash_set<int> LoadsOf(const Expr& e);
// Whether `e` (null: no) has a node of kind `op`.
bool ContainsOp(const Expr& e, ExprOp op);
// Replaces kVar i by vars[i].
Expr SubstituteVars(const Expr& e, const std::vector<Expr>& vars);
std::string ToString(const Expr& e,
                     const std::vector<std::string>& symbol_names = {});

// An int64 index expression as constant + sum_i coeffs[i] * v_i, with the
// constant and coefficients polynomials over the symbols.
struct AffineForm {
  SymExpr constant;
  std::vector<SymExpr> coeffs;  // one per var
};
// `e` (over vars [0, num_vars)) in affine form, or nullopt when it is not
// affine in the vars (loads, selects, a division that does not cancel).
// The divisions and moduli of a reshape cancel:
// floor(x / p) mod s * q + floor(x / (p*s)) * s * q folds to floor(x / p) * q
// and floor(x / 1) to x, so a view that merges dims stays affine.
std::optional<AffineForm> Affine(const Expr& e, int num_vars);

// The values an int64 expression takes: lo <= v <= hi.
struct IndexRange {
  int64_t lo = 0;
  int64_t hi = 0;
};
// `e` with its int64 index arithmetic simplified where the ranges of the
// vars prove it (var_ranges[i] for kVar i; nullopt or past the end:
// unknown; symbols are unknown), over non-negative operands only, so
// floor and truncating division agree. With x = a*Q + R, 0 <= R < a:
//   floor(x / (a*b)) -> floor(Q / b)       floor(x / a) -> Q
//   x mod (a*b)      -> a * (Q mod b) + R  x mod a      -> R
// (a: the divisor or a coefficient of x dividing it), x mod m -> x for
// x < m, multiples of the divisor leave a division or remainder
// (floor((d*Q + R) / d) -> Q + floor(R / d) for R >= 0), and the parts of
// a reshape's index recombine in sums as in Affine (floor(x / p) mod s * q
// + floor(x / (p*s)) * s * q -> floor(x / p) * q). The value is the same
// for every value of the vars within their ranges. Floating-point nodes are
// rebuilt around their simplified int64 operands only.
Expr SimplifyIndex(const Expr& e,
                   const std::vector<std::optional<IndexRange>>& var_ranges);

// Rewrites an expression bottom-up; `fn` may replace any node (returning
// nullopt keeps the rebuilt node). Memoised structurally so that shared
// subexpressions stay shared (inlining would otherwise blow up). One
// Rewriter may run over several expressions, sharing its memo.
class Rewriter {
 public:
  using Fn = std::function<std::optional<Expr>(const Expr& rebuilt)>;
  explicit Rewriter(Fn fn) : fn_(std::move(fn)) {}
  // Null stays null.
  Expr Run(const Expr& e);

 private:
  static Expr Recons(const std::shared_ptr<ExprNode>& n);
  std::optional<Expr> Find(const Expr& e);

  Fn fn_;
  absl::flat_hash_map<uint64_t, std::vector<std::pair<Expr, Expr>>> memo_;
};
}  // namespace ir

enum class ReduceKind : uint8_t {
  kSum,
  kProd,
  kMax,
  kMin,
  kArgMax,
  kArgMin,
  kAny,
  kAll
};

// argmax/argmin: the result is a position, kept next to the extreme value.
inline bool IsArgReduce(ReduceKind k) {
  return k == ReduceKind::kArgMax || k == ReduceKind::kArgMin;
}

// How an extern call reads or writes a matrix in place: element (b, r, c)
// is element offset + b * batch_stride + r * row_stride + c * col_stride of
// the node's (or, after fusion, the buffer's) flat storage.
struct MatrixLayout {
  SymExpr offset{0};
  SymExpr batch_stride{0};
  SymExpr row_stride{0};
  SymExpr col_stride{1};
  std::string ToString(const std::vector<std::string>& symbol_names) const;
};

// A batched matrix product computed by a vendor library (issue 16):
// C[b] = alpha * A[b] @ B[b] for b < batch, A m x k, B k x n, C m x n, with
// C contiguous. The operands are whole loop nodes (extern_inputs), read in
// place through their layouts.
//
// The library may apply an epilogue before C is written (compiler/
// gemm_epilogue.h folds one in): C = act(alpha * A @ B + bias[col]), bias a
// vector of n elements (the node's extern_inputs[2], its kernel's buffer
// slot 3), act the identity, ReLU or tanh-GELU, computed in compute_dtype
// and rounded once. kBiasGradB instead also writes B's column sums,
// bias[j] = sum_p B[p][j] (batch 1, alpha 1, B row-major), and kBiasGradA
// A's row sums, bias[i] = sum_p A[i][p] (A column-major): the node's
// extern_outputs[0], its kernel's buffer slot 3.
enum class GemmEpilogue : uint8_t {
  kNone,
  kBias,
  kRelu,
  kReluBias,
  kGeluTanh,
  kGeluTanhBias,
  kBiasGradB,
  kBiasGradA,
};
// Whether the epilogue reads a bias vector (kBias, kReluBias, kGeluTanhBias).
bool EpilogueHasBias(GemmEpilogue e);
// Whether it writes one (kBiasGradB, kBiasGradA).
bool EpilogueWritesBias(GemmEpilogue e);
const char* EpilogueName(GemmEpilogue e);

struct GemmCall {
  MatrixLayout a, b, c;
  SymExpr batch{1}, m{0}, n{0}, k{0};
  double alpha = 1;
  DType compute_dtype = DType::kFloat32;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  SymExpr bias_offset{0};  // of bias[0] in the bias node's storage
  // PyTorch's flags (CompileOptions): float32 inputs may be rounded to
  // TF32; 16-bit split-K partial sums must not be reduced in 16 bits.
  bool tf32 = false;
  bool strict_reduction = false;
  // The library heuristic's first algorithm, untimed
  // (CompileOptions.deterministic_algorithms).
  bool deterministic = false;
};

// Whether a library can read `layout` in place: its row or column stride is
// statically 1.
bool IsBlasLayout(const MatrixLayout& layout);

// A convolution computed by a vendor library (cuDNN, oneDNN; issue 16) in one
// of the directions of a regular convolution over x [N, C, *S], w [O, C/G, *K]
// and y [N, O, *P] (artifact.proto, Convolution):
//   kForward         y from (x, w)
//   kBackwardData    x from (y, w)   (also a transposed convolution)
//   kBackwardFilter  w from (x, y)
// The node's value is the written tensor; its extern_inputs are the two
// others in that order, each a whole contiguous node of the node's dtype.
enum class ConvDirection : uint8_t { kForward, kBackwardData, kBackwardFilter };
const char* ConvDirectionName(ConvDirection d);

struct ConvCall {
  ConvDirection direction = ConvDirection::kForward;
  std::vector<SymExpr> x_sizes, w_sizes, y_sizes;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
  // CompileOptions: float32 inputs may be rounded to TF32; deterministic
  // algorithms only; the algorithm timed (cudnn.benchmark).
  bool tf32 = false;
  bool deterministic = false;
  bool benchmark = false;
};

// Fused attention computed by a library (cuDNN; issue 16), with the
// semantics of runtime/cuda_attention.h over contiguous tensors
// q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev] of one dtype:
//   forward   extern_inputs q, k, v[, bias]; the node's value is out
//             [B, H, L, Ev], extern_outputs[0] the float32 lse [B, H, L]
//   backward  extern_inputs q, k, v[, bias], out, lse, grad_out; the
//             node's value is grad_q, extern_outputs grad_k and grad_v
//             (and the bias's gradient with bias_grad)
// bias: an additive bias on the scaled scores, contiguous
// [bias_batch ? B : 1, bias_heads ? H : 1, L, S] of the inputs' dtype.
// dropout > 0: the probabilities are dropped with that probability (the
// library draws the mask), and the last of extern_inputs is the int64 [2]
// (seed, offset) of its generator.
struct AttentionCall {
  bool backward = false;
  SymExpr batch{0}, heads{0}, s_q{0}, s_kv{0}, d_qk{0}, d_v{0};
  bool causal = false;
  double scale = 1;
  bool bias = false, bias_batch = false, bias_heads = false;
  // Backward only: also writes the bias's gradient (Attention.bias_grad).
  bool bias_grad = false;
  double dropout = 0;
};

struct LoopNode {
  // kExtern: the node's value (contiguous) is computed by a library call,
  // `gemm` over the nodes extern_inputs (A, B[, bias]), `conv` over
  // extern_inputs (its two operands) or `attention` over extern_inputs
  // (AttentionCall's order), or, with extern_owner set, by another node's
  // call.
  // kScatter: see the scatter fields below.
  enum class Kind : uint8_t {
    kInput,
    kPointwise,
    kReduction,
    kExtern,
    kScatter
  };
  Kind kind = Kind::kPointwise;
  std::string name;  // for dumps: the graph value it computes
  DType dtype = DType::kFloat32;
  std::vector<SymExpr> sizes;  // the node's own shape

  // kInput
  int input_index = -1;
  std::vector<SymExpr> strides;

  // kPointwise: body over vars [0, rank).
  // kReduction: body over vars [0, reduce_sizes.size()); the node's shape is
  // reduce_sizes with the reduced dims dropped (or 1 when keepdim).
  Expr body;
  ReduceKind reduce = ReduceKind::kSum;
  std::vector<SymExpr> reduce_sizes;
  std::vector<bool> reduced;
  bool keepdim = false;
  // Applied to the accumulator at the end of the row (mean's division, var's
  // correction): an expression over kAcc 0 and the row's vars; null = acc.
  Expr finalize;
  DType acc_dtype = DType::kFloat32;  // accumulator dtype
  // kPointwise: stored in memory even where fusion would recompute it in
  // its readers, so that every read sees the same bits (a vectorised
  // transcendental and its scalar tail may round differently; a sort
  // compares each element with every other, compiler/ops/sort_lowering.cc).
  bool realize = false;

  // kScatter (issue 17.2): the node starts as `body` (over the node's vars)
  // and, for every position q of scatter_sizes (vars [0,
  // scatter_sizes.size())), scatter_value(q) is added to its element
  // scatter_index(q) (one expression per dim of `sizes`, each within its
  // dim: the lowering clamps and checks data indices). dtype is the sum's
  // dtype (float32 or int64). The order of the additions per element:
  //   scatter_inner[d] set  source dim d is walked in order, within one
  //                         thread (the CPU: every dim whose var is not a
  //                         target coordinate of its own, so that threads
  //                         own disjoint elements and the sums are
  //                         deterministic, in source order)
  //   all dims clear        every position in parallel, added atomically
  //                         (CUDA: the order is not deterministic)
  std::vector<SymExpr> scatter_sizes;
  std::vector<bool> scatter_inner;
  std::vector<Expr> scatter_index;
  Expr scatter_value;
  // Each source replaces its element instead (scatter, index_put without
  // accumulate; dtype is the op's): the last in source order. CPU targets
  // only (CUDA's racing stores would leave any of them).
  bool scatter_replace = false;

  // kExtern
  std::optional<GemmCall> gemm;
  std::optional<ConvCall> conv;
  std::optional<AttentionCall> attention;
  std::vector<int> extern_inputs;  // loop nodes, realized (see above)
  // The other results a call writes (attention's): kExtern nodes of their
  // own with no call, whose extern_owner is this node. They follow it in
  // the graph, so that their readers follow the call.
  std::vector<int> extern_outputs;
  int extern_owner = -1;

  // kPointwise: what a library call could compute in its epilogue instead
  // (set by the lowerings of addmm's bias add, relu and tanh-gelu; read by
  // compiler/gemm_epilogue.h): the node is `epilogue` applied element for
  // element to node `epilogue_source` of the same sizes, plus for kBias
  // node `epilogue_bias` (n elements, contiguous) broadcast along the rows.
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  int epilogue_source = -1;
  int epilogue_bias = -1;

  int output_index = -1;  // >= 0: this node is graph output #output_index
};

// Out-of-range indices (issue 17.2). Every index an op reads from data is
// checked where it is read (ExprOp::kCheck): the kernel clamps it, so memory
// outside a buffer is never touched, and records a violation in the
// program's error word, an int64[3] buffer (ProgramBuffer::Kind::kError)
// that the runtime zeroes before a run and reads after it:
//   word[0] = site + 1 of a violated check (0: none), word[1] = the index,
//   word[2] = the size it was checked against.
// Each kernel keeps, per check site, whether an index failed and the
// largest index that failed (an or and a max reduction in registers, which
// loops vectorise with) and writes them once, at its end, with a
// compare-and-swap on word[0] (the first writer wins, so words 1 and 2
// belong to word[0]); the common path costs a compare, an or, a select
// and a max per index read, no branch and no atomic
// (bench/compiler/index_check_bench.cc). The runtime turns a set word into
// OUT_OF_RANGE naming the site's node and op (runtime/program_plan.h,
// IndexErrorStatus).
struct IndexCheck {
  enum class Kind : uint8_t {
    kIndex,   // an index into a dim of `size`: valid in [-size, size)
    kTarget,  // a class target (nll_loss): valid in [0, size) or ignored
  };
  Kind kind = Kind::kIndex;
  int node = -1;   // the graph node that reads the index
  std::string op;  // its op, e.g. "aten.embedding.default"
  int dim = 0;     // the dim the index selects along
  SymExpr size;    // that dim's size (classes, for kTarget)
};

struct LoopGraph {
  std::vector<std::string> symbol_names;
  // Check sites, numbered by ExprOp::kCheck's `i`.
  std::vector<IndexCheck> index_checks;
  std::vector<LoopNode> nodes;
  // Graph output o is node outputs[o] (a node per output position).
  std::vector<int> outputs;
  // Per output: the input it is the new value of (Graph::input_writes), or
  // -1. Empty when the graph has none.
  std::vector<int> output_input;
  int num_inputs = 0;
  std::string ToString() const;
};

// ---- after fusion ----

struct Stage {
  enum class Kind : uint8_t {
    kReduce,      // accumulate `value` over the inner dims into acc #stage
    kStoreInner,  // for each inner index, store `value` at buffer[offset]
    kStoreOuter,  // once per row, store `value` at buffer[offset]
    // For every position of the kernel's dims (outer and inner), add
    // `value` to buffer[offset] (a LoopNode::kScatter). A kernel with this
    // stage has no other; CPU code walks its inner dims in order, each
    // over the chunk's outer positions (no two outer positions share an
    // element), CUDA code has no inner dims and adds atomically.
    kScatterAdd,
    // The same, storing `value` at buffer[offset] (the last store wins; on
    // CUDA any of them).
    kScatterStore,
  };
  Kind kind = Kind::kStoreOuter;
  Expr value;
  // kReduce
  ReduceKind reduce = ReduceKind::kSum;
  DType acc_dtype = DType::kFloat32;
  Expr finalize;  // over kAcc(this stage) and outer vars; null = acc
  // kStore*
  int buffer_slot = -1;
  Expr offset;  // flat element offset into the buffer
  DType store_dtype = DType::kFloat32;
};

struct Kernel {
  std::string name;  // exported symbol
  // Buffers this kernel reads or writes: slot i is program buffer buffers[i].
  std::vector<int> buffers;
  // Index vars: the kernel iterates vars [0, dims.size()); outer dims form
  // the parallel range (their flattened product), inner dims are the
  // reduction dims iterated within a row.
  std::vector<SymExpr> dims;
  std::vector<bool> inner;  // per dim: reduced (inner) or kept (outer)
  std::vector<Stage> stages;
  // An extern call instead of generated code (no dims, no stages). A GEMM:
  // slots 0, 1, 2 are A, B and C (possibly the same buffer twice), 3 the
  // bias when the epilogue has one. A convolution: slots 0 and 1 its
  // operands, 2 the tensor it writes (ConvCall).
  // Attention: slots are its extern_inputs, then the tensors it writes
  // (the node's value, then its extern_outputs; AttentionCall).
  std::optional<GemmCall> gemm;
  std::optional<ConvCall> conv;
  std::optional<AttentionCall> attention;
  bool is_extern() const {
    return gemm.has_value() || conv.has_value() || attention.has_value();
  }
  // A scatter's kernel: one Stage::kScatterAdd or kScatterStore.
  bool is_scatter() const {
    return !stages.empty() && (stages[0].kind == Stage::Kind::kScatterAdd ||
                               stages[0].kind == Stage::Kind::kScatterStore);
  }

  SymExpr OuterRange() const;
  std::string ToString(const std::vector<std::string>& symbol_names) const;
};

struct ProgramBuffer {
  // kError: the error word of the index checks (IndexCheck), int64[3],
  // zeroed by the runtime before the program runs; at most one per program,
  // added only when some kernel checks an index.
  enum class Kind : uint8_t { kInput, kOutput, kTemp, kError };
  Kind kind = Kind::kTemp;
  // Input number; output number among the outputs that are not input
  // writes (FusedProgram::input_writes), as the artifact lists them.
  int index = -1;
  DType dtype = DType::kFloat32;
  SymExpr elements;
  std::vector<SymExpr> strides;  // kInput: guarded strides; else contiguous
};

struct FusedProgram {
  std::vector<std::string> symbol_names;
  std::vector<IndexCheck> index_checks;  // from the LoopGraph
  // The input writes the program stores into the inputs' memory, as
  // (graph output, input) pairs; those outputs have no kOutput buffer, and
  // kOutput buffers number the other outputs in graph order.
  std::vector<std::pair<int, int>> input_writes;
  std::vector<ProgramBuffer> buffers;
  std::vector<Kernel> kernels;  // in execution order
  std::string ToString() const;
};

}  // namespace kiln

#endif  // KILN_COMPILER_LOOP_IR_H_
