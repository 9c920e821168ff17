// cuBLASLt loaded at run time with dlopen, as the CUDA driver is
// (cuda_driver.h): the client library links no CUDA library and builds
// without the toolkit; a machine without cuBLASLt loads every artifact
// without matrix products and fails one with them with a clear
// FAILED_PRECONDITION.
//
//   absl::StatusOr<std::unique_ptr<CudaGemm>> gemm = CudaGemm::Create();
//   (*gemm)->Run(step, DType::kBFloat16, dims, 1.0, 0.0, a, b, c,
//                workspace, CudaGemm::kWorkspaceBytes, stream);
//
// Which library: $KILN_CUBLASLT when set (a path or soname), else
// libcublasLt.so.13, else libcublasLt.so.12. A process that has loaded
// PyTorch's CUDA libraries finds theirs by soname (no second copy).
//
// Kiln's GEMMs are row-major (program_plan.h's GemmDims); cuBLASLt is
// column-major, so C = A @ B is computed as C^T = B^T @ A^T: the library's
// "A" is Kiln's B and its "B" is Kiln's A, each read in place (a transposed
// operand is a transpose flag, never a copy). Data types: float32 (computed
// in float32, or with TF32 inputs when asked), float16 and bfloat16
// (accumulated in float32). Epilogues (bias, ReLU, tanh-GELU, the bias
// gradient) are cuBLASLt's: the bias is a vector along Kiln's n, which is
// the column-major result's rows, as cuBLASLt's bias is.
//
// Thread-safety: CudaGemm::Create may be called from any thread. Run may be
// called concurrently from several threads; concurrent calls on different
// streams must pass different workspaces.
#ifndef KILN_RUNTIME_CUDA_BLASLT_H_
#define KILN_RUNTIME_CUDA_BLASLT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "graph/dtype.h"
#include "kiln/v1/artifact.pb.h"
#include "runtime/cuda_driver.h"
#include "runtime/program_plan.h"

namespace kiln {

class CublasLtLibrary;

// GEMMs on one device: a cuBLASLt handle, and per extern step and shape
// the matrix descriptors and the algorithm chosen for them (cached here,
// outside the artifact: the choice depends on the GPU and the library
// version, not on the graph). CudaExecutable shares one per CUDA context
// among all its executables (runtime/per_context.h): a step index and shape
// that two executables both have is one plan, and a shape timed by one is
// not timed again by the others.
//
// Choosing: the first call of a step and shape asks cuBLASLt's heuristic
// for up to 8 algorithms and, when the call overwrites C (beta 0) and its
// stream is not being captured into a CUDA graph, times them on the call's
// own buffers on `stream` (synchronising it) and keeps the fastest, or the
// heuristic's first unless another is at least 3% faster. That first call
// costs 16 to about 32 products more, about 2–3 ms for small ones
// (cuda_blaslt.cc, FastestAlgorithm); later calls nothing, and the first
// call of another step of the same shape (a model's repeated layers) takes
// the same choice untimed.
// $KILN_GEMM_AUTOTUNE=N times N candidates (0 or 1: the heuristic's first,
// no timing, the same algorithm in every process), and so does a call with
// Options::deterministic (torch.use_deterministic_algorithms(True)).
class CudaGemm {
 public:
  // Workspace each Run may use (cuBLASLt's recommendation for Hopper).
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // Loads the library (once per process) and creates a handle. Call with
  // the executable's CUDA context current. Errors: FAILED_PRECONDITION
  // naming every library tried and why; INTERNAL for a failed handle.
  static absl::StatusOr<std::unique_ptr<CudaGemm>> Create();

  // What a call applies besides the product (artifact.proto, Gemm).
  struct Options {
    // Applied before C is written: bias (n elements of `dtype` at
    // `bias`, added to every row), ReLU, tanh-GELU, or both. NONE: none.
    // BGRAD_B writes B's column sums to `bias` instead (batch 1, alpha 1,
    // beta 0, B row-major: cuBLASLt's BGRADA), BGRAD_A A's row sums (m
    // elements, A column-major: BGRADB).
    v1::Gemm::Epilogue epilogue = v1::Gemm::EPILOGUE_NONE;
    cuda::DevicePtr bias = 0;
    // float32 products may round their inputs to TF32.
    bool tf32 = false;
    // No split-K partial sums reduced in a 16-bit dtype.
    bool strict_reduction = false;
    // The heuristic's first algorithm, never a timed one (the same in
    // every process on one GPU and library).
    bool deterministic = false;
  };

  // Enqueues C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] for
  // i < dims.batch on `stream`, `dtype` being A's, B's and C's (float32,
  // float16, bfloat16), at the offsets, strides and leading dimensions of
  // `dims` (from EvaluateGemm, which has checked them against the buffers).
  // `step` identifies the call within the executable (the cache key). A
  // product over k = 0 writes zeros (beta must be 0, no epilogue), then
  // `options` apply (the bias at dims.bias_offset elements into `bias`).
  // Errors: UNIMPLEMENTED for another dtype, an epilogue over k = 0 or a case
  // cuBLASLt has no algorithm for, INTERNAL for a cuBLASLt failure (with its
  // status string).
  absl::Status Run(int step, DType dtype, const GemmDims& dims, double alpha,
                   double beta, cuda::DevicePtr a, cuda::DevicePtr b,
                   cuda::DevicePtr c, cuda::DevicePtr workspace,
                   size_t workspace_bytes, cuda::Stream stream,
                   const Options& options) const;
  absl::Status Run(int step, DType dtype, const GemmDims& dims, double alpha,
                   double beta, cuda::DevicePtr a, cuda::DevicePtr b,
                   cuda::DevicePtr c, cuda::DevicePtr workspace,
                   size_t workspace_bytes, cuda::Stream stream) const {
    return Run(step, dtype, dims, alpha, beta, a, b, c, workspace,
               workspace_bytes, stream, Options{});
  }

  // The library that was loaded (its path or soname) and its version.
  const std::string& library() const;
  size_t version() const;

  ~CudaGemm();
  CudaGemm(const CudaGemm&) = delete;
  CudaGemm& operator=(const CudaGemm&) = delete;

 private:
  struct Key;
  struct Plan;
  CudaGemm(const CublasLtLibrary* lib, void* handle, int autotune_candidates)
      : lib_(lib), handle_(handle), autotune_candidates_(autotune_candidates) {}
  const Plan* PlanFor(const Key& key) const;

  const CublasLtLibrary* lib_;
  void* handle_;  // cublasLtHandle_t
  const int autotune_candidates_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, std::shared_ptr<const Plan>> plans_
      ABSL_GUARDED_BY(mu_);
  // Per shape (Key::shape()): which of the heuristic's candidates timed
  // fastest, for the other steps of that shape.
  mutable absl::flat_hash_map<std::string, size_t> timed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_BLASLT_H_
