// Runs a CPU artifact: verifies the binary's SHA-256, loads the shared
// object from memory, checks the guards against the actual inputs and
// executes the artifact's program over caller-owned host buffers.
//
// Thread-safety: a loaded CpuExecutable is immutable; Run may be called
// from many threads at once (each call has its own buffers).
#ifndef KILN_CLIENT_CPU_EXECUTABLE_H_
#define KILN_CLIENT_CPU_EXECUTABLE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/cpu_loader.h"
#include "client/guards.h"  // EvaluateSymPoly
#include "client/thread_pool.h"
#include "compiler/host_tensor.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln {

class CpuExecutable {
 public:
  // Errors: DATA_LOSS when the binary's hash does not match (nothing is
  // loaded), FAILED_PRECONDITION for an artifact of another format version
  // or target, NOT_FOUND for a kernel symbol missing from the binary.
  static absl::StatusOr<std::unique_ptr<CpuExecutable>> Load(
      const v1::Artifact& artifact);

  // Checks the guards and runs. Inputs may be strided views (their strides
  // must match the guarded ones). Outputs are new contiguous tensors.
  // Errors: INVALID_ARGUMENT naming the input, dim and the guard it fails.
  // `pool` may be null (run on the calling thread).
  absl::StatusOr<std::vector<HostTensor>> Run(
      absl::Span<const HostTensor> inputs, ThreadPool* pool = nullptr) const;

  // The symbol values the inputs imply, after checking every guard.
  absl::StatusOr<std::vector<int64_t>> CheckGuards(
      absl::Span<const HostTensor> inputs) const;

  const v1::Artifact& artifact() const { return artifact_; }

 private:
  using KernelFn = void (*)(void* const*, const int64_t*, int64_t, int64_t);
  CpuExecutable(v1::Artifact artifact, LoadedLibrary library)
      : artifact_(std::move(artifact)), library_(std::move(library)) {}

  v1::Artifact artifact_;
  LoadedLibrary library_;
  std::vector<KernelFn> kernels_;  // per launch step, in step order
};

}  // namespace kiln

#endif  // KILN_CLIENT_CPU_EXECUTABLE_H_
