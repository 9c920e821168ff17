// The new pass manager's O3 pipeline, set up once for both back ends: the
// CPU back end (cpu_backend.h, OptimizeModule: libmvec, no unrolling) and
// the NVPTX one (cuda_backend.h, OptimizeNvptxModule: the target's pipeline
// callbacks) differ only in the options below.
//
// Thread-safety: a pure function of its arguments; `module` and `tm` are the
// caller's (one thread at a time).
#ifndef KILN_COMPILER_LLVM_PIPELINE_H_
#define KILN_COMPILER_LLVM_PIPELINE_H_

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
};

// Runs buildPerModuleDefaultPipeline(O3) for `tm` over `module`, with the
// module, CGSCC, function and loop analyses registered and cross-registered.
void RunO3Pipeline(llvm::Module& module, llvm::TargetMachine& tm,
                   const O3PipelineOptions& options);

}  // namespace kiln

#endif  // KILN_COMPILER_LLVM_PIPELINE_H_
