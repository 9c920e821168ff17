// Convolutions on the CPU through oneDNN 2.x, loaded at run time with dlopen
// as the BLAS is (cpu_blas.h): the client library links no oneDNN; a
// machine without it compiles CPU convolutions as im2col kernels and GEMMs
// instead (the client asks for library calls only where Available() holds:
// CompileOptions.cpu_library_convolutions), and an artifact with oneDNN
// calls fails to load there with a clear FAILED_PRECONDITION.
//
//   absl::StatusOr<std::unique_ptr<CpuConv>> conv = CpuConv::Create();
//   (*conv)->Run(step, conv_step, dims, a, b, c);  // c overwritten
//
// Which library: $KILN_ONEDNN when set (a path or soname; "0" turns the
// library off), else libdnnl.so.2 (Debian's libdnnl2). Only oneDNN 2.x's C
// API is used; a build without its header (libdnnl-dev) has no library
// convolutions and Available() is false.
//
// Per extern step and shape (at most 256, then the cache starts over) one
// oneDNN convolution primitive over float32 tensors whose memory format
// oneDNN chooses (blocked, as PyTorch's own CPU convolutions are), plus the
// reorders between those formats and the program's contiguous NCHW
// buffers, made on the first call and cached; each call then binds its
// pointers, reorders, computes and reorders back.
// The threads are the process's OpenMP threads (a PyTorch process shares
// its libgomp with the library), as Kiln's own kernels use.
//
// Thread-safety: Create and Available may be called from any thread; Run
// from several threads at once (every call has its own stream, scratchpad
// and reorder buffers).
#ifndef KILN_RUNTIME_CPU_CONV_H_
#define KILN_RUNTIME_CPU_CONV_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kiln/v1/artifact.pb.h"
#include "runtime/program_plan.h"

namespace kiln {

class CpuConv {
 public:
  // Loads the library (once per process). Errors: FAILED_PRECONDITION
  // naming the library tried and why it failed (or that it is turned off,
  // or that this build has no oneDNN).
  static absl::StatusOr<std::unique_ptr<CpuConv>> Create();

  // Whether Create succeeds on this machine: what the client tells the
  // compiler (cheap after the first call, which loads the library).
  static bool Available();

  // The library that was loaded and its version ("libdnnl.so.2 (oneDNN
  // 2.6.3)"), or why none was.
  static std::string Describe();

  // Runs extern step `step` (part of the cache key, with the shape) of
  // `dims` (from EvaluateConv) over the step's buffers: `a` and `b` its
  // operands and `c` the tensor it writes, in the order of artifact.proto's
  // Convolution; in float32, or with bfloat16 operands written into a
  // float32 `c` (Convolution.result_dtype; where this oneDNN has no
  // bfloat16 convolution for the CPU, or with $KILN_ONEDNN_BF16=0, the
  // operands are widened to float32 first).
  // `c` is overwritten. Empty tensors are allowed (the written tensor is
  // then zeros). Errors: INVALID_ARGUMENT for another dtype, INTERNAL for a
  // oneDNN failure (naming the call and its status), RESOURCE_EXHAUSTED
  // when a buffer cannot be allocated.
  absl::Status Run(int step, const v1::Convolution& conv, const ConvDims& dims,
                   const void* a, const void* b, void* c) const;

  ~CpuConv();
  CpuConv(const CpuConv&) = delete;
  CpuConv& operator=(const CpuConv&) = delete;

  struct Plan;

 private:
  CpuConv() = default;
  absl::StatusOr<std::shared_ptr<const Plan>> GetPlan(
      int step, const v1::Convolution& conv, const ConvDims& dims,
      bool bf16_operands) const;

  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::vector<int64_t>, std::shared_ptr<const Plan>>
      plans_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln

#endif  // KILN_RUNTIME_CPU_CONV_H_
