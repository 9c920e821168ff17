// Fused scaled-dot-product attention on CUDA through cuDNN's backend
// (graph) API, forward and backward, as PyTorch's cuDNN attention and
// cuDNN's frontend build it: one operation graph per direction that cuDNN
// matches to its fused flash-attention engines (the scores are never
// written to memory). cuDNN is loaded at run time (runtime/cudnn_graph.h);
// a machine without it fails such an artifact with FAILED_PRECONDITION.
//
//   absl::StatusOr<std::unique_ptr<CudaAttention>> a = CudaAttention::Create();
//   absl::StatusOr<CudaAttention::Prepared> p = (*a)->Prepare(
//       step, CudaAttention::Direction::kForward, DType::kBFloat16, dims,
//       {.causal = true, .scale = 0.125f});
//   ... allocate p->workspace_bytes ...
//   (*a)->Run(*p, {q, k, v, out, stats}, workspace, stream);
//
// Semantics, with every tensor contiguous (row-major) and of `dtype`
// except stats (float32):
//   q [B, H, Sq, D], k [B, H, Skv, D], v [B, H, Skv, Dv]
//   s = scale * q @ k^T (+ bias, an additive mask of `dtype`
//       [B or 1, H or 1, Sq, Skv], broadcast over the dims of size 1),
//       masked to -inf where the key is after the query (causal: column
//       j > row i, PyTorch's is_causal), in float32
//   stats [B, H, Sq] = logsumexp(s) over the keys (natural log)
//   out [B, H, Sq, Dv] = softmax(s) @ v, the probabilities rounded to
//       `dtype` before the product, accumulating in float32
// Backward takes q, k, v (the bias), out, stats and grad_out and writes
// grad_q, grad_k, grad_v (the products accumulate in float32; grad_q
// through a float32 buffer in the workspace, which cuDNN 9.6 and later
// initialise themselves: the backward needs 9.6; with bias_grad, cuDNN's
// engines that keep the scores' gradient in their workspace write grad_q
// directly), and with bias_grad the
// bias's gradient in the bias's shape and `dtype`: the scores' gradient
// p * (dp - rowsum(grad_out * out)) before the scale (dp with the keep
// mask over 1 - dropout under dropout), summed in float32 over the batch
// and heads dims where the bias has size 1 (cuDNN's dBias).
//
// cuDNN's fused engines take float16 and bfloat16, head dims that are
// multiples of 8 up to 128 (256 on newer versions and GPUs); Prepare says
// UNIMPLEMENTED where cuDNN has no engine for a case.
//
// Thread-safety: as CudaConv (runtime/cuda_cudnn.h): any thread; the
// context's cuDNN handle is shared with its convolutions and Run serializes
// enqueueing on it.
#ifndef KILN_RUNTIME_CUDA_ATTENTION_H_
#define KILN_RUNTIME_CUDA_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "graph/dtype.h"
#include "runtime/cuda_driver.h"
#include "runtime/program_plan.h"

namespace kiln {

class CudnnLibrary;
struct CudnnHandle;

// What one attention call computes besides its sizes.
struct AttentionOptions {
  bool causal = false;
  float scale = 1.0f;
  bool bias = false;        // an additive bias is the buffer after v
  bool bias_batch = false;  // its first dim is B (else 1)
  bool bias_heads = false;  // its second dim is H (else 1)
  // Dropout on the probabilities, in [0, 1): with dropout > 0 an int64 [2]
  // buffer (seed, offset) follows the reads, and cuDNN's Philox generator
  // draws the keep mask from it (the backward draws the same mask from the
  // same pair).
  float dropout = 0.0f;
  // Backward with a bias only: also writes the bias's gradient, the
  // buffer after grad_v. cuDNN may have no engine for some bias shapes
  // (Prepare then says UNIMPLEMENTED).
  bool bias_grad = false;
  // A power of two up to 16 that divides every buffer's address (cuDNN's
  // flash engines want 16; a smaller one may leave no engine).
  int64_t alignment = 16;
};

class CudaAttention {
 public:
  // Loads cuDNN (once per process) and takes `context`'s cuDNN handle
  // (shared with the context's convolutions), or with a null context a
  // handle of its own. Call with that context current. Errors:
  // FAILED_PRECONDITION when cuDNN cannot be loaded; INTERNAL for a failed
  // handle.
  static absl::StatusOr<std::unique_ptr<CudaAttention>> Create(
      cuda::Context context = nullptr);

  enum class Direction { kForward, kBackward };
  // The buffers Run takes, in order, the reads then the writes (with a
  // bias, it follows v; with dropout, the (seed, offset) buffer follows the
  // reads; with bias_grad, the bias's gradient follows grad_v):
  static constexpr int kForwardBuffers = 5;   // q k v | out stats
  static constexpr int kBackwardBuffers = 9;  // q k v out stats grad_out |
                                              // grad_q grad_k grad_v

  struct Plan;
  // A call ready to run: its plan and the workspace it needs (at least
  // 256 bytes: cuDNN takes no null workspace).
  struct Prepared {
    std::shared_ptr<const Plan> plan;
    size_t workspace_bytes = 0;
  };

  // The execution plan for extern step `step` (the cache key, with the
  // rest of the arguments), made and cached on the first call for a shape.
  // Errors: INVALID_ARGUMENT for an empty shape, a dtype other than
  // float16/bfloat16, a dropout outside [0, 1) or bias_grad without a
  // backward with a bias; UNIMPLEMENTED for a backward
  // with cuDNN before 9.6, or when cuDNN has no engine for the case (with the
  // first rejection); INTERNAL for a cuDNN failure.
  absl::StatusOr<Prepared> Prepare(int step, Direction direction, DType dtype,
                                   const AttentionDims& dims,
                                   const AttentionOptions& options) const;

  // Enqueues the call on `stream`. `buffers` are kForwardBuffers or
  // kBackwardBuffers device addresses (one more with a bias; aligned as
  // options.alignment promised) in the order above; `workspace` holds at least
  // prepared.workspace_bytes (256-byte aligned). Errors: INVALID_ARGUMENT for
  // the wrong number of buffers; INTERNAL for a cuDNN failure.
  absl::Status Run(const Prepared& prepared,
                   absl::Span<const cuda::DevicePtr> buffers,
                   cuda::DevicePtr workspace, cuda::Stream stream) const;

  // The library that was loaded (its path or soname) and its version.
  const std::string& library() const;
  size_t version() const;

  ~CudaAttention();
  CudaAttention(const CudaAttention&) = delete;
  CudaAttention& operator=(const CudaAttention&) = delete;

 private:
  CudaAttention(const CudnnLibrary* lib, std::shared_ptr<CudnnHandle> handle)
      : lib_(lib), handle_(std::move(handle)) {}

  const CudnnLibrary* lib_;
  std::shared_ptr<CudnnHandle> handle_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, std::shared_ptr<const Plan>> plans_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_ATTENTION_H_
