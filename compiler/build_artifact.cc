#include "compiler/build_artifact.h"

#include <utility>

#include "absl/algorithm/container.h"
#include "graph/ops/random.h"
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

v1::DType WireDType(DType d) {
  return static_cast<v1::DType>(static_cast<int>(d));
}

v1::MatrixOperand MatrixOperandOf(const MatrixLayout& layout, int buffer) {
  v1::MatrixOperand m;
  m.set_buffer(buffer);
  *m.mutable_offset() = ToSymPoly(layout.offset);
  *m.mutable_batch_stride() = ToSymPoly(layout.batch_stride);
  *m.mutable_row_stride() = ToSymPoly(layout.row_stride);
  *m.mutable_col_stride() = ToSymPoly(layout.col_stride);
  return m;
}

v1::Gemm::Epilogue WireEpilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone:
      return v1::Gemm::EPILOGUE_NONE;
    case GemmEpilogue::kBias:
      return v1::Gemm::BIAS;
    case GemmEpilogue::kRelu:
      return v1::Gemm::RELU;
    case GemmEpilogue::kReluBias:
      return v1::Gemm::RELU_BIAS;
    case GemmEpilogue::kGeluTanh:
      return v1::Gemm::GELU_TANH;
    case GemmEpilogue::kGeluTanhBias:
      return v1::Gemm::GELU_TANH_BIAS;
    case GemmEpilogue::kBiasGradB:
      return v1::Gemm::BGRAD_B;
    case GemmEpilogue::kBiasGradA:
      return v1::Gemm::BGRAD_A;
  }
  return v1::Gemm::EPILOGUE_NONE;
}

// An extern kernel's call: slots 0, 1, 2 are A, B, C, 3 the bias.
v1::ExternCall ExternCallStep(const GemmCall& gemm,
                              const std::vector<int>& buffers,
                              const FusedProgram& fused, bool cpu) {
  v1::ExternCall call;
  call.set_library(cpu ? v1::ExternCall::BLAS : v1::ExternCall::CUBLASLT);
  v1::Gemm* g = call.mutable_gemm();
  *g->mutable_a() = MatrixOperandOf(gemm.a, buffers[0]);
  *g->mutable_b() = MatrixOperandOf(gemm.b, buffers[1]);
  *g->mutable_c() = MatrixOperandOf(gemm.c, buffers[2]);
  *g->mutable_batch() = ToSymPoly(gemm.batch);
  *g->mutable_m() = ToSymPoly(gemm.m);
  *g->mutable_n() = ToSymPoly(gemm.n);
  *g->mutable_k() = ToSymPoly(gemm.k);
  g->set_alpha(gemm.alpha);
  g->set_beta(0);
  const DType ab = fused.buffers[buffers[0]].dtype;
  const DType c = fused.buffers[buffers[2]].dtype;
  g->set_dtype(WireDType(ab));
  if (c != ab) g->set_c_dtype(WireDType(c));
  g->set_compute_dtype(WireDType(gemm.compute_dtype));
  g->set_epilogue(WireEpilogue(gemm.epilogue));
  if (EpilogueHasBias(gemm.epilogue) || EpilogueWritesBias(gemm.epilogue)) {
    MatrixLayout bias;
    bias.offset = gemm.bias_offset;
    *g->mutable_bias() = MatrixOperandOf(bias, buffers[3]);
  }
  g->set_tf32(gemm.tf32);
  g->set_strict_reduction(gemm.strict_reduction);
  g->set_deterministic(gemm.deterministic);
  return call;
}

v1::Convolution::Direction WireDirection(ConvDirection d) {
  switch (d) {
    case ConvDirection::kForward:
      return v1::Convolution::FORWARD;
    case ConvDirection::kBackwardData:
      return v1::Convolution::BACKWARD_DATA;
    case ConvDirection::kBackwardFilter:
      return v1::Convolution::BACKWARD_FILTER;
  }
  return v1::Convolution::FORWARD;
}

// A convolution kernel's call (cuDNN on CUDA targets, oneDNN on CPU
// ones): slots 0, 1 its operands, 2 the tensor it writes.
v1::ExternCall ConvCallStep(const ConvCall& conv,
                            const std::vector<int>& buffers,
                            const FusedProgram& fused, bool cpu) {
  v1::ExternCall call;
  call.set_library(cpu ? v1::ExternCall::ONEDNN : v1::ExternCall::CUDNN);
  v1::Convolution* c = call.mutable_conv();
  c->set_direction(WireDirection(conv.direction));
  c->set_input(buffers[0]);
  c->set_weight(buffers[1]);
  c->set_output(buffers[2]);
  for (const SymExpr& e : conv.x_sizes) *c->add_x_sizes() = ToSymPoly(e);
  for (const SymExpr& e : conv.w_sizes) *c->add_w_sizes() = ToSymPoly(e);
  for (const SymExpr& e : conv.y_sizes) *c->add_y_sizes() = ToSymPoly(e);
  for (int64_t v : conv.stride) c->add_stride(v);
  for (int64_t v : conv.padding) c->add_padding(v);
  for (int64_t v : conv.dilation) c->add_dilation(v);
  c->set_groups(conv.groups);
  const DType operands = fused.buffers[buffers[0]].dtype;
  const DType written = fused.buffers[buffers[2]].dtype;
  c->set_dtype(WireDType(operands));
  if (written != operands) c->set_result_dtype(WireDType(written));
  c->set_tf32(conv.tf32);
  c->set_deterministic(conv.deterministic);
  c->set_benchmark(conv.benchmark);
  return call;
}

// An attention kernel's call (cuDNN on CUDA targets, the CPU runtime's own
// kernel on CPU targets): its slots are the buffers it reads, then those
// it writes (loop_ir.h, AttentionCall).
v1::ExternCall AttentionCallStep(const AttentionCall& a,
                                 const std::vector<int>& buffers,
                                 const FusedProgram& fused, bool cpu) {
  v1::ExternCall call;
  call.set_library(cpu ? v1::ExternCall::KILN_RUNTIME : v1::ExternCall::CUDNN);
  v1::Attention* c = call.mutable_attention();
  c->set_direction(a.backward ? v1::Attention::BACKWARD
                              : v1::Attention::FORWARD);
  for (int b : buffers) c->add_buffers(b);
  *c->mutable_batch() = ToSymPoly(a.batch);
  *c->mutable_heads() = ToSymPoly(a.heads);
  *c->mutable_s_q() = ToSymPoly(a.s_q);
  *c->mutable_s_kv() = ToSymPoly(a.s_kv);
  *c->mutable_d_qk() = ToSymPoly(a.d_qk);
  *c->mutable_d_v() = ToSymPoly(a.d_v);
  c->set_causal(a.causal);
  c->set_scale(static_cast<float>(a.scale));
  c->set_bias(a.bias);
  c->set_bias_batch(a.bias_batch);
  c->set_bias_heads(a.bias_heads);
  c->set_bias_grad(a.bias_grad);
  c->set_dropout(static_cast<float>(a.dropout));
  if (a.dropout > 0) {  // the graph's dropout_p, exactly (CPU targets)
    c->set_keep_threshold(ops::BernoulliThreshold(1.0 - a.dropout));
    c->set_keep_scale(static_cast<float>(ops::DropoutScale(a.dropout)));
  }
  c->set_dtype(WireDType(fused.buffers[buffers[0]].dtype));
  return call;
}

// A generated kernel's launch.
void AddLaunch(const Kernel& kernel, const GpuKernelPlan* gpu_plan,
               v1::Program& program) {
  v1::Launch* launch = program.add_steps()->mutable_launch();
  launch->set_kernel(kernel.name);
  for (int b : kernel.buffers) launch->add_buffers(b);
  *launch->mutable_range() = ToSymPoly(kernel.OuterRange());
  // Rows of a row kernel are heavy; pointwise elements are light.
  bool has_inner = false;
  for (bool i : kernel.inner) has_inner |= i;
  launch->set_grain(has_inner ? 16 : 16384);
  if (gpu_plan != nullptr) {
    launch->set_block_threads(gpu_plan->block_threads);
    launch->set_items_per_block(gpu_plan->items_per_block);
  }
}

// The program: buffers, then per kernel: allocate the temps it writes first,
// launch (or call the library), and free temps after their last reader.
// `gpu_plans`: per kernel, for CUDA targets; empty for CPU targets.
v1::Program BuildProgram(const FusedProgram& fused,
                         const std::vector<GpuKernelPlan>& gpu_plans) {
  v1::Program program;
  for (const ProgramBuffer& b : fused.buffers) {
    v1::BufferSpec* spec = program.add_buffers();
    spec->set_kind(
        b.kind == ProgramBuffer::Kind::kInput    ? v1::BufferSpec::INPUT
        : b.kind == ProgramBuffer::Kind::kOutput ? v1::BufferSpec::OUTPUT
        : b.kind == ProgramBuffer::Kind::kError  ? v1::BufferSpec::ERROR
                                                 : v1::BufferSpec::TEMP);
    spec->set_index(b.index);
    spec->set_dtype(WireDType(b.dtype));
    *spec->mutable_elements() = ToSymPoly(b.elements);
  }
  // The check sites, only where a kernel records them (fusion adds the
  // error word then).
  bool has_error_word = false;
  for (const ProgramBuffer& b : fused.buffers)
    has_error_word |= b.kind == ProgramBuffer::Kind::kError;
  if (has_error_word) {
    for (const IndexCheck& c : fused.index_checks) {
      v1::IndexCheck* check = program.add_index_checks();
      check->set_kind(c.kind == IndexCheck::Kind::kTarget
                          ? v1::IndexCheck::TARGET
                          : v1::IndexCheck::INDEX);
      check->set_node(c.node);
      check->set_op(c.op);
      check->set_dim(c.dim);
    }
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
    if (kernel.attention) {
      *program.add_steps()->mutable_call() = AttentionCallStep(
          *kernel.attention, kernel.buffers, fused, gpu_plans.empty());
    } else if (kernel.conv) {
      *program.add_steps()->mutable_call() =
          ConvCallStep(*kernel.conv, kernel.buffers, fused, gpu_plans.empty());
    } else if (kernel.is_extern()) {
      *program.add_steps()->mutable_call() = ExternCallStep(
          *kernel.gemm, kernel.buffers, fused, gpu_plans.empty());
    } else {
      AddLaunch(kernel, gpu_plans.empty() ? nullptr : &gpu_plans[k], program);
    }
    for (int b : kernel.buffers) {
      if (fused.buffers[b].kind == ProgramBuffer::Kind::kTemp &&
          last_use[b] == static_cast<int>(k)) {
        program.add_steps()->set_free(b);
        last_use[b] = -1;  // an extern may name a buffer twice
      }
    }
  }
  return program;
}

}  // namespace

v1::Artifact BuildArtifact(const ImportedRequest& request,
                           const FusedProgram& fused,
                           const std::vector<GpuKernelPlan>& gpu_plans,
                           KernelBinary binary) {
  const Graph& graph = request.graph;
  v1::Artifact a;
  const Sha256Digest binary_hash =
      Sha256(request.target.has_cuda() ? binary.cuda.cubin()
                                       : binary.cpu_shared_object);
  if (request.target.has_cuda()) {
    *a.mutable_cuda() = std::move(binary.cuda);
  } else {
    a.mutable_cpu()->set_shared_object(std::move(binary.cpu_shared_object));
  }
  a.set_format_version(kArtifactFormatVersion);
  a.set_guard_key(std::string(reinterpret_cast<const char*>(request.key.data()),
                              request.key.size()));
  *a.mutable_target() = request.target;
  // Symbols: where the runtime reads each one (its first appearance).
  for (size_t s = 0; s < graph.symbols.size(); ++s) {
    v1::SymbolGuard* g = a.add_symbols();
    g->set_name(graph.symbols[s].name);
    g->set_min_value(kMinSymbolValue);
    g->set_max_value(graph.symbols[s].max_value);
    g->set_multiple_of(graph.symbols[s].multiple_of);
    g->set_input(-1);
    g->set_dim(-1);
    for (size_t i = 0; i < graph.inputs.size() && g->input() < 0; ++i) {
      const TensorType& t = graph.type(graph.inputs[i].value);
      for (int d = 0; d < t.rank(); ++d) {
        if (t.sizes[d].AsSymbol() == static_cast<int>(s)) {
          g->set_input(static_cast<int>(i));
          g->set_dim(d);
          break;
        }
      }
    }
  }
  for (const GraphInput& in : graph.inputs) {
    const TensorType& t = graph.type(in.value);
    v1::InputGuard* g = a.add_inputs();
    g->set_dtype(WireDType(t.dtype));
    for (const SymExpr& s : t.sizes) *g->add_sizes() = ToSymPoly(s);
    for (const SymExpr& s : in.strides) *g->add_strides() = ToSymPoly(s);
    // CPU code uses unaligned vector loads; CUDA code uses aligned vector
    // loads of 16 bytes where the request promises that alignment (which is
    // part of the guard key).
    g->set_alignment(request.target.has_cuda() && in.alignment >= 16
                         ? 16
                         : DTypeSize(t.dtype));
  }
  *a.mutable_program() = BuildProgram(fused, gpu_plans);
  for (const auto& [output, input] : fused.input_writes) {
    v1::InputWrite* iw = a.add_input_writes();
    iw->set_output(output);
    iw->set_input(input);
  }
  int output = 0;  // the artifact's outputs skip the input writes
  for (size_t o = 0; o < graph.outputs.size(); ++o) {
    if (absl::c_any_of(fused.input_writes, [&](const auto& w) {
          return w.first == static_cast<int>(o);
        }))
      continue;
    const TensorType& t = graph.type(graph.outputs[o]);
    v1::OutputSpec* out = a.add_outputs();
    out->set_dtype(WireDType(t.dtype));
    for (const SymExpr& s : t.sizes) *out->add_sizes() = ToSymPoly(s);
    for (size_t b = 0; b < fused.buffers.size(); ++b) {
      if (fused.buffers[b].kind == ProgramBuffer::Kind::kOutput &&
          fused.buffers[b].index == output) {
        out->set_buffer(static_cast<int>(b));
      }
    }
    ++output;
  }
  a.set_binary_sha256(std::string(
      reinterpret_cast<const char*>(binary_hash.data()), binary_hash.size()));
  return a;
}

}  // namespace kiln
