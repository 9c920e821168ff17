// The CPU code generator: FusedProgram -> LLVM IR, one function per kernel.
//
// Kernel ABI (what client/cpu_executable.cc calls):
//   void kiln_kN(void* const* buffers, const int64_t* symbols,
//                int64_t start, int64_t end);
// buffers[i] is the data pointer (storage offset applied) of the kernel's
// slot i; symbols[j] the value of symbol j; [start, end) a chunk of the
// kernel's parallel range (Kernel::OuterRange), so the runtime can hand
// chunks to threads.
//
// Loop structure. Pointwise kernels walk the flattened range in runs along
// the innermost dim, so the inner loop is a plain counted loop the LLVM
// vectoriser handles (with libmvec for exp/sin/cos/log/pow). Row kernels
// decompose each row index, then run one inner loop nest per stage.
// Reduction accumulation carries the `reassoc` flag so float reductions
// vectorise: the summation order is unspecified, as in every parallel
// reduction. float16/bfloat16 values are computed in float32 and converted
// with integer bit manipulation (no libgcc helpers needed); float -> int
// conversions saturate (NaN -> 0); integer division by zero yields 0.
//
// Thread-safety: the LLVMContext passed in must not be shared with other
// threads during the call.
#ifndef KILN_COMPILER_CODEGEN_CPU_H_
#define KILN_COMPILER_CODEGEN_CPU_H_

#include <memory>

#include "absl/status/statusor.h"
#include "compiler/loop_ir.h"

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace kiln {

struct CpuCodegenOptions {
  // Fast-math flags on all float arithmetic (not only reductions).
  bool fast_math = false;
  // Row kernels whose loads run along the last outer dim (column
  // reductions) walk their rows in blocks, the block innermost, so that
  // their loads vectorise (codegen_cpu.cc, PrefersRowBlocks). false: every
  // row kernel one row at a time (tests compare the two).
  bool row_blocks = true;
  // Pointwise kernels whose innermost var is read through floordiv and
  // remainder by constants run it as segments over which those are
  // constant or linear (codegen_cpu.cc, SplitInnermostDim). false: as
  // written (tests compare the two).
  bool split_innermost_dim = true;
  // Adjacent dims that every access reads as one (c * (P * size(L) + L))
  // run as one dim, so that runs along a short last dim (a feature map's
  // 28 columns) become long enough to vectorise (codegen_cpu.cc,
  // CoalesceDims). false: the dims as written (tests compare the two).
  bool coalesce_dims = true;
  // The target converts float16 in hardware (x86's F16C: vcvtph2ps,
  // vcvtps2ph): float16 values convert through LLVM's fpext/fptrunc, which
  // vectorise to one instruction per vector, instead of the integer
  // sequences every target can run (HasF16c, cpu_backend.h).
  bool f16c = false;
};

absl::StatusOr<std::unique_ptr<llvm::Module>> EmitCpuModule(
    const FusedProgram& program, llvm::LLVMContext& context,
    const CpuCodegenOptions& options);

}  // namespace kiln

#endif  // KILN_COMPILER_CODEGEN_CPU_H_
