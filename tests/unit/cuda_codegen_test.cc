// The CUDA back end without a GPU: every example graph and a few hundred
// random graphs over all of op set v1 compile to PTX and to a cubin for
// sm_90 (nvJitLink), and the artifact is checked structurally: one
// `.entry` per launched kernel with one parameter per buffer and symbol, a
// cubin that is an ELF file, no unresolved __nvvm_reflect, launch geometry
// present, no local-memory spills on the example graphs, and 128-bit
// accesses where the inputs are 16-byte aligned. Running the kernels is
// tests/gpu's job (on a machine with a GPU).
//
// Environment: KILN_CUDA_RANDOM_GRAPHS=<count> (default 600).
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "compiler/compile.h"
#include "compiler/cuda_backend.h"
#include "compiler/fuse.h"
#include "compiler/gpu_launch.h"
#include "compiler/lower.h"
#include "compiler/split_reductions.h"
#include "google/protobuf/util/json_util.h"
#include "graph/guard_key.h"
#include "graph/import.h"
#include "graph/imported_request.h"
#include "graph/op_signature.h"
#include "gtest/gtest.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "tests/unit/epilogue_graphs.h"
#include "tests/unit/example_graphs.h"
#include "tests/unit/graph_gen.h"
#include "tests/unit/random_graphs.h"

namespace kiln::testing {
namespace {

v1::CompileRequest ForGpu(v1::CompileRequest req, const char* arch = "sm_90",
                          int64_t alignment = 16) {
  req.mutable_target()->mutable_cuda()->set_arch(arch);
  for (v1::Input& in : *req.mutable_graph()->mutable_inputs())
    in.mutable_meta()->set_alignment(alignment);
  return req;
}

// Example graph `file` for sm_90 with its first input's sizes replaced.
v1::CompileRequest Resized(const char* file, std::vector<int64_t> sizes,
                           int64_t alignment = 16) {
  v1::CompileRequest req = ForGpu(Request(file), "sm_90", alignment);
  v1::TensorMeta* meta = req.mutable_graph()->mutable_inputs(0)->mutable_meta();
  meta->clear_sizes();
  for (int64_t size : sizes) meta->add_sizes()->set_value(size);
  return req;
}

// The `.param` lines of `.entry name(...)` in the PTX; -1 if absent.
int EntryParams(const std::string& ptx, const std::string& name) {
  const size_t at = ptx.find(absl::StrCat(".entry ", name, "("));
  if (at == std::string::npos) return -1;
  const size_t end = ptx.find(')', at);
  int params = 0;
  for (size_t p = ptx.find(".param", at); p < end;
       p = ptx.find(".param", p + 1))
    ++params;
  return params;
}

// Whether `e` loads from the program buffer of `kind` and `index` (through
// a kernel's slots `slots`).
bool ReadsBuffer(const Expr& e, const std::vector<int>& slots,
                 const std::vector<ProgramBuffer>& buffers,
                 ProgramBuffer::Kind kind, int index) {
  if (!e) return false;
  if (e->op == ExprOp::kLoadBuffer) {
    const ProgramBuffer& b = buffers[slots[e->index]];
    if (b.kind == kind && b.index == index) return true;
  }
  for (const Expr& a : e->args)
    if (ReadsBuffer(a, slots, buffers, kind, index)) return true;
  return false;
}

// The text of the first kernel (`.entry`) in `ptx`, up to the next
// function.
std::string FirstKernelBody(const std::string& ptx) {
  const size_t at = ptx.find(".entry");
  if (at == std::string::npos) return "";
  return ptx.substr(at, ptx.find("\n.func", at) - at);
}

// Empty when the artifact has the structure the runtime relies on.
std::string CheckStructure(const v1::Artifact& a) {
  if (!a.has_cuda()) return "no CUDA binary";
  const std::string& cubin = a.cuda().cubin();
  if (cubin.size() < 4 || cubin.compare(0, 4,
                                        "\x7f"
                                        "ELF") != 0)
    return "the cubin is not an ELF file";
  const std::string& ptx = a.cuda().ptx();
  if (absl::StrContains(ptx, "__nvvm_reflect"))
    return "__nvvm_reflect survived NVVMReflect";
  if (absl::StrContains(ptx, ".extern .func"))
    return "the PTX calls a function it does not define";
  // libdevice is inlined except the trigonometric functions (their
  // Payne-Hanek reduction would be copied into every lane).
  for (absl::string_view line : absl::StrSplit(ptx, '\n')) {
    if (!absl::StrContains(line, ".func")) continue;
    if (!absl::StrContains(line, "__nv_sinf") &&
        !absl::StrContains(line, "__nv_cosf") &&
        !absl::StrContains(line, "__nv_tanf"))
      return absl::StrCat("unexpected PTX function: ", line);
  }
  const int symbols = a.symbols_size();
  for (const v1::Step& step : a.program().steps()) {
    if (!step.has_launch()) continue;
    const v1::Launch& l = step.launch();
    const int params = EntryParams(ptx, l.kernel());
    if (params != l.buffers_size() + symbols) {
      return absl::StrCat("kernel ", l.kernel(), " has ", params,
                          " params, want ", l.buffers_size() + symbols, "\n",
                          ptx);
    }
    if (l.block_threads() <= 0 || l.block_threads() > 1024 ||
        l.items_per_block() <= 0)
      return absl::StrCat("kernel ", l.kernel(), ": bad launch geometry");
  }
  return "";
}

TEST(CudaCodegen, ExampleGraphsCompileWithoutSpills) {
  for (const char* file :
       {"chain10.json", "chain30.json", "chain30_sum.json", "softmax.json",
        "layer_norm.json", "reduce_two_dims.json", "dynamic_batch.json"}) {
    for (int64_t alignment : {16, 0}) {
      auto a = Compile(ForGpu(Request(file), "sm_90", alignment));
      ASSERT_TRUE(a.ok()) << file << ": " << a.status();
      EXPECT_EQ(CheckStructure(*a), "") << file;
      EXPECT_EQ(SpillBytes(a->cuda().jit_log()), 0) << file << ":\n"
                                                    << a->cuda().jit_log();
      EXPECT_TRUE(absl::StrContains(a->cuda().jit_log(), "registers"))
          << "no ptxas -v info: " << a->cuda().jit_log();
      for (const v1::InputGuard& g : a->inputs())
        EXPECT_EQ(g.alignment(), alignment >= 16 ? 16 : 4) << file;
    }
  }
}

TEST(CudaCodegen, AlignedContiguousChainsUse128BitAccesses) {
  // (Over a range too small for vectors, kMaxOneElementPerThread,
  // there are none: the other test above.)
  auto aligned = Compile(Resized("chain10.json", {64, 1024}));
  ASSERT_TRUE(aligned.ok()) << aligned.status();
  const std::string& ptx = aligned->cuda().ptx();
  EXPECT_TRUE(absl::StrContains(ptx, ".v4.f32")) << ptx;
  EXPECT_TRUE(absl::StrContains(ptx, "st.global.v4.f32")) << ptx;
  // Without the alignment promise the loads stay scalar; the output (256
  // byte aligned by the runtime) may still be stored as vectors.
  auto unaligned = Compile(Resized("chain10.json", {64, 1024}, 0));
  ASSERT_TRUE(unaligned.ok()) << unaligned.status();
  EXPECT_FALSE(absl::StrContains(unaligned->cuda().ptx(), "ld.global.v4.f32"));
  EXPECT_FALSE(
      absl::StrContains(unaligned->cuda().ptx(), "ld.global.nc.v4.f32"));
  // The softmax row stays in registers: the input is read by one vector
  // load per group, once, not once per stage.
  auto softmax = Compile(ForGpu(Request("softmax.json")));
  ASSERT_TRUE(softmax.ok()) << softmax.status();
  EXPECT_TRUE(absl::StrContains(softmax->cuda().ptx(), "shfl.sync.bfly"));
}

// One pointwise op over 16-bit inputs x (and y) [64, 1024] for `arch`,
// 16-byte aligned; `approximate` names gelu's variant when set.
absl::StatusOr<v1::Artifact> HalfPointwise(const char* op, v1::DType dtype,
                                           int inputs, const char* arch,
                                           const char* approximate = nullptr) {
  v1::CompileRequest req;
  v1::Graph& g = *req.mutable_graph();
  v1::Node& n = *g.add_nodes();
  n.set_op(op);
  for (const char* name : {"x", "y"}) {
    if (inputs-- <= 0) break;
    v1::Input& in = *g.add_inputs();
    in.set_name(name);
    in.mutable_meta()->set_dtype(dtype);
    in.mutable_meta()->add_sizes()->set_value(64);
    in.mutable_meta()->add_sizes()->set_value(1024);
    n.add_args()->set_ref(name);
  }
  if (approximate != nullptr) {
    v1::Argument& a = *n.add_args();
    a.set_name("approximate");
    a.set_str(approximate);
  }
  n.add_outputs("out");
  g.add_outputs("out");
  return Compile(ForGpu(req, arch));
}

// How often `what` occurs in `text`.
int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1))
    ++n;
  return n;
}

// float16 and bfloat16 values convert with one instruction each
// (cvt.f32.f16, cvt.rn.f16.f32; cvt.rn.bf16.f32 from sm_80, the integer
// rounding before it), and a value rounded to its dtype is stored without
// a second conversion: x + y reads two values and rounds once per element.
TEST(CudaCodegen, HalfPrecisionConversionsAreSingleInstructions) {
  auto add = HalfPointwise("aten.add.Tensor", v1::FLOAT16, 2, "sm_90");
  ASSERT_TRUE(add.ok()) << add.status();
  const std::string body = FirstKernelBody(add->cuda().ptx());
  const int widen = Count(body, "cvt.f32.f16"),
            narrow = Count(body, "cvt.rn.f16.f32");
  EXPECT_GT(narrow, 0) << body;
  EXPECT_EQ(widen, 2 * narrow) << body;
  for (const char* arch : {"sm_90", "sm_75"}) {
    auto gelu =
        HalfPointwise("aten.gelu.default", v1::BFLOAT16, 1, arch, "tanh");
    ASSERT_TRUE(gelu.ok()) << arch << ": " << gelu.status();
    EXPECT_EQ(CheckStructure(*gelu), "") << arch;
    const std::string ptx = FirstKernelBody(gelu->cuda().ptx());
    const bool hardware = std::string(arch) == "sm_90";
    EXPECT_EQ(absl::StrContains(ptx, "cvt.rn.bf16.f32"), hardware) << arch;
    // The integer rounding adds 0x7fff (32767) and the lowest kept bit.
    EXPECT_EQ(absl::StrContains(ptx, "32767"), !hardware) << arch;
  }
}

// Pointwise groups per thread (gpu_launch.h): light bodies over large
// static ranges take two groups, both loaded before either is computed;
// heavy bodies, bodies without math calls, small or dynamic ranges and last
// dims that do not split into groups take one; small static ranges take
// one element per thread, in pointwise kernels and in persistent rows.
TEST(CudaCodegen, PointwiseElementsPerThread) {
  // x + 0.1: no math call.
  v1::CompileRequest chain1 = Resized("chain10.json", {256, 1024});
  chain1.mutable_graph()->mutable_nodes()->DeleteSubrange(
      1, chain1.graph().nodes_size() - 1);
  chain1.mutable_graph()->clear_outputs();
  chain1.mutable_graph()->add_outputs(chain1.graph().nodes(0).outputs(0));
  struct Case {
    const char* name;
    v1::CompileRequest req;
    int64_t items_per_block;
  };
  const Case cases[] = {
      {"chain-10 on 256x1024", Resized("chain10.json", {256, 1024}), 2048},
      {"chain-30 on 256x1024", Resized("chain30.json", {256, 1024}), 1024},
      {"chain-1 on 256x1024", chain1, 1024},
      // One element per thread (kMaxOneElementPerThread).
      {"chain-10 on 8x16", Resized("chain10.json", {8, 16}), 256},
      {"chain-10 on 128x256", Resized("chain10.json", {128, 256}), 256},
      {"chain-10 on 129x256", Resized("chain10.json", {129, 256}), 1024},
      {"chain-10 on 256x1001", Resized("chain10.json", {256, 1001}), 1024},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto a = Compile(c.req);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_EQ(a->program().steps_size(), 1);
    EXPECT_EQ(a->program().steps(0).launch().items_per_block(),
              c.items_per_block);
    if (c.items_per_block != 2048) continue;
    const std::string body = FirstKernelBody(a->cuda().ptx());
    const size_t first_load = body.find("ld.global.nc.v4.f32");
    const size_t second_load = body.find("ld.global.nc.v4.f32", first_load + 1);
    ASSERT_NE(second_load, std::string::npos) << body;
    EXPECT_LT(second_load, body.find("st.global.v4.f32")) << body;
    EXPECT_EQ(SpillBytes(a->cuda().jit_log()), 0) << a->cuda().jit_log();
  }
  // chain-30 + sum on 8x16 (128 elements in all): one row of 128 threads,
  // one element each, so the chain is emitted once (6 libdevice
  // trigonometric calls: 3 sin, 3 cos); with the knob off, groups of 4.
  for (int64_t one_element_max : {int64_t{-1}, int64_t{0}}) {
    CompileEnv env;
    env.gpu_one_element_per_thread_max = one_element_max;
    auto summed = Compile(ForGpu(Request("chain30_sum.json")), env);
    ASSERT_TRUE(summed.ok()) << summed.status();
    const v1::Launch& l = summed->program().steps(0).launch();
    const std::string body = FirstKernelBody(summed->cuda().ptx());
    size_t calls = 0;
    for (size_t at = body.find("call.uni"); at != std::string::npos;
         at = body.find("call.uni", at + 1))
      ++calls;
    if (one_element_max < 0) {
      EXPECT_EQ(l.block_threads(), 128);
      EXPECT_EQ(calls, 6u) << body;
    } else {
      EXPECT_EQ(l.block_threads(), 128);  // four warps of one row each
      EXPECT_EQ(calls, 24u) << body;
    }
  }
}

// Issue 17.2's gathers and scatters: loads whose index is another load
// (an embedding feeding cross-entropy and its backward; index_select,
// gather, index, masked_fill, constant_pad_nd, scatter_add, scatter,
// index_put, cumsum; sort and topk with topk's backward) compile to PTX and
// cubins with the structure the runtime relies on; data-dependent loads are
// never vector candidates.
TEST(CudaCodegen, GatherScatterGraphsCompile) {
  for (const char* file : {"embedding_cross_entropy.json",
                           "gather_scatter_mix.json", "topk_sort.json"}) {
    SCOPED_TRACE(file);
    auto a = Compile(ForGpu(Request(file)));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(CheckStructure(*a), "");
  }
}

// Accumulating scatters on the GPU (LoopNode::kScatter): the embedding's
// backward in embedding_cross_entropy.json is a zeroing and a kernel over
// its source positions that adds each into place with a float32 atomic
// (red.global.add.f32), not a reduction per output element over every
// source position. Under deterministic_algorithms (use_deterministic_
// algorithms in PyTorch) the scatter is UNIMPLEMENTED, naming its node, so
// the client runs it in PyTorch's deterministic kernel.
TEST(CudaCodegen, AccumulatingScattersAreAtomicAdds) {
  auto a = Compile(ForGpu(Request("embedding_cross_entropy.json")));
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string& ptx = a->cuda().ptx();
  int atomic_kernels = 0;
  for (const v1::Step& step : a->program().steps()) {
    if (!step.has_launch()) continue;
    const size_t at =
        ptx.find(absl::StrCat(".entry ", step.launch().kernel(), "("));
    ASSERT_NE(at, std::string::npos);
    const std::string body = ptx.substr(at, ptx.find(".entry ", at + 1) - at);
    atomic_kernels += absl::StrContains(body, "red.global.add.f32") ||
                      absl::StrContains(body, "atom.global.add.f32");
  }
  EXPECT_EQ(atomic_kernels, 1) << ptx;

  v1::CompileRequest deterministic =
      ForGpu(Request("embedding_cross_entropy.json"));
  deterministic.mutable_options()->set_deterministic_algorithms(true);
  auto refused = Compile(deterministic);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "aten.embedding_dense_backward.default"))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "use_deterministic_algorithms"))
      << refused.status();
}

// A 1-D convolution whose input broadcasts its channels (strides [3, 0, 1]):
// the im2col kernel's index is floordiv(j, 2) * 3 + remainder(j, 2) * 2,
// which LLVM lowers through `select (j & 2) != 0, 3, 0` to `and (sra (shl
// j, 62), 63), 3`, the pattern LLVM 16's NVPTX back end selects as an
// unsigned bfe.u64 j', 63, 2 (0 or 1 where 0 or 3 is meant; see
// FixSignedBitfieldExtracts in compiler/cuda_backend.cc): the example graph
// conv1d_broadcast.json, which the GPU suite (tests/gpu/cuda_gpu_test.cc)
// runs.
//
// Every bit-field extract in the PTX takes its field from within the
// register: where LLVM 16 emitted bfe.u64 past bit 63 for a signed field,
// the PTX has bfe.s64 and an and that keeps the field.
TEST(CudaCodegen, SignedBitFieldsAreExtractedSigned) {
  CompileEnv im2col;  // cuDNN calls would read a contiguous copy instead
  im2col.gpu_kernel_convolutions = true;
  auto a = Compile(ForGpu(Request("conv1d_broadcast.json")), im2col);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string& ptx = a->cuda().ptx();
  int signed_fields = 0;
  for (absl::string_view line : absl::StrSplit(ptx, '\n')) {
    for (const char* op : {"bfe.u64", "bfe.s64"}) {
      const size_t at = line.find(op);
      if (at == absl::string_view::npos) continue;
      std::vector<std::string> ops =
          absl::StrSplit(line.substr(at + 7, line.find(';') - at - 7), ',');
      ASSERT_EQ(ops.size(), 4u) << line;
      int pos = 0, len = 0;
      ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ops[2]), &pos));
      ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ops[3]), &len));
      if (op[4] == 'u') {
        EXPECT_LE(pos + len, 64) << line;
      } else if (pos + len > 64) {
        ++signed_fields;
      }
    }
  }
  // The graph still gives LLVM the pattern: the rewrite is exercised.
  EXPECT_GE(signed_fields, 1) << ptx;
  EXPECT_TRUE(absl::StrContains(ptx, ", 63, 2;")) << ptx;
}

// Out-of-range indices (issue 17.2) on the GPU: every kernel that reads
// an index from data takes the error word (an ERROR buffer, one more
// parameter) and writes it only on its cold path, with a 64-bit
// compare-and-swap in global memory; no kernel without a check gets it.
TEST(CudaCodegen, IndexChecksWriteTheErrorWord) {
  auto a = Compile(ForGpu(Request("embedding_cross_entropy.json")));
  ASSERT_TRUE(a.ok()) << a.status();
  const v1::Program& p = a->program();
  ASSERT_GT(p.index_checks_size(), 0);
  int error_buffer = -1;
  for (int b = 0; b < p.buffers_size(); ++b) {
    if (p.buffers(b).kind() == v1::BufferSpec::ERROR) {
      EXPECT_EQ(error_buffer, -1);
      error_buffer = b;
      EXPECT_EQ(p.buffers(b).dtype(), v1::INT64);
    }
  }
  ASSERT_GE(error_buffer, 0);
  const std::string& ptx = a->cuda().ptx();
  int with = 0;
  for (const v1::Step& step : p.steps()) {
    if (!step.has_launch()) continue;
    const v1::Launch& l = step.launch();
    bool takes = false;
    for (int b : l.buffers()) takes |= b == error_buffer;
    const size_t at = ptx.find(absl::StrCat(".entry ", l.kernel(), "("));
    ASSERT_NE(at, std::string::npos) << l.kernel();
    const size_t end = ptx.find(".entry ", at + 1);
    const std::string body = ptx.substr(at, end - at);
    EXPECT_EQ(absl::StrContains(body, "atom.global.cas.b64"), takes)
        << l.kernel();
    with += takes;
  }
  EXPECT_GT(with, 0);
}

TEST(CudaCodegen, ArchitecturesAndErrors) {
  for (const char* arch : {"sm_80", "sm_90", "sm_100"}) {
    auto a = Compile(ForGpu(Request("softmax.json"), arch));
    ASSERT_TRUE(a.ok()) << arch << ": " << a.status();
    EXPECT_EQ(a->cuda().arch(), arch);
    EXPECT_EQ(CheckStructure(*a), "") << arch;
  }
  for (const char* arch : {"sm_9", "sm_40", "compute_90", "", "sm_90x"}) {
    auto a = Compile(ForGpu(Request("chain10.json"), arch));
    ASSERT_FALSE(a.ok()) << arch;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << arch;
  }
}

// Compiles `count` random graphs for sm_90 (half of them with 16-byte
// aligned inputs) and checks each structurally; counts the ops drawn
// (matrix products are cuBLASLt calls: MatrixProductsAreCublasLtCalls).
void CompileRandomGraphs(graph_gen::GraphGenOptions o, int count,
                         bool fast_math, std::map<std::string, int>* ops,
                         const CompileEnv& env = {}) {
  int failures = 0;
  for (int seed = 0; seed < count && failures < 10; ++seed) {
    v1::CompileRequest req;
    *req.mutable_graph() = graph_gen::RandomGraph(seed, o);
    for (const v1::Node& n : req.graph().nodes()) ++(*ops)[n.op()];
    req = ForGpu(req, "sm_90", seed % 2 ? 16 : 0);
    req.mutable_options()->set_fast_math(fast_math);
    auto a = Compile(req, env);
    std::string problem =
        a.ok() ? CheckStructure(*a) : std::string(a.status().ToString());
    if (!problem.empty()) {
      ADD_FAILURE() << "seed " << seed << ": " << problem;
      ++failures;
    }
  }
}

// fast_math maps math to libdevice's approximate variants and approximate
// division: every float32 random graph still assembles.
TEST(CudaCodegen, RandomGraphsCompileWithFastMath) {
  graph_gen::GraphGenOptions o = random_graphs::Options();
  o.dtypes = {v1::FLOAT32};
  std::map<std::string, int> ops;
  CompileRandomGraphs(o,
                      random_graphs::EnvInt("KILN_CUDA_RANDOM_GRAPHS", 600) / 3,
                      /*fast_math=*/true, &ops);
}

// Every pointwise kernel with its lanes in a loop (GpuPlanOptions::
// lane_loop, a benchmark variant): every random graph still assembles.
TEST(CudaCodegen, RandomGraphsCompileWithLaneLoops) {
  CompileEnv env;
  env.gpu_lane_loop = true;
  env.gpu_pointwise_vector_width = 4;  // lanes even where the range is small
  std::map<std::string, int> ops;
  CompileRandomGraphs(random_graphs::Options(),
                      random_graphs::EnvInt("KILN_CUDA_RANDOM_GRAPHS", 600) / 3,
                      /*fast_math=*/false, &ops, env);
}

// With lane_loop, chain-30 runs its lanes in a loop that PTX keeps rolled,
// with the group's 128-bit accesses before and after it; by default it is
// unrolled. fast_math divides with div.full, as Triton does.
TEST(CudaCodegen, LaneLoopsAndFastMathDivision) {
  CompileEnv env;
  env.gpu_lane_loop = true;
  auto looped = Compile(Resized("chain30.json", {64, 1024}), env);
  ASSERT_TRUE(looped.ok()) << looped.status();
  const std::string kernel = FirstKernelBody(looped->cuda().ptx());
  EXPECT_TRUE(absl::StrContains(kernel, ".pragma \"nounroll\"")) << kernel;
  EXPECT_TRUE(absl::StrContains(kernel, "ld.global.nc.v4.f32")) << kernel;
  EXPECT_TRUE(absl::StrContains(kernel, "st.global.v4.f32")) << kernel;
  EXPECT_FALSE(absl::StrContains(kernel, ".local")) << kernel;
  auto unrolled = Compile(Resized("chain30.json", {64, 1024}));
  ASSERT_TRUE(unrolled.ok()) << unrolled.status();
  EXPECT_FALSE(absl::StrContains(FirstKernelBody(unrolled->cuda().ptx()),
                                 ".pragma \"nounroll\""));
  // chain-10's sigmoid: a reciprocal, and its exp, as approximate
  // instructions with fast_math only.
  v1::CompileRequest fast = ForGpu(Request("chain10.json"));
  fast.mutable_options()->set_fast_math(true);
  auto chain10_fast = Compile(fast);
  ASSERT_TRUE(chain10_fast.ok()) << chain10_fast.status();
  EXPECT_TRUE(absl::StrContains(chain10_fast->cuda().ptx(), "rcp.approx"));
  auto chain10 = Compile(ForGpu(Request("chain10.json")));
  ASSERT_TRUE(chain10.ok()) << chain10.status();
  EXPECT_FALSE(absl::StrContains(chain10->cuda().ptx(), "rcp.approx"));
  // x / y divides with div.full under fast_math, div.rn without.
  v1::CompileRequest div;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(R"({
    "inputs": [
      {"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"value": "1024"}]}},
      {"name": "y", "meta": {"dtype": "FLOAT32", "sizes": [{"value": "1024"}]}}],
    "nodes": [{"op": "aten.div.Tensor", "args": [{"ref": "x"}, {"ref": "y"}],
               "outputs": ["q"]}],
    "outputs": ["q"]})",
                                                          div.mutable_graph())
                  .ok());
  div = ForGpu(div);
  auto exact = Compile(div);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_TRUE(absl::StrContains(exact->cuda().ptx(), "div.rn.f32"));
  div.mutable_options()->set_fast_math(true);
  auto approx = Compile(div);
  ASSERT_TRUE(approx.ok()) << approx.status();
  EXPECT_TRUE(absl::StrContains(approx->cuda().ptx(), "div.full.f32"));
  EXPECT_FALSE(absl::StrContains(approx->cuda().ptx(), "div.rn.f32"));
}

// A full sum over 2^20 elements (one row) becomes a partial kernel over
// rows x S blocks and a combining kernel through a temp buffer; a short row
// and the CPU target keep one kernel.
TEST(CudaCodegen, FewLongRowsAreSplit) {
  auto sum = [](int64_t n, const char* arch,
                const char* op = "aten.sum.default") {
    v1::CompileRequest req;
    v1::Input* in = req.mutable_graph()->add_inputs();
    in->set_name("x");
    in->mutable_meta()->set_dtype(v1::FLOAT32);
    in->mutable_meta()->add_sizes()->set_value(n);
    v1::Node* node = req.mutable_graph()->add_nodes();
    node->set_op(op);
    node->add_args()->set_ref("x");
    node->add_outputs("y");
    req.mutable_graph()->add_outputs("y");
    if (arch) return ForGpu(req, arch);
    *req.mutable_target()->mutable_cpu() = HostCpuTarget();
    return req;
  };
  auto launches = [](const v1::Artifact& a) {
    std::vector<std::string> names;
    for (const v1::Step& step : a.program().steps())
      if (step.has_launch()) names.push_back(step.launch().kernel());
    return names;
  };
  auto split = Compile(sum(1 << 20, "sm_90"));
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(CheckStructure(*split), "");
  EXPECT_EQ(launches(*split),
            (std::vector<std::string>{"kiln_k0_partial", "kiln_k0"}));
  auto small = Compile(sum(4096, "sm_90"));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(launches(*small), std::vector<std::string>{"kiln_k0"});
  auto cpu = Compile(sum(1 << 20, nullptr));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->program().steps_size(), 1) << "the CPU program is not split";
  // argmax: the partial kernel stores each chunk's max and its position in
  // the row; the combining kernel loads the winning chunk's position (a
  // 64-bit load from the positions' temp buffer after its reduction).
  auto argmax = Compile(sum(1 << 26, "sm_90", "aten.argmax.default"));
  ASSERT_TRUE(argmax.ok()) << argmax.status();
  EXPECT_EQ(CheckStructure(*argmax), "");
  EXPECT_EQ(launches(*argmax),
            (std::vector<std::string>{"kiln_k0_partial", "kiln_k0"}));
  // The partial's persistent row (32 elements per thread, 1024 threads)
  // keeps argmax's candidate as an element number, not 32 live 64-bit
  // positions, which spilled.
  EXPECT_EQ(SpillBytes(argmax->cuda().jit_log()), 0)
      << argmax->cuda().jit_log();
  const std::string& ptx = argmax->cuda().ptx();
  const size_t combine = ptx.find(".entry kiln_k0(");
  ASSERT_NE(combine, std::string::npos);
  EXPECT_TRUE(absl::StrContains(ptx.substr(combine), "ld.global.u64") ||
              absl::StrContains(ptx.substr(combine), "ld.global.nc.u64") ||
              absl::StrContains(ptx.substr(combine), "ld.global.b64"))
      << ptx.substr(combine);
}

// Few long rows of a multi-pass row kernel: var's centered second moment
// is split so that the row is read once (a chunk's mean and M2 per partial
// block, merged per row); softmax's passes (the sum of exp(x - max); element
// stores of row results) are fissioned into a kernel per pass, each split,
// and a pointwise kernel for the element stores; layer norm's statistics
// take the one-pass split, its element stores the pointwise kernel; short
// rows stay one kernel.
TEST(CudaCodegen, FewLongRowsOfMultiPassKernelsAreFissioned) {
  auto launches = [](const v1::CompileRequest& req) {
    std::vector<std::string> names;
    auto a = Compile(req);
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return names;
    EXPECT_EQ(CheckStructure(*a), "");
    for (const v1::Step& step : a->program().steps())
      if (step.has_launch()) names.push_back(step.launch().kernel());
    return names;
  };
  v1::CompileRequest var;
  v1::Input* in = var.mutable_graph()->add_inputs();
  in->set_name("x");
  in->mutable_meta()->set_dtype(v1::FLOAT32);
  in->mutable_meta()->add_sizes()->set_value(1 << 20);
  v1::Node* node = var.mutable_graph()->add_nodes();
  node->set_op("aten.var.correction");
  node->add_args()->set_ref("x");
  node->add_outputs("y");
  var.mutable_graph()->add_outputs("y");
  EXPECT_EQ(launches(ForGpu(var)),
            (std::vector<std::string>{"kiln_k0_partial", "kiln_k0"}));
  // The combining kernel stores the finalized variance: its division by
  // n - 1 is there (a finalize's raw accumulator once shared an IR node with
  // the finalized value and replaced it). (The means' divisions by powers of
  // two are multiplications.)
  auto compiled = Compile(ForGpu(var));
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  for (const char* kernel : {"kiln_k0"}) {
    const std::string& ptx = compiled->cuda().ptx();
    const size_t at = ptx.find(absl::StrCat(".entry ", kernel, "("));
    ASSERT_NE(at, std::string::npos) << kernel;
    const std::string body = ptx.substr(at, ptx.find(".entry", at + 1) - at);
    EXPECT_TRUE(absl::StrContains(body, "div.rn.f32")) << kernel << body;
  }

  // Rows that cut only into chunks over kMaxPersistentRow (2 x 40009, a
  // prime) are fissioned: a chunk's moments would not come from registers.
  var.mutable_graph()
      ->mutable_inputs(0)
      ->mutable_meta()
      ->mutable_sizes(0)
      ->set_value(2 * 40009);
  EXPECT_EQ(launches(ForGpu(var)),
            (std::vector<std::string>{"kiln_k0_f0_partial", "kiln_k0_f0",
                                      "kiln_k0_f1_partial", "kiln_k0_f1"}));

  v1::CompileRequest softmax = ForGpu(Request("softmax.json"));
  v1::TensorMeta* meta =
      softmax.mutable_graph()->mutable_inputs(0)->mutable_meta();
  meta->mutable_sizes(0)->set_value(4);
  meta->mutable_sizes(1)->set_value(1 << 18);
  EXPECT_EQ(launches(softmax),
            (std::vector<std::string>{"kiln_k0_f0_partial", "kiln_k0_f0",
                                      "kiln_k0_f1_partial", "kiln_k0_f1",
                                      "kiln_k0_fp"}));
  EXPECT_EQ(launches(ForGpu(Request("softmax.json"))),
            std::vector<std::string>{"kiln_k0"});

  EXPECT_EQ(
      launches(ForGpu(LayerNormRequest(16, 1 << 22))),
      (std::vector<std::string>{"kiln_k0_partial", "kiln_k0", "kiln_k0_fp"}));
  EXPECT_EQ(launches(ForGpu(Request("layer_norm.json"))),
            std::vector<std::string>{"kiln_k0"});
}

// The one-pass split of var and layer norm over few long rows
// (split_reductions.h, "One-pass moments"), stage by stage: only the
// partial kernel reads x for the statistics, as a persistent row (the
// chunk in registers: one read), and only the pointwise kernel reads it
// again for layer norm's output.
TEST(CudaCodegen, LongRowMomentsReadTheRowOnce) {
  auto var = [](std::vector<int64_t> sizes) {
    v1::CompileRequest req;
    v1::Input* in = req.mutable_graph()->add_inputs();
    in->set_name("x");
    in->mutable_meta()->set_dtype(v1::FLOAT32);
    for (int64_t s : sizes) in->mutable_meta()->add_sizes()->set_value(s);
    v1::Node* node = req.mutable_graph()->add_nodes();
    node->set_op("aten.var.correction");
    node->add_args()->set_ref("x");
    node->add_args()->mutable_ints()->add_values(
        static_cast<int64_t>(sizes.size()) - 1);
    node->add_outputs("y");
    req.mutable_graph()->add_outputs("y");
    return req;
  };
  const struct {
    const char* name;
    v1::CompileRequest req;
    std::vector<std::string> kernels;  // those reading x first
    int64_t splits;
  } cases[] = {
      {"var 1x2^26", var({1, 1 << 26}), {"kiln_k0_partial"}, 2048},
      {"var 16x2^22", var({16, 1 << 22}), {"kiln_k0_partial"}, 128},
      {"layer norm 16x2^22",
       LayerNormRequest(16, 1 << 22),
       {"kiln_k0_partial", "kiln_k0_fp"},
       128},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto graph = ImportGraph(c.req.graph());
    ASSERT_TRUE(graph.ok()) << graph.status();
    auto loops = Lower(*graph);
    ASSERT_TRUE(loops.ok()) << loops.status();
    auto fused = Fuse(*loops);
    ASSERT_TRUE(fused.ok()) << fused.status();
    ASSERT_EQ(fused->kernels.size(), 1u);
    const FusedProgram split = SplitLongReductions(*fused);
    std::vector<std::string> reading_x;
    for (const Kernel& k : split.kernels) {
      bool reads = false;
      for (const Stage& st : k.stages) {
        for (const Expr& e : {st.value, st.finalize}) {
          reads |= ReadsBuffer(e, k.buffers, split.buffers,
                               ProgramBuffer::Kind::kInput, 0);
        }
      }
      if (reads) reading_x.push_back(k.name);
    }
    EXPECT_EQ(reading_x, c.kernels);
    ASSERT_GE(split.kernels.size(), 2u);
    const Kernel& partial = split.kernels[0];
    ASSERT_EQ(partial.name, "kiln_k0_partial");
    const GpuKernelPlan plan = PlanGpuKernel(partial);
    EXPECT_EQ(plan.form, GpuKernelPlan::Form::kPersistentRow)
        << plan.ToString();
    EXPECT_EQ(plan.row_size, kMaxPersistentRow);
    // Two reductions (the chunk's sum, then its squared deviations from its
    // mean) over the chunk; the combine's row is the S partials.
    int reductions = 0;
    for (const Stage& st : partial.stages)
      reductions += st.kind == Stage::Kind::kReduce;
    EXPECT_EQ(reductions, 2);
    const Kernel& combine = split.kernels[1];
    EXPECT_EQ(combine.name, "kiln_k0");
    EXPECT_EQ(PlanGpuKernel(combine).row_size, c.splits);
    ASSERT_TRUE(Compile(ForGpu(c.req)).ok());
  }
}

// Long rows (gpu_launch.h): a softmax over GPT-2's vocabulary (one row
// tensor read in three passes: max, sum of exps, quotient) stays
// persistent up to kMaxPersistentRowOneLoad; a one-pass sum over the same
// row and longer rows loop with kLoopedLongRowThreads; a dynamic row loops
// with 512 threads.
// `g` imported, lowered and fused (an empty program, with the test
// failed, where a step fails).
FusedProgram FusedOf(const v1::Graph& g) {
  auto graph = ImportGraph(g);
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok()) return {};
  auto loops = Lower(*graph);
  EXPECT_TRUE(loops.ok()) << loops.status();
  if (!loops.ok()) return {};
  auto fused = Fuse(*loops);
  EXPECT_TRUE(fused.ok()) << fused.status();
  return fused.ok() ? *std::move(fused) : FusedProgram{};
}

TEST(CudaCodegen, LongRowPlans) {
  auto plan_of = [](v1::CompileRequest req) {
    const FusedProgram fused = FusedOf(req.graph());
    EXPECT_EQ(fused.kernels.size(), 1u);
    return fused.kernels.empty() ? GpuKernelPlan{}
                                 : PlanGpuKernel(fused.kernels[0]);
  };
  auto softmax = [](int64_t row) {
    v1::CompileRequest req = Request("softmax.json");
    req.mutable_graph()
        ->mutable_inputs(0)
        ->mutable_meta()
        ->mutable_sizes(1)
        ->set_value(row);
    return req;
  };
  using Form = GpuKernelPlan::Form;
  GpuKernelPlan p = plan_of(softmax(50257));
  EXPECT_EQ(p.form, Form::kPersistentRow) << p.ToString();
  EXPECT_EQ(p.block_threads, 1024);
  p = plan_of(softmax(kMaxPersistentRowOneLoad + 1));
  EXPECT_EQ(p.form, Form::kLoopedRow) << p.ToString();
  EXPECT_EQ(p.block_threads, kLoopedLongRowThreads);
  v1::CompileRequest sum = softmax(50257);
  sum.mutable_graph()->mutable_nodes(0)->set_op("aten.sum.dim_IntList");
  sum.mutable_graph()->mutable_nodes(0)->clear_args();
  sum.mutable_graph()->mutable_nodes(0)->add_args()->set_ref("x");
  sum.mutable_graph()->mutable_nodes(0)->add_args()->mutable_ints()->add_values(
      1);
  p = plan_of(sum);
  EXPECT_EQ(p.form, Form::kLoopedRow) << p.ToString();  // one pass
  EXPECT_EQ(p.block_threads, kLoopedLongRowThreads);
  v1::CompileRequest dynamic = softmax(50257);
  auto* size =
      dynamic.mutable_graph()->mutable_inputs(0)->mutable_meta()->mutable_sizes(
          1);
  size->Clear();
  size->set_symbol("s0");
  dynamic.mutable_graph()->add_symbols()->set_name("s0");
  p = plan_of(dynamic);
  EXPECT_EQ(p.form, Form::kLoopedRow) << p.ToString();
  EXPECT_EQ(p.block_threads, 512);
}

// Column reductions (gpu_launch.h, kColumn): a sum over the tokens of a
// [tokens, features] tensor (a bias gradient: unfused here) and layer
// norm's weight gradients (a product with per-token statistics) take the
// column form; the same sums over the last dim keep the row forms; every
// graph compiles.
TEST(CudaCodegen, ColumnReductionPlans) {
  using Form = GpuKernelPlan::Form;
  auto plans = [](const v1::Graph& g) {
    std::vector<GpuKernelPlan> out;
    for (const Kernel& k : FusedOf(g).kernels) {
      if (!k.is_extern()) out.push_back(PlanGpuKernel(k));
    }
    return out;
  };
  auto count = [](const std::vector<GpuKernelPlan>& ps, Form f) {
    return std::count_if(ps.begin(), ps.end(),
                         [&](const GpuKernelPlan& p) { return p.form == f; });
  };
  for (bool symbolic : {false, true}) {
    LinearBackwardCase c;
    c.batch = 2;
    c.tokens = 256;
    c.symbolic_tokens = symbolic;
    const v1::Graph g = LinearBackwardGraph(c);
    const std::vector<GpuKernelPlan> ps = plans(g);
    EXPECT_EQ(count(ps, Form::kColumn), 1) << "symbolic " << symbolic;
    for (const GpuKernelPlan& p : ps) {
      if (p.form != Form::kColumn) continue;
      EXPECT_EQ(p.items_per_block, kColumnRows);
      EXPECT_EQ(p.block_threads, kColumnRows * kColumnThreads);
    }
    v1::CompileRequest req;
    *req.mutable_graph() = g;
    req.mutable_options()->set_unfused_gemm_epilogues(true);
    auto a = Compile(ForGpu(req, "sm_90"));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(CheckStructure(*a), "");
  }
  // A sum over the last dim reads rows, not columns.
  v1::CompileRequest rows = Request("softmax.json");
  rows.mutable_graph()->mutable_nodes(0)->set_op("aten.sum.dim_IntList");
  rows.mutable_graph()->mutable_nodes(0)->clear_args();
  rows.mutable_graph()->mutable_nodes(0)->add_args()->set_ref("x");
  rows.mutable_graph()
      ->mutable_nodes(0)
      ->add_args()
      ->mutable_ints()
      ->add_values(1);
  EXPECT_EQ(count(plans(rows.graph()), Form::kColumn), 0);
  // The same sum over dim 0 is a column reduction, and an argmax over it too.
  v1::CompileRequest cols = rows;
  cols.mutable_graph()
      ->mutable_nodes(0)
      ->mutable_args(1)
      ->mutable_ints()
      ->set_values(0, 0);
  EXPECT_EQ(count(plans(cols.graph()), Form::kColumn), 1);
  ASSERT_TRUE(Compile(ForGpu(cols, "sm_90")).ok());
  // Few columns of long rows are split (ChooseColumnSplits): a bias
  // gradient's [8192, 768] sum becomes 16 partial sums per column, then
  // their sum, both column kernels.
  EXPECT_EQ(ChooseColumnSplits(768, 8192), 16);
  EXPECT_EQ(ChooseColumnSplits(3072, 8192), 4);
  EXPECT_EQ(ChooseColumnSplits(32768, 8192), 1);  // enough blocks
  EXPECT_EQ(ChooseColumnSplits(768, 300), 1);     // no chunk to cut
  {
    v1::CompileRequest big = cols;
    auto* sizes = big.mutable_graph()->mutable_inputs(0)->mutable_meta();
    sizes->mutable_sizes(0)->set_value(8192);
    sizes->mutable_sizes(1)->set_value(768);
    const FusedProgram split = SplitLongReductions(FusedOf(big.graph()));
    ASSERT_EQ(split.kernels.size(), 2u);
    EXPECT_EQ(split.kernels[0].name, "kiln_k0_partial");
    EXPECT_EQ(split.kernels[0].dims[0], SymExpr(16));  // the split, outer
    for (const Kernel& k : split.kernels) EXPECT_TRUE(IsColumnKernel(k));
    EXPECT_EQ(PlanGpuKernel(split.kernels[0]).form, Form::kColumn);
    auto a = Compile(ForGpu(big, "sm_90"));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(CheckStructure(*a), "");
  }
  v1::CompileRequest arg = rows;
  arg.mutable_graph()->mutable_nodes(0)->set_op("aten.argmax.default");
  arg.mutable_graph()->mutable_nodes(0)->mutable_args(1)->Clear();
  arg.mutable_graph()->mutable_nodes(0)->mutable_args(1)->set_i(0);
  EXPECT_EQ(count(plans(arg.graph()), Form::kColumn), 1);
  auto a = Compile(ForGpu(arg, "sm_90"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(CheckStructure(*a), "");
}

TEST(CudaCodegen, ChooseReductionSplits) {
  EXPECT_EQ(ChooseReductionSplits(1, 1 << 26), 2048);  // chunk 32768
  EXPECT_EQ(ChooseReductionSplits(64, 1 << 20), 32);
  EXPECT_EQ(ChooseReductionSplits(1, 1 << 20), 256);  // 1024 blocks
  EXPECT_EQ(ChooseReductionSplits(3, 40000), 8);      // chunk 5000
  EXPECT_EQ(ChooseReductionSplits(2, 99991), 1);      // prime
  EXPECT_EQ(ChooseReductionSplits(4096, 32768), 1);   // enough rows
  EXPECT_EQ(ChooseReductionSplits(8, 4096), 1);       // short rows
  EXPECT_EQ(ChooseReductionSplits(8, 32768), 1);      // one persistent row each
  EXPECT_EQ(ChooseReductionSplits(1, 32768), 1);
  EXPECT_EQ(ChooseReductionSplits(8, 65536), 16);  // looped otherwise
  // Batch norm's channels at ResNet shapes: 256 rows of 32*56*56.
  EXPECT_EQ(ChooseReductionSplits(256, 32 * 56 * 56), 4);
  EXPECT_EQ(ChooseReductionSplits(1024, 65536), 1);  // enough rows
}

// An artifact is a function of its request: the same request compiled
// again, after other compiles in this process, gives the same PTX and cubin
// (LLVM numbers call sequences with a process-wide counter; EmitPtx drops
// those comments).
TEST(CudaCodegen, ArtifactsDoNotDependOnEarlierCompiles) {
  const v1::CompileRequest chain30 = ForGpu(Request("chain30.json"));
  auto first = Compile(chain30);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(Compile(ForGpu(Request("chain10.json"))).ok());
  ASSERT_TRUE(Compile(ForGpu(Request("softmax.json"))).ok());
  auto again = Compile(chain30);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(absl::StrContains(first->cuda().ptx(), "callseq"));
  EXPECT_EQ(first->cuda().ptx(), again->cuda().ptx());
  EXPECT_TRUE(first->cuda().cubin() == again->cuda().cubin());
}

// The example graphs and `count` random graphs of `o` (every other one
// with 16-byte aligned inputs), for sm_90: the requests the tests below
// compile two ways and compare.
std::vector<v1::CompileRequest> ExampleAndRandomRequests(
    const graph_gen::GraphGenOptions& o, int count) {
  std::vector<v1::CompileRequest> requests;
  for (const char* file : {"chain10.json", "chain30.json", "chain30_sum.json",
                           "softmax.json", "dynamic_batch.json"})
    requests.push_back(ForGpu(Request(file)));
  for (int seed = 0; seed < count; ++seed) {
    v1::CompileRequest req;
    *req.mutable_graph() = graph_gen::RandomGraph(seed, o);
    requests.push_back(ForGpu(req, "sm_90", seed % 2 ? 16 : 0));
  }
  return requests;
}

// The precompiled trig functions (CompileEnv::cuda_precompiled_trig) leave
// the PTX and the cubin as they were when each compile built them.
TEST(CudaCodegen, PrecompiledTrigFunctionsChangeNothing) {
  graph_gen::GraphGenOptions o = random_graphs::Options();
  o.dtypes = {v1::FLOAT32};
  const std::vector<v1::CompileRequest> requests = ExampleAndRandomRequests(
      o, random_graphs::EnvInt("KILN_CUDA_RANDOM_GRAPHS", 600) / 6);
  CompileEnv each_compile;
  each_compile.cuda_precompiled_trig = false;
  int with_trig = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    for (bool fast_math : {false, true}) {
      v1::CompileRequest req = requests[i];
      req.mutable_options()->set_fast_math(fast_math);
      auto a = Compile(req);
      auto b = Compile(req, each_compile);
      ASSERT_TRUE(a.ok()) << i << ": " << a.status();
      ASSERT_TRUE(b.ok()) << i << ": " << b.status();
      with_trig += absl::StrContains(a->cuda().ptx(), ".func");
      EXPECT_EQ(a->cuda().ptx(), b->cuda().ptx())
          << "request " << i << " fast_math " << fast_math;
      EXPECT_TRUE(a->cuda().cubin() == b->cuda().cubin())
          << "request " << i << " fast_math " << fast_math;
    }
  }
  EXPECT_GE(with_trig, 6);
}

// ptxas on every core (CompileEnv::cuda_link_threads 0: nvJitLink's
// -split-compile) gives the cubin one thread gives, byte for byte, trig
// calls and multi-kernel programs included.
TEST(CudaCodegen, LinkingOnManyThreadsGivesTheSameCubin) {
  graph_gen::GraphGenOptions o = random_graphs::Options();
  o.first_issue17_seed = 0;
  std::vector<v1::CompileRequest> requests = ExampleAndRandomRequests(
      o, random_graphs::EnvInt("KILN_CUDA_RANDOM_GRAPHS", 600) / 12);
  const graph_gen::GraphGenOptions large = random_graphs::Large(o);
  for (int seed = 0; seed < 4; ++seed) {
    v1::CompileRequest req;
    *req.mutable_graph() = graph_gen::RandomGraph(1000 + seed, large);
    requests.push_back(ForGpu(req));
  }
  CompileEnv one, many;
  one.cuda_compile_threads = many.cuda_compile_threads = 1;  // one module
  one.cuda_link_threads = 1;
  many.cuda_link_threads = 0;
  int kernels = 0, largest = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    for (bool fast_math : {false, true}) {
      v1::CompileRequest req = requests[i];
      req.mutable_options()->set_fast_math(fast_math);
      auto a = Compile(req, one);
      auto b = Compile(req, many);
      ASSERT_TRUE(a.ok()) << i << ": " << a.status();
      ASSERT_TRUE(b.ok()) << i << ": " << b.status();
      kernels += a->program().steps_size();
      largest = std::max(largest, a->program().steps_size());
      EXPECT_TRUE(a->cuda().cubin() == b->cuda().cubin())
          << "request " << i << " fast_math " << fast_math;
    }
  }
  EXPECT_GT(kernels, static_cast<int>(2 * requests.size()));
  EXPECT_GT(largest, 20);
}

// A signed conversion of a bool to float gives -1.0 for true in the PTX
// (LLVM 16's NVPTX lowering gives 1.0: SelectSignedBoolConversions).
TEST(CudaCodegen, SignedBoolConversionsGiveMinusOne) {
  v1::CudaTarget target;
  target.set_arch("sm_90");
  auto tm = MakeNvptxTargetMachine(target);
  ASSERT_TRUE(tm.ok()) << tm.status();
  llvm::LLVMContext context;
  llvm::Module module("kiln_test", context);
  module.setTargetTriple((*tm)->getTargetTriple().str());
  module.setDataLayout((*tm)->createDataLayout());
  llvm::Type* ptr = llvm::PointerType::get(context, 1);
  llvm::Function* f = llvm::Function::Create(
      llvm::FunctionType::get(llvm::Type::getVoidTy(context), {ptr, ptr},
                              false),
      llvm::Function::ExternalLinkage, "kiln_k0", module);
  f->setCallingConv(llvm::CallingConv::PTX_Kernel);
  llvm::IRBuilder<> b(llvm::BasicBlock::Create(context, "entry", f));
  // to_float32(to_int64(all) - 1), as Kiln writes it for a bool
  // reduction's result minus one (here all of two elements): InstCombine
  // makes it sitofp(or(x0 == 0, x1 == 0)), which LLVM 16 got wrong.
  llvm::Value* x0 = b.CreateLoad(b.getFloatTy(), f->getArg(0));
  llvm::Value* x1 = b.CreateLoad(
      b.getFloatTy(), b.CreateConstGEP1_64(b.getFloatTy(), f->getArg(0), 1));
  llvm::Value* zero = llvm::ConstantFP::get(b.getFloatTy(), 0.0);
  llvm::Value* all =
      b.CreateAnd(b.CreateFCmpUNE(x0, zero), b.CreateFCmpUNE(x1, zero));
  llvm::Value* minus_one =
      b.CreateAdd(b.CreateZExt(all, b.getInt64Ty()), b.getInt64(-1));
  b.CreateStore(b.CreateSIToFP(minus_one, b.getFloatTy()), f->getArg(1));
  b.CreateRetVoid();
  ASSERT_TRUE(OptimizeNvptxModule(module, **tm).ok());
  auto ptx = EmitPtx(module, **tm);
  ASSERT_TRUE(ptx.ok()) << ptx.status();
  EXPECT_TRUE(absl::StrContains(*ptx, "0fBF800000")) << *ptx;  // -1.0f
  EXPECT_FALSE(absl::StrContains(*ptx, "cvt.rn.f32.s32")) << *ptx;
}

// Each `.entry` of `ptx` (one or more modules, as BuildCudaBinary joins
// them) by name, its labels and local depot renumbered as 0: those carry the
// function's index in its module.
std::map<std::string, std::string> EntriesOf(const std::string& ptx) {
  std::map<std::string, std::string> out;
  for (size_t at = ptx.find(".entry "); at != std::string::npos;
       at = ptx.find(".entry ", at + 1)) {
    const size_t name_end = ptx.find('(', at);
    const size_t end = ptx.find("\n}\n", at);
    if (name_end == std::string::npos || end == std::string::npos) break;
    std::string body = ptx.substr(at, end - at);
    for (const char* prefix : {"$L__BB", "__local_depot"}) {
      std::string renumbered;
      size_t from = 0;
      for (size_t p = body.find(prefix); p != std::string::npos;
           p = body.find(prefix, from)) {
        size_t digits = p + std::string(prefix).size();
        renumbered.append(body, from, digits - from);
        while (digits < body.size() && absl::ascii_isdigit(body[digits]))
          ++digits;
        renumbered.append("0");
        from = digits;
      }
      renumbered.append(body, from, std::string::npos);
      body = std::move(renumbered);
    }
    out[ptx.substr(at + 7, name_end - at - 7)] = std::move(body);
  }
  return out;
}

// A program's kernels optimized and emitted as several modules on several
// threads (CompileEnv::cuda_compile_threads) get the PTX the one module
// gives them, but for label numbers, and link into one cubin; the same
// split twice gives the same cubin. (tests/gpu/cuda_gpu_test.cc,
// SplitProgramsMatchReference, runs them.)
TEST(CudaCodegen, SplitProgramsGiveEachKernelTheSamePtx) {
  graph_gen::GraphGenOptions large =
      random_graphs::Large(random_graphs::Options());
  large.first_issue17_seed = 0;
  CompileEnv one, split;
  one.cuda_compile_threads = 1;
  split.cuda_compile_threads = 3;
  split.cuda_min_kernels_per_part = 2;
  int split_programs = 0, kernels = 0;
  for (int seed = 0; seed < 6; ++seed) {
    for (bool fast_math : {false, true}) {
      v1::CompileRequest req;
      *req.mutable_graph() = graph_gen::RandomGraph(7000 + seed, large);
      req = ForGpu(req);
      req.mutable_options()->set_fast_math(fast_math);
      auto a = Compile(req, one);
      auto b = Compile(req, split);
      auto c = Compile(req, split);
      ASSERT_TRUE(a.ok()) << seed << ": " << a.status();
      ASSERT_TRUE(b.ok()) << seed << ": " << b.status();
      ASSERT_TRUE(c.ok()) << seed << ": " << c.status();
      EXPECT_TRUE(b->cuda().cubin() == c->cuda().cubin()) << "seed " << seed;
      const std::map<std::string, std::string> whole =
          EntriesOf(a->cuda().ptx());
      const std::map<std::string, std::string> parts =
          EntriesOf(b->cuda().ptx());
      ASSERT_EQ(whole.size(), parts.size()) << "seed " << seed;
      for (const auto& [name, body] : whole) {
        auto it = parts.find(name);
        ASSERT_NE(it, parts.end()) << "seed " << seed << ": " << name;
        EXPECT_EQ(it->second, body) << "seed " << seed << ": " << name;
        // Every kernel is in the linked cubin.
        EXPECT_NE(b->cuda().cubin().find(name), std::string::npos) << name;
      }
      kernels += static_cast<int>(whole.size());
      // The split happened: one PTX header per part.
      int headers = 0;
      for (size_t at = b->cuda().ptx().find(".version");
           at != std::string::npos;
           at = b->cuda().ptx().find(".version", at + 1))
        ++headers;
      split_programs += headers > 1;
    }
  }
  EXPECT_GE(split_programs, 8);
  EXPECT_GT(kernels, 100);
}

TEST(CudaCodegen, RandomGraphsOverTheWholeOpSetCompile) {
  const int count = random_graphs::EnvInt("KILN_CUDA_RANDOM_GRAPHS", 600);
  std::map<std::string, int> ops;
  // The op set before issue 17, with the same graphs as before; then half
  // as many graphs that draw the ops added since (issues 16 and 17) too.
  graph_gen::GraphGenOptions before = random_graphs::Options();
  before.first_issue17_seed = count;
  CompileRandomGraphs(before, count, /*fast_math=*/false, &ops);
  graph_gen::GraphGenOptions with_issue17 = random_graphs::Options();
  with_issue17.first_issue17_seed = 0;
  CompileRandomGraphs(with_issue17, count, /*fast_math=*/false, &ops);
  // And a quarter as many new graphs that draw the random ops (issue 17.3)
  // too: Philox in PTX.
  graph_gen::GraphGenOptions with_random = with_issue17;
  with_random.first_random_seed = 0;
  CompileRandomGraphs(with_random, count / 4, /*fast_math=*/false, &ops);
  // And an eighth as many that draw the sorts (issue 17.2) too.
  graph_gen::GraphGenOptions with_sort = with_random;
  with_sort.first_sort_seed = 0;
  CompileRandomGraphs(with_sort, count / 8, /*fast_math=*/false, &ops);
  if (count >= 600) {
    for (const std::string& op : OpSignatures::Get().Names()) {
      if (OpSignatures::Get().Find(op)->op_class == OpClass::kExtern) continue;
      EXPECT_TRUE(ops.count(op)) << op << " never generated";
    }
  }
}

// Matrix products on CUDA targets are cuBLASLt calls: float16 and bfloat16
// products are called in their own dtype (accumulating in float32), float32
// ones in float32; the kernels around them are compiled as usual.
TEST(CudaCodegen, MatrixProductsAreCublasLtCalls) {
  graph_gen::GraphGenOptions o = random_graphs::Options();
  o.first_issue17_seed = 0;
  int products = 0;
  std::set<int> dtypes;
  for (int seed = 0; seed < 400 && products < 12; ++seed) {
    v1::CompileRequest req;
    *req.mutable_graph() = graph_gen::RandomGraph(seed, o);
    bool has_product = false;
    for (const v1::Node& n : req.graph().nodes())
      has_product |= absl::StrContains(n.op(), "mm.default");
    if (!has_product) continue;
    auto a = Compile(ForGpu(req, "sm_90"));
    ASSERT_TRUE(a.ok()) << "seed " << seed << ": " << a.status();
    EXPECT_EQ(CheckStructure(*a), "") << "seed " << seed;
    int calls = 0;
    for (const v1::Step& step : a->program().steps()) {
      if (!step.has_call()) continue;
      ++calls;
      EXPECT_EQ(step.call().library(), v1::ExternCall::CUBLASLT);
      const v1::Gemm& g = step.call().gemm();
      EXPECT_EQ(g.compute_dtype(), v1::FLOAT32) << "seed " << seed;
      EXPECT_TRUE(g.dtype() == v1::FLOAT32 || g.dtype() == v1::FLOAT16 ||
                  g.dtype() == v1::BFLOAT16)
          << "seed " << seed;
      dtypes.insert(g.dtype());
    }
    EXPECT_GT(calls, 0) << "seed " << seed;
    ++products;
  }
  EXPECT_EQ(products, 12);
  EXPECT_GT(dtypes.size(), 1u) << "only one GEMM dtype drawn";
}

// A linear layer's bias and activation are the cuBLASLt call's epilogue
// (compiler/gemm_epilogue.h) when nothing else reads what they replace;
// the matrix-product flags reach the call; CPU targets ignore them all.
struct EpilogueProgram {
  int calls = 0, launches = 0;
  v1::Gemm gemm;  // the last call's
};

EpilogueProgram CompileLinear(const LinearCase& c,
                              const v1::CompileOptions& options = {}) {
  v1::CompileRequest req;
  *req.mutable_graph() = LinearGraph(c);
  *req.mutable_options() = options;
  auto a = Compile(ForGpu(req, "sm_90"));
  EXPECT_TRUE(a.ok()) << a.status();
  EpilogueProgram p;
  if (!a.ok()) return p;
  EXPECT_EQ(CheckStructure(*a), "");
  for (const v1::Step& step : a->program().steps()) {
    if (step.has_launch()) ++p.launches;
    if (!step.has_call()) continue;
    ++p.calls;
    p.gemm = step.call().gemm();
  }
  return p;
}

TEST(CudaCodegen, BiasAndActivationsAreCublasLtEpilogues) {
  struct Want {
    LinearCase c;
    v1::Gemm::Epilogue epilogue;
    int launches;
  };
  auto with = [](auto f) {
    LinearCase c;
    f(c);
    return c;
  };
  const Want cases[] = {
      {with([](LinearCase& c) { c.activation = "relu"; }), v1::Gemm::RELU_BIAS,
       0},
      {with([](LinearCase& c) { c.activation = "gelu_tanh"; }),
       v1::Gemm::GELU_TANH_BIAS, 0},
      {with([](LinearCase&) {}), v1::Gemm::BIAS, 0},
      {with([](LinearCase& c) { c.bias_row = true; }), v1::Gemm::BIAS, 0},
      // erf-GELU is not cuBLASLt's: the bias folds, the GELU is a kernel.
      {with([](LinearCase& c) { c.activation = "gelu"; }), v1::Gemm::BIAS, 1},
      // The pre-activation is read again (as AOTAutograd saves it for
      // GELU's backward): the bias folds, the activation does not.
      {with([](LinearCase& c) {
         c.activation = "gelu_tanh";
         c.sum_is_output = true;
       }),
       v1::Gemm::BIAS, 1},
      {with([](LinearCase& c) {
         c.bias = false;
         c.activation = "relu";
       }),
       v1::Gemm::RELU, 0},
      {with([](LinearCase& c) {
         c.bias = false;
         c.activation = "gelu_tanh";
       }),
       v1::Gemm::GELU_TANH, 0},
      {with([](LinearCase& c) {
         c.dtype = "BFLOAT16";
         c.activation = "relu";
       }),
       v1::Gemm::RELU_BIAS, 0},
      {with([](LinearCase& c) {
         c.dtype = "FLOAT16";
         c.activation = "gelu_tanh";
       }),
       v1::Gemm::GELU_TANH_BIAS, 0},
      // Dynamic tokens fold; a dynamic k (possibly 0) does not.
      {with([](LinearCase& c) {
         c.symbolic_m = true;
         c.activation = "relu";
       }),
       v1::Gemm::RELU_BIAS, 0},
      {with([](LinearCase& c) {
         c.symbolic_k = true;
         c.activation = "relu";
       }),
       v1::Gemm::EPILOGUE_NONE, 1},
  };
  for (const Want& w : cases) {
    SCOPED_TRACE(absl::StrCat(w.c.dtype, " act '", w.c.activation, "' bias ",
                              w.c.bias, " row ", w.c.bias_row, " sum out ",
                              w.c.sum_is_output, " sym m/k ", w.c.symbolic_m,
                              w.c.symbolic_k));
    const EpilogueProgram p = CompileLinear(w.c);
    EXPECT_EQ(p.calls, 1);
    EXPECT_EQ(p.gemm.epilogue(), w.epilogue);
    EXPECT_EQ(p.launches, w.launches);
    const bool bias = w.epilogue == v1::Gemm::BIAS ||
                      w.epilogue == v1::Gemm::RELU_BIAS ||
                      w.epilogue == v1::Gemm::GELU_TANH_BIAS;
    EXPECT_EQ(p.gemm.has_bias(), bias);
    EXPECT_FALSE(p.gemm.tf32());
    EXPECT_FALSE(p.gemm.strict_reduction());
    // Unfused: the bias and activation are Kiln kernels again.
    v1::CompileOptions unfused;
    unfused.set_unfused_gemm_epilogues(true);
    const EpilogueProgram u = CompileLinear(w.c, unfused);
    EXPECT_EQ(u.gemm.epilogue(), v1::Gemm::EPILOGUE_NONE);
    EXPECT_FALSE(u.gemm.has_bias());
    EXPECT_EQ(u.launches, w.c.bias || !w.c.activation.empty() ? 1 : 0);
  }
}

// A linear layer's bias gradient is written by the weight gradient's
// cuBLASLt call where that call reads the output gradient as its row-major
// B (BGRAD_B) or column-major A (BGRAD_A, AOTAutograd's mm(t(gy), x)); its
// reduction kernel is gone. Unfused, or where the sum is not of a whole
// operand, it stays a kernel.
TEST(CudaCodegen, BiasGradientIsTheWeightGradientsEpilogue) {
  struct Want {
    LinearBackwardCase c;
    v1::Gemm::Epilogue folds;  // EPILOGUE_NONE: none
  };
  auto with = [](auto f) {
    LinearBackwardCase c;
    f(c);
    return c;
  };
  constexpr v1::Gemm::Epilogue kB = v1::Gemm::BGRAD_B;
  constexpr v1::Gemm::Epilogue kA = v1::Gemm::BGRAD_A;
  const Want cases[] = {
      {with([](LinearBackwardCase&) {}), kB},
      {with([](LinearBackwardCase& c) { c.dtype = "BFLOAT16"; }), kB},
      {with([](LinearBackwardCase& c) { c.dtype = "FLOAT16"; }), kB},
      {with([](LinearBackwardCase& c) { c.batch = 3; }), kB},
      {with([](LinearBackwardCase& c) { c.symbolic_tokens = true; }), kB},
      {with([](LinearBackwardCase& c) {
         c.batch = 2;
         c.symbolic_tokens = true;
         c.dtype = "BFLOAT16";
       }),
       kB},
      {with([](LinearBackwardCase& c) { c.gy_transposed_product = true; }), kA},
      // AOTAutograd's order: the sum before the products.
      {with([](LinearBackwardCase& c) {
         c.gy_transposed_product = true;
         c.sum_first = true;
       }),
       kA},
      {with([](LinearBackwardCase& c) {
         c.sum_first = true;
         c.batch = 3;
       }),
       kB},
      {with([](LinearBackwardCase& c) {
         c.gy_transposed_product = true;
         c.batch = 2;
         c.symbolic_tokens = true;
         c.dtype = "FLOAT16";
       }),
       kA},
      // The sum is over part of the rows: no fold.
      {with([](LinearBackwardCase& c) { c.partial_sum = true; }),
       v1::Gemm::EPILOGUE_NONE},
  };
  for (const Want& w : cases) {
    SCOPED_TRACE(absl::StrCat(w.c.dtype, " batch ", w.c.batch, " symbolic ",
                              w.c.symbolic_tokens, " gy^T @ x ",
                              w.c.gy_transposed_product));
    auto compile = [&](bool unfused) {
      v1::CompileRequest req;
      *req.mutable_graph() = LinearBackwardGraph(w.c);
      req.mutable_options()->set_unfused_gemm_epilogues(unfused);
      return Compile(ForGpu(req, "sm_90"));
    };
    for (bool unfused : {false, true}) {
      auto a = compile(unfused);
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_EQ(CheckStructure(*a), "");
      int launches = 0, calls = 0, bgrad = 0;
      for (const v1::Step& step : a->program().steps()) {
        if (step.has_launch()) ++launches;
        if (!step.has_call()) continue;
        ++calls;
        const v1::Gemm& g = step.call().gemm();
        if (g.epilogue() != v1::Gemm::BGRAD_B &&
            g.epilogue() != v1::Gemm::BGRAD_A) {
          continue;
        }
        ++bgrad;
        EXPECT_EQ(g.epilogue(), w.folds);
        EXPECT_TRUE(g.has_bias());
        // B row-major, A column-major.
        const v1::SymPoly& unit = g.epilogue() == v1::Gemm::BGRAD_B
                                      ? g.b().col_stride()
                                      : g.a().row_stride();
        ASSERT_EQ(unit.terms_size(), 1);
        EXPECT_EQ(unit.terms(0).coeff(), 1);
        EXPECT_EQ(unit.terms(0).symbols_size(), 0);
        // The bias gradient is the graph's third output, written in place.
        EXPECT_EQ(a->outputs(2).buffer(), g.bias().buffer());
      }
      EXPECT_EQ(calls, 2);
      const bool folds = w.folds != v1::Gemm::EPILOGUE_NONE && !unfused;
      EXPECT_EQ(bgrad, folds ? 1 : 0);
      if (!unfused) continue;
      auto fused = compile(false);
      ASSERT_TRUE(fused.ok()) << fused.status();
      int fused_launches = 0;
      for (const v1::Step& step : fused->program().steps())
        fused_launches += step.has_launch();
      // The sum's kernels (one, or two where a long column is split) go.
      if (w.folds != v1::Gemm::EPILOGUE_NONE) {
        EXPECT_LT(fused_launches, launches);
      } else {
        EXPECT_EQ(fused_launches, launches);
      }
    }
  }
}

TEST(CudaCodegen, MatmulFlagsReachTheCallAndTheKey) {
  LinearCase f32;
  LinearCase bf16;
  bf16.dtype = "BFLOAT16";
  LinearCase f16;
  f16.dtype = "FLOAT16";
  v1::CompileOptions tf32;
  tf32.set_allow_tf32(true);
  EXPECT_TRUE(CompileLinear(f32, tf32).gemm.tf32());
  EXPECT_FALSE(CompileLinear(bf16, tf32).gemm.tf32());
  v1::CompileOptions strict_bf16;
  strict_bf16.set_strict_bf16_reduction(true);
  EXPECT_TRUE(CompileLinear(bf16, strict_bf16).gemm.strict_reduction());
  EXPECT_FALSE(CompileLinear(f16, strict_bf16).gemm.strict_reduction());
  EXPECT_FALSE(CompileLinear(f32, strict_bf16).gemm.strict_reduction());
  v1::CompileOptions strict_f16;
  strict_f16.set_strict_fp16_reduction(true);
  EXPECT_TRUE(CompileLinear(f16, strict_f16).gemm.strict_reduction());
  // torch.use_deterministic_algorithms(True): the heuristic's algorithm,
  // never a timed one (runtime/cuda_blaslt.h).
  v1::CompileOptions deterministic;
  deterministic.set_deterministic_algorithms(true);
  EXPECT_TRUE(CompileLinear(f32, deterministic).gemm.deterministic());
  EXPECT_TRUE(CompileLinear(bf16, deterministic).gemm.deterministic());
  EXPECT_FALSE(CompileLinear(f32).gemm.deterministic());

  // Keys: each flag is another CUDA artifact; CPU targets ignore them, and
  // a request without them keeps the key it had before they existed.
  auto key = [](const v1::Target& target, const v1::CompileOptions& o) {
    v1::CompileRequest req;
    *req.mutable_graph() = LinearGraph(LinearCase{});
    *req.mutable_target() = target;
    *req.mutable_options() = o;
    auto imported = ImportRequest(req);
    EXPECT_TRUE(imported.ok()) << imported.status();
    return imported.ok() ? DigestToHex(imported->key) : std::string();
  };
  v1::Target cuda;
  cuda.mutable_cuda()->set_arch("sm_90");
  v1::Target cpu;
  *cpu.mutable_cpu() = HostCpuTarget();
  v1::CompileOptions unfused;
  unfused.set_unfused_gemm_epilogues(true);
  v1::CompileOptions strict_f16_bf16 = strict_f16;
  strict_f16_bf16.set_strict_bf16_reduction(true);
  const std::string none_cuda = key(cuda, {});
  std::set<std::string> cuda_keys = {none_cuda};
  for (const v1::CompileOptions& o : {tf32, strict_bf16, strict_f16, unfused,
                                      strict_f16_bf16, deterministic}) {
    EXPECT_TRUE(cuda_keys.insert(key(cuda, o)).second) << o.DebugString();
    EXPECT_EQ(key(cpu, o), key(cpu, {})) << o.DebugString();
  }
  // The options text of a request without the new flags is unchanged.
  v1::CompileRequest req;
  *req.mutable_graph() = LinearGraph(LinearCase{});
  *req.mutable_target() = cuda;
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok());
  for (const KeyComponent& c : ExplainKey(*graph, cuda, {})) {
    if (c.name == "options") EXPECT_EQ(c.canonical, "fast_math=false");
  }
  for (const KeyComponent& c : ExplainKey(*graph, cuda, tf32)) {
    if (c.name == "options")
      EXPECT_EQ(c.canonical, "fast_math=false allow_tf32=true");
  }
}

}  // namespace
}  // namespace kiln::testing
