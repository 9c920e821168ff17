#include "runtime/cuda_attention.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "runtime/cudnn_api.h"
#include "runtime/cudnn_graph.h"

namespace kiln {

namespace {

// The unique ids of the graph's tensors: the buffers Run binds, the host
// scalars, the two float32 tensors kept in the workspace, then virtual
// tensors from kFirstVirtual on.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kOut,
  kStats,
  kGradOut,
  kGradQ,
  kGradK,
  kGradV,
  kScale,
  kNegInf,
  kOne,
  kBias,
  kSoftmaxSum,  // backward: rowsum(grad_out * out), float32
  kGradQAccum,  // backward: grad_q in float32
  kSeed,        // dropout: the generator's seed and offset, int64
  kOffset,
  kDropoutScale,     // 1 / (1 - p)
  kDropoutScaleInv,  // backward: 1 - p
  kGradBias,         // backward with bias_grad: the bias's gradient
  kFirstVirtual = 100,
};

constexpr size_t kWorkspaceAlign = 256;
size_t AlignUp(size_t n) {
  return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// The operations of one attention graph as cuDNN's frontend writes them
// (node/scaled_dot_product_flash_attention.h, its composite nodes): each
// call adds one operation and returns its output tensor.
class AttentionGraph {
 public:
  AttentionGraph(const CudnnLibrary* lib, const AttentionDims& d, int io_type,
                 int64_t alignment)
      : b_(lib), d_(d), io_(io_type), alignment_(alignment) {}

  CudnnGraphBuilder& builder() { return b_; }

  // A non-virtual tensor bound in the variant pack, its address aligned to
  // `alignment` bytes (0: the call's common alignment).
  void* Bound(int64_t uid, int type, std::vector<int64_t> sizes,
              std::vector<int64_t> strides = {}, int64_t alignment = 0) {
    return b_.Tensor({.data_type = type,
                      .sizes = std::move(sizes),
                      .strides = std::move(strides),
                      .uid = uid,
                      .alignment = alignment > 0 ? alignment : alignment_});
  }
  void* Scalar(int64_t uid) {
    return b_.Tensor({.data_type = cudnn::kDataFloat,
                      .sizes = {1, 1, 1, 1},
                      .strides = {1, 1, 1, 1},
                      .uid = uid,
                      .by_value = true});
  }
  void* Virtual(int type, std::vector<int64_t> sizes,
                std::vector<int64_t> strides = {}) {
    return b_.Tensor({.data_type = type,
                      .sizes = std::move(sizes),
                      .strides = std::move(strides),
                      .uid = next_virtual_++,
                      .is_virtual = true});
  }
  // [B, H, rows, cols] row-major, float32 unless `type`.
  void* Scores(int64_t rows, int64_t cols, int type = cudnn::kDataFloat) {
    return Virtual(type, {d_.batch, d_.heads, rows, cols});
  }
  // [B, H, Sq, 1] with the frontend's strides.
  std::vector<int64_t> RowSizes() const {
    return {d_.batch, d_.heads, d_.s_q, 1};
  }
  std::vector<int64_t> RowStrides() const {
    return {d_.heads * d_.s_q, d_.s_q, 1, 1};
  }
  void* Rows() { return Virtual(cudnn::kDataFloat, RowSizes(), RowStrides()); }

  // y = mode(x[, b[, t]]) computed in `prec`.
  void Pointwise(int mode, void* x, void* b, void* t, void* y,
                 int prec = cudnn::kDataFloat, int64_t axis = -1) {
    void* pw = b_.Make(cudnn::kPointwiseDescriptor);
    b_.Set(pw, cudnn::kAttrPointwiseMode, cudnn::kTypePointwiseMode, 1, &mode);
    b_.Set(pw, cudnn::kAttrPointwiseMathPrec, cudnn::kTypeDataType, 1, &prec);
    if (axis >= 0) b_.SetInt64(pw, cudnn::kAttrPointwiseAxis, axis);
    b_.Finalize(pw, "pointwise");
    void* op = b_.Make(cudnn::kOperationPointwiseDescriptor);
    b_.SetDesc(op, cudnn::kAttrOperationPointwisePwDescriptor, pw);
    b_.SetDesc(op, cudnn::kAttrOperationPointwiseX, x);
    b_.SetDesc(op, cudnn::kAttrOperationPointwiseY, y);
    if (b != nullptr) b_.SetDesc(op, cudnn::kAttrOperationPointwiseB, b);
    if (t != nullptr) b_.SetDesc(op, cudnn::kAttrOperationPointwiseT, t);
    const float one = 1.0f;
    b_.Set(op, cudnn::kAttrOperationPointwiseAlpha1, cudnn::kTypeFloat, 1,
           &one);
    b_.Set(op, cudnn::kAttrOperationPointwiseAlpha2, cudnn::kTypeFloat, 1,
           &one);
    b_.Finalize(op, absl::StrCat("pointwise operation ", mode));
    ops_.push_back(op);
  }
  void Reduce(int mode, void* x, void* y) {
    void* r = b_.Make(cudnn::kReductionDescriptor);
    const int comp = cudnn::kDataFloat;
    b_.Set(r, cudnn::kAttrReductionCompType, cudnn::kTypeDataType, 1, &comp);
    b_.Set(r, cudnn::kAttrReductionOperator, cudnn::kTypeReductionOperatorType,
           1, &mode);
    b_.Finalize(r, "reduction");
    void* op = b_.Make(cudnn::kOperationReductionDescriptor);
    b_.SetDesc(op, cudnn::kAttrOperationReductionDesc, r);
    b_.SetDesc(op, cudnn::kAttrOperationReductionX, x);
    b_.SetDesc(op, cudnn::kAttrOperationReductionY, y);
    b_.Finalize(op, "reduction operation");
    ops_.push_back(op);
  }
  void Matmul(void* a, void* b, void* c) {
    void* m = b_.Make(cudnn::kMatmulDescriptor);
    const int comp = cudnn::kDataFloat;
    b_.Set(m, cudnn::kAttrMatmulCompType, cudnn::kTypeDataType, 1, &comp);
    b_.Finalize(m, "matmul");
    void* op = b_.Make(cudnn::kOperationMatmulDescriptor);
    b_.SetDesc(op, cudnn::kAttrOperationMatmulA, a);
    b_.SetDesc(op, cudnn::kAttrOperationMatmulB, b);
    b_.SetDesc(op, cudnn::kAttrOperationMatmulC, c);
    b_.SetDesc(op, cudnn::kAttrOperationMatmulDesc, m);
    b_.Finalize(op, "matmul operation");
    ops_.push_back(op);
  }
  void Reshape(void* x, void* y) {
    void* op = b_.Make(cudnn::kOperationReshapeDescriptor);
    b_.SetDesc(op, cudnn::kAttrOperationReshapeX, x);
    b_.SetDesc(op, cudnn::kAttrOperationReshapeY, y);
    b_.Finalize(op, "reshape operation");
    ops_.push_back(op);
  }

  // s * scale, plus the bias (the frontend's bias score modifier), then
  // (causal) -inf where the key's column is after the query's row: the
  // frontend's diagonal band mask with right bound 0.
  void* ScaleAndMask(void* s, void* scale, void* bias, void* neg_inf,
                     bool causal) {
    void* scaled = Scores(d_.s_q, d_.s_kv);
    Pointwise(cudnn::kPointwiseMul, s, scale, nullptr, scaled);
    if (bias != nullptr) {
      void* biased = Scores(d_.s_q, d_.s_kv);
      Pointwise(cudnn::kPointwiseAdd, scaled, bias, nullptr, biased);
      scaled = biased;
    }
    if (!causal) return scaled;
    void* row = Scores(d_.s_q, d_.s_kv, cudnn::kDataInt32);
    Pointwise(cudnn::kPointwiseGenIndex, scaled, nullptr, nullptr, row,
              cudnn::kDataFloat, /*axis=*/2);
    void* col = Scores(d_.s_q, d_.s_kv, cudnn::kDataInt32);
    Pointwise(cudnn::kPointwiseGenIndex, scaled, nullptr, nullptr, col,
              cudnn::kDataFloat, /*axis=*/3);
    void* keep = Scores(d_.s_q, d_.s_kv, cudnn::kDataBoolean);
    Pointwise(cudnn::kPointwiseCmpGe, row, col, nullptr, keep,
              cudnn::kDataBoolean);
    void* masked = Scores(d_.s_q, d_.s_kv);
    Pointwise(cudnn::kPointwiseBinarySelect, scaled, neg_inf, keep, masked);
    return masked;
  }

  // The keep mask of dropout with probability `p`: Bernoulli(1 - p) of
  // the scores' shape in float32 from cuDNN's Philox generator at the bound
  // int64 (seed, offset) (the frontend's rng node; the backward draws the
  // same mask from the same pair).
  void* DropoutMask(double p) {
    // The pair is one int64 [2] buffer: the offset is 8 bytes in.
    void* seed = Bound(kSeed, cudnn::kDataInt64, {1, 1, 1, 1}, {1, 1, 1, 1},
                       /*alignment=*/8);
    void* offset = Bound(kOffset, cudnn::kDataInt64, {1, 1, 1, 1}, {1, 1, 1, 1},
                         /*alignment=*/8);
    void* rng = b_.Make(cudnn::kRngDescriptor);
    const int distribution = cudnn::kRngBernoulli;
    b_.Set(rng, cudnn::kAttrRngDistribution, cudnn::kTypeRngDistribution, 1,
           &distribution);
    const double keep = 1.0 - p;
    b_.Set(rng, cudnn::kAttrRngBernoulliProbability, cudnn::kTypeDouble, 1,
           &keep);
    b_.Finalize(rng, "rng");
    void* mask = Scores(d_.s_q, d_.s_kv);
    void* op = b_.Make(cudnn::kOperationRngDescriptor);
    b_.SetDesc(op, cudnn::kAttrOperationRngY, mask);
    b_.SetDesc(op, cudnn::kAttrOperationRngDesc, rng);
    b_.SetDesc(op, cudnn::kAttrOperationRngSeed, seed);
    b_.SetDesc(op, cudnn::kAttrOperationRngOffset, offset);
    b_.Finalize(op, "rng operation");
    ops_.push_back(op);
    return mask;
  }

  // The finalized operation graph (null after a failure).
  void* Finish(cudnn::Handle handle) {
    void* graph = b_.Make(cudnn::kOperationGraphDescriptor);
    b_.Set(graph, cudnn::kAttrOperationGraphHandle, cudnn::kTypeHandle, 1,
           &handle);
    b_.Set(graph, cudnn::kAttrOperationGraphOps, cudnn::kTypeBackendDescriptor,
           static_cast<int64_t>(ops_.size()), ops_.data());
    b_.Finalize(graph, "attention operation graph");
    return b_.ok() ? graph : nullptr;
  }

  const AttentionDims& dims() const { return d_; }
  int io() const { return io_; }

 private:
  CudnnGraphBuilder b_;
  AttentionDims d_;
  int io_;
  int64_t alignment_;  // of the bound tensors' addresses
  int64_t next_virtual_ = kFirstVirtual;
  std::vector<void*> ops_;
};

// K [B, H, Skv, D] as the K^T [B, H, D, Skv] the first product reads.
std::vector<int64_t> TransposedSizes(int64_t b, int64_t h, int64_t rows,
                                     int64_t cols) {
  return {b, h, cols, rows};
}
std::vector<int64_t> TransposedStrides(int64_t h, int64_t rows, int64_t cols) {
  return {h * rows * cols, rows * cols, 1, cols};
}

// The bias's sizes: [B or 1, H or 1, Sq, Skv].
std::vector<int64_t> BiasSizes(const AttentionDims& d,
                               const AttentionOptions& o) {
  return {o.bias_batch ? d.batch : 1, o.bias_heads ? d.heads : 1, d.s_q,
          d.s_kv};
}

// The bias tensor, when the call has one.
void* BiasTensor(AttentionGraph& g, const AttentionOptions& o) {
  if (!o.bias) return nullptr;
  return g.Bound(kBias, g.io(), BiasSizes(g.dims(), o));
}

void BuildForward(AttentionGraph& g, const AttentionOptions& o) {
  const bool causal = o.causal;
  const AttentionDims& d = g.dims();
  const int io = g.io();
  void* q = g.Bound(kQ, io, {d.batch, d.heads, d.s_q, d.d_qk});
  void* kt = g.Bound(kK, io, TransposedSizes(d.batch, d.heads, d.s_kv, d.d_qk),
                     TransposedStrides(d.heads, d.s_kv, d.d_qk));
  void* v = g.Bound(kV, io, {d.batch, d.heads, d.s_kv, d.d_v});
  void* out = g.Bound(kOut, io, {d.batch, d.heads, d.s_q, d.d_v});
  void* stats =
      g.Bound(kStats, cudnn::kDataFloat, g.RowSizes(), g.RowStrides());
  void* scale = g.Scalar(kScale);
  void* neg_inf = causal ? g.Scalar(kNegInf) : nullptr;
  void* bias = BiasTensor(g, o);

  void* s = g.Scores(d.s_q, d.s_kv);
  g.Matmul(q, kt, s);
  void* masked = g.ScaleAndMask(s, scale, bias, neg_inf, causal);
  // Softmax with its statistics (the frontend's softmax node).
  void* max = g.Rows();
  g.Reduce(cudnn::kReduceMax, masked, max);
  void* shifted = g.Scores(d.s_q, d.s_kv);
  g.Pointwise(cudnn::kPointwiseSub, masked, max, nullptr, shifted);
  void* e = g.Scores(d.s_q, d.s_kv);
  g.Pointwise(cudnn::kPointwiseExp, shifted, nullptr, nullptr, e);
  void* sum = g.Rows();
  g.Reduce(cudnn::kReduceAdd, e, sum);
  void* log_sum = g.Rows();
  g.Pointwise(cudnn::kPointwiseLog, sum, nullptr, nullptr, log_sum);
  g.Pointwise(cudnn::kPointwiseAdd, max, log_sum, nullptr, stats);
  if (o.dropout <= 0) {
    void* p = g.Scores(d.s_q, d.s_kv, io);  // rounded to the inputs' dtype
    g.Pointwise(cudnn::kPointwiseDiv, e, sum, nullptr, p);
    g.Matmul(p, v, out);
    return;
  }
  // Dropout: p * keep / (1 - dropout), then rounded.
  void* p = g.Scores(d.s_q, d.s_kv);
  g.Pointwise(cudnn::kPointwiseDiv, e, sum, nullptr, p);
  void* kept = g.Scores(d.s_q, d.s_kv);
  g.Pointwise(cudnn::kPointwiseMul, p, g.DropoutMask(o.dropout), nullptr, kept);
  void* dropped = g.Scores(d.s_q, d.s_kv, io);
  g.Pointwise(cudnn::kPointwiseMul, kept, g.Scalar(kDropoutScale), nullptr,
              dropped);
  g.Matmul(dropped, v, out);
}

void BuildBackward(AttentionGraph& g, const AttentionOptions& o) {
  const bool causal = o.causal;
  const AttentionDims& d = g.dims();
  const int io = g.io();
  const int f32 = cudnn::kDataFloat;
  void* q = g.Bound(kQ, io, {d.batch, d.heads, d.s_q, d.d_qk});
  void* kt = g.Bound(kK, io, TransposedSizes(d.batch, d.heads, d.s_kv, d.d_qk),
                     TransposedStrides(d.heads, d.s_kv, d.d_qk));
  void* vt = g.Bound(kV, io, TransposedSizes(d.batch, d.heads, d.s_kv, d.d_v),
                     TransposedStrides(d.heads, d.s_kv, d.d_v));
  void* out = g.Bound(kOut, io, {d.batch, d.heads, d.s_q, d.d_v});
  void* stats = g.Bound(kStats, f32, g.RowSizes(), g.RowStrides());
  void* dout = g.Bound(kGradOut, io, {d.batch, d.heads, d.s_q, d.d_v});
  void* dq = g.Bound(kGradQ, io, {d.batch, d.heads, d.s_q, d.d_qk});
  void* dk = g.Bound(kGradK, io, {d.batch, d.heads, d.s_kv, d.d_qk});
  void* dv = g.Bound(kGradV, io, {d.batch, d.heads, d.s_kv, d.d_v});
  void* softmax_sum = g.Bound(kSoftmaxSum, f32, g.RowSizes(), g.RowStrides());
  void* dq_accum = o.bias_grad ? nullptr
                               : g.Bound(kGradQAccum, f32,
                                         {d.batch, d.heads, d.s_q, d.d_qk});
  void* scale = g.Scalar(kScale);
  void* neg_inf = causal ? g.Scalar(kNegInf) : nullptr;
  void* bias = BiasTensor(g, o);
  const bool dropout = o.dropout > 0;
  void* mask = dropout ? g.DropoutMask(o.dropout) : nullptr;
  void* dropout_scale = dropout ? g.Scalar(kDropoutScale) : nullptr;

  // softmax_sum = rowsum(grad_out * out) (times 1 - dropout: the
  // gradient of the kept probabilities carries 1 / (1 - dropout)).
  void* prod =
      g.Virtual(f32, {d.batch, d.heads, d.s_q, d.d_v},
                {d.heads * d.s_q * d.d_v, d.s_q * d.d_v, d.heads * d.d_v, 1});
  g.Pointwise(cudnn::kPointwiseMul, dout, out, nullptr, prod);
  void* rowsum = g.Rows();
  g.Reduce(cudnn::kReduceAdd, prod, rowsum);
  g.Pointwise(cudnn::kPointwiseMul, rowsum,
              g.Scalar(dropout ? kDropoutScaleInv : kOne), nullptr,
              softmax_sum);

  // p = exp(scale * q @ k^T (masked) - stats); grad_v = p^T @ grad_out
  // (of p * keep / (1 - dropout) with dropout).
  void* s = g.Scores(d.s_q, d.s_kv);
  g.Matmul(q, kt, s);
  void* masked = g.ScaleAndMask(s, scale, bias, neg_inf, causal);
  void* shifted = g.Scores(d.s_q, d.s_kv);
  g.Pointwise(cudnn::kPointwiseSub, masked, stats, nullptr, shifted);
  void* p = g.Scores(d.s_q, d.s_kv);
  g.Pointwise(cudnn::kPointwiseExp, shifted, nullptr, nullptr, p);
  void* dropped = p;
  if (dropout) {
    void* kept = g.Scores(d.s_q, d.s_kv);
    g.Pointwise(cudnn::kPointwiseMul, p, mask, nullptr, kept);
    dropped = g.Scores(d.s_q, d.s_kv);
    g.Pointwise(cudnn::kPointwiseMul, kept, dropout_scale, nullptr, dropped);
  }
  void* pt = g.Virtual(io, TransposedSizes(d.batch, d.heads, d.s_q, d.s_kv),
                       TransposedStrides(d.heads, d.s_q, d.s_kv));
  g.Reshape(dropped, pt);
  g.Matmul(pt, dout, dv);

  // ds = p * (grad_out @ v^T - softmax_sum) * scale; with dropout
  // p * ((grad_out @ v^T) * keep - softmax_sum) / (1 - dropout) * scale.
  void* dp = g.Scores(d.s_q, d.s_kv);
  g.Matmul(dout, vt, dp);
  if (dropout) {
    void* dp_kept = g.Scores(d.s_q, d.s_kv);
    g.Pointwise(cudnn::kPointwiseMul, dp, mask, nullptr, dp_kept);
    dp = dp_kept;
  }
  void* centered = g.Scores(d.s_q, d.s_kv);
  g.Pointwise(cudnn::kPointwiseSub, dp, softmax_sum, nullptr, centered);
  void* weighted = g.Scores(d.s_q, d.s_kv);
  g.Pointwise(cudnn::kPointwiseMul, centered, p, nullptr, weighted);
  if (dropout) {
    void* rescaled = g.Scores(d.s_q, d.s_kv);
    g.Pointwise(cudnn::kPointwiseMul, weighted, dropout_scale, nullptr,
                rescaled);
    weighted = rescaled;
  }
  // The bias's gradient: the scores' gradient before the scale, summed
  // over the dims where the bias broadcasts (the frontend's dBias
  // reduction, written in the inputs' dtype).
  if (o.bias_grad) {
    g.Reduce(cudnn::kReduceAdd, weighted,
             g.Bound(kGradBias, io, BiasSizes(d, o)));
  }
  void* ds = g.Scores(d.s_q, d.s_kv);
  g.Pointwise(cudnn::kPointwiseMul, weighted, scale, nullptr, ds);

  // grad_k = ds^T @ q; grad_q = ds @ k (through float32).
  void* dst = g.Virtual(io, TransposedSizes(d.batch, d.heads, d.s_q, d.s_kv),
                        TransposedStrides(d.heads, d.s_q, d.s_kv));
  g.Reshape(ds, dst);
  g.Matmul(dst, q, dk);
  void* k = g.Virtual(io, {d.batch, d.heads, d.s_kv, d.d_qk});
  g.Reshape(kt, k);
  if (o.bias_grad) {
    // cuDNN gives dBias only in the engines that keep dS in the workspace,
    // which write grad_q directly (the frontend's use_dp_workspace): the
    // float32 form below matched an engine that left dBias unwritten
    // (CudaGpu.CudnnAttentionBiasGradient).
    g.Matmul(ds, k, dq);
    return;
  }
  g.Matmul(ds, k, dq_accum);
  g.Pointwise(cudnn::kPointwiseIdentity, dq_accum, nullptr, nullptr, dq);
}

}  // namespace

// One call's execution plan, the descriptors it was made from, and the
// host scalars its variant pack points at.
struct CudaAttention::Plan {
  Direction direction = Direction::kForward;
  bool causal = false;
  bool bias = false;
  bool bias_grad = false;
  std::vector<CudnnDescriptor> descriptors;
  CudnnDescriptor plan;
  size_t library_workspace = 0;   // the plan's own, at the workspace start
  size_t softmax_sum_offset = 0;  // backward: its float32 tensors after it
  size_t grad_q_accum_offset = 0;
  size_t workspace_bytes = 0;
  float scale = 1.0f, neg_inf = 0.0f, one = 1.0f;
  bool dropout = false;
  float dropout_scale = 1.0f, dropout_scale_inv = 1.0f;
  // Guarded by the handle's run_mu.
  mutable CudnnVariantPack pack;
};

absl::StatusOr<std::unique_ptr<CudaAttention>> CudaAttention::Create(
    cuda::Context context) {
  absl::StatusOr<const CudnnLibrary*> lib = CudnnLibrary::Get();
  if (!lib.ok()) return lib.status();
  absl::StatusOr<std::shared_ptr<CudnnHandle>> handle =
      SharedCudnnHandle(*lib, context);
  if (!handle.ok()) return handle.status();
  return std::unique_ptr<CudaAttention>(
      new CudaAttention(*lib, *std::move(handle)));
}

CudaAttention::~CudaAttention() {
  absl::MutexLock lock(&mu_);
  plans_.clear();
}

const std::string& CudaAttention::library() const { return lib_->name(); }
size_t CudaAttention::version() const { return lib_->version(); }

absl::StatusOr<CudaAttention::Prepared> CudaAttention::Prepare(
    int step, Direction direction, DType dtype, const AttentionDims& d,
    const AttentionOptions& options) const {
  const bool causal = options.causal;
  const float scale = options.scale;
  if (dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuDNN's fused attention takes float16 or bfloat16, not ",
                     DTypeName(dtype)));
  }
  if (!(options.dropout >= 0 && options.dropout < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention's dropout must be in [0, 1), not ", options.dropout));
  }
  if (d.batch <= 0 || d.heads <= 0 || d.s_q <= 0 || d.s_kv <= 0 ||
      d.d_qk <= 0 || d.d_v <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuDNN's fused attention takes no empty tensor (batch ", d.batch,
        ", heads ", d.heads, ", queries ", d.s_q, ", keys ", d.s_kv,
        ", head dims ", d.d_qk, " and ", d.d_v, ")"));
  }
  if (options.bias_grad &&
      (direction != Direction::kBackward || !options.bias)) {
    return absl::InvalidArgumentError(
        "only an attention backward with a bias gives the bias's gradient");
  }
  if (direction == Direction::kBackward && lib_->version() < 90600) {
    return absl::UnimplementedError(absl::StrCat(
        "Kiln's fused attention backward needs cuDNN 9.6 or later; ",
        lib_->name(), " is ", lib_->version()));
  }
  std::string key;
  {
    const int64_t values[] = {step,
                              static_cast<int64_t>(direction),
                              static_cast<int64_t>(dtype),
                              causal,
                              options.bias,
                              options.bias_batch,
                              options.bias_heads,
                              options.bias_grad,
                              options.alignment,
                              d.batch,
                              d.heads,
                              d.s_q,
                              d.s_kv,
                              d.d_qk,
                              d.d_v};
    key.assign(reinterpret_cast<const char*>(values), sizeof(values));
    key.append(reinterpret_cast<const char*>(&scale), sizeof(scale));
    key.append(reinterpret_cast<const char*>(&options.dropout),
               sizeof(options.dropout));
  }
  {
    absl::MutexLock lock(&mu_);
    if (auto it = plans_.find(key); it != plans_.end())
      return Prepared{it->second, it->second->workspace_bytes};
  }

  absl::MutexLock run_lock(&handle_->run_mu);
  AttentionGraph g(lib_, d, CudnnDataType(dtype), options.alignment);
  if (direction == Direction::kForward) {
    BuildForward(g, options);
  } else {
    BuildBackward(g, options);
  }
  void* graph = g.Finish(handle_->handle);
  if (graph == nullptr) return g.builder().status();
  absl::StatusOr<CudnnPlans> found = FinalizeCudnnPlans(
      *lib_, handle_->handle, graph,
      [](absl::Span<const int>) { return false; }, /*wanted=*/1);
  if (!found.ok()) return found.status();
  if (found->plans.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "cuDNN ", lib_->version(), " has no engine for this ", DTypeName(dtype),
        causal ? " causal" : "", options.bias_grad ? " bias-gradient" : "",
        " attention ",
        direction == Direction::kForward ? "forward" : "backward", " (batch ",
        d.batch, ", heads ", d.heads, ", queries ", d.s_q, ", keys ", d.s_kv,
        ", head dims ", d.d_qk, " and ", d.d_v, ")",
        found->rejected.empty() ? "" : "; the first rejected: ",
        found->rejected));
  }
  auto plan = std::make_shared<Plan>();
  plan->direction = direction;
  plan->causal = causal;
  plan->bias = options.bias;
  plan->bias_grad = options.bias_grad;
  plan->dropout = options.dropout > 0;
  plan->dropout_scale = 1.0f / (1.0f - options.dropout);
  plan->dropout_scale_inv = 1.0f - options.dropout;
  plan->plan = std::move(found->plans[0]);
  plan->descriptors = std::move(found->keep);
  for (CudnnDescriptor& keep : g.builder().Release())
    plan->descriptors.push_back(std::move(keep));
  plan->scale = scale;
  // Older cuDNN prefers the lowest float to -inf for masked scores (as the
  // frontend does).
  plan->neg_inf = lib_->version() < 91000
                      ? std::numeric_limits<float>::lowest()
                      : -std::numeric_limits<float>::infinity();
  plan->library_workspace = AlignUp(found->workspace_bytes);
  size_t bytes = plan->library_workspace;
  if (direction == Direction::kBackward) {
    plan->softmax_sum_offset = bytes;
    bytes += AlignUp(sizeof(float) * d.batch * d.heads * d.s_q);
    if (!options.bias_grad) {
      plan->grad_q_accum_offset = bytes;
      bytes += AlignUp(sizeof(float) * d.batch * d.heads * d.s_q * d.d_qk);
    }
  }
  // cuDNN takes no null workspace, even for a plan that needs none.
  plan->workspace_bytes = std::max(bytes, kWorkspaceAlign);
  std::shared_ptr<const Plan> made = std::move(plan);
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = plans_.try_emplace(key, made);
  return Prepared{it->second, it->second->workspace_bytes};
}

absl::Status CudaAttention::Run(const Prepared& prepared,
                                absl::Span<const cuda::DevicePtr> buffers,
                                cuda::DevicePtr workspace,
                                cuda::Stream stream) const {
  const Plan& p = *prepared.plan;
  const bool forward = p.direction == Direction::kForward;
  const size_t want = (forward ? kForwardBuffers : kBackwardBuffers) +
                      (p.bias ? 1 : 0) + (p.bias_grad ? 1 : 0) +
                      (p.dropout ? 1 : 0);
  if (buffers.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention ", forward ? "forward" : "backward", " takes ",
                     want, " buffers, not ", buffers.size()));
  }
  auto ptr = [](cuda::DevicePtr a) { return reinterpret_cast<void*>(a); };
  // Run's order (the reads, then the writes): q k v [bias] [out stats
  // grad_out] [rng] then out stats or grad_q grad_k grad_v [grad_bias]; then
  // the host
  // scalars and the workspace tensors: at most 20, no heap.
  absl::InlinedVector<int64_t, 20> uids = {kQ, kK, kV};
  if (p.bias) uids.push_back(kBias);
  if (!forward) uids.insert(uids.end(), {kOut, kStats, kGradOut});
  const size_t rng = p.dropout ? uids.size() : want;
  if (p.dropout) uids.push_back(kSeed);
  if (forward) {
    uids.insert(uids.end(), {kOut, kStats});
  } else {
    uids.insert(uids.end(), {kGradQ, kGradK, kGradV});
    if (p.bias_grad) uids.push_back(kGradBias);
  }
  absl::InlinedVector<void*, 20> pointers;
  for (size_t i = 0; i < want; ++i) pointers.push_back(ptr(buffers[i]));
  if (p.dropout) {
    // (seed, offset): the offset is the buffer's second int64.
    uids.push_back(kOffset);
    pointers.push_back(ptr(buffers[rng] + sizeof(int64_t)));
    uids.push_back(kDropoutScale);
    pointers.push_back(const_cast<float*>(&p.dropout_scale));
    if (!forward) {
      uids.push_back(kDropoutScaleInv);
      pointers.push_back(const_cast<float*>(&p.dropout_scale_inv));
    }
  }
  uids.push_back(kScale);
  pointers.push_back(const_cast<float*>(&p.scale));
  if (p.causal) {
    uids.push_back(kNegInf);
    pointers.push_back(const_cast<float*>(&p.neg_inf));
  }
  if (!forward) {
    // The variant pack binds exactly the graph's tensors (cuDNN refuses
    // one more): with dropout, 1 - dropout scales softmax_sum, not 1.
    if (!p.dropout) {
      uids.push_back(kOne);
      pointers.push_back(const_cast<float*>(&p.one));
    }
    uids.push_back(kSoftmaxSum);
    pointers.push_back(ptr(workspace + p.softmax_sum_offset));
    if (!p.bias_grad) {
      uids.push_back(kGradQAccum);
      pointers.push_back(ptr(workspace + p.grad_q_accum_offset));
    }
  }
  const cudnn::Api& api = lib_->api();
  absl::MutexLock lock(&handle_->run_mu);
  if (absl::Status s = p.pack.Bind(*lib_, uids, pointers, ptr(workspace));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = lib_->Check(api.cudnnSetStream(handle_->handle, stream),
                                   "cudnnSetStream");
      !s.ok()) {
    return s;
  }
  return lib_->Check(
      api.cudnnBackendExecute(handle_->handle, p.plan.get(), p.pack.get()),
      forward ? "cudnnBackendExecute(attention forward)"
              : "cudnnBackendExecute(attention backward)");
}

}  // namespace kiln
