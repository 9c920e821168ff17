#include "compiler/cuda_backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "compiler/cpu_backend.h"
#include "compiler/llvm_pipeline.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Bitcode/BitcodeReader.h"
#include "llvm/Bitcode/BitcodeWriter.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/InlineAsm.h"
#include "llvm/IR/InstIterator.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/IntrinsicsNVPTX.h"
#include "llvm/IR/Verifier.h"
#include "llvm/Linker/Linker.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Transforms/IPO/Internalize.h"
#include "llvm/Transforms/Utils/Cloning.h"

extern "C" {
void LLVMInitializeNVPTXTargetInfo();
void LLVMInitializeNVPTXTarget();
void LLVMInitializeNVPTXTargetMC();
void LLVMInitializeNVPTXAsmPrinter();
}

#ifndef KILN_CUDA_TOOLKIT_ROOT
#define KILN_CUDA_TOOLKIT_ROOT "/usr/local/cuda"
#endif

namespace kiln {
namespace {

constexpr int kMaxPtxArch = 90;  // LLVM 16's newest
constexpr char kTriple[] = "nvptx64-nvidia-cuda";

void InitNvptxOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
  });
}

std::string ExecutableDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, n);
  return path.substr(0, path.rfind('/'));
}

// libdevice's bytes, read once per process (immutable afterwards).
struct LibdeviceFile {
  std::unique_ptr<llvm::MemoryBuffer> buffer;
  std::vector<std::string> tried;
};

const LibdeviceFile& Libdevice() {
  static const LibdeviceFile file = [] {
    LibdeviceFile f;
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("KILN_LIBDEVICE")) {
      candidates.push_back(env);
    }
    const std::string exe_dir = ExecutableDir();
    if (!exe_dir.empty()) {
      candidates.push_back(exe_dir + "/../share/kiln/libdevice.10.bc");
    }
    candidates.push_back(std::string(KILN_CUDA_TOOLKIT_ROOT) +
                         "/nvvm/libdevice/libdevice.10.bc");
    for (const std::string& path : candidates) {
      auto buf = llvm::MemoryBuffer::getFile(path);
      f.tried.push_back(path);
      if (buf) {
        f.buffer = std::move(*buf);
        break;
      }
    }
    return f;
  }();
  return file;
}

// Math the CPU code generator expresses as LLVM intrinsics or libm calls,
// and its libdevice name.
struct MathMapping {
  llvm::Intrinsic::ID intrinsic;  // not_intrinsic: a libm function
  const char* libm;
  const char* libdevice;
  // With fast_math: the approximate variant (ex2.approx, lg2.approx
  // based), or null to keep the accurate one. Trigonometric
  // functions stay accurate: sin.approx loses accuracy quickly outside
  // [-pi, pi]. This is the policy of Triton's defaults (what Inductor
  // emits): approximate exp/log and division, libdevice sin/cos.
  const char* fast = nullptr;
};
constexpr MathMapping kMath[] = {
    {llvm::Intrinsic::sin, nullptr, "__nv_sinf"},
    {llvm::Intrinsic::cos, nullptr, "__nv_cosf"},
    // With fast_math exp is ex2.approx (UseApproximateInstructions).
    {llvm::Intrinsic::exp, nullptr, "__nv_expf"},
    {llvm::Intrinsic::exp2, nullptr, "__nv_exp2f"},
    {llvm::Intrinsic::log, nullptr, "__nv_logf", "__nv_fast_logf"},
    {llvm::Intrinsic::log2, nullptr, "__nv_log2f", "__nv_fast_log2f"},
    {llvm::Intrinsic::log10, nullptr, "__nv_log10f", "__nv_fast_log10f"},
    // __nv_fast_powf is exp2(y * log2(x)): NaN for every negative base.
    {llvm::Intrinsic::pow, nullptr, "__nv_powf"},
    {llvm::Intrinsic::not_intrinsic, "expm1f", "__nv_expm1f"},
    {llvm::Intrinsic::not_intrinsic, "log1pf", "__nv_log1pf"},
    {llvm::Intrinsic::not_intrinsic, "tanf", "__nv_tanf"},
    // __nv_fast_tanhf calls llvm.nvvm.tanh.approx.f32, unknown to LLVM 16.
    {llvm::Intrinsic::not_intrinsic, "tanhf", "__nv_tanhf"},
    {llvm::Intrinsic::not_intrinsic, "erff", "__nv_erff"},
    {llvm::Intrinsic::not_intrinsic, "atan2f", "__nv_atan2f"},
};

// Returns whether anything now calls libdevice.
bool ReplaceMathWithLibdevice(llvm::Module& module, bool fast_math) {
  bool used = false;
  std::vector<llvm::Function*> dead;
  for (llvm::Function& f : module) {
    if (!f.isDeclaration()) continue;
    for (const MathMapping& m : kMath) {
      const bool match = m.libm ? f.getName() == m.libm
                                : (f.getIntrinsicID() == m.intrinsic &&
                                   f.getReturnType()->isFloatTy());
      if (!match) continue;
      llvm::FunctionCallee nv = module.getOrInsertFunction(
          fast_math && m.fast ? m.fast : m.libdevice, f.getFunctionType());
      f.replaceAllUsesWith(nv.getCallee());
      dead.push_back(&f);
      used = true;
      break;
    }
  }
  for (llvm::Function* f : dead) f->eraseFromParent();
  // frem has no PTX instruction.
  std::vector<llvm::BinaryOperator*> frems;
  for (llvm::Function& f : module) {
    for (llvm::BasicBlock& bb : f) {
      for (llvm::Instruction& inst : bb) {
        if (inst.getOpcode() == llvm::Instruction::FRem &&
            inst.getType()->isFloatTy()) {
          frems.push_back(llvm::cast<llvm::BinaryOperator>(&inst));
        }
      }
    }
  }
  for (llvm::BinaryOperator* frem : frems) {
    llvm::IRBuilder<> b(frem);
    llvm::Type* f32 = b.getFloatTy();
    llvm::FunctionCallee fmod = module.getOrInsertFunction(
        "__nv_fmodf", llvm::FunctionType::get(f32, {f32, f32}, false));
    llvm::Value* r =
        b.CreateCall(fmod, {frem->getOperand(0), frem->getOperand(1)});
    frem->replaceAllUsesWith(r);
    frem->eraseFromParent();
    used = true;
  }
  return used;
}

// With fast_math: Triton's approximate instructions (what Inductor's
// kernels run), chosen so LLVM can still fold around them:
//   a / b    -> div.full.f32 (at most 2 ulp over the whole range);
//   1 / b    -> rcp.approx.ftz.f32 (at most 1 ulp; sigmoid's division);
//   exp(x)   -> ex2.approx.ftz.f32(x * log2(e)), the multiply with
//               fast-math flags so a preceding x * c folds into it.
// LLVM 16 picks fdiv's precision per target machine, not per function,
// and has no div.full intrinsic, hence inline PTX for it. Runs before
// libdevice is linked: libdevice's own arithmetic keeps its precision.
void UseApproximateInstructions(llvm::Module& module) {
  std::vector<llvm::Instruction*> targets;
  for (llvm::Function& f : module) {
    for (llvm::BasicBlock& bb : f) {
      for (llvm::Instruction& inst : bb) {
        if (!inst.getType()->isFloatTy()) continue;
        auto* call = llvm::dyn_cast<llvm::CallInst>(&inst);
        if (inst.getOpcode() == llvm::Instruction::FDiv ||
            (call && call->getCalledFunction() &&
             call->getCalledFunction()->getIntrinsicID() ==
                 llvm::Intrinsic::exp)) {
          targets.push_back(&inst);
        }
      }
    }
  }
  if (targets.empty()) return;
  llvm::Type* f32 = llvm::Type::getFloatTy(module.getContext());
  llvm::InlineAsm* div_full = llvm::InlineAsm::get(
      llvm::FunctionType::get(f32, {f32, f32}, false),
      "div.full.f32 $0, $1, $2;", "=f,f,f", /*hasSideEffects=*/false);
  for (llvm::Instruction* inst : targets) {
    llvm::IRBuilder<> b(inst);
    llvm::FastMathFlags fast;
    fast.setFast();
    fast.setNoNaNs(false);
    fast.setNoInfs(false);
    b.setFastMathFlags(fast);
    llvm::Value* r = nullptr;
    llvm::Value* x = inst->getOperand(0);
    if (inst->getOpcode() == llvm::Instruction::FDiv) {
      auto* one = llvm::dyn_cast<llvm::ConstantFP>(x);
      if (one && one->isExactlyValue(1.0)) {
        r = b.CreateIntrinsic(llvm::Intrinsic::nvvm_rcp_approx_ftz_f, {},
                              {inst->getOperand(1)});
      } else {
        llvm::CallInst* q = b.CreateCall(div_full, {x, inst->getOperand(1)});
        q->setDoesNotAccessMemory();
        q->setDoesNotThrow();
        r = q;
      }
    } else {
      r = b.CreateIntrinsic(
          llvm::Intrinsic::nvvm_ex2_approx_ftz_f, {},
          {b.CreateFMul(x, llvm::ConstantFP::get(f32, 1.4426950408889634))});
    }
    inst->replaceAllUsesWith(r);
    inst->eraseFromParent();
  }
}

// nvJitLink, loaded on first use.
struct NvJitLink {
  using Handle = void*;
  int (*create)(Handle*, uint32_t, const char**) = nullptr;
  int (*destroy)(Handle*) = nullptr;
  int (*add_data)(Handle, int, const void*, size_t, const char*) = nullptr;
  int (*complete)(Handle) = nullptr;
  int (*cubin_size)(Handle, size_t*) = nullptr;
  int (*cubin)(Handle, void*) = nullptr;
  int (*error_log_size)(Handle, size_t*) = nullptr;
  int (*error_log)(Handle, char*) = nullptr;
  int (*info_log_size)(Handle, size_t*) = nullptr;
  int (*info_log)(Handle, char*) = nullptr;
  std::string error;  // why it could not be loaded
};

constexpr int kNvJitLinkInputPtx = 2;

const NvJitLink& LoadNvJitLink() {
  static const NvJitLink lib = [] {
    NvJitLink lib;
    NvJitLink* l = &lib;
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("KILN_NVJITLINK"))
      candidates.push_back(env);
    candidates.push_back("libnvJitLink.so.13");
    candidates.push_back(std::string(KILN_CUDA_TOOLKIT_ROOT) +
                         "/lib64/libnvJitLink.so.13");
    void* handle = nullptr;
    std::vector<std::string> errors;
    for (const std::string& c : candidates) {
      handle = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
      errors.push_back(::dlerror());
    }
    if (!handle) {
      l->error = absl::StrJoin(errors, "; ");
      return lib;
    }
    auto sym = [&](const char* name, auto& fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
          ::dlsym(handle, name));
      if (!fn && l->error.empty())
        l->error = absl::StrCat("symbol ", name, " missing");
    };
    sym("nvJitLinkCreate", l->create);
    sym("nvJitLinkDestroy", l->destroy);
    sym("nvJitLinkAddData", l->add_data);
    sym("nvJitLinkComplete", l->complete);
    sym("nvJitLinkGetLinkedCubinSize", l->cubin_size);
    sym("nvJitLinkGetLinkedCubin", l->cubin);
    sym("nvJitLinkGetErrorLogSize", l->error_log_size);
    sym("nvJitLinkGetErrorLog", l->error_log);
    sym("nvJitLinkGetInfoLogSize", l->info_log_size);
    sym("nvJitLinkGetInfoLog", l->info_log);
    return lib;
  }();
  return lib;
}

// libdevice's sinf/cosf/tanf carry Payne-Hanek reduction for arguments of
// magnitude >= 105615 (~300 lines of IR each). Inlined into every lane of
// every sin/cos, it dominates compile time (chain-30: 6 sin/cos x 4 lanes
// made ptxas take 370 ms); called as a function, the common case pays a
// call. So call sites get a clone whose huge-argument branch calls the
// original (kept out of line) instead: the fast path inlines, Payne-Hanek
// exists once. When libdevice's shape is not the expected one, the whole
// function stays out of line (correct, slower).
void OutlineTrigSlowPath(llvm::Function& f) {
  f.removeFnAttr(llvm::Attribute::AlwaysInline);
  f.addFnAttr(llvm::Attribute::NoInline);
  llvm::ValueToValueMapTy vmap;
  llvm::Function* fast = llvm::CloneFunction(&f, vmap);
  fast->setName(absl::StrCat("__kiln_", f.getName().str(), "_fast"));
  fast->setLinkage(llvm::GlobalValue::InternalLinkage);
  fast->removeFnAttr(llvm::Attribute::NoInline);
  llvm::BranchInst* slow_branch = nullptr;
  for (llvm::BasicBlock& bb : *fast) {
    auto* br = llvm::dyn_cast<llvm::BranchInst>(bb.getTerminator());
    if (!br || !br->isConditional()) continue;
    auto* cmp = llvm::dyn_cast<llvm::FCmpInst>(br->getCondition());
    if (!cmp || cmp->getPredicate() != llvm::FCmpInst::FCMP_OGE) continue;
    auto* limit = llvm::dyn_cast<llvm::ConstantFP>(cmp->getOperand(1));
    if (limit && limit->getValueAPF().convertToDouble() == 105615.0) {
      slow_branch = br;
      break;
    }
  }
  if (!slow_branch) {
    fast->eraseFromParent();
    return;
  }
  auto* slow = llvm::BasicBlock::Create(f.getContext(), "huge_argument", fast);
  llvm::IRBuilder<> b(slow);
  b.CreateRet(b.CreateCall(&f, {fast->getArg(0)}));
  slow_branch->getSuccessor(0)->removePredecessor(slow_branch->getParent());
  slow_branch->setSuccessor(0, slow);
  // Every call outside the clone goes to the clone.
  std::vector<llvm::CallInst*> calls;
  for (llvm::User* u : f.users()) {
    if (auto* call = llvm::dyn_cast<llvm::CallInst>(u)) {
      if (call->getFunction() != fast) calls.push_back(call);
    }
  }
  for (llvm::CallInst* call : calls) call->setCalledFunction(fast);
}

// The functions OutlineTrigSlowPath keeps out of line.
constexpr const char* kTrigFunctions[] = {"__nv_sinf", "__nv_cosf",
                                          "__nv_tanf"};

// O3 with the NVPTX pipeline callbacks (NVVMReflect, the NVPTX IR passes).
// LLVM 16's NVPTX back end lowers `sitofp i1 %b` as `selp.u32 1, 0`, then a
// signed conversion: true becomes 1.0 instead of -1.0. InstCombine makes
// such conversions from ordinary code (sitofp(zext(all(...)) - 1), a bool
// reduction's result minus one, became sitofp(not b): CudaGpu.
// SplitProgramsMatchReference's seed 35 got -0.67 for 0.67). Each becomes
// the select it stands for. Returns how many were rewritten.
int SelectSignedBoolConversions(llvm::Module& module) {
  std::vector<llvm::SIToFPInst*> found;
  for (llvm::Function& f : module)
    for (llvm::Instruction& inst : llvm::instructions(f))
      if (auto* c = llvm::dyn_cast<llvm::SIToFPInst>(&inst))
        if (c->getOperand(0)->getType()->getScalarType()->isIntegerTy(1))
          found.push_back(c);
  for (llvm::SIToFPInst* c : found) {
    llvm::IRBuilder<> b(c);
    llvm::Type* type = c->getType();
    llvm::Value* select =
        b.CreateSelect(c->getOperand(0), llvm::ConstantFP::get(type, -1.0),
                       llvm::ConstantFP::get(type, 0.0), c->getName());
    c->replaceAllUsesWith(select);
    c->eraseFromParent();
  }
  return static_cast<int>(found.size());
}

void RunO3(llvm::Module& module, llvm::TargetMachine& tm) {
  O3PipelineOptions o3;
  o3.target_callbacks = true;
  RunO3Pipeline(module, tm, o3);
  SelectSignedBoolConversions(module);
}

// libdevice's out-of-line trigonometric functions (OutlineTrigSlowPath:
// the whole of sinf, cosf and tanf, Payne-Hanek reduction included), compiled
// once per process per (target CPU, features, FTZ). They are the same in
// every compile, yet O3 on them took ~45% of chain-30's optimisation time
// and their code generation ~1/3 of its PTX emission. Each compile instead
// declares them (with the attributes O3 gives their bodies, so the code
// around the calls optimises as before) and EmitPtx splices their PTX in:
// the PTX is the same as when each compile built them.
struct PrecompiledTrig {
  // The optimised module: the functions external, their helpers internal.
  // Compiles read the functions' attributes from it.
  std::string bitcode;
  // PTX: the module's global variables (the Payne-Hanek table), one per
  // line, and each function's definition (as a .func, not .visible).
  std::string globals;
  std::map<std::string, std::string> functions;
};

// The NVPTX printer numbers call sequences ("{ // callseq 12, 0") with a
// counter that runs across every compile of the process, so the same
// request would give other PTX text in a warm kilnd than in a fresh one.
// The comments are dropped: an artifact is a function of its request.
void DropCallseqComments(std::string& ptx) {
  size_t at = 0;
  while ((at = ptx.find(" // callseq", at)) != std::string::npos) {
    const size_t end = ptx.find('\n', at);
    ptx.erase(at, (end == std::string::npos ? ptx.size() : end) - at);
  }
}

// LLVM 16's NVPTX instruction selection (NVPTXDAGToDAGISel::tryBFE)
// miscompiles `and (sra x, s), 2^len - 1` for a 64-bit x when s > 32 and
// the field reaches past bit 63: it measures the bits left above s against
// the shift amount's 32-bit type, and emits `bfe.u64 d, x, s, len`, whose
// bits past bit 63 are zeros where sra's are copies of the sign. DAGCombiner
// makes that pattern of every `select (x < 0), 2^len - 1, 0` and `select
// (x & 2^j) != 0, 2^len - 1, 0`, which the index arithmetic of wrapped
// negative indices, floor division and im2col produces: a kernel added 1
// where it meant 3 or 15 (llvm/llvm-project#130862 fixed the selection in
// LLVM 21). An unsigned source never gives such a field (LLVM folds `and
// (srl x, s), m` past bit 63 into the shift alone), so each bfe.u64 whose
// position + length exceeds 64 is the signed one: it becomes bfe.s64,
// which fills past bit 63 with the sign, and an and that keeps the field.
// Returns how many it rewrote.
int FixSignedBitfieldExtracts(std::string& ptx) {
  const std::string kOp = "bfe.u64";
  int fixed = 0;
  size_t at = 0;
  while ((at = ptx.find(kOp, at)) != std::string::npos) {
    const size_t line_start = ptx.rfind('\n', at) + 1;  // npos + 1 == 0
    const size_t semi = ptx.find(';', at);
    if (semi == std::string::npos) break;
    const std::string prefix = ptx.substr(line_start, at - line_start);
    std::vector<std::string> ops = absl::StrSplit(
        absl::string_view(ptx).substr(at + kOp.size(), semi - at - kOp.size()),
        ',');
    for (std::string& op : ops)
      op = std::string(absl::StripAsciiWhitespace(op));
    int pos = 0, len = 0;
    if (ops.size() != 4 || !absl::SimpleAtoi(ops[2], &pos) ||
        !absl::SimpleAtoi(ops[3], &len) || pos + len <= 64 || len >= 64 ||
        len <= 0) {
      at = semi;
      continue;
    }
    const std::string text = absl::StrCat(
        "bfe.s64 \t", ops[0], ", ", ops[1], ", ", pos, ", ", len, ";\n", prefix,
        "and.b64 \t", ops[0], ", ", ops[0], ", ", (uint64_t{1} << len) - 1);
    ptx.replace(at, semi - at, text);
    at += text.size();
    ++fixed;
  }
  return fixed;
}

// The marker on the declarations that EmitPtx fills in.
constexpr char kPrecompiledAttr[] = "kiln-precompiled-trig";

absl::StatusOr<PrecompiledTrig> BuildPrecompiledTrig(llvm::TargetMachine& tm,
                                                     bool ftz) {
  llvm::LLVMContext context;
  llvm::Module module("kiln_trig", context);
  module.setTargetTriple(tm.getTargetTriple().str());
  module.setDataLayout(tm.createDataLayout());
  module.addModuleFlag(llvm::Module::Override, "nvvm-reflect-ftz", ftz ? 1 : 0);
  llvm::Type* f32 = llvm::Type::getFloatTy(context);
  llvm::FunctionType* type = llvm::FunctionType::get(f32, {f32}, false);
  for (const char* name : kTrigFunctions)
    module.getOrInsertFunction(name, type);
  const LibdeviceFile& file = Libdevice();
  if (!file.buffer) return absl::FailedPreconditionError("no libdevice");
  auto lib =
      llvm::getLazyBitcodeModule(file.buffer->getMemBufferRef(), context);
  if (!lib) {
    return absl::InternalError(
        absl::StrCat("libdevice: ", llvm::toString(lib.takeError())));
  }
  (*lib)->setTargetTriple(module.getTargetTriple());
  (*lib)->setDataLayout(module.getDataLayout());
  if (llvm::Linker::linkModules(
          module, std::move(*lib), llvm::Linker::Flags::LinkOnlyNeeded,
          [](llvm::Module& m, const llvm::StringSet<>&) {
            llvm::internalizeModule(m, [](const llvm::GlobalValue& gv) {
              for (const char* name : kTrigFunctions)
                if (gv.getName() == name) return true;
              return false;
            });
          })) {
    return absl::InternalError("linking libdevice's trig functions failed");
  }
  for (const char* name : kTrigFunctions) {
    llvm::Function* f = module.getFunction(name);
    if (!f || f->isDeclaration())
      return absl::InternalError(absl::StrCat("libdevice lacks ", name));
    // As OutlineTrigSlowPath leaves them.
    f->removeFnAttr(llvm::Attribute::AlwaysInline);
    f->addFnAttr(llvm::Attribute::NoInline);
  }
  RunO3(module, tm);
  PrecompiledTrig result;
  {
    llvm::raw_string_ostream os(result.bitcode);
    llvm::WriteBitcodeToFile(module, os);
  }
  auto ptx = EmitAssembly(module, tm);
  if (!ptx.ok()) return ptx.status();
  DropCallseqComments(*ptx);
  FixSignedBitfieldExtracts(*ptx);
  for (absl::string_view line : absl::StrSplit(*ptx, '\n')) {
    if (absl::StartsWith(line, ".global ") || absl::StartsWith(line, ".const "))
      absl::StrAppend(&result.globals, line, "\n");
  }
  for (const char* name : kTrigFunctions) {
    // ".visible .func  (.param .b32 func_retval0) __nv_sinf(" ... "\n}\n"
    const std::string head = absl::StrCat(") ", name, "(\n");
    const size_t at = ptx->find(head);
    const size_t begin = at == std::string::npos
                             ? std::string::npos
                             : ptx->rfind("\n.visible .func", at);
    const size_t end =
        begin == std::string::npos ? begin : ptx->find("\n}\n", begin);
    if (end == std::string::npos) {
      return absl::InternalError(
          absl::StrCat("no definition of ", name, " in the trig PTX"));
    }
    std::string text = ptx->substr(begin + 1, end + 3 - (begin + 1));
    text.erase(0, std::string(".visible ").size());
    result.functions[name] = std::move(text);
  }
  return result;
}

// BuildPrecompiledTrig's result, built on first use per key. Never freed.
absl::StatusOr<const PrecompiledTrig*> Precompiled(llvm::TargetMachine& tm,
                                                   bool ftz) {
  using Key = std::tuple<std::string, std::string, bool>;
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache =
      new std::map<Key, std::unique_ptr<absl::StatusOr<PrecompiledTrig>>>();
  const Key key(tm.getTargetCPU().str(), tm.getTargetFeatureString().str(),
                ftz);
  absl::MutexLock lock(&mu);
  auto& entry = (*cache)[key];
  if (!entry) {
    entry = std::make_unique<absl::StatusOr<PrecompiledTrig>>(
        BuildPrecompiledTrig(tm, ftz));
  }
  if (!entry->ok()) return entry->status();
  return &**entry;
}

bool ModuleFtz(const llvm::Module& module) {
  auto* ftz = llvm::mdconst::extract_or_null<llvm::ConstantInt>(
      module.getModuleFlag("nvvm-reflect-ftz"));
  return ftz && !ftz->isZero();
}

}  // namespace

// Sum of "N bytes spill stores, M bytes spill loads" over the log's lines.
int64_t SpillBytes(const std::string& log) {
  int64_t total = 0;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    for (const char* what : {" bytes spill stores", " bytes spill loads"}) {
      const size_t at = line.find(what);
      if (at == absl::string_view::npos) continue;
      size_t start = line.rfind(' ', at - 1);
      start = start == absl::string_view::npos ? 0 : start + 1;
      int64_t n = 0;
      if (absl::SimpleAtoi(line.substr(start, at - start), &n)) total += n;
    }
  }
  return total;
}

absl::StatusOr<int> ParseCudaArch(const std::string& arch) {
  int cc = 0;
  absl::string_view rest = arch;
  if (!absl::ConsumePrefix(&rest, "sm_") || !absl::SimpleAtoi(rest, &cc) ||
      cc < 50 || cc > 999) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA target arch \"", arch,
        "\": expected sm_XX with a compute capability of at least 5.0, "
        "e.g. sm_90"));
  }
  return cc;
}

absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> MakeNvptxTargetMachine(
    const v1::CudaTarget& target) {
  auto cc = ParseCudaArch(target.arch());
  if (!cc.ok()) return cc.status();
  InitNvptxOnce();
  std::string error;
  const llvm::Target* t = llvm::TargetRegistry::lookupTarget(kTriple, error);
  if (!t) {
    return absl::InternalError(absl::StrCat("NVPTX target: ", error));
  }
  const std::string cpu = absl::StrCat("sm_", std::min(*cc, kMaxPtxArch));
  llvm::TargetOptions options;
  std::unique_ptr<llvm::TargetMachine> tm(
      t->createTargetMachine(kTriple, cpu, "+ptx78", options, std::nullopt,
                             std::nullopt, llvm::CodeGenOpt::Aggressive));
  if (!tm) return absl::InternalError("cannot create the NVPTX target");
  return tm;
}

absl::Status LinkLibdevice(llvm::Module& module, bool fast_math) {
  module.addModuleFlag(llvm::Module::Override, "nvvm-reflect-ftz",
                       fast_math ? 1 : 0);
  if (fast_math) UseApproximateInstructions(module);
  if (!ReplaceMathWithLibdevice(module, fast_math)) return absl::OkStatus();
  const LibdeviceFile& file = Libdevice();
  if (!file.buffer) {
    return absl::FailedPreconditionError(
        absl::StrCat("libdevice.10.bc not found (tried ",
                     absl::StrJoin(file.tried, ", "), "); set KILN_LIBDEVICE"));
  }
  auto lib = llvm::getLazyBitcodeModule(file.buffer->getMemBufferRef(),
                                        module.getContext());
  if (!lib) {
    return absl::InternalError(
        absl::StrCat("libdevice: ", llvm::toString(lib.takeError())));
  }
  (*lib)->setTargetTriple(module.getTargetTriple());
  (*lib)->setDataLayout(module.getDataLayout());
  const bool failed = llvm::Linker::linkModules(
      module, std::move(*lib), llvm::Linker::Flags::LinkOnlyNeeded,
      [](llvm::Module& m, const llvm::StringSet<>& linked) {
        llvm::internalizeModule(m, [&linked](const llvm::GlobalValue& gv) {
          return !gv.hasName() || !linked.count(gv.getName());
        });
      });
  if (failed) return absl::InternalError("linking libdevice failed");
  for (const char* name : kTrigFunctions) {
    if (llvm::Function* f = module.getFunction(name)) OutlineTrigSlowPath(*f);
  }
  return absl::OkStatus();
}

absl::Status OptimizeNvptxModule(llvm::Module& module, llvm::TargetMachine& tm,
                                 const NvptxOptimizeOptions& options) {
  module.setTargetTriple(tm.getTargetTriple().str());
  module.setDataLayout(tm.createDataLayout());
  std::string err;
  llvm::raw_string_ostream os(err);
  if (llvm::verifyModule(module, &os)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid NVPTX module: ", os.str()));
  }
  // The out-of-line trig functions come precompiled (PrecompiledTrig).
  if (options.precompiled_trig) {
    std::vector<llvm::Function*> trig;
    for (const char* name : kTrigFunctions) {
      llvm::Function* f = module.getFunction(name);
      if (f && !f->isDeclaration() &&
          f->hasFnAttribute(llvm::Attribute::NoInline))
        trig.push_back(f);
    }
    if (!trig.empty()) {
      auto pre = Precompiled(tm, ModuleFtz(module));
      if (!pre.ok()) return pre.status();
      auto lazy = llvm::getLazyBitcodeModule(
          llvm::MemoryBufferRef((*pre)->bitcode, "kiln_trig"),
          module.getContext());
      if (!lazy) {
        return absl::InternalError(absl::StrCat(
            "precompiled trig functions: ", llvm::toString(lazy.takeError())));
      }
      for (llvm::Function* f : trig) {
        f->deleteBody();  // an external declaration
        f->setAttributes((*lazy)->getFunction(f->getName())->getAttributes());
        f->addFnAttr(kPrecompiledAttr);
      }
    }
  }
  RunO3(module, tm);
  return absl::OkStatus();
}

absl::StatusOr<std::string> EmitPtx(llvm::Module& module,
                                    llvm::TargetMachine& tm) {
  // For NVPTX the target's assembly is PTX.
  auto ptx = EmitAssembly(module, tm);
  if (!ptx.ok()) return ptx;
  DropCallseqComments(*ptx);
  FixSignedBitfieldExtracts(*ptx);
  std::vector<std::string> spliced;
  for (const llvm::Function& f : module) {
    if (f.isDeclaration() && f.hasFnAttribute(kPrecompiledAttr))
      spliced.push_back(f.getName().str());
  }
  if (spliced.empty()) return ptx;
  auto pre = Precompiled(tm, ModuleFtz(module));
  if (!pre.ok()) return pre.status();
  // Where LLVM would have put the functions' prototypes, the table and
  // the definitions, as when the module held the bodies.
  for (const std::string& name : spliced) {
    const std::string decl =
        absl::StrCat(".extern .func  (.param .b32 func_retval0) ", name, "\n");
    const size_t at = ptx->find(absl::StrCat("\n", decl));
    if (at == std::string::npos) {
      return absl::InternalError(
          absl::StrCat("no declaration of ", name, " in the PTX"));
    }
    ptx->erase(at + 1, std::string(".extern ").size());
  }
  const size_t entry = ptx->find("\n.visible .entry");
  if (entry == std::string::npos)
    return absl::InternalError("no kernel in the PTX");
  // (A table this module defines itself is not defined twice.)
  std::string globals;
  for (absl::string_view line :
       absl::StrSplit((*pre)->globals, '\n', absl::SkipEmpty())) {
    if (!absl::StrContains(*ptx, line)) absl::StrAppend(&globals, line, "\n");
  }
  ptx->insert(entry, globals);
  // Labels and local depots carry the function's number in its module
  // (the AsmPrinter's count of defined functions); renumber them as this
  // module would have.
  int number = 0;
  for (const llvm::Function& f : module) number += !f.isDeclaration();
  for (const std::string& name : spliced) {
    std::string text = (*pre)->functions.at(name);
    const size_t label = text.find("$L__BB");
    if (label != std::string::npos) {
      const size_t digits = label + std::string("$L__BB").size();
      const std::string from =
          text.substr(digits, text.find('_', digits) - digits);
      const std::string to = absl::StrCat(number);
      text = absl::StrReplaceAll(
          text,
          {{absl::StrCat("$L__BB", from, "_"), absl::StrCat("$L__BB", to, "_")},
           {absl::StrCat("__local_depot", from, "["),
            absl::StrCat("__local_depot", to, "[")},
           {absl::StrCat("__local_depot", from, ";"),
            absl::StrCat("__local_depot", to, ";")}});
    }
    ptx->append(text);
    ++number;
  }
  return ptx;
}

absl::StatusOr<std::vector<std::string>> OptimizeAndEmitPtx(
    llvm::Module& module, const v1::CudaTarget& target,
    const NvptxOptimizeOptions& options, int parts) {
  return CompileKernelParts(
      module, parts, [&](llvm::Module& part) -> absl::StatusOr<std::string> {
        auto tm = MakeNvptxTargetMachine(target);
        if (!tm.ok()) return tm.status();
        if (absl::Status s = OptimizeNvptxModule(part, **tm, options); !s.ok())
          return s;
        return EmitPtx(part, **tm);
      });
}

absl::StatusOr<CubinResult> LinkCubin(absl::Span<const std::string> ptx,
                                      const std::string& arch, int threads) {
  if (auto cc = ParseCudaArch(arch); !cc.ok()) return cc.status();
  if (ptx.empty())
    return absl::InvalidArgumentError("LinkCubin: no PTX to link");
  const NvJitLink& nv = LoadNvJitLink();
  if (!nv.error.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nvJitLink not available (", nv.error,
        "); install CUDA 13's libnvjitlink or set KILN_NVJITLINK"));
  }
  const std::string arch_opt = absl::StrCat("-arch=", arch);
  const std::string split_opt =
      absl::StrCat("-split-compile=", std::max(threads, 0));
  const char* options[] = {arch_opt.c_str(), "-O3", "-verbose",
                           split_opt.c_str()};
  NvJitLink::Handle h = nullptr;
  int created = nv.create(&h, threads == 1 ? 3 : 4, options);
  if (created != 0 && threads != 1) {
    // An nvJitLink that does not take -split-compile: one thread.
    h = nullptr;
    created = nv.create(&h, 3, options);
  }
  if (created != 0) {
    return absl::InternalError(
        absl::StrCat("nvJitLinkCreate failed: ", created));
  }
  auto log_of = [&](auto size_fn, auto log_fn) {
    size_t n = 0;
    if (size_fn(h, &n) != 0 || n == 0) return std::string();
    std::string s(n, '\0');
    log_fn(h, s.data());
    while (!s.empty() && s.back() == '\0') s.pop_back();
    return s;
  };
  CubinResult result;
  // nvJitLink wants the PTX NUL-terminated.
  int r = 0;
  for (size_t i = 0; i < ptx.size() && r == 0; ++i) {
    const std::string name =
        i == 0 ? std::string("kiln.ptx") : absl::StrCat("kiln_", i, ".ptx");
    r = nv.add_data(h, kNvJitLinkInputPtx, ptx[i].c_str(), ptx[i].size() + 1,
                    name.c_str());
  }
  if (r == 0) r = nv.complete(h);
  if (r != 0) {
    std::string log = log_of(nv.error_log_size, nv.error_log);
    nv.destroy(&h);
    return absl::InternalError(
        absl::StrCat("nvJitLink failed (", r, ") for ", arch, ": ", log));
  }
  result.log = log_of(nv.info_log_size, nv.info_log);
  size_t size = 0;
  nv.cubin_size(h, &size);
  result.cubin.resize(size);
  nv.cubin(h, result.cubin.data());
  nv.destroy(&h);
  result.spill_bytes = SpillBytes(result.log);
  return result;
}

}  // namespace kiln
