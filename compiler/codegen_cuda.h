// The CUDA code generator: FusedProgram -> NVPTX LLVM IR, one kernel entry
// per fused kernel, in the form compiler/gpu_launch.h chooses.
//
// Kernel ABI (what client/cuda_executable.cc launches, artifact.proto's
// Launch):
//   kernel(T addrspace(1)* buffer_0, ..., buffer_{n-1},
//          i64 symbol_0, ..., i64 symbol_{m-1})
// with every symbol of the program, in order. Buffers are distinct
// allocations (`noalias`); inputs are only read.
//
// Kernels are marked both ways LLVM 16's NVPTX back end and tools expect:
// the ptx_kernel calling convention and !nvvm.annotations "kernel" (plus
// "maxntidx", the block size, for register allocation).
//
// Vector accesses. A load or store whose flat offset is linear in the
// group's var with coefficient 1 (consecutive elements of a group are
// consecutive in memory) and whose buffer is aligned to 16 bytes (inputs:
// the alignment the request declares, which is part of the guard key;
// outputs and temps: the runtime allocates 256-byte aligned) becomes one
// vector access per group when, at run time, the offset of the group's first
// element is a multiple of the group size; otherwise the same group is
// accessed element by element (a uniform branch, computed once per kernel).
//
// Semantics are those of the CPU code generator (kernel_emitter.h):
// float16/bfloat16 computed in float32 and rounded once per op, integer
// division by zero gives 0, float -> int saturates. Reductions combine
// partial results in a tree: float sums and products are reassociated; for
// argmax/argmin ties and NaNs pick the smallest index, as on the CPU.
//
// Thread-safety: the LLVMContext passed in must not be shared with other
// threads during the call.
#ifndef KILN_COMPILER_CODEGEN_CUDA_H_
#define KILN_COMPILER_CODEGEN_CUDA_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/gpu_launch.h"
#include "compiler/loop_ir.h"

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace kiln {

struct CudaCodegenOptions {
  bool fast_math = false;
  // Guaranteed alignment in bytes of each graph input's data pointer (the
  // request's TensorMeta.alignment; 0 = element-aligned).
  std::vector<int64_t> input_alignment;
  // The target's compute capability, e.g. 90 for sm_90 (0: unknown, the
  // oldest). From 80, bfloat16 values are rounded by the hardware's
  // cvt.rn.bf16.f32; float16 ones always are (cvt.rn.f16.f32,
  // cvt.f32.f16).
  int compute_capability = 0;
};

// Emits each kernel of `program` in the form of its plan (`plans`, from
// PlanGpuLaunches: one per kernel). Errors: INTERNAL when the module does
// not verify (a compiler bug).
absl::StatusOr<std::unique_ptr<llvm::Module>> EmitCudaModule(
    const FusedProgram& program, const std::vector<GpuKernelPlan>& plans,
    llvm::LLVMContext& context, const CudaCodegenOptions& options);

}  // namespace kiln

#endif  // KILN_COMPILER_CODEGEN_CUDA_H_
