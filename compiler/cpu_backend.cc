#include "compiler/cpu_backend.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "compiler/llvm_pipeline.h"
#include "compiler/promote_half.h"
#include "lld/Common/CommonLinkerContext.h"
#include "lld/Common/Driver.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Analysis/TargetLibraryInfo.h"
#include "llvm/Bitcode/BitcodeReader.h"
#include "llvm/Bitcode/BitcodeWriter.h"
#include "llvm/IR/Function.h"
#include "llvm/IR/InstIterator.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Operator.h"
#include "llvm/IR/Verifier.h"
#include "llvm/MC/MCSubtargetInfo.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/CodeGen.h"
#include "llvm/Support/CrashRecoveryContext.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetOptions.h"
#include "llvm/TargetParser/Host.h"
#include "llvm/TargetParser/Triple.h"
#include "llvm/Transforms/Utils/Cloning.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------------------
// Process-wide initialisation (once).

void InitializeLlvmOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
    // lld reports fatal errors by "exiting" the process; inside a
    // CrashRecoveryContext that becomes a longjmp back to LinkSharedObject
    // instead. Enable() installs signal handlers that only act while a
    // CrashRecoveryContext is active on the faulting thread.
    llvm::CrashRecoveryContext::Enable();
  });
}

// ---------------------------------------------------------------------------
// Target validation.

// Whether `name` is a feature of the target: "+name" and "-name" give
// different feature bits exactly when LLVM knows the feature (an unknown one
// is ignored both times, with a warning on stderr).
bool IsKnownFeature(const llvm::MCSubtargetInfo& info, llvm::StringRef name) {
  llvm::MCSubtargetInfo probe(info);
  const llvm::FeatureBitset plus = probe.ApplyFeatureFlag(("+" + name).str());
  const llvm::FeatureBitset minus = probe.ApplyFeatureFlag(("-" + name).str());
  return plus != minus;
}

// Checks the CPU and "+a,-b,..." against the target's tables: LLVM itself
// only prints a warning for an unknown CPU or feature and ignores it.
absl::Status ValidateCpuAndFeatures(const llvm::Target& llvm_target,
                                    const llvm::Triple& triple,
                                    const v1::CpuTarget& target) {
  std::unique_ptr<llvm::MCSubtargetInfo> info(
      llvm_target.createMCSubtargetInfo(triple.str(), "", ""));
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("LLVM has no subtarget information for triple \"",
                     target.triple(), "\""));
  }
  const std::string& cpu = target.cpu();
  if (!cpu.empty() && !info->isCPUStringValid(cpu)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown CPU \"", cpu, "\" for triple \"", target.triple(), "\""));
  }
  const std::string& features = target.features();
  for (absl::string_view item :
       absl::StrSplit(features, ',', absl::SkipWhitespace())) {
    if (item.size() < 2 || (item[0] != '+' && item[0] != '-')) {
      return absl::InvalidArgumentError(
          absl::StrCat("CPU feature \"", item, "\" in \"", features,
                       "\" is not of the form +name or -name"));
    }
    if (!IsKnownFeature(*info,
                        llvm::StringRef(item.data() + 1, item.size() - 1))) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown CPU feature \"", item, "\" for triple \"",
                       target.triple(), "\" in \"", features, "\""));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// libmvec (glibc's vector math library) mappings.

// Functions glibc's libmvec provides in every x86 vector ISA variant: sin,
// cos, exp, log and pow since glibc 2.22, the others since 2.35 (symbol
// version GLIBC_2.35, so a client with an older glibc fails to load a kernel
// that uses them).
constexpr const char* kUnaryMathFunctions[] = {
    "acos",  "acosh", "asin", "asinh", "atan",  "atanh", "cbrt",  "cos",
    "cosh",  "erf",   "erfc", "exp",   "exp10", "exp2",  "expm1", "log",
    "log10", "log1p", "log2", "sin",   "sinh",  "tan",   "tanh"};
constexpr const char* kBinaryMathFunctions[] = {"atan2", "hypot", "pow"};
// Those with an LLVM intrinsic (llvm.<name>.f32/.f64) in LLVM 16.
constexpr const char* kIntrinsicMathFunctions[] = {
    "cos", "exp", "exp2", "log", "log10", "log2", "pow", "sin"};

// One vector ISA of the x86 vector function ABI: its mangling letter and its
// register width in bits.
struct VectorIsa {
  char letter;
  int bits;
};

// The libmvec variants `tm` can execute: 'b' (SSE) always, the widest of
// 'd' (AVX2) / 'c' (AVX), and 'e' (AVX-512F). LLVM's own LIBMVEC_X86 table
// offers the AVX2 variants to any target, which would fault on an AVX-only
// CPU, and knows only sin/cos/exp/log/pow; hence this table.
std::vector<VectorIsa> LibmvecIsas(const llvm::TargetMachine& tm) {
  const llvm::MCSubtargetInfo& sti = *tm.getMCSubtargetInfo();
  std::vector<VectorIsa> isas = {{'b', 128}};
  if (sti.checkFeatures("+avx2")) {
    isas.push_back({'d', 256});
  } else if (sti.checkFeatures("+avx")) {
    isas.push_back({'c', 256});
  }
  if (sti.checkFeatures("+avx512f")) isas.push_back({'e', 512});
  return isas;
}

// Fills `names` (which owns the strings the VecDescs point to) and returns
// the scalar -> vector mappings for `isas`.
std::vector<llvm::VecDesc> LibmvecMappings(const std::vector<VectorIsa>& isas,
                                           std::deque<std::string>& names) {
  std::vector<llvm::VecDesc> descs;
  auto add = [&](const std::string& function, int arity) {
    bool has_intrinsic = false;
    for (const char* f : kIntrinsicMathFunctions) {
      has_intrinsic |= function == f;
    }
    for (bool is_float : {true, false}) {
      const std::string scalar = is_float ? function + "f" : function;
      const std::string* intrinsic = nullptr;
      if (has_intrinsic) {
        intrinsic = &names.emplace_back(
            absl::StrCat("llvm.", function, is_float ? ".f32" : ".f64"));
      }
      const std::string& scalar_name = names.emplace_back(scalar);
      for (const VectorIsa& isa : isas) {
        const int lanes = isa.bits / (is_float ? 32 : 64);
        const std::string& vector_name = names.emplace_back(
            absl::StrCat("_ZGV", std::string(1, isa.letter), "N", lanes,
                         std::string(arity, 'v'), "_", scalar));
        const llvm::ElementCount vf = llvm::ElementCount::getFixed(lanes);
        descs.push_back({scalar_name, vector_name, vf});
        if (intrinsic != nullptr) {
          descs.push_back({*intrinsic, vector_name, vf});
        }
      }
    }
  };
  for (const char* f : kUnaryMathFunctions) add(f, 1);
  for (const char* f : kBinaryMathFunctions) add(f, 2);
  return descs;
}

// ---------------------------------------------------------------------------
// Module preparation.

// Sets the triple and data layout from `tm` where unset; refuses a module
// whose data layout was set for another target.
absl::Status PrepareModule(llvm::Module& module, llvm::TargetMachine& tm) {
  const llvm::DataLayout expected = tm.createDataLayout();
  const std::string& current = module.getDataLayoutStr();
  if (!current.empty() && current != expected.getStringRepresentation()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "module \"", module.getModuleIdentifier(), "\" has data layout \"",
        current, "\" but target ", tm.getTargetTriple().str(), " wants \"",
        expected.getStringRepresentation(), "\""));
  }
  module.setDataLayout(expected);
  module.setTargetTriple(tm.getTargetTriple().str());
  return absl::OkStatus();
}

absl::StatusOr<std::string> Emit(llvm::Module& module, llvm::TargetMachine& tm,
                                 llvm::CodeGenFileType type) {
  if (absl::Status s = PrepareModule(module, tm); !s.ok()) return s;
  llvm::SmallVector<char, 0> buffer;
  llvm::raw_svector_ostream stream(buffer);
  llvm::legacy::PassManager passes;
  if (tm.addPassesToEmitFile(passes, stream, /*DwoOut=*/nullptr, type)) {
    return absl::InternalError(absl::StrCat(
        "target ", tm.getTargetTriple().str(), " cannot emit ",
        type == llvm::CGFT_ObjectFile ? "object files" : "assembly"));
  }
  passes.run(module);
  return std::string(buffer.data(), buffer.size());
}

// ---------------------------------------------------------------------------
// Files for lld.

absl::Status ErrnoError(int error, absl::string_view what) {
  return absl::ErrnoToStatus(error, what);
}

// An owned file descriptor.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, reporting close()'s error (which can be a deferred write
  // error).
  int Close() {
    const int rc = close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

absl::Status WriteFile(const std::string& path, absl::string_view bytes) {
  ScopedFd fd(
      open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (fd.get() < 0) return ErrnoError(errno, absl::StrCat("open ", path));
  while (!bytes.empty()) {
    const ssize_t n = write(fd.get(), bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, absl::StrCat("write ", path));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  if (fd.Close() != 0) return ErrnoError(errno, absl::StrCat("close ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError(errno, absl::StrCat("open ", path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return ErrnoError(errno, absl::StrCat("fstat ", path));
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, absl::StrCat("read ", path));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path, " shrank while reading"));
    }
    done += static_cast<size_t>(n);
  }
  return bytes;
}

// A private directory (mode 0700) under $TMPDIR or /tmp, removed with
// everything in it when the object dies.
class TempDir {
 public:
  static absl::StatusOr<TempDir> Create() {
    const char* base = getenv("TMPDIR");
    std::string path = absl::StrCat(
        base != nullptr && base[0] != '\0' ? base : "/tmp", "/kiln-lld-XXXXXX");
    if (mkdtemp(path.data()) == nullptr) {
      return ErrnoError(errno, absl::StrCat("mkdtemp ", path));
    }
    return TempDir(std::move(path));
  }
  TempDir(TempDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  TempDir& operator=(TempDir&&) = delete;
  TempDir(const TempDir&) = delete;
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string File(absl::string_view name) const {
    return absl::StrCat(path_, "/", name);
  }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// The relocatable bundle (deploy/bundle.sh) carries glibc's libc.so,
// libm.so and libmvec.so as link inputs in <exe>/../share/kiln/link, so
// kilnd links kernels on a machine without libc6-dev; it comes first so that
// a bundle links the same way everywhere.
std::string BundleLinkDir() {
  std::error_code ec;
  std::filesystem::path exe =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return (exe.parent_path().parent_path() / "share" / "kiln" / "link").string();
}

absl::StatusOr<std::vector<std::string>> DefaultLibraryDirs() {
  std::vector<std::string> candidates = {"/usr/lib/x86_64-linux-gnu",
                                         "/lib/x86_64-linux-gnu", "/usr/lib64",
                                         "/lib64", "/usr/lib"};
  if (std::string bundle = BundleLinkDir(); !bundle.empty()) {
    candidates.insert(candidates.begin(), std::move(bundle));
  }
  for (const std::string& dir : candidates) {
    bool complete = true;
    for (const char* lib : {"libmvec.so", "libm.so", "libc.so"}) {
      std::error_code ec;
      complete &= std::filesystem::exists(absl::StrCat(dir, "/", lib), ec);
    }
    if (complete) return std::vector<std::string>{dir};
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no directory among ", absl::StrJoin(candidates, ", "),
                   " holds libmvec.so, libm.so and libc.so (install "
                   "libc6-dev or set LinkOptions::library_dirs)"));
}

// lld keeps its state in globals: one link at a time in the process. After a
// crash inside lld (a signal caught by the CrashRecoveryContext) that state
// may be corrupt, so no further link is attempted.
ABSL_CONST_INIT absl::Mutex lld_mutex(absl::kConstInit);
bool lld_unusable ABSL_GUARDED_BY(lld_mutex) = false;

}  // namespace

// ---------------------------------------------------------------------------

bool CpuTargetHasAvx512(const v1::CpuTarget& target) {
  return target.cpu() == "x86-64-v4" ||
         absl::StrContains(target.features(), "+avx512bw");
}

bool HasF16c(const llvm::TargetMachine& tm) {
  const llvm::MCSubtargetInfo* info = tm.getMCSubtargetInfo();
  return info != nullptr && tm.getTargetTriple().isX86() &&
         info->checkFeatures("+f16c");
}

v1::CpuTarget HostCpuTarget() {
  v1::CpuTarget target;
  target.set_triple(llvm::sys::getProcessTriple());
  target.set_cpu(llvm::sys::getHostCPUName().str());
  llvm::StringMap<bool> features;
  std::vector<std::string> items;
  if (llvm::sys::getHostCPUFeatures(features)) {
    for (const auto& entry : features) {
      items.push_back(
          absl::StrCat(entry.getValue() ? "+" : "-", entry.getKey().str()));
    }
    std::sort(items.begin(), items.end(),
              [](const std::string& a, const std::string& b) {
                return a.substr(1) < b.substr(1);
              });
  }
  target.set_features(absl::StrJoin(items, ","));
  return target;
}

absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> MakeTargetMachine(
    const v1::CpuTarget& target) {
  InitializeLlvmOnce();
  const llvm::Triple triple(llvm::Triple::normalize(target.triple()));
  std::string error;
  const llvm::Target* llvm_target =
      llvm::TargetRegistry::lookupTarget(triple.str(), error);
  if (llvm_target == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("no LLVM target for triple \"", target.triple(),
                     "\" (this compiler registers only its native target, ",
                     llvm::sys::getProcessTriple(), "): ", error));
  }
  if (!triple.isOSBinFormatELF()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "triple \"", target.triple(),
        "\" does not produce ELF objects; only ELF (Linux) CPU targets are "
        "supported"));
  }
  if (absl::Status s = ValidateCpuAndFeatures(*llvm_target, triple, target);
      !s.ok()) {
    return s;
  }
  llvm::TargetOptions options;
  std::unique_ptr<llvm::TargetMachine> tm(llvm_target->createTargetMachine(
      triple.str(), target.cpu(), target.features(), options, llvm::Reloc::PIC_,
      /*CM=*/std::nullopt, llvm::CodeGenOpt::Aggressive));
  if (tm == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("LLVM could not create a target machine for triple \"",
                     target.triple(), "\", cpu \"", target.cpu(),
                     "\", features \"", target.features(), "\""));
  }
  return tm;
}

absl::Status OptimizeModule(llvm::Module& module, llvm::TargetMachine& tm,
                            bool fast_math) {
  if (absl::Status s = PrepareModule(module, tm); !s.ok()) return s;
  {
    std::string messages;
    llvm::raw_string_ostream os(messages);
    if (llvm::verifyModule(module, &os)) {
      os.flush();
      return absl::InvalidArgumentError(
          absl::StrCat("module \"", module.getModuleIdentifier(),
                       "\" is not valid LLVM IR: ", messages));
    }
  }
  const std::string cpu = tm.getTargetCPU().str();
  const std::string features = tm.getTargetFeatureString().str();
  for (llvm::Function& function : module) {
    if (function.isDeclaration()) continue;
    if (!function.hasFnAttribute("target-cpu") && !cpu.empty()) {
      function.addFnAttr("target-cpu", cpu);
    }
    if (!function.hasFnAttribute("target-features") && !features.empty()) {
      function.addFnAttr("target-features", features);
    }
    if (!fast_math) continue;
    for (llvm::Instruction& inst : llvm::instructions(function)) {
      if (!llvm::isa<llvm::FPMathOperator>(inst)) continue;
      llvm::FastMathFlags flags = inst.getFastMathFlags();
      flags.setAllowReassoc();
      flags.setAllowContract();
      flags.setApproxFunc();
      inst.setFastMathFlags(flags);
    }
  }

  llvm::TargetLibraryInfoImpl tlii(tm.getTargetTriple());
  std::deque<std::string> vector_names;  // owns what the VecDescs point to
  if (tm.getTargetTriple().isX86()) {
    tlii.addVectorizableFunctions(
        LibmvecMappings(LibmvecIsas(tm), vector_names));
  }

  O3PipelineOptions o3;
  o3.tuning.LoopVectorization = true;
  o3.tuning.SLPVectorization = true;
  o3.tuning.LoopInterleaving = true;
  // No loop unrolling: with row lengths known at compile time (1024 for a
  // layer norm) the unroller replicated whole vector loops, tripling compile
  // time (layer norm 66 -> 19 ms CPU, bench/compiler/compile_bench) for no
  // gain on memory-bound kernels. Interleaving stays: it gives reductions
  // several accumulators.
  o3.tuning.LoopUnrolling = false;
  o3.library_info = &tlii;
  if (HasF16c(tm) && !tm.getMCSubtargetInfo()->checkFeatures("+avx512fp16")) {
    o3.extensions = [](llvm::PassBuilder& builder) {
      builder.registerVectorizerStartEPCallback(
          [](llvm::FunctionPassManager& passes, llvm::OptimizationLevel) {
            passes.addPass(PromoteHalfPass());
          });
      builder.registerOptimizerLastEPCallback(
          [](llvm::ModulePassManager& passes, llvm::OptimizationLevel) {
            passes.addPass(
                llvm::createModuleToFunctionPassAdaptor(PromoteHalfPass()));
          });
    };
  }
  RunO3Pipeline(module, tm, o3);
  return absl::OkStatus();
}

absl::StatusOr<std::string> EmitObject(llvm::Module& module,
                                       llvm::TargetMachine& tm) {
  return Emit(module, tm, llvm::CGFT_ObjectFile);
}

absl::StatusOr<std::string> EmitAssembly(llvm::Module& module,
                                         llvm::TargetMachine& tm) {
  return Emit(module, tm, llvm::CGFT_AssemblyFile);
}

namespace {

// One module's object: a target machine for `target`, O3, emission.
absl::StatusOr<std::string> OptimizeAndEmit(llvm::Module& module,
                                            const v1::CpuTarget& target,
                                            bool fast_math) {
  auto tm = MakeTargetMachine(target);
  if (!tm.ok()) return tm.status();
  if (absl::Status s = OptimizeModule(module, **tm, fast_math); !s.ok())
    return s;
  return EmitObject(module, **tm);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> OptimizeAndEmitObjects(
    llvm::Module& module, const v1::CpuTarget& target, bool fast_math,
    int parts) {
  return CompileKernelParts(module, parts, [&](llvm::Module& part) {
    return OptimizeAndEmit(part, target, fast_math);
  });
}

absl::StatusOr<std::string> LinkSharedObject(
    absl::Span<const std::string> objects, const LinkOptions& options) {
  if (objects.empty()) {
    return absl::InvalidArgumentError("LinkSharedObject: no objects to link");
  }
  std::vector<std::string> library_dirs = options.library_dirs;
  if (library_dirs.empty()) {
    absl::StatusOr<std::vector<std::string>> dirs = DefaultLibraryDirs();
    if (!dirs.ok()) return dirs.status();
    library_dirs = *std::move(dirs);
  }
  InitializeLlvmOnce();

  absl::StatusOr<TempDir> dir = TempDir::Create();
  if (!dir.ok()) return dir.status();
  // Fixed file names: nothing of the temporary path reaches the output.
  std::vector<std::string> args = {"ld.lld",
                                   "-shared",
                                   "--hash-style=gnu",
                                   "--build-id=none",
                                   "-z",
                                   "noexecstack",
                                   "-z",
                                   "relro",
                                   "-z",
                                   "now",
                                   "-o",
                                   dir->File("out.so")};
  if (!options.soname.empty()) {
    args.push_back("-soname");
    args.push_back(options.soname);
  }
  if (options.threads > 0) {
    args.push_back(absl::StrCat("--threads=", options.threads));
  }
  if (options.no_undefined) {
    args.push_back("-z");
    args.push_back("defs");
  }
  args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());
  for (size_t i = 0; i < objects.size(); ++i) {
    std::string path = dir->File(absl::StrCat("in", i, ".o"));
    if (absl::Status s = WriteFile(path, objects[i]); !s.ok()) return s;
    args.push_back(std::move(path));
  }
  for (const std::string& library_dir : library_dirs) {
    args.push_back(absl::StrCat("-L", library_dir));
  }
  args.push_back("--as-needed");
  for (const std::string& library : options.libraries) {
    args.push_back(absl::StrCat("-l", library));
  }
  std::vector<const char*> argv;
  argv.reserve(args.size());
  for (const std::string& arg : args) argv.push_back(arg.c_str());

  std::string out_text, err_text;
  llvm::raw_string_ostream out(out_text), err(err_text);
  bool linked = false;
  {
    absl::MutexLock lock(&lld_mutex);
    if (lld_unusable) {
      return absl::FailedPreconditionError(
          "lld crashed earlier in this process and its global "
          "state may be corrupt; restart the process to link again");
    }
    llvm::CrashRecoveryContext recovery;
    const bool returned = recovery.RunSafely([&] {
      linked = lld::elf::link(argv, out, err, /*exitEarly=*/false,
                              /*disableOutput=*/false);
    });
    if (!returned) {
      // lld "exited": a fatal() error (e.g. a malformed input object), which
      // unwinds here with RetCode = exit status, or a crash signal
      // (isCrash). After a fatal error lld's own cleanup (run by destroy())
      // resets its globals and linking can go on; after a crash it cannot.
      const bool crashed =
          llvm::CrashRecoveryContext::isCrash(recovery.RetCode);
      llvm::CrashRecoveryContext cleanup;
      const bool cleaned = !crashed && cleanup.RunSafely([] {
        lld::CommonLinkerContext::destroy();
      });
      if (!cleaned) lld_unusable = true;
      err.flush();
      return absl::InternalError(absl::StrCat(
          crashed ? "lld crashed" : "lld stopped with a fatal error",
          cleaned ? "" : " (no further links in this process)", ": ",
          err_text));
    }
    lld::CommonLinkerContext::destroy();
  }
  err.flush();
  if (!linked) {
    return absl::InternalError(absl::StrCat(
        "lld failed to link ", objects.size(), " object(s): ", err_text));
  }
  return ReadFile(dir->File("out.so"));
}

}  // namespace kiln
