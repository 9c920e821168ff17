// Runs a CPU artifact: verifies the binary's SHA-256, loads the shared
// object from memory, checks the guards against the actual inputs and
// executes the artifact's program over caller-owned host buffers.
//
// Thread-safety: a loaded CpuExecutable is immutable; Run may be called
// from many threads at once (each call has its own buffers).
#ifndef KILN_RUNTIME_CPU_EXECUTABLE_H_
#define KILN_RUNTIME_CPU_EXECUTABLE_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "graph/host_tensor.h"
#include "kiln/v1/artifact.pb.h"
#include "runtime/cpu_conv.h"
#include "runtime/cpu_loader.h"
#include "runtime/guards.h"  // EvaluateSymPoly
#include "runtime/program_plan.h"
#include "runtime/thread_pool.h"

namespace kiln {

// A tensor in memory the caller owns, for running without copies
// (CpuExecutable::RunInto): the first element's address (storage offset
// applied), dtype, sizes and strides in elements. Views only point: the
// spans and the memory must outlive the call.
struct HostBufferView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  absl::Span<const int64_t> sizes;
  absl::Span<const int64_t> strides;
};

class CpuExecutable {
 public:
  // Errors: DATA_LOSS when the binary's hash does not match (nothing is
  // loaded), FAILED_PRECONDITION for an artifact of another format version
  // or target, INVALID_ARGUMENT for a program that fails the check shared
  // with the CUDA runtime (program_plan.h; checked before the binary is
  // loaded), NOT_FOUND for a kernel symbol missing from the binary.
  static absl::StatusOr<std::unique_ptr<CpuExecutable>> Load(
      const v1::Artifact& artifact);
  // The same without copying the artifact (its binary is moved out).
  static absl::StatusOr<std::unique_ptr<CpuExecutable>> Load(
      v1::Artifact&& artifact);
  ~CpuExecutable();
  // The same for an artifact whose cpu.shared_object is given apart, as the
  // concatenation of `shared_object` (the received slices of a Lookup,
  // client/raw_lookup.h); `artifact`'s own shared_object is ignored. The
  // pieces are hashed and checked like the bytes Load checks, then loaded,
  // without being joined; they need to live only during the call.
  static absl::StatusOr<std::unique_ptr<CpuExecutable>> LoadFromPieces(
      v1::Artifact artifact, absl::Span<const absl::string_view> shared_object);

  // Checks the guards and runs. Inputs may be strided views (their strides
  // must match the guarded ones). Outputs are new contiguous tensors.
  // Errors: INVALID_ARGUMENT naming the input, dim and the guard it fails;
  // OUT_OF_RANGE naming the node, op, index and size when the program read
  // an index outside its dim (program_plan.h, IndexErrorStatus; the
  // outputs are then not meaningful). `pool` may be null (run on the
  // calling thread).
  absl::StatusOr<std::vector<HostTensor>> Run(
      absl::Span<const HostTensor> inputs, ThreadPool* pool = nullptr) const;

  // Run over caller memory, without copies: checks the inputs' guards, then
  // the outputs against what the program writes (dtype, the sizes the
  // inputs imply, contiguous strides; strides of dims of size 1 are not
  // checked), and runs, writing output o into outputs[o].data. Outputs must
  // not overlap the inputs or each other. Errors: INVALID_ARGUMENT naming
  // the input or output and what is wrong; RESOURCE_EXHAUSTED when a
  // temporary cannot be allocated; OUT_OF_RANGE for an index read out of
  // range, as Run. `pool` may be null.
  absl::Status RunInto(absl::Span<const HostBufferView> inputs,
                       absl::Span<const HostBufferView> outputs,
                       ThreadPool* pool = nullptr) const;

  // The sizes of each output for these inputs (after checking their
  // guards): what RunInto expects its outputs to hold.
  absl::StatusOr<std::vector<std::vector<int64_t>>> OutputSizes(
      absl::Span<const HostBufferView> inputs) const;

  // The symbol values the inputs imply, after checking every guard.
  absl::StatusOr<std::vector<int64_t>> CheckGuards(
      absl::Span<const HostTensor> inputs) const;

  // The artifact it was loaded from, without the binary's bytes
  // (cpu.shared_object is empty: the code lives in the loaded library).
  const v1::Artifact& artifact() const { return artifact_; }

 private:
  using KernelFn = void (*)(void* const*, const int64_t*, int64_t, int64_t);
  CpuExecutable(v1::Artifact artifact, LoadedLibrary library);

  absl::StatusOr<std::vector<int64_t>> CheckViewGuards(
      absl::Span<const HostBufferView> inputs) const;
  std::vector<std::vector<int64_t>> SizesFor(
      absl::Span<const int64_t> symbols) const;
  // Runs the program with the inputs' and outputs' buffers bound
  // (input_data[i], output_data[o]) for these symbol values.
  absl::Status Execute(absl::Span<const int64_t> symbols,
                       absl::Span<void* const> input_data,
                       absl::Span<void* const> output_data,
                       ThreadPool* pool) const;

  v1::Artifact artifact_;
  LoadedLibrary library_;
  ProgramPlan plan_;               // the checked program; points into artifact_
  std::vector<KernelFn> kernels_;  // per launch, in plan_ order
  // Temporaries' memory kept from one run for the next (fresh memory
  // page-faults on every touch: ResNet-18's CPU training step spent about
  // a sixth of its time there), at most kMaxCachedTempBytes; a run takes
  // all of it, so concurrent runs allocate their own. Thread-safe.
  struct TempCache;
  std::unique_ptr<TempCache> temp_cache_;
  // Time per program step, when KILN_CPU_PROFILE=N (N > 0) was set at load:
  // every N runs the executable writes a table of its steps (kernel or
  // GEMM, calls, milliseconds, share) to stderr and starts again. Null
  // otherwise (runs pay nothing). Thread-safe.
  struct Profile;
  std::unique_ptr<Profile> profile_;
  // The convolutions' library (oneDNN), when the program has any.
  std::unique_ptr<CpuConv> conv_;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_CPU_EXECUTABLE_H_
