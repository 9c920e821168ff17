#include "compiler/compile.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/build_artifact.h"
#include "compiler/codegen_cpu.h"
#include "compiler/cpu_backend.h"
#ifdef KILN_HAVE_CUDA_BACKEND
#include "compiler/codegen_cuda.h"
#include "compiler/cuda_backend.h"
#endif
#include "compiler/fuse.h"
#include "compiler/gemm_epilogue.h"
#include "compiler/gpu_launch.h"
#include "compiler/llvm_pipeline.h"
#include "compiler/lower.h"
#include "compiler/simplify_indices.h"
#include "compiler/split_reductions.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Transforms/Utils/Cloning.h"

namespace kiln {
namespace {

// Whether CUDA arch "sm_XX" (validated by ValidateTarget) is at least sm_min.
bool CudaArchAtLeast(const std::string& arch, int min) {
  int sm = 0;
  return arch.size() > 3 && absl::SimpleAtoi(arch.substr(3), &sm) && sm >= min;
}

// Writes stage dumps when a dump directory is configured. Failures to
// write are ignored: dumps are a debugging aid, never a reason to fail.
class Dumper {
 public:
  Dumper(const CompileEnv& env, const GuardKey& key) {
    std::string root = env.dump_dir;
    if (root.empty()) {
      if (const char* d = std::getenv("KILN_DUMP_DIR")) root = d;
    }
    if (root.empty()) return;
    dir_ = absl::StrCat(root, "/", DigestToHex(key).substr(0, 16),
                        env.fuse ? "" : "-unfused");
    ::mkdir(root.c_str(), 0755);
    ::mkdir(dir_.c_str(), 0755);
  }
  bool enabled() const { return !dir_.empty(); }
  void Write(absl::string_view name, absl::string_view text) {
    if (!enabled()) return;
    std::ofstream out(absl::StrCat(dir_, "/", name));
    out << text;
  }
  // The text is made only when dumps are on (an IR's ToString is not free:
  // a big program's is a noticeable share of its compile).
  void Write(absl::string_view name,
             absl::FunctionRef<std::string()> make_text) {
    if (enabled()) Write(name, absl::string_view(make_text()));
  }

 private:
  std::string dir_;
};

// Stage wall times for the dump (08-timings.txt): "stage N ms" lines.
class Laps {
 public:
  void Lap(absl::string_view stage) {
    const auto now = std::chrono::steady_clock::now();
    absl::StrAppend(&text_, stage, " ",
                    std::chrono::duration<double, std::milli>(now - t_).count(),
                    " ms\n");
    t_ = now;
  }
  const std::string& text() const { return text_; }

 private:
  std::chrono::steady_clock::time_point t_ = std::chrono::steady_clock::now();
  std::string text_;
};

std::string ModuleText(const llvm::Module& m) {
  std::string s;
  llvm::raw_string_ostream os(s);
  m.print(os, nullptr);
  return os.str();
}

// A CompileEnv thread count: `configured` when set (>= 0), else $`env_var`
// when it is a count, else 0 (every core).
int ThreadsSetting(int configured, const char* env_var) {
  if (configured >= 0) return configured;
  int threads = 0;
  const char* v = std::getenv(env_var);
  if (v == nullptr || !absl::SimpleAtoi(v, &threads) || threads < 0) return 0;
  return threads;
}

// How many modules a program's kernels are compiled as, each on a thread of
// its own (CompileKernelParts, llvm_pipeline.h): one per `threads` (a
// CompileEnv setting, ThreadsSetting's `env_var` when unset; 0: every
// core), but no part under `min_per_part` kernels (0: kMinKernelsPerPart;
// a part's target machine and bitcode copy are not free).
constexpr int kMinKernelsPerPart = 32;

int CompileParts(int configured, const char* env_var, int min_per_part,
                 const llvm::Module& module) {
  int threads = ThreadsSetting(configured, env_var);
  if (threads == 0)
    threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int kernels = CountKernels(module);
  if (min_per_part <= 0) min_per_part = kMinKernelsPerPart;
  return std::max(1, std::min(threads, kernels / min_per_part));
}

// The CPU back end: LLVM IR, O3 with libmvec, object, shared object.
absl::StatusOr<std::string> BuildCpuBinary(const FusedProgram& fused,
                                           const ImportedRequest& request,
                                           const CompileEnv& env, Dumper& dump,
                                           Laps& laps) {
  llvm::LLVMContext context;
  CpuCodegenOptions options;
  options.fast_math = request.options.fast_math();
  options.row_blocks = env.cpu_row_blocks;
  options.split_innermost_dim = env.cpu_split_innermost_dim;
  options.coalesce_dims = env.cpu_coalesce_dims;
  if (auto tm = MakeTargetMachine(request.target.cpu()); tm.ok())
    options.f16c = HasF16c(**tm);
  auto module = EmitCpuModule(fused, context, options);
  if (!module.ok()) return module.status();
  laps.Lap("codegen");
  if (dump.enabled()) {
    dump.Write("04-llvm.ll", ModuleText(**module));
    // The whole module optimized, for the dumps (the parts below are
    // optimized one by one): dumping doubles the LLVM work.
    auto tm = MakeTargetMachine(request.target.cpu());
    if (!tm.ok()) return tm.status();
    std::unique_ptr<llvm::Module> copy = llvm::CloneModule(**module);
    if (OptimizeModule(*copy, **tm, request.options.fast_math()).ok()) {
      dump.Write("05-llvm-opt.ll", ModuleText(*copy));
      if (auto asm_text = EmitAssembly(*copy, **tm); asm_text.ok())
        dump.Write("06-asm.s", *asm_text);
    }
    laps.Lap("dump");
  }
  const int parts =
      CompileParts(env.cpu_compile_threads, "KILN_CPU_COMPILE_THREADS",
                   env.cpu_min_kernels_per_part, **module);
  auto objects = OptimizeAndEmitObjects(**module, request.target.cpu(),
                                        request.options.fast_math(), parts);
  if (!objects.ok()) return objects.status();
  laps.Lap(absl::StrCat("O3+object/", objects->size(), "_parts"));
  auto so = LinkSharedObject(*objects);
  laps.Lap("link");
  return so;
}

// The CUDA back end: NVPTX IR in the plans' forms, libdevice, O3, PTX,
// nvJitLink cubin.
absl::StatusOr<v1::CudaBinary> BuildCudaBinary(
    const FusedProgram& fused, const std::vector<GpuKernelPlan>& plans,
    const ImportedRequest& request, const CompileEnv& env, Dumper& dump,
    Laps& laps) {
#ifdef KILN_HAVE_CUDA_BACKEND
  const bool fast_math = request.options.fast_math();
  CudaCodegenOptions options;
  options.fast_math = fast_math;
  for (const GraphInput& in : request.graph.inputs)
    options.input_alignment.push_back(in.alignment);
  absl::StatusOr<int> cc = ParseCudaArch(request.target.cuda().arch());
  if (!cc.ok()) return cc.status();
  options.compute_capability = *cc;
  auto tm = MakeNvptxTargetMachine(request.target.cuda());
  if (!tm.ok()) return tm.status();
  llvm::LLVMContext context;
  auto emitted = EmitCudaModule(fused, plans, context, options);
  if (!emitted.ok()) return emitted.status();
  laps.Lap("codegen");
  llvm::Module& module = **emitted;
  module.setTargetTriple((*tm)->getTargetTriple().str());
  module.setDataLayout((*tm)->createDataLayout());
  if (dump.enabled()) {
    dump.Write("04-llvm.ll", ModuleText(module));
    laps.Lap("dump");
  }
  if (absl::Status s = LinkLibdevice(module, fast_math); !s.ok()) return s;
  laps.Lap("libdevice");
  const NvptxOptimizeOptions nvptx{env.cuda_precompiled_trig};
  if (dump.enabled()) {
    // The whole module optimized, for the dumps (the parts below are
    // optimized one by one): dumping doubles the LLVM work.
    std::unique_ptr<llvm::Module> copy = llvm::CloneModule(module);
    if (OptimizeNvptxModule(*copy, **tm, nvptx).ok())
      dump.Write("05-llvm-opt.ll", ModuleText(*copy));
    laps.Lap("dump");
  }
  const int parts =
      CompileParts(env.cuda_compile_threads, "KILN_CUDA_COMPILE_THREADS",
                   env.cuda_min_kernels_per_part, module);
  auto ptx = OptimizeAndEmitPtx(module, request.target.cuda(), nvptx, parts);
  if (!ptx.ok()) return ptx.status();
  laps.Lap(absl::StrCat("O3+ptx/", ptx->size(), "_parts"));
  // The parts one after another (for reading; the runtime loads the cubin).
  std::string ptx_text = absl::StrJoin(*ptx, "\n");
  if (dump.enabled()) {
    dump.Write("06-kernels.ptx", ptx_text);
    laps.Lap("dump");
  }
  auto cubin = LinkCubin(
      *ptx, request.target.cuda().arch(),
      ThreadsSetting(env.cuda_link_threads, "KILN_CUDA_LINK_THREADS"));
  if (!cubin.ok()) return cubin.status();
  laps.Lap("nvjitlink");
  dump.Write("07-nvjitlink.txt", cubin->log);
  v1::CudaBinary out;
  out.set_arch(request.target.cuda().arch());
  out.set_cubin(std::move(cubin->cubin));
  out.set_ptx(std::move(ptx_text));
  out.set_jit_log(std::move(cubin->log));
  return out;
#else
  return absl::UnimplementedError(
      absl::StrCat("target ", request.target.cuda().arch(),
                   ": this build of Kiln has no CUDA backend (CMake did not "
                   "find the CUDA toolkit); compile for a CPU target"));
#endif
}

// The launch-plan options a CompileEnv asks for (benchmarks try others).
GpuPlanOptions PlanOptions(const CompileEnv& env) {
  GpuPlanOptions plan;
  if (env.gpu_groups_per_thread > 0)
    plan.groups_per_thread = env.gpu_groups_per_thread;
  plan.lane_loop = env.gpu_lane_loop;
  if (env.gpu_pointwise_vector_width > 0)
    plan.pointwise_vector_width = env.gpu_pointwise_vector_width;
  if (env.gpu_one_element_per_thread_max >= 0)
    plan.one_element_per_thread_max = env.gpu_one_element_per_thread_max;
  if (env.gpu_pointwise_groups_per_thread > 0)
    plan.pointwise_groups_per_thread = env.gpu_pointwise_groups_per_thread;
  if (env.gpu_max_persistent_row >= 0)
    plan.max_persistent_row = env.gpu_max_persistent_row;
  if (env.gpu_looped_row_threads > 0)
    plan.looped_row_threads = env.gpu_looped_row_threads;
  if (env.gpu_max_persistent_row_values >= 0)
    plan.max_persistent_row_values = env.gpu_max_persistent_row_values;
  return plan;
}

}  // namespace

absl::StatusOr<v1::Artifact> Compile(const ImportedRequest& request,
                                     const CompileEnv& env) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool cuda = request.target.has_cuda();
  Dumper dump(env, request.key);
  Laps laps;
  dump.Write("01-graph.txt", [&] { return request.graph.ToString(); });

  LowerOptions lower_options;
  lower_options.half_precision_gemm = cuda;  // cuBLASLt takes f16/bf16
  // oneDNN's bfloat16 GEMM and convolutions need AVX-512 (avx512_core);
  // below it the operands are widened by Kiln kernels instead.
  const bool avx512 = !cuda && CpuTargetHasAvx512(request.target.cpu());
  lower_options.bf16_operands_f32_result = avx512;
  // (request.options is normalized: these are false for CPU targets.)
  lower_options.tf32 = request.options.allow_tf32();
  lower_options.strict_fp16_reduction = request.options.strict_fp16_reduction();
  lower_options.strict_bf16_reduction = request.options.strict_bf16_reduction();
  // (cpu_library_convolutions is false for CUDA targets and graphs without
  // convolutions: NormalizeOptions.)
  lower_options.library_convolutions =
      cuda ? !env.gpu_kernel_convolutions
           : request.options.cpu_library_convolutions();
  lower_options.half_precision_convolutions = cuda;
  lower_options.bf16_convolutions_f32_result = avx512;  // oneDNN
  lower_options.unrolled_pool_windows = !cuda;
  lower_options.tf32_convolution = request.options.allow_tf32_convolution();
  lower_options.deterministic_convolutions =
      request.options.deterministic_convolutions();
  lower_options.cudnn_benchmark = cuda && request.options.cudnn_benchmark();
  // cuDNN's fused attention engines need sm_80 or later; on sm_90 and
  // later cuDNN 9 takes head dims up to 256, forward and backward
  // (CudaGpu.CudnnAttentionMatchesReference: 160, 192, 256 on an H200 with
  // cuDNN 9.14). An older cuDNN without such an engine fails the call with
  // UNIMPLEMENTED, and the Python backend then runs the partition eagerly.
  // cuDNN's backward also gives the bias's gradient (dBias) for every bias
  // shape Kiln passes it, [B or 1, H or 1, L, S], with or without dropout
  // (CudaGpu.CudnnAttentionBiasGradient on an H200, cuDNN 9.14).
  // The CPU runtime's fused attention (runtime/cpu_attention.h) takes every
  // case, and draws dropout as Kiln's kernels do.
  LowerOptions::LibraryAttention& attention = lower_options.library_attention;
  if (cuda) {
    attention.enabled = CudaArchAtLeast(request.target.cuda().arch(), 80);
    attention.max_head_dim =
        CudaArchAtLeast(request.target.cuda().arch(), 90) ? 256 : 128;
    attention.bias_grad = true;
  } else {
    attention.enabled = !env.cpu_written_attention;
    attention.float32 = true;
    attention.head_dim_multiple = 1;
    attention.max_head_dim = std::numeric_limits<int>::max();
    attention.max_dropout_head_dim = std::numeric_limits<int>::max();
    attention.deterministic = true;
    attention.kiln_philox = true;
    attention.bias_grad = true;
  }
  lower_options.atomic_scatters = cuda;
  lower_options.reduction_cumsum = cuda || env.reduction_cumsum_on_cpu;
  lower_options.deterministic_scatters =
      request.options.deterministic_algorithms();
  lower_options.deterministic_gemms =
      request.options.deterministic_algorithms();
  lower_options.max_scatter_work_log2 =
      cuda ? kCudaMaxScatterWorkLog2 : kCpuMaxScatterWorkLog2;
  absl::StatusOr<LoopGraph> loops = Lower(request.graph, lower_options);
  if (!loops.ok()) return loops.status();
  laps.Lap("lower");
  if (!env.index_checks && !loops->index_checks.empty()) {
    ir::Rewriter unchecked([](const Expr& x) -> std::optional<Expr> {
      if (x->op != ExprOp::kCheck) return std::nullopt;
      return x->args[0];
    });
    for (LoopNode& n : loops->nodes) {
      n.body = unchecked.Run(n.body);
      n.finalize = unchecked.Run(n.finalize);
    }
    loops->index_checks.clear();
  }
  dump.Write("02-loops.txt", [&] { return loops->ToString(); });

  if (cuda && !request.options.unfused_gemm_epilogues()) {
    *loops = FoldGemmEpilogues(*std::move(loops));
    dump.Write("02-epilogues.txt", [&] { return loops->ToString(); });
  }

  FuseOptions fuse_options;
  fuse_options.fuse = env.fuse;
  fuse_options.stores_into_reductions = cuda || env.split_reductions_on_cpu;
  absl::StatusOr<FusedProgram> fused = Fuse(*loops, fuse_options);
  if (!fused.ok()) return fused.status();
  laps.Lap("fuse");
  dump.Write("03-fused.txt", [&] { return fused->ToString(); });

  if (cuda ? env.gpu_split_reductions : env.split_reductions_on_cpu) {
    *fused = SplitLongReductions(*std::move(fused));
    dump.Write("03-split.txt", [&] { return fused->ToString(); });
  }
  *fused = SimplifyIndices(*std::move(fused));
  dump.Write("03-indices.txt", [&] { return fused->ToString(); });
  laps.Lap("simplify");

  std::vector<GpuKernelPlan> gpu_plans;
  KernelBinary binary;
  if (cuda) {
    gpu_plans = PlanGpuLaunches(*fused, PlanOptions(env));
    dump.Write("04-gpu-plan.txt",
               [&] { return GpuPlansToString(*fused, gpu_plans); });
    absl::StatusOr<v1::CudaBinary> cubin =
        BuildCudaBinary(*fused, gpu_plans, request, env, dump, laps);
    if (!cubin.ok()) return cubin.status();
    binary.cuda = *std::move(cubin);
  } else {
    absl::StatusOr<std::string> so =
        BuildCpuBinary(*fused, request, env, dump, laps);
    if (!so.ok()) return so.status();
    binary.cpu_shared_object = *std::move(so);
  }
  dump.Write("08-timings.txt", laps.text());

  v1::Artifact artifact =
      BuildArtifact(request, *fused, gpu_plans, std::move(binary));
  artifact.set_compile_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count());
  return artifact;
}

absl::StatusOr<v1::Artifact> Compile(const v1::CompileRequest& request,
                                     const CompileEnv& env) {
  absl::StatusOr<ImportedRequest> imported = ImportRequest(request);
  if (!imported.ok()) return imported.status();
  return Compile(*imported, env);
}

}  // namespace kiln
