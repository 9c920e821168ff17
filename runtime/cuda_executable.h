// Runs a CUDA artifact: verifies the cubin's SHA-256, loads it from memory
// into a device's primary context, checks the guards against the caller's
// device tensors and enqueues the artifact's program on the caller's
// stream. The driver is loaded at run time (cuda_driver.h): this builds and
// links without CUDA, and Load fails with FAILED_PRECONDITION where there is
// no driver or device.
//
//   CudaLoadOptions options;                  // device 0, own allocator
//   auto exe = CudaExecutable::Load(artifact, options);
//   const int64_t sizes[] = {8, 16}, strides[] = {16, 1};
//   DeviceTensorView x{x_ptr, DType::kFloat32, sizes, strides};
//   auto outputs = (*exe)->Run({x}, stream);  // enqueued, not finished
//
// Kernel ABI (artifact.proto, Launch): kernel(buffer_0 .. buffer_{n-1} as
// device pointers, then every program symbol as int64 in symbol order) on a
// 1-D grid of max(1, ceil(range / items_per_block)) blocks of block_threads
// threads, no dynamic shared memory; a range of 0 launches nothing.
//
// Thread-safety: a loaded CudaExecutable is immutable; Run may be called
// from many threads at once, on the same or different streams (the
// allocator must be thread-safe, as DeviceAllocator requires).
#ifndef KILN_RUNTIME_CUDA_EXECUTABLE_H_
#define KILN_RUNTIME_CUDA_EXECUTABLE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "graph/dtype.h"
#include "kiln/v1/artifact.pb.h"
#include "runtime/cuda_attention.h"
#include "runtime/cuda_blaslt.h"
#include "runtime/cuda_cudnn.h"
#include "runtime/cuda_driver.h"
#include "runtime/device_allocator.h"
#include "runtime/program_plan.h"

namespace kiln {

// An input: device memory the caller owns (a torch.Tensor's data_ptr(),
// dtype, sizes() and strides(), say). Only read during Run's call for its
// metadata; the memory must stay valid until the enqueued work finishes.
struct DeviceTensorView {
  cuda::DevicePtr data = 0;  // the first element (storage offset applied)
  DType dtype = DType::kFloat32;
  absl::Span<const int64_t> sizes;
  absl::Span<const int64_t> strides;  // in elements
};

// An output: a contiguous tensor in memory from the executable's allocator,
// given back to it (stream-ordered, on the stream of the Run that made it)
// when destroyed. Movable, not copyable.
class DeviceTensor {
 public:
  DeviceTensor(DeviceAllocation storage, DType dtype,
               absl::Span<const int64_t> sizes);

  cuda::DevicePtr data() const { return storage_.get(); }
  DType dtype() const { return dtype_; }
  absl::Span<const int64_t> sizes() const { return sizes_; }
  absl::Span<const int64_t> strides() const { return strides_; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const {
    return static_cast<size_t>(numel_ * DTypeSize(dtype_));
  }
  // A view to pass this tensor as another Run's input.
  DeviceTensorView view() const {
    return DeviceTensorView{data(), dtype_, sizes_, strides_};
  }
  // The memory: to name another last-use stream (set_last_use_stream), to
  // free it early (Reset), or to move it out.
  DeviceAllocation& storage() { return storage_; }

 private:
  DeviceAllocation storage_;
  DType dtype_;
  absl::InlinedVector<int64_t, 6> sizes_;
  absl::InlinedVector<int64_t, 6> strides_;
  int64_t numel_ = 0;
};

struct CudaLoadOptions {
  // The device whose primary context the module is loaded into (the context
  // PyTorch's cuda:N uses). Run's stream must belong to it.
  int device_ordinal = 0;
  // Where outputs and intermediates come from. Null: a new
  // CachingDeviceAllocator for the device, owned by this executable; pass
  // one allocator to many executables to share its cache.
  std::shared_ptr<DeviceAllocator> allocator;
};

class CudaExecutable {
 public:
  // Checks the artifact (format version, a CUDA target and binary, the
  // SHA-256 of the cubin, a well-formed program), in that order and before
  // touching the driver; then loads the cubin (or NUL-terminated PTX) from
  // memory with cuModuleLoadData and resolves every launched kernel.
  //
  // Errors: FAILED_PRECONDITION for another format version, a non-CUDA
  // target or binary, an arch this device cannot run ("built for sm_90,
  // device 0 is sm_80"), a block size above the kernel's limit, no driver or
  // device (see cuda::Driver::Get); DATA_LOSS when the binary's hash does
  // not match (nothing is loaded); INVALID_ARGUMENT naming the step or
  // buffer of a malformed program; NOT_FOUND naming a kernel missing from
  // the binary; the driver's status for a binary it rejects.
  static absl::StatusOr<std::unique_ptr<CudaExecutable>> Load(
      const v1::Artifact& artifact, const CudaLoadOptions& options = {});

  CudaExecutable(const CudaExecutable&) = delete;
  CudaExecutable& operator=(const CudaExecutable&) = delete;
  ~CudaExecutable();

  // Checks the guards, allocates the outputs and temporaries from the
  // allocator for `stream`, and enqueues every step of the program on
  // `stream` (a CUstream / cudaStream_t of this device; nullptr is the
  // legacy default stream). Returns as soon as the work is enqueued, never
  // synchronising: the outputs are ready when `stream` reaches this point.
  // Temporaries are freed stream-ordered as the program says. Makes the
  // executable's context current for the call and restores the caller's.
  //
  // Inputs may be strided views (their strides must match the guarded
  // ones). Outputs are new contiguous tensors.
  //
  // Errors: INVALID_ARGUMENT naming the input, dim and the guard it fails
  // (dtype, rank, size, stride, symbol bounds, data pointer alignment), or a
  // grid larger than the device allows; RESOURCE_EXHAUSTED when the
  // allocator runs out of memory; the driver's status when a launch fails
  // (work enqueued before it stays enqueued; memory is still freed in
  // stream order).
  //
  // Out-of-range indices (artifact.proto, IndexCheck) are PyTorch's
  // device-side assert made a status, asynchronous like it: the kernels
  // clamp every index (never reading outside a buffer) and record the first
  // violation in this executable's error word in device memory, which each
  // Run copies, stream-ordered and without synchronising, into pinned host
  // memory after its last step. A later Run that finds a violation there
  // fails with OUT_OF_RANGE ("node 7 (aten.embedding.default): index 50300
  // is out of range for dimension 0 of size 50257") before enqueuing
  // anything, and clears the word (stream-ordered), so the call after it
  // runs normally. To learn about a run's indices without another Run,
  // call CheckIndexErrors. Runs in flight on other streams may make one
  // violation be reported twice, or by a Run on another stream.
  absl::StatusOr<std::vector<DeviceTensor>> Run(
      absl::Span<const DeviceTensorView> inputs, cuda::Stream stream) const;

  // Run into caller memory: as Run, but output o is written into
  // outputs[o] (a contiguous tensor of the output's dtype and of the sizes
  // the inputs imply, e.g. from PyTorch's allocator on `stream`) instead of
  // new memory; nothing is allocated but temporaries. Errors: as Run, and
  // INVALID_ARGUMENT naming the output whose count, dtype, sizes, strides
  // or data pointer differ; FAILED_PRECONDITION when the program's buffer
  // for an output is larger than the output (use Run). Nothing is enqueued
  // on error.
  absl::Status RunInto(absl::Span<const DeviceTensorView> inputs,
                       absl::Span<const DeviceTensorView> outputs,
                       cuda::Stream stream) const;

  // OUT_OF_RANGE (and clears it) when a Run read an index out of range and
  // its error word has reached the host; with `synchronize`, first waits
  // for `stream` (cuStreamSynchronize), so every Run enqueued on it before
  // is accounted for. OK for a program that reads no index from data.
  absl::Status CheckIndexErrors(cuda::Stream stream, bool synchronize) const;

  const v1::Artifact& artifact() const { return artifact_; }
  const std::shared_ptr<DeviceAllocator>& allocator() const {
    return allocator_;
  }
  int device_ordinal() const { return device_ordinal_; }

 private:
  CudaExecutable() = default;
  // Loads the module and resolves the launches' functions.
  absl::Status LoadModule(const CudaLoadOptions& options);

  v1::Artifact artifact_;
  int device_ordinal_ = 0;
  const cuda::Driver* driver_ = nullptr;
  std::optional<cuda::PrimaryContext> context_;
  std::optional<cuda::Module> module_;  // unloaded before the context
  std::shared_ptr<DeviceAllocator> allocator_;
  int64_t max_grid_x_ = 0;

  // The checked program (runtime/program_plan.h), so that Run only
  // evaluates sizes; pointers into artifact_.
  ProgramPlan plan_;
  std::vector<cuda::Function> functions_;  // per launch, in plan_ order
  // The index checks' error word (int64[3]) in device memory, sticky until
  // a Run or CheckIndexErrors reports it, and its pinned host mirror; 0 and
  // null when the program checks no index.
  cuda::DevicePtr error_word_ = 0;
  int64_t* error_mirror_ = nullptr;
  // Checks the inputs against the guards; writes the symbols' values.
  absl::Status CheckGuards(absl::Span<const DeviceTensorView> inputs,
                           absl::Span<int64_t> symbols) const;
  // The program over inputs and output memory whose guards passed, with
  // the executable's context current: temporaries, launches, extern calls
  // and the error word's copy, enqueued on `stream`. The launches pass
  // `symbols` by address.
  absl::Status Execute(absl::Span<int64_t> symbols,
                       absl::Span<const DeviceTensorView> inputs,
                       absl::Span<const cuda::DevicePtr> output_data,
                       cuda::Stream stream) const;
  // Reports and clears the mirror's violation (the device word's clear is
  // enqueued on `stream`); the executable's context must be current.
  absl::Status TakeIndexError(cuda::Stream stream) const;
  // Convolution extern step `step` (plan_.externs[step] is `e`) for the
  // symbol values, buffer addresses and element counts of a Run: cuDNN's
  // call with a workspace from the allocator, or zeros when a tensor is
  // empty. The executable's context must be current.
  absl::Status RunConv(int step, const ProgramPlan::Extern& e,
                       absl::Span<const int64_t> symbols,
                       absl::Span<const int64_t> elements,
                       absl::Span<const cuda::DevicePtr> buffers,
                       cuda::Stream stream) const;
  // Attention extern step `step` (plan_.externs[step] is `e`), as RunConv:
  // cuDNN's fused attention with a workspace from the allocator.
  absl::Status RunAttention(int step, const ProgramPlan::Extern& e,
                            absl::Span<const int64_t> symbols,
                            absl::Span<const int64_t> elements,
                            absl::Span<const cuda::DevicePtr> buffers,
                            cuda::Stream stream) const;
  // cuBLASLt and cuDNN for the extern calls (null when the program makes
  // no GEMM, no convolution, no attention).
  // The GEMM object (handle, plans, timed choices) is the context's, shared
  // by every executable on it (runtime/per_context.h); the convolutions'
  // plans are this executable's, over the context's shared cuDNN handle.
  std::shared_ptr<CudaGemm> gemm_;
  std::unique_ptr<CudaConv> conv_;
  std::unique_ptr<CudaAttention> attention_;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_EXECUTABLE_H_
