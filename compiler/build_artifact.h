// The last stage of the pipeline (compile.h): the artifact a client runs,
// from the imported request, the fused program, the CUDA launch plans and
// the kernels' binary. It holds the program (buffers; per kernel: allocate
// the temps it writes first, launch, free temps after their last reader),
// the symbol and input guards, the output specs, the binary and its
// SHA-256 (artifact.proto).
//
// Thread-safety: pure functions.
#ifndef KILN_COMPILER_BUILD_ARTIFACT_H_
#define KILN_COMPILER_BUILD_ARTIFACT_H_

#include <string>
#include <vector>

#include "compiler/gpu_launch.h"
#include "graph/imported_request.h"
#include "compiler/loop_ir.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln {

// Version of the artifact format (Artifact.format_version).
inline constexpr int kArtifactFormatVersion = 1;

// The kernels' binary, as a back end built it.
struct KernelBinary {
  std::string cpu_shared_object;  // CPU targets
  v1::CudaBinary cuda;            // CUDA targets
};

// `gpu_plans`: per kernel, for CUDA targets; empty for CPU targets. The
// binary is moved into the artifact; compile_seconds is left for the caller.
v1::Artifact BuildArtifact(const ImportedRequest& request,
                           const FusedProgram& fused,
                           const std::vector<GpuKernelPlan>& gpu_plans,
                           KernelBinary binary);

// Serialises a SymExpr-shaped polynomial (see artifact.proto's SymPoly).
v1::SymPoly ToSymPoly(const SymExpr& e);

}  // namespace kiln

#endif  // KILN_COMPILER_BUILD_ARTIFACT_H_
