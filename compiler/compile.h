// Compile(request) -> Artifact: the whole pipeline, top to bottom.
//
//   ImportGraph       kiln.v1.Graph -> Graph          (import.h)
//   ComputeGuardKey   Graph + target + options -> key (guard_key.h)
//   Lower             Graph -> LoopGraph              (lower.h)
//   Fuse              LoopGraph -> FusedProgram       (fuse.h)
//   EmitCpuModule     FusedProgram -> LLVM IR         (codegen_cpu.h)
//   OptimizeModule, EmitObject, LinkSharedObject      (cpu_backend.h)
//   BuildArtifact     program, guards, outputs, binary, SHA-256
//
// With KILN_DUMP_DIR set, each stage writes its IR to
// $KILN_DUMP_DIR/<first 16 hex digits of the key>/NN-stage.txt.
//
// Errors: INVALID_ARGUMENT / UNIMPLEMENTED from validation (naming node, op
// and reason), UNIMPLEMENTED for CUDA targets in this build, INTERNAL for a
// compiler bug (the message says which stage).
// Thread-safety: safe to call from many threads at once (each call has its
// own LLVMContext; the in-process linker is serialised inside).
#ifndef KILN_COMPILER_COMPILE_H_
#define KILN_COMPILER_COMPILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "kiln/v1/artifact.pb.h"
#include "kiln/v1/graph.pb.h"

namespace kiln {

// Version of the artifact format (Artifact.format_version).
inline constexpr int kArtifactFormatVersion = 1;

struct CompileEnv {
  // Where stage dumps go; empty: $KILN_DUMP_DIR if set, else no dumps.
  std::string dump_dir;
  // false: one kernel per op, for benchmarks against fusion. Not part of the
  // guard key, so never use it for artifacts that reach a cache.
  bool fuse = true;
  // CUDA persistent rows: groups per thread (0: the default). For
  // benchmarks; like `fuse`, not part of the guard key.
  int gpu_groups_per_thread = 0;
  // CUDA pointwise kernels with their lanes in a loop
  // (GpuPlanOptions::lane_loop). For benchmarks.
  bool gpu_lane_loop = false;
  // CUDA pointwise kernels: elements per thread, 4, 2 or 1
  // (GpuPlanOptions::pointwise_vector_width; 0: the default). For
  // benchmarks.
  int gpu_pointwise_vector_width = 0;
  // CUDA pointwise kernels: groups of vector_width elements per thread
  // (GpuPlanOptions::pointwise_groups_per_thread; 0: the default). For
  // benchmarks.
  int gpu_pointwise_groups_per_thread = 0;
  // CUDA: GpuPlanOptions::one_element_per_thread_max (-1: the default). For
  // benchmarks.
  int64_t gpu_one_element_per_thread_max = -1;
  // CUDA: split reductions over few long rows (split_reductions.h). Off
  // only to measure what the split gains.
  bool gpu_split_reductions = true;
  // Tests only: apply the same split to CPU targets, so that the split
  // programs (whose numerics otherwise only a GPU checks) run on the CPU
  // against the reference evaluator. Not part of the guard key.
  bool split_reductions_on_cpu = false;
  // CUDA: libdevice's out-of-line trig functions compiled once per process
  // (NvptxOptimizeOptions::precompiled_trig). Off only to measure what that
  // saves; the PTX is the same.
  bool cuda_precompiled_trig = true;
};

absl::StatusOr<v1::Artifact> Compile(const v1::CompileRequest& request,
                                     const CompileEnv& env = {});

// Serialises a SymExpr-shaped polynomial (see artifact.proto's SymPoly).
class SymExpr;
v1::SymPoly ToSymPoly(const SymExpr& e);

}  // namespace kiln

#endif  // KILN_COMPILER_COMPILE_H_
