// The new pass manager's O3 pipeline, set up once for both back ends: the
// CPU back end (cpu_backend.h, OptimizeModule: libmvec, no unrolling) and
// the NVPTX one (cuda_backend.h, OptimizeNvptxModule: the target's pipeline
// callbacks) differ only in the options below.
//
// Thread-safety: a pure function of its arguments; `module` and `tm` are the
// caller's (one thread at a time).
#ifndef KILN_COMPILER_LLVM_PIPELINE_H_
#define KILN_COMPILER_LLVM_PIPELINE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "llvm/Analysis/TargetLibraryInfo.h"
#include "llvm/IR/Module.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Target/TargetMachine.h"

namespace kiln {

struct O3PipelineOptions {
  llvm::PipelineTuningOptions tuning;
  // Adds the target's own passes (NVPTX: NVVMReflect and its IR passes).
  bool target_callbacks = false;
  // The library info the passes see (CPU: libmvec's vector variants); it
  // must outlive the call. Null: LLVM's default for the module's triple.
  const llvm::TargetLibraryInfoImpl* library_info = nullptr;
  // Registers passes at the pipeline's extension points (CPU: PromoteHalfPass
  // before the vectoriser and last, promote_half.h). Empty: none.
  std::function<void(llvm::PassBuilder&)> extensions;
};

// Runs buildPerModuleDefaultPipeline(O3) for `tm` over `module`, with the
// module, CGSCC, function and loop analyses registered and cross-registered.
void RunO3Pipeline(llvm::Module& module, llvm::TargetMachine& tm,
                   const O3PipelineOptions& options);

// The functions `module` defines with external linkage: its kernels, which
// SplitKernels deals into parts.
int CountKernels(const llvm::Module& module);

// `module` as `parts` modules, each as bitcode: its kernels dealt round
// robin, in module order, into the parts, each part a copy of the module
// with everything else it defines (internal helpers, constants) and the
// declarations of other parts' kernels dropped. Every other definition
// visible outside the module (a global variable, should codegen ever make
// one) belongs to part 0, so that a link sees it once. Named metadata
// whose operands name a function (NVPTX's nvvm.annotations) keeps only the
// operands of functions the part defines. Deterministic; `module` is not
// changed. With parts <= 1 or fewer kernels than parts: one part.
std::vector<std::string> SplitKernels(const llvm::Module& module, int parts);

// Runs `compile` on each part of SplitKernels(module, parts), each on a
// thread of its own (the first on the caller's) in an LLVMContext of its
// own, and returns the results in order; with one part, `compile` gets
// `module` itself in this thread (and may change it). A kernel is compiled
// with the same helpers as in the whole module. Errors: the first part's
// error in part order; INTERNAL when a part's bitcode cannot be read back.
absl::StatusOr<std::vector<std::string>> CompileKernelParts(
    llvm::Module& module, int parts,
    const std::function<absl::StatusOr<std::string>(llvm::Module&)>& compile);

}  // namespace kiln

#endif  // KILN_COMPILER_LLVM_PIPELINE_H_
