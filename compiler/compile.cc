#include "compiler/compile.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "compiler/codegen_cpu.h"
#include "compiler/cpu_backend.h"
#include "compiler/fuse.h"
#include "compiler/guard_key.h"
#include "compiler/import.h"
#include "compiler/lower.h"
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
v1::Program BuildProgram(const FusedProgram& fused) {
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
    for (int b : kernel.buffers) {
      if (fused.buffers[b].kind == ProgramBuffer::Kind::kTemp &&
          last_use[b] == static_cast<int>(k)) {
        program.add_steps()->set_free(b);
      }
    }
  }
  return program;
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
  if (request.target().has_cuda()) {
    return absl::UnimplementedError(
        absl::StrCat("target ", request.target().cuda().arch(),
                     ": this build of Kiln has no CUDA backend yet; compile "
                     "for a CPU target"));
  }
  auto loops = Lower(*graph);
  if (!loops.ok()) return loops.status();
  dump.Write("02-loops.txt", loops->ToString());
  auto fused = Fuse(*loops, FuseOptions{env.fuse});
  if (!fused.ok()) return fused.status();
  dump.Write("03-fused.txt", fused->ToString());

  llvm::LLVMContext context;
  auto module = EmitCpuModule(*fused, context,
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
  auto so = LinkSharedObject({*object});
  if (!so.ok()) return so.status();

  v1::Artifact a;
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
    g->set_alignment(
        DTypeSize(t.dtype));  // the code uses unaligned vector loads
  }
  *a.mutable_program() = BuildProgram(*fused);
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
  const Sha256Digest binary_hash = Sha256(*so);
  a.mutable_cpu()->set_shared_object(*std::move(so));
  a.set_binary_sha256(std::string(
      reinterpret_cast<const char*>(binary_hash.data()), binary_hash.size()));
  a.set_compile_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count());
  return a;
}

}  // namespace kiln
