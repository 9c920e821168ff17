// The lowering stage: Graph -> LoopGraph (compiler/loop_ir.h).
//
// Each graph value becomes a LoweredValue: a loop node read through an index
// map. Pointwise ops and reductions create nodes; views only compose index
// maps (never copies); composites expand into reductions and pointwise
// nodes. The rules live in the compiler's lowering table
// (op_lowering.h).
//
// Errors: UNIMPLEMENTED for an op without a lowering, naming node and op.
// Thread-safety: pure function.
#ifndef KILN_COMPILER_LOWER_H_
#define KILN_COMPILER_LOWER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "compiler/loop_ir.h"
#include "graph/graph.h"

namespace kiln {

// A value of the graph as the loop IR sees it: element idx of the value is
// element index[...] of loop node `node`, where index is a list of
// expressions over the value's own index vars (v0 .. v{rank-1}).
struct LoweredValue {
  int node = -1;
  std::vector<Expr> index;
  DType dtype = DType::kFloat32;
  std::vector<SymExpr> sizes;
};

// What the target lets lowerings choose (part of the key through the
// target they are derived from).
struct LowerOptions {
  // Matrix products in float16/bfloat16 are library calls in that dtype
  // (accumulating in float32; cuBLASLt) rather than float32 calls on
  // converted operands (CPU BLAS has no half-precision GEMM).
  bool half_precision_gemm = false;
  // Without half_precision_gemm: bfloat16 products read their operands in
  // bfloat16 and write a float32 C (oneDNN's gemm_bf16bf16f32 on the CPU),
  // instead of float32 calls on operands converted by Kiln kernels.
  bool bf16_operands_f32_result = false;
  // GemmCall::tf32 for float32 products, GemmCall::strict_reduction for
  // float16 / bfloat16 ones (CompileOptions: PyTorch's flags).
  bool tf32 = false;
  bool strict_fp16_reduction = false;
  bool strict_bf16_reduction = false;
  // Convolutions in float32 (and in float16 and bfloat16 with
  // half_precision_convolutions) are library calls (ConvCall: cuDNN on
  // CUDA, oneDNN on the CPU) rather than im2col kernels and GEMMs;
  // ConvCall::tf32 and ::deterministic (CompileOptions).
  bool library_convolutions = false;
  bool half_precision_convolutions = false;
  // Without half_precision_convolutions: bfloat16 library convolutions
  // read their operands in bfloat16 and write a float32 tensor (oneDNN on
  // the CPU), which the program rounds where it needs bfloat16.
  bool bf16_convolutions_f32_result = false;
  // Max pools over small windows are one pointwise node with the window
  // unrolled rather than an argmax reduction (the CPU: its kernels then
  // run across outputs).
  bool unrolled_pool_windows = false;
  bool tf32_convolution = false;
  bool deterministic_convolutions = false;
  // Convolution extern calls choose their algorithm by timing
  // (Convolution.benchmark; CUDA).
  bool cudnn_benchmark = false;
  // kiln.attention is one library call (AttentionCall) rather than GEMMs
  // around a softmax where the library takes the case: cuDNN's fused
  // attention on CUDA (float16/bfloat16, head dims multiples of 8 up to
  // 128, 256 on sm_90 and later; its backward only unless
  // deterministic_gemms asks for repeatable sums), the CPU runtime's own
  // kernel on the CPU (every floating dtype and head dim, deterministic,
  // dropout drawn as Kiln's kernels draw it).
  struct LibraryAttention {
    bool enabled = false;
    bool float32 = false;  // also float32 (else float16/bfloat16 only)
    int head_dim_multiple = 8;
    int max_head_dim = 128;
    bool dropout = true;         // it draws dropout masks
    // The largest head dim it computes with dropout: cuDNN's flash engines
    // with dropout are tested on an H200 at 64; above 128 a backward cuDNN
    // refused would leave its mask undrawable, so the written-out form
    // takes those.
    int max_dropout_head_dim = 128;
    bool deterministic = false;  // its backward sums in a fixed order
    // It draws them as Kiln's kernels do (Philox at the score element's
    // row-major index: the CPU's), so its (seed, offset) pair is Kiln's;
    // else from a generator of its own (cuDNN's: the pair flagged).
    bool kiln_philox = false;
    // Its backward also gives the bias's gradient (Attention.bias_grad;
    // the CPU's kernel; cuDNN's dBias is not wired).
    bool bias_grad = false;
  };
  LibraryAttention library_attention;
  // Accumulating scatters (LoopNode::kScatter) add every source position
  // in parallel, atomically (CUDA: the order of the additions is not
  // deterministic), rather than walking the source dims that are not a
  // target coordinate of their own in order (CPU: deterministic).
  bool atomic_scatters = false;
  // With atomic_scatters: accumulating scatters are UNIMPLEMENTED (the
  // client runs them in PyTorch's deterministic kernels;
  // CompileOptions.deterministic_algorithms).
  bool deterministic_scatters = false;
  // cumsum as reductions (CUDA, which has no ordered scatters: blocks of
  // about sqrt(n) over long static rows, else quadratic) rather than a
  // linear scan (the CPU's ordered scatter).
  bool reduction_cumsum = false;
  // GemmCall::deterministic: library GEMMs use the heuristic's first
  // algorithm, never a timed choice (CompileOptions.deterministic_algorithms).
  bool deterministic_gemms = false;
  // The most steps (2^this) a non-accumulating scatter or a cumulative
  // sum may cost as Kiln's quadratic reduction
  // (compiler/ops/gather_scatter_lowering.cc); above it the node is
  // UNIMPLEMENTED and the client runs it eagerly, in linear time. Set per
  // target: kCudaMaxScatterWorkLog2, kCpuMaxScatterWorkLog2.
  int max_scatter_work_log2 = 24;
};

// max_scatter_work_log2 for CUDA targets: 2^24 steps, about 0.1 ms on an
// H100, what a partition split and PyTorch's linear-time kernel cost about
// (measured when accumulating scatters were quadratic reductions too:
// BERT-base's position embedding backward, 512 x 768 x 4096 =
// 1.6e9 steps, took 11.9 ms against Inductor's 0.36 ms for the whole
// forward and backward; bench/python/train_ops.py --cases positions).
inline constexpr int kCudaMaxScatterWorkLog2 = 24;

// max_scatter_work_log2 for CPU targets: 2^18 steps, about 0.4 ms, what a
// partition split and PyTorch's linear-time kernel cost about (measured on
// accumulating scatters, then quadratic reductions too; the
// reduction measured about 1.5 ns a step on the dev box: BERT's three
// embedding backwards at 8 x 64 tokens, 5.4M steps, took 8 ms of a 21 ms
// training step whose eager version took 6 ms).
inline constexpr int kCpuMaxScatterWorkLog2 = 18;

// What an op's lowering sees and uses.
class LowerContext {
 public:
  LowerContext(const Graph& graph, const Node& node, int node_index,
               LoopGraph& loops, const std::vector<LoweredValue>& values,
               const LowerOptions& options = {})
      : graph_(graph),
        node_(node),
        node_index_(node_index),
        loops_(loops),
        values_(values),
        options_(options) {}

  const Node& node() const { return node_; }
  const LowerOptions& options() const { return options_; }
  const Attr& arg(int i) const { return node_.args[i]; }
  bool is_tensor(int i) const {
    return node_.args[i].kind == Attr::Kind::kTensor;
  }
  const LoweredValue& value(int i) const {
    return values_[node_.args[i].tensor];
  }
  const LoweredValue& value_of(ValueId v) const { return values_[v]; }
  // The inferred type of output o.
  const TensorType& out_type(int o = 0) const {
    return graph_.type(node_.outputs[o]);
  }

  // Argument i (a tensor, broadcast to `sizes`, or a Python scalar) as an
  // expression over the vars of `sizes`, converted to `dtype`.
  Expr Operand(int i, const std::vector<SymExpr>& sizes, DType dtype) const;
  // Value `v` read at `index` (expressions over the reader's vars).
  static Expr Read(const LoweredValue& v, const std::vector<Expr>& index);
  // `v` broadcast to `sizes`, read at the vars of `sizes`.
  static Expr ReadBroadcast(const LoweredValue& v,
                            const std::vector<SymExpr>& sizes);

  // Adds a node; returns the value reading it at the identity map.
  LoweredValue AddNode(LoopNode node);
  // The node number the next AddNode gives: for a node whose expressions
  // read the node itself (a scan's running value, loop_ir.h's kScatter).
  int NextNode() const { return static_cast<int>(loops_.nodes.size()); }
  // A view of `v`: element idx of the view is element `v_index` of v, where
  // v_index are expressions over the view's vars.
  static LoweredValue Remap(const LoweredValue& v,
                            const std::vector<Expr>& v_index,
                            std::vector<SymExpr> sizes);

  // Registers an index check of this node (loop_ir.h, IndexCheck: the
  // node and op are this context's) and returns its site number for
  // ir::Check. The same (kind, dim, size) twice gives the same site.
  int AddIndexCheck(IndexCheck::Kind kind, int dim, const SymExpr& size);

  // Records on `result`'s node that it is `kind` applied element for
  // element to `source` (+ `bias`, an n-vector along the last dim, for
  // GemmEpilogue::kBias), so that compiler/gemm_epilogue.h may fold it into
  // a library call producing `source`. Does nothing unless every value is
  // read in place: `result` and `source` of the same sizes at the identity
  // map, `bias` a contiguous vector ([n] or [1, n]) at its identity map.
  void MarkEpilogue(const LoweredValue& result, GemmEpilogue kind,
                    const LoweredValue& source,
                    const LoweredValue* bias = nullptr);

  absl::Status Unimplemented(absl::string_view what) const;
  const LoopGraph& loops() const { return loops_; }

 private:
  const Graph& graph_;
  const Node& node_;
  int node_index_;
  LoopGraph& loops_;
  const std::vector<LoweredValue>& values_;
  const LowerOptions& options_;
};

// The vars v0..v{n-1}.
std::vector<Expr> IdentityIndex(int n);

absl::StatusOr<LoopGraph> Lower(const Graph& graph,
                                const LowerOptions& options = {});

}  // namespace kiln

#endif  // KILN_COMPILER_LOWER_H_
