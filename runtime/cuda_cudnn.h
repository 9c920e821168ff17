// cuDNN loaded at run time with dlopen, as cuBLASLt is (cuda_blaslt.h):
// the client library links no CUDA library and builds without the toolkit;
// a machine without cuDNN loads every artifact without convolutions and
// fails one with them with a clear FAILED_PRECONDITION.
//
//   absl::StatusOr<std::unique_ptr<CudaConv>> conv = CudaConv::Create();
//   absl::StatusOr<CudaConv::Prepared> p =
//       (*conv)->Prepare(step, conv_step, dtype, dims, /*alignment=*/16);
//   ... allocate p->workspace_bytes ...
//   (*conv)->Run(*p, input, weight, output, workspace, stream);
//
// Which library: $KILN_CUDNN when set (a path or soname), else
// libcudnn.so.9. A process that has loaded PyTorch's cuDNN finds it by
// soname (no second copy).
//
// The calls go through cuDNN's backend (graph) API, as PyTorch's do: per
// extern step and shape one operation graph (the convolution over
// NCHW-contiguous tensors, 1-D convolutions as 2-D ones of height 1) and
// one finalized execution plan, made on the first call and cached; each
// call then only binds its pointers (a variant pack) and executes. The
// engine is the first of cuDNN's heuristic ranking (mode INSTANT, then
// FALLBACK) that finalizes and passes PyTorch's filters: no engine that
// down-converts its inputs; for float32 without TF32 none that uses Tensor
// Cores; and when the step asks, none marked non-deterministic. Data types:
// float32, float16 and bfloat16, accumulating in float32.
//
// Thread-safety: Create may be called from any thread; Prepare and Run
// from several threads at once, on one CudaConv or on several of one
// context (a cuDNN handle is bound to one stream at a time, so Run
// serializes its enqueueing with every user of the handle; the work itself
// runs on the caller's stream).
#ifndef KILN_RUNTIME_CUDA_CUDNN_H_
#define KILN_RUNTIME_CUDA_CUDNN_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "graph/dtype.h"
#include "kiln/v1/artifact.pb.h"
#include "runtime/cuda_driver.h"
#include "runtime/program_plan.h"

namespace kiln {

class CudnnLibrary;
struct CudnnHandle;

// One executable's convolutions on one device: the device's cuDNN handle
// (one per CUDA context, shared by the executables on it), and per extern
// step and shape the descriptors and the algorithm chosen for them (cached
// here, outside the artifact: the choice depends on the GPU and the
// library version, not on the graph).
class CudaConv {
 public:
  // Loads the library (once per process) and takes `context`'s cuDNN
  // handle, shared with every CudaConv of that context (made by the first,
  // destroyed with the last; runtime/per_context.h), or with a null
  // context a handle of its own. Call with that context current. Errors:
  // FAILED_PRECONDITION naming every library tried and why; INTERNAL for a
  // failed handle.
  static absl::StatusOr<std::unique_ptr<CudaConv>> Create(
      cuda::Context context = nullptr);

  struct Plan;
  // A call ready to run: its plan and the workspace it needs.
  struct Prepared {
    std::shared_ptr<const Plan> plan;
    size_t workspace_bytes = 0;
  };

  // The execution plan of extern step `step` (the cache key, with the
  // shape, the flags and `alignment`) for `dims` (from EvaluateConv), whose
  // buffers' addresses are all multiples of `alignment` bytes (a power of
  // two up to 16): made and cached on the first call for a shape. No tensor of
  // `dims` may be empty (cuDNN takes none: the caller writes the zeros such a
  // call gives). Errors: INVALID_ARGUMENT for an empty tensor, UNIMPLEMENTED
  // when cuDNN has no engine for the case (none deterministic, when asked),
  // INTERNAL for a cuDNN failure (with its status string).
  absl::StatusOr<Prepared> Prepare(int step, const v1::Convolution& conv,
                                   DType dtype, const ConvDims& dims,
                                   int64_t alignment) const;

  // Enqueues the call on `stream`: `input` and `weight` are the step's
  // operands and `output` the tensor it overwrites (artifact.proto,
  // Convolution), `workspace` at least prepared.workspace_bytes (may be 0
  // when that is 0). Errors: INTERNAL for a cuDNN failure.
  absl::Status Run(const Prepared& prepared, cuda::DevicePtr input,
                   cuda::DevicePtr weight, cuda::DevicePtr output,
                   cuda::DevicePtr workspace, cuda::Stream stream) const;

  // The library that was loaded (its path or soname) and its version.
  const std::string& library() const;
  size_t version() const;

  ~CudaConv();
  CudaConv(const CudaConv&) = delete;
  CudaConv& operator=(const CudaConv&) = delete;

 private:
  CudaConv(const CudnnLibrary* lib, std::shared_ptr<CudnnHandle> handle)
      : lib_(lib), handle_(std::move(handle)) {}

  const CudnnLibrary* lib_;
  // The cuDNN handle and the lock that serializes binding it to a stream,
  // enqueueing on it and making plans (which use it), shared by every
  // CudaConv of the context.
  std::shared_ptr<CudnnHandle> handle_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, std::shared_ptr<const Plan>> plans_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_CUDNN_H_
