#include "compiler/compile.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "compiler/codegen_cpu.h"
#include "compiler/cpu_backend.h"
#ifdef KILN_HAVE_CUDA_BACKEND
#include "compiler/codegen_cuda.h"
#include "compiler/cuda_backend.h"
#endif
#include "compiler/fuse.h"
#include "compiler/gpu_launch.h"
#include "compiler/guard_key.h"
#include "compiler/import.h"
#include "compiler/lower.h"
#include "compiler/split_reductions.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/raw_ostream.h"
#include "support/sha256.h"

namespace kiln {

v1::SymPoly ToSymPoly(const SymExpr& e) {
  v1::SymPoly p;
  for (const SymExpr::Term& t : e.terms()) {
    v1::SymPoly::Term* term = p.add_terms();
    term->set_coeff(t.coeff);
    for (int s : t.symbols) term->add_symbols(s);
  }
  return p;
}

namespace {

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

 private:
  std::string dir_;
};

std::string ModuleText(const llvm::Module& m) {
  std::string s;
  llvm::raw_string_ostream os(s);
  m.print(os, nullptr);
  return os.str();
}

v1::DType WireDType(DType d) {
  return static_cast<v1::DType>(static_cast<int>(d));
}

// The program: buffers, then per kernel: allocate the temps it writes first,
// launch, and free temps after their last reader.
// `gpu_plans`: per kernel, for CUDA targets; empty for CPU targets.
v1::Program BuildProgram(const FusedProgram& fused,
                         const std::vector<GpuKernelPlan>& gpu_plans) {
  v1::Program program;
  for (const ProgramBuffer& b : fused.buffers) {
    v1::BufferSpec* spec = program.add_buffers();
    spec->set_kind(b.kind == ProgramBuffer::Kind::kInput ? v1::BufferSpec::INPUT
                   : b.kind == ProgramBuffer::Kind::kOutput
                       ? v1::BufferSpec::OUTPUT
                       : v1::BufferSpec::TEMP);
    spec->set_index(b.index);
    spec->set_dtype(WireDType(b.dtype));
    *spec->mutable_elements() = ToSymPoly(b.elements);
  }
  std::vector<int> last_use(fused.buffers.size(), -1);
  for (size_t k = 0; k < fused.kernels.size(); ++k) {
    for (int b : fused.kernels[k].buffers) last_use[b] = static_cast<int>(k);
  }
  std::vector<bool> allocated(fused.buffers.size(), false);
  for (size_t k = 0; k < fused.kernels.size(); ++k) {
    const Kernel& kernel = fused.kernels[k];
    for (int b : kernel.buffers) {
      if (fused.buffers[b].kind == ProgramBuffer::Kind::kTemp &&
          !allocated[b]) {
        program.add_steps()->set_alloc(b);
        allocated[b] = true;
      }
    }
    v1::Launch* launch = program.add_steps()->mutable_launch();
    launch->set_kernel(kernel.name);
    for (int b : kernel.buffers) launch->add_buffers(b);
    *launch->mutable_range() = ToSymPoly(kernel.OuterRange());
    // Rows of a row kernel are heavy; pointwise elements are light.
    bool has_inner = false;
    for (bool i : kernel.inner) has_inner |= i;
    launch->set_grain(has_inner ? 16 : 16384);
    if (!gpu_plans.empty()) {
      launch->set_block_threads(gpu_plans[k].block_threads);
      launch->set_items_per_block(gpu_plans[k].items_per_block);
    }
    for (int b : kernel.buffers) {
      if (fused.buffers[b].kind == ProgramBuffer::Kind::kTemp &&
          last_use[b] == static_cast<int>(k)) {
        program.add_steps()->set_free(b);
      }
    }
  }
  return program;
}

// The CPU back end: LLVM IR, O3 with libmvec, object, shared object.
absl::StatusOr<std::string> BuildCpuBinary(const FusedProgram& fused,
                                           const v1::CompileRequest& request,
                                           Dumper& dump) {
  llvm::LLVMContext context;
  auto module = EmitCpuModule(fused, context,
                              CpuCodegenOptions{request.options().fast_math()});
  if (!module.ok()) return module.status();
  dump.Write("04-llvm.ll", ModuleText(**module));
  auto tm = MakeTargetMachine(request.target().cpu());
  if (!tm.ok()) return tm.status();
  if (absl::Status s =
          OptimizeModule(**module, **tm, request.options().fast_math());
      !s.ok())
    return s;
  if (dump.enabled()) {
    dump.Write("05-llvm-opt.ll", ModuleText(**module));
    if (auto asm_text = EmitAssembly(**module, **tm); asm_text.ok())
      dump.Write("06-asm.s", *asm_text);
  }
  auto object = EmitObject(**module, **tm);
  if (!object.ok()) return object.status();
  return LinkSharedObject({*object});
}

// The CUDA back end: NVPTX IR, libdevice, O3, PTX, nvJitLink cubin.
absl::Status BuildCudaBinary(const Graph& graph, const FusedProgram& fused,
                             const v1::CompileRequest& request,
                             const CompileEnv& env, Dumper& dump,
                             std::vector<GpuKernelPlan>* plans,
                             v1::CudaBinary* out) {
#ifdef KILN_HAVE_CUDA_BACKEND
  const bool fast_math = request.options().fast_math();
  // Stage wall times, for the dump (the CUDA path's costs are uneven:
  // nvJitLink's ptxas dominates).
  std::string timings;
  auto t = std::chrono::steady_clock::now();
  auto lap = [&](const char* stage) {
    const auto now = std::chrono::steady_clock::now();
    absl::StrAppend(&timings, stage, " ",
                    std::chrono::duration<double, std::milli>(now - t).count(),
                    " ms\n");
    t = now;
  };
  CudaCodegenOptions options;
  options.fast_math = fast_math;
  if (env.gpu_groups_per_thread > 0)
    options.plan.groups_per_thread = env.gpu_groups_per_thread;
  options.plan.lane_loop = env.gpu_lane_loop;
  if (env.gpu_pointwise_vector_width > 0)
    options.plan.pointwise_vector_width = env.gpu_pointwise_vector_width;
  if (env.gpu_one_element_per_thread_max >= 0) {
    options.plan.one_element_per_thread_max =
        env.gpu_one_element_per_thread_max;
  }
  if (env.gpu_pointwise_groups_per_thread > 0) {
    options.plan.pointwise_groups_per_thread =
        env.gpu_pointwise_groups_per_thread;
  }
  for (const GraphInput& in : graph.inputs)
    options.input_alignment.push_back(in.alignment);
  auto tm = MakeNvptxTargetMachine(request.target().cuda());
  if (!tm.ok()) return tm.status();
  llvm::LLVMContext context;
  auto cuda = EmitCudaModule(fused, context, options);
  if (!cuda.ok()) return cuda.status();
  *plans = cuda->plans;
  lap("codegen");
  llvm::Module& module = *cuda->module;
  module.setTargetTriple((*tm)->getTargetTriple().str());
  module.setDataLayout((*tm)->createDataLayout());
  if (dump.enabled()) {
    std::string text;
    for (size_t k = 0; k < fused.kernels.size(); ++k) {
      absl::StrAppend(&text, fused.kernels[k].name, ": ",
                      (*plans)[k].ToString(), "\n");
    }
    dump.Write("04-gpu-plan.txt", text);
    dump.Write("04-llvm.ll", ModuleText(module));
  }
  if (absl::Status s = LinkLibdevice(module, fast_math); !s.ok()) return s;
  lap("libdevice");
  if (absl::Status s = OptimizeNvptxModule(
          module, **tm, NvptxOptimizeOptions{env.cuda_precompiled_trig});
      !s.ok())
    return s;
  lap("O3");
  dump.Write("05-llvm-opt.ll", ModuleText(module));
  auto ptx = EmitPtx(module, **tm);
  if (!ptx.ok()) return ptx.status();
  lap("ptx");
  dump.Write("06-kernels.ptx", *ptx);
  auto cubin = LinkCubin(*ptx, request.target().cuda().arch());
  if (!cubin.ok()) return cubin.status();
  lap("nvjitlink");
  dump.Write("08-timings.txt", timings);
  dump.Write("07-nvjitlink.txt", cubin->log);
  out->set_arch(request.target().cuda().arch());
  out->set_cubin(std::move(cubin->cubin));
  out->set_ptx(*std::move(ptx));
  out->set_jit_log(std::move(cubin->log));
  return absl::OkStatus();
#else
  return absl::UnimplementedError(
      absl::StrCat("target ", request.target().cuda().arch(),
                   ": this build of Kiln has no CUDA backend (CMake did not "
                   "find the CUDA toolkit); compile for a CPU target"));
#endif
}

}  // namespace

absl::StatusOr<v1::Artifact> Compile(const v1::CompileRequest& request,
                                     const CompileEnv& env) {
  const auto t0 = std::chrono::steady_clock::now();
  if (absl::Status s = ValidateTarget(request.target()); !s.ok()) return s;
  auto graph = ImportGraph(request.graph());
  if (!graph.ok()) return graph.status();
  const GuardKey key =
      ComputeGuardKey(*graph, request.target(), request.options());
  Dumper dump(env, key);
  dump.Write("01-graph.txt", graph->ToString());
  auto loops = Lower(*graph);
  if (!loops.ok()) return loops.status();
  dump.Write("02-loops.txt", loops->ToString());
  auto fused = Fuse(*loops, FuseOptions{env.fuse});
  if (!fused.ok()) return fused.status();
  dump.Write("03-fused.txt", fused->ToString());
  if ((request.target().has_cuda() && env.gpu_split_reductions) ||
      (!request.target().has_cuda() && env.split_reductions_on_cpu)) {
    *fused = SplitLongReductions(*std::move(fused));
    dump.Write("03-split.txt", fused->ToString());
  }

  v1::Artifact a;
  std::vector<GpuKernelPlan> gpu_plans;
  std::string binary;
  if (request.target().has_cuda()) {
    if (absl::Status s = BuildCudaBinary(*graph, *fused, request, env, dump,
                                         &gpu_plans, a.mutable_cuda());
        !s.ok())
      return s;
    binary = a.cuda().cubin();
  } else {
    auto so = BuildCpuBinary(*fused, request, dump);
    if (!so.ok()) return so.status();
    binary = *so;
    a.mutable_cpu()->set_shared_object(*std::move(so));
  }

  a.set_format_version(kArtifactFormatVersion);
  a.set_guard_key(
      std::string(reinterpret_cast<const char*>(key.data()), key.size()));
  *a.mutable_target() = request.target();
  // Symbols: where the runtime reads each one (its first appearance).
  for (size_t s = 0; s < graph->symbols.size(); ++s) {
    v1::SymbolGuard* g = a.add_symbols();
    g->set_name(graph->symbols[s].name);
    g->set_min_value(kMinSymbolValue);
    g->set_max_value(graph->symbols[s].max_value);
    g->set_multiple_of(graph->symbols[s].multiple_of);
    g->set_input(-1);
    g->set_dim(-1);
    for (size_t i = 0; i < graph->inputs.size() && g->input() < 0; ++i) {
      const TensorType& t = graph->type(graph->inputs[i].value);
      for (int d = 0; d < t.rank(); ++d) {
        if (t.sizes[d].AsSymbol() == static_cast<int>(s)) {
          g->set_input(static_cast<int>(i));
          g->set_dim(d);
          break;
        }
      }
    }
  }
  for (const GraphInput& in : graph->inputs) {
    const TensorType& t = graph->type(in.value);
    v1::InputGuard* g = a.add_inputs();
    g->set_dtype(WireDType(t.dtype));
    for (const SymExpr& s : t.sizes) *g->add_sizes() = ToSymPoly(s);
    for (const SymExpr& s : in.strides) *g->add_strides() = ToSymPoly(s);
    // CPU code uses unaligned vector loads; CUDA code uses aligned vector
    // loads of 16 bytes where the request promises that alignment (which is
    // part of the guard key).
    g->set_alignment(request.target().has_cuda() && in.alignment >= 16
                         ? 16
                         : DTypeSize(t.dtype));
  }
  *a.mutable_program() = BuildProgram(*fused, gpu_plans);
  for (size_t o = 0; o < graph->outputs.size(); ++o) {
    const TensorType& t = graph->type(graph->outputs[o]);
    v1::OutputSpec* out = a.add_outputs();
    out->set_dtype(WireDType(t.dtype));
    for (const SymExpr& s : t.sizes) *out->add_sizes() = ToSymPoly(s);
    for (size_t b = 0; b < fused->buffers.size(); ++b) {
      if (fused->buffers[b].kind == ProgramBuffer::Kind::kOutput &&
          fused->buffers[b].index == static_cast<int>(o)) {
        out->set_buffer(static_cast<int>(b));
      }
    }
  }
  const Sha256Digest binary_hash = Sha256(binary);
  a.set_binary_sha256(std::string(
      reinterpret_cast<const char*>(binary_hash.data()), binary_hash.size()));
  a.set_compile_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count());
  return a;
}

}  // namespace kiln
