// Compile(request) -> Artifact: the whole pipeline, top to bottom, one
// stage per line, each a function from one IR to the next (compile.cc reads
// the same way):
//
//   ImportRequest     kiln.v1.CompileRequest -> ImportedRequest: target
//                     checked, graph imported, request key (imported_request.h)
//   Lower             Graph -> LoopGraph                        (lower.h)
//   FoldGemmEpilogues LoopGraph -> LoopGraph (CUDA: bias, ReLU, tanh-GELU
//                     and the bias gradient into the cuBLASLt call)
//                     (gemm_epilogue.h)
//   Fuse              LoopGraph -> FusedProgram                 (fuse.h)
//   SplitLongReductions  FusedProgram -> FusedProgram (CUDA)
//                     (split_reductions.h)
//   SimplifyIndices   FusedProgram -> FusedProgram: index arithmetic with
//                     the kernels' dim ranges (simplify_indices.h)
//   PlanGpuLaunches   FusedProgram -> a GpuKernelPlan per kernel (CUDA;
//                     gpu_launch.h)
//   CPU:  EmitCpuModule  FusedProgram -> LLVM IR (codegen_cpu.h)
//         OptimizeModule, EmitObject, LinkSharedObject -> .so   (cpu_backend.h)
//   CUDA: EmitCudaModule FusedProgram + plans -> NVPTX IR (codegen_cuda.h)
//         LinkLibdevice, OptimizeNvptxModule, EmitPtx, LinkCubin -> cubin
//                                                               (cuda_backend.h)
//   BuildArtifact     program, guards, outputs, binary, SHA-256
//   (build_artifact.h)
//
// With KILN_DUMP_DIR set, each stage writes its IR to
// $KILN_DUMP_DIR/<first 16 hex digits of the request key>/NN-stage.txt:
// 01-graph.txt, 02-loops.txt, 02-epilogues.txt (CUDA), 03-fused.txt,
// 03-split.txt (CUDA), 03-indices.txt,
// 04-gpu-plan.txt (CUDA), 04-llvm.ll, 05-llvm-opt.ll, 06-asm.s (CPU) or
// 06-kernels.ptx, 07-nvjitlink.txt and 08-timings.txt (CUDA).
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
#include "compiler/build_artifact.h"  // kArtifactFormatVersion
#include "graph/imported_request.h"
#include "kiln/v1/artifact.pb.h"
#include "kiln/v1/graph.pb.h"

namespace kiln {

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
  // CUDA: convolutions as Kiln's im2col kernels and GEMMs instead of cuDNN
  // calls (LowerOptions::library_convolutions). For tests and benchmarks
  // against cuDNN; like `fuse`, not part of the guard key.
  bool gpu_kernel_convolutions = false;
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
  // CUDA: GpuPlanOptions::max_persistent_row (-1: the default). For
  // benchmarks.
  int64_t gpu_max_persistent_row = -1;
  // CUDA: GpuPlanOptions::max_persistent_row_values (-1: the default). For
  // benchmarks.
  int64_t gpu_max_persistent_row_values = -1;
  // CUDA: GpuPlanOptions::looped_row_threads (0: the default). For
  // benchmarks.
  int gpu_looped_row_threads = 0;
  // CUDA: split reductions over few long rows (split_reductions.h). Off
  // only to measure what the split gains.
  bool gpu_split_reductions = true;
  // Tests only: apply the same split to CPU targets, so that the split
  // programs (whose numerics otherwise only a GPU checks) run on the CPU
  // against the reference evaluator. Not part of the guard key.
  bool split_reductions_on_cpu = false;
  // Tests only: CUDA's cumsum (LowerOptions::reduction_cumsum: blocked or
  // quadratic reductions) on CPU targets, so that it runs against the
  // reference evaluator here. Not part of the guard key.
  bool reduction_cumsum_on_cpu = false;
  // Tests only: kiln.attention on CPU targets written out as GEMMs around a
  // softmax (as on CUDA where cuDNN does not take a call) instead of the
  // CPU runtime's fused kernel, so that the written-out form runs against
  // the reference evaluator here. Not part of the guard key.
  bool cpu_written_attention = false;
  // CPU: CpuCodegenOptions::row_blocks. Off only for tests and benchmarks
  // against the row-at-a-time walk; not part of the guard key.
  bool cpu_row_blocks = true;
  // CPU: CpuCodegenOptions::split_innermost_dim. Off only for tests and
  // benchmarks; not part of the guard key.
  bool cpu_split_innermost_dim = true;
  // CPU: CpuCodegenOptions::coalesce_dims. Off only for tests and
  // benchmarks; not part of the guard key.
  bool cpu_coalesce_dims = true;
  // CUDA: libdevice's out-of-line trig functions compiled once per process
  // (NvptxOptimizeOptions::precompiled_trig). Off only to measure what that
  // saves; the PTX is the same.
  bool cuda_precompiled_trig = true;
  // CPU: the threads a program's kernels are optimized and emitted on
  // (OptimizeAndEmitObjects; 1 one, 0 every core; -1:
  // $KILN_CPU_COMPILE_THREADS, else 0), each with at least
  // cpu_min_kernels_per_part kernels (0: the default, 32; tests set fewer).
  // The results are the same bit for bit either way (CompileThreads.*), so
  // neither is part of the guard key.
  int cpu_compile_threads = -1;
  int cpu_min_kernels_per_part = 0;
  // CUDA: the threads a program's kernels are optimized and emitted as PTX
  // on (OptimizeAndEmitPtx; 1 one, 0 every core; -1:
  // $KILN_CUDA_COMPILE_THREADS, else 0), each with at least
  // cuda_min_kernels_per_part kernels (0: the default, 32; tests set
  // fewer). Each kernel's PTX is the same either way but for label numbers
  // (CudaCodegen.SplitProgramsGiveEachKernelTheSamePtx), so neither is part
  // of the guard key.
  int cuda_compile_threads = -1;
  int cuda_min_kernels_per_part = 0;
  // CUDA: the threads ptxas compiles a program's kernels on (LinkCubin's
  // `threads`: 1 one, 0 every core; -1: $KILN_CUDA_LINK_THREADS, else 0).
  // The cubin is the same byte for byte either way (CudaCodegen.
  // LinkingOnManyThreadsGivesTheSameCubin), so not part of the guard key.
  // On 16 cores DenseNet-121's two programs linked in 0.17 s instead of
  // 13.1 s (bench/README.md, session 29).
  int cuda_link_threads = -1;
  // Out-of-range index checks (loop_ir.h, IndexCheck). Off only to measure
  // what they cost (bench/compiler/index_check_bench.cc): indices are still
  // clamped, but a bad one is never reported. Not part of the guard key, so
  // never use it for artifacts that reach a cache.
  bool index_checks = true;
};

// Compiles a request imported once (kilnd imports and keys each request
// when it arrives, then compiles from that).
absl::StatusOr<v1::Artifact> Compile(const ImportedRequest& request,
                                     const CompileEnv& env = {});

// ImportRequest, then the above.
absl::StatusOr<v1::Artifact> Compile(const v1::CompileRequest& request,
                                     const CompileEnv& env = {});

}  // namespace kiln

#endif  // KILN_COMPILER_COMPILE_H_
