// The LLVM back end for CPU kernels: from an llvm::Module to the bytes of an
// ELF shared object. In pipeline order:
//
//   MakeTargetMachine   kiln.v1.CpuTarget -> llvm::TargetMachine (PIC, -O3)
//   OptimizeModule      the new-PM O3 pipeline, with glibc's libmvec as the
//                       vector math library (exp/log/sin/... vectorise)
//   EmitObject          -> ELF relocatable object bytes
//   EmitAssembly        -> text assembly (for KILN_DUMP_DIR dumps)
//   LinkSharedObject    objects -> ELF shared object bytes, linked in-process
//                       with lld
//
// The result is loaded by runtime/cpu_loader.h (LoadedLibrary).
//
// Thread-safety: every function may be called from several threads at once as
// long as each thread uses its own llvm::LLVMContext, llvm::Module and
// llvm::TargetMachine (none of those is thread-safe). LinkSharedObject
// serialises the lld calls internally (lld keeps global state).
#ifndef KILN_COMPILER_CPU_BACKEND_H_
#define KILN_COMPILER_CPU_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kiln/v1/graph.pb.h"
#include "llvm/IR/Module.h"
#include "llvm/Target/TargetMachine.h"

namespace kiln {

// The CPU this process runs on: llvm::sys::getProcessTriple(), the host CPU
// name and its features ("+avx2,+fma,-avx512f,...", sorted by name).
v1::CpuTarget HostCpuTarget();

// Whether `target` has AVX-512 (F, BW, DQ, VL: the x86-64-v4 level, or
// "+avx512bw" among its features): what oneDNN's bfloat16 GEMM and
// convolutions need (its avx512_core).
bool CpuTargetHasAvx512(const v1::CpuTarget& target);

// Whether `tm`'s CPU converts float16 to and from float32 in hardware
// (x86's F16C, implied by every x86-64-v3 CPU and later).
bool HasF16c(const llvm::TargetMachine& tm);

// Creates a TargetMachine for `target` (relocation model PIC, code model
// small, CodeGenOpt::Aggressive). Registers LLVM's native target once per
// process. An empty `cpu` means LLVM's generic CPU for the triple.
//
// Errors: INVALID_ARGUMENT naming the offending value when the triple has no
// registered LLVM target (only the native target, x86, is registered), is not
// an ELF triple, when the CPU is not a known processor of that target, or
// when a feature is not of the form +name/-name with a known name (LLVM
// itself would only print a warning and ignore it).
absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> MakeTargetMachine(
    const v1::CpuTarget& target);

// Optimises `module` in place for `tm`: sets the module's target triple and
// data layout from `tm`, verifies it, then runs the new pass manager's O3
// pipeline (loop and SLP vectorisation on) with a TargetLibraryInfo that maps
// scalar math calls (expf, llvm.exp.f32, sinf, tanhf, log1pf, powf, ...) to
// glibc's libmvec vector variants, choosing only the variants the target's
// ISA can run (_ZGVb* SSE4 always, _ZGVc* AVX, _ZGVd* AVX2, _ZGVe* AVX-512F).
// (The CPU kernel emitter computes float32 exp inline rather than through
// libmvec, whose expf is slow for arguments below -87: codegen_cpu.cc.)
// On x86 with F16C but without AVX512-FP16, float16 compares, min/max, fneg,
// fabs, rounding and sqrt are computed in float32 (PromoteHalfPass,
// promote_half.h), which x86 vectorises; float16 ones it would not.
// Scalar libm calls must not be assumed to write errno (declare them
// memory(none), or use llvm.* intrinsics) or they stay scalar.
//
// With `fast_math`, every floating-point operation also gets the `reassoc`,
// `contract` and `afn` fast-math flags: float reductions then vectorise and
// a*b+c becomes an FMA. NaN/Inf semantics are kept (no `nnan`/`ninf`), so
// isnan and max/min propagation stay correct.
//
// Errors: INVALID_ARGUMENT with the verifier's messages when `module` is not
// valid IR.
absl::Status OptimizeModule(llvm::Module& module, llvm::TargetMachine& tm,
                            bool fast_math);

// Generates machine code for `module` (sets its triple/data layout from `tm`
// if unset) and returns the bytes of an ELF relocatable object. Code
// generation runs IR passes that modify `module`; emit at most once per
// module, except that EmitAssembly may precede EmitObject.
//
// Errors: FAILED_PRECONDITION when the module's data layout was set for a
// different target; INTERNAL when `tm` cannot emit objects.
absl::StatusOr<std::string> EmitObject(llvm::Module& module,
                                       llvm::TargetMachine& tm);

// As EmitObject, but returns the text assembly (AT&T syntax).
absl::StatusOr<std::string> EmitAssembly(llvm::Module& module,
                                         llvm::TargetMachine& tm);

// OptimizeModule and EmitObject for `module` on up to `parts` threads
// (CompileKernelParts, llvm_pipeline.h: the kernels dealt into `parts`
// modules, each optimized and emitted in an LLVMContext of its own with a
// TargetMachine for `target`, MakeTargetMachine). Returns one object per part,
// in order, for LinkSharedObject; with `parts` <= 1, or fewer kernels than
// parts, the module's one object made in this thread. A kernel is optimized
// with the same helpers as in the whole module, so it computes the same;
// `module` is left in an unspecified state. Deterministic: the same module and
// `parts` give the same objects.
//
// Errors: as MakeTargetMachine, OptimizeModule and EmitObject (the first
// part's error); INTERNAL when a part cannot be written or read back as
// bitcode.
absl::StatusOr<std::vector<std::string>> OptimizeAndEmitObjects(
    llvm::Module& module, const v1::CpuTarget& target, bool fast_math,
    int parts);

struct LinkOptions {
  // DT_SONAME of the output; empty: none.
  std::string soname = "libkiln_kernels.so";
  // Directories searched for `libraries` (lld's -L). Empty: the first of
  // <executable dir>/../share/kiln/link (the relocatable bundle's copies),
  // /usr/lib/x86_64-linux-gnu, /lib/x86_64-linux-gnu, /usr/lib64, /lib64,
  // /usr/lib that holds libmvec.so, libm.so and libc.so (libc6-dev).
  std::vector<std::string> library_dirs;
  // Linked --as-needed (lld's -l): a DT_NEEDED entry only for those used.
  // libmvec for the vector math calls OptimizeModule creates, libm for scalar
  // math, libc for memcpy/memset that LLVM's idiom recognition emits.
  std::vector<std::string> libraries = {"mvec", "m", "c"};
  // Fail on symbols no input or library defines (-z defs), so a bad kernel
  // fails here, in the compiler, rather than in the client's dlopen.
  bool no_undefined = true;
  // lld's --threads. 1 by default: for kernel-sized inputs lld's thread
  // pool costs more than it saves (measured 16 ms -> 8 ms per link on a
  // 2-core machine), links are serialised anyway, and with one thread every
  // lld fatal() happens on the thread whose CrashRecoveryContext catches it
  // (one in a pool thread would exit the process).
  int threads = 1;
  // Further lld arguments, appended before the inputs (e.g. "--gc-sections").
  std::vector<std::string> extra_args;
};

// Links ELF relocatable `objects` (from EmitObject) into a shared object with
// lld in this process and returns its bytes. The flags are -shared
// --hash-style=gnu --build-id=none -z noexecstack -z relro -z now, plus
// `options` (-soname, -z defs, --threads, -L, --as-needed -l...). lld works on
// files: inputs and output live in a private directory (mkdtemp under $TMPDIR
// or /tmp, mode 0700) that is removed before returning, on success and on every
// error. The output is a function of the inputs and options only (no paths,
// times or build ids), so identical objects give identical bytes.
//
// Errors: INVALID_ARGUMENT when `objects` is empty; INTERNAL with lld's
// diagnostics when the link fails (e.g. "undefined symbol: foo") or lld
// stops with a fatal error (a malformed object: lld would exit the process;
// here it unwinds through an llvm::CrashRecoveryContext and later links
// work); FAILED_PRECONDITION when no library directory is found, or when lld
// crashed (a signal) earlier in this process: its global state may be
// corrupt and no further links are attempted; the errno text when the
// temporary files cannot be created, written or read.
//
// Thread-safety: safe to call concurrently; lld calls are serialised by a
// process-wide mutex (lld::elf::link is not re-entrant), everything else runs
// in parallel.
absl::StatusOr<std::string> LinkSharedObject(
    absl::Span<const std::string> objects,
    const LinkOptions& options = LinkOptions());

}  // namespace kiln

#endif  // KILN_COMPILER_CPU_BACKEND_H_
