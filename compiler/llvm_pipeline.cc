#include "compiler/llvm_pipeline.h"

namespace kiln {

void RunO3Pipeline(llvm::Module& module, llvm::TargetMachine& tm,
                   const O3PipelineOptions& options) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder builder(&tm, options.tuning);
  if (options.target_callbacks) tm.registerPassBuilderCallbacks(builder);
  if (options.library_info != nullptr) {
    // Must precede registerFunctionAnalyses, which would register the
    // default TargetLibraryAnalysis (no vector library) first.
    fam.registerPass(
        [&] { return llvm::TargetLibraryAnalysis(*options.library_info); });
  }
  builder.registerModuleAnalyses(mam);
  builder.registerCGSCCAnalyses(cgam);
  builder.registerFunctionAnalyses(fam);
  builder.registerLoopAnalyses(lam);
  builder.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager passes =
      builder.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
  passes.run(module, mam);
}

}  // namespace kiln
