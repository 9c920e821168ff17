#include "compiler/llvm_pipeline.h"

#include <memory>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "llvm/Bitcode/BitcodeReader.h"
#include "llvm/Bitcode/BitcodeWriter.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Metadata.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Transforms/Utils/Cloning.h"
#include "llvm/Transforms/Utils/ValueMapper.h"

namespace kiln {
namespace {

bool IsKernel(const llvm::Function& f) {
  return !f.isDeclaration() && !f.hasLocalLinkage();
}

// The function a metadata tuple's first operand names, if any.
const llvm::Function* FunctionOf(const llvm::MDNode& node) {
  if (node.getNumOperands() == 0) return nullptr;
  return llvm::mdconst::dyn_extract_or_null<llvm::Function>(node.getOperand(0));
}

}  // namespace

void RunO3Pipeline(llvm::Module& module, llvm::TargetMachine& tm,
                   const O3PipelineOptions& options) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder builder(&tm, options.tuning);
  if (options.target_callbacks) tm.registerPassBuilderCallbacks(builder);
  if (options.extensions) options.extensions(builder);
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

int CountKernels(const llvm::Module& module) {
  int n = 0;
  for (const llvm::Function& f : module) n += IsKernel(f);
  return n;
}

std::vector<std::string> SplitKernels(const llvm::Module& module, int parts) {
  std::vector<const llvm::Function*> kernels;
  for (const llvm::Function& f : module)
    if (IsKernel(f)) kernels.push_back(&f);
  if (parts <= 1 || kernels.size() < static_cast<size_t>(parts)) parts = 1;
  // A copy of the module whose other parts' kernels are declarations
  // (CloneModule leaves undefined what the predicate declines), then
  // dropped where nothing refers to them.
  absl::flat_hash_map<const llvm::GlobalValue*, int> part_of;
  for (size_t i = 0; i < kernels.size(); ++i)
    part_of[kernels[i]] = static_cast<int>(i % parts);
  for (const llvm::GlobalVariable& g : module.globals())
    if (!g.isDeclaration() && !g.hasLocalLinkage()) part_of[&g] = 0;
  std::vector<std::string> bitcode(parts);
  for (int p = 0; p < parts; ++p) {
    llvm::ValueToValueMapTy map;
    std::unique_ptr<llvm::Module> copy =
        llvm::CloneModule(module, map, [&](const llvm::GlobalValue* gv) {
          auto it = part_of.find(gv);
          return it == part_of.end() || it->second == p;
        });
    auto elsewhere = [&](const llvm::Function* f) {
      if (f == nullptr || !f->isDeclaration()) return false;
      const llvm::Function* original = module.getFunction(f->getName());
      return original != nullptr && part_of.contains(original);
    };
    for (llvm::NamedMDNode& named : copy->named_metadata()) {
      std::vector<llvm::MDNode*> keep;
      bool dropped = false;
      for (llvm::MDNode* node : named.operands()) {
        if (elsewhere(FunctionOf(*node))) {
          dropped = true;
        } else {
          keep.push_back(node);
        }
      }
      if (!dropped) continue;
      named.clearOperands();
      for (llvm::MDNode* node : keep) named.addOperand(node);
    }
    std::vector<llvm::Function*> unused;
    for (llvm::Function& f : *copy)
      if (f.use_empty() && elsewhere(&f)) unused.push_back(&f);
    for (llvm::Function* f : unused) f->eraseFromParent();
    llvm::raw_string_ostream os(bitcode[p]);
    llvm::WriteBitcodeToFile(*copy, os);
  }
  return bitcode;
}

absl::StatusOr<std::vector<std::string>> CompileKernelParts(
    llvm::Module& module, int parts,
    const std::function<absl::StatusOr<std::string>(llvm::Module&)>& compile) {
  if (parts <= 1 || CountKernels(module) < parts) {
    absl::StatusOr<std::string> one = compile(module);
    if (!one.ok()) return one.status();
    return std::vector<std::string>{*std::move(one)};
  }
  const std::vector<std::string> bitcode = SplitKernels(module, parts);
  std::vector<absl::StatusOr<std::string>> results(
      parts, absl::InternalError("not compiled"));
  auto compile_part = [&](int p) {
    llvm::LLVMContext context;
    auto part = llvm::parseBitcodeFile(
        llvm::MemoryBufferRef(bitcode[p], "kiln_part"), context);
    if (!part) {
      results[p] = absl::InternalError(absl::StrCat(
          "module part ", p, ": ", llvm::toString(part.takeError())));
      return;
    }
    results[p] = compile(**part);
  };
  std::vector<std::thread> threads;
  for (int p = 1; p < parts; ++p) threads.emplace_back(compile_part, p);
  compile_part(0);
  for (std::thread& t : threads) t.join();
  std::vector<std::string> out;
  for (absl::StatusOr<std::string>& r : results) {
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  return out;
}

}  // namespace kiln
