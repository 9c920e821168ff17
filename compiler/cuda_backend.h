// The LLVM NVPTX back end for CUDA kernels: from the module codegen_cuda.h
// emits to a cubin, without a GPU. In pipeline order:
//
//   MakeNvptxTargetMachine  kiln.v1.CudaTarget -> llvm::TargetMachine
//   LinkLibdevice           math calls -> libdevice (__nv_expf, ...), linked
//                           with LinkOnlyNeeded and internalized
//   OptimizeNvptxModule     O3 with the NVPTX passes (NVVMReflect folds
//                           __nvvm_reflect("__CUDA_FTZ") from the module's
//                           nvvm-reflect-ftz flag); the out-of-line trig
//                           functions become declarations of precompiled ones
//   EmitPtx                 -> PTX text, the precompiled functions spliced in
//   LinkCubin               PTX -> cubin for sm_XX with nvJitLink
//
// LLVM 16 knows PTX ISA 7.8 and sm_90 at most: newer architectures get
// sm_90 PTX, which nvJitLink compiles for the requested one (PTX is forward
// compatible).
//
// libdevice.10.bc is read once per process, from the first of
// $KILN_LIBDEVICE, <dir of this executable>/../share/kiln/libdevice.10.bc
// (the relocatable bundle), and the CUDA toolkit found at build time. Each
// compile parses it lazily in its own LLVMContext, so only the functions a
// kernel calls are materialised. The out-of-line sinf/cosf/tanf (their
// Payne-Hanek path) are optimised and compiled to PTX once per process, per
// PTX target and FTZ setting, on first use (NvptxOptimizeOptions).
//
// nvJitLink is loaded with dlopen on first use (libnvJitLink.so.13 from the
// library path, $KILN_NVJITLINK, or the toolkit found at build time), so
// kilnd starts and compiles for CPUs on machines without CUDA.
//
// Thread-safety: every function may be called from several threads at once
// as long as each thread uses its own LLVMContext, Module and TargetMachine.
#ifndef KILN_COMPILER_CUDA_BACKEND_H_
#define KILN_COMPILER_CUDA_BACKEND_H_

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

// The compute capability of "sm_XX" (e.g. 90), or INVALID_ARGUMENT naming
// the value when it is not of that form or older than sm_50.
absl::StatusOr<int> ParseCudaArch(const std::string& arch);

// A TargetMachine for nvptx64-nvidia-cuda and the PTX architecture used for
// `target` (min(sm_XX, sm_90)), CodeGenOpt::Aggressive. Registers the NVPTX
// target once per process. Errors: INVALID_ARGUMENT for a bad arch.
absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> MakeNvptxTargetMachine(
    const v1::CudaTarget& target);

// Rewrites LLVM math intrinsics and libm calls (llvm.exp.f32, expm1f, frem,
// ...) into libdevice calls (with `fast_math`, the __nv_fast_* variants
// of log; ex2.approx for exp, rcp.approx for reciprocals and div.full for
// other float division, as Triton's defaults; sin/cos/tan, pow and tanh
// stay accurate), links the libdevice
// functions they need and internalizes them, and sets the nvvm-reflect-ftz
// module flag from `fast_math`. Errors: FAILED_PRECONDITION when libdevice is
// needed and not found (the message lists where it looked); INTERNAL when
// linking fails.
absl::Status LinkLibdevice(llvm::Module& module, bool fast_math);

struct NvptxOptimizeOptions {
  // libdevice's out-of-line trig functions (the huge-argument path of
  // sinf/cosf/tanf, see LinkLibdevice) optimised and compiled to PTX once
  // per process (per target CPU and FTZ) instead of in every compile: the
  // module keeps declarations of them and EmitPtx splices their PTX in. The
  // PTX is the same either way; false only to measure that or to check it.
  bool precompiled_trig = true;
};

// Sets the module's triple and data layout from `tm` and runs O3 with the
// NVPTX pipeline callbacks. Errors: INVALID_ARGUMENT for invalid IR;
// INTERNAL when the precompiled trig functions cannot be built.
absl::Status OptimizeNvptxModule(llvm::Module& module, llvm::TargetMachine& tm,
                                 const NvptxOptimizeOptions& options = {});

// PTX text of `module`, with the precompiled trig functions its
// declarations stand for (NvptxOptimizeOptions::precompiled_trig) spliced
// in. Errors: INTERNAL when code generation fails.
absl::StatusOr<std::string> EmitPtx(llvm::Module& module,
                                    llvm::TargetMachine& tm);

struct CubinResult {
  std::string cubin;
  // nvJitLink's info log (ptxas -v: registers, shared memory, spills per
  // kernel).
  std::string log;
  int64_t spill_bytes = 0;  // spill stores + loads over all kernels
};

// Sum of the "N bytes spill stores" and "M bytes spill loads" figures in an
// nvJitLink/ptxas -verbose log.
int64_t SpillBytes(const std::string& log);

// OptimizeNvptxModule and EmitPtx for `module` (libdevice linked) on up to
// `parts` threads: CompileKernelParts (llvm_pipeline.h) deals its kernels
// into `parts` modules, each optimized and emitted in an LLVMContext of its
// own with a TargetMachine for `target`. Returns one PTX module per part,
// in order, for LinkCubin; with `parts` <= 1 or fewer kernels than parts,
// the module's one PTX made in this thread. A kernel's PTX is the same as
// in the whole module but for the numbers in its labels and local depot
// (the function's index in its module). Deterministic; `module` is left in
// an unspecified state. Errors: as MakeNvptxTargetMachine,
// OptimizeNvptxModule and EmitPtx (the first part's error).
absl::StatusOr<std::vector<std::string>> OptimizeAndEmitPtx(
    llvm::Module& module, const v1::CudaTarget& target,
    const NvptxOptimizeOptions& options, int parts);

// Compiles PTX modules (EmitPtx's, one or more: each kernel is defined in
// one) into one cubin for `arch` ("sm_90") with nvJitLink (-O3,
// -verbose). `threads` other than 1 lets ptxas compile the kernels on that
// many threads (nvJitLink's -split-compile; 0: as many as the machine
// has). Errors: FAILED_PRECONDITION when nvJitLink cannot be loaded;
// INVALID_ARGUMENT for no modules; INTERNAL with nvJitLink's error log when
// it rejects the PTX.
absl::StatusOr<CubinResult> LinkCubin(absl::Span<const std::string> ptx,
                                      const std::string& arch, int threads = 1);

}  // namespace kiln

#endif  // KILN_COMPILER_CUDA_BACKEND_H_
