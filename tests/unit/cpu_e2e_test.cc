// The example graphs compiled for this machine, loaded from memory and run,
// against the reference evaluator.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/substitute.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "compiler/fuse.h"
#include "compiler/lower.h"
#include "compiler/reference.h"
#include "google/protobuf/util/json_util.h"
#include "graph/import.h"
#include "gtest/gtest.h"
#include "runtime/cpu_executable.h"
#include "support/half.h"
#include "tests/unit/example_graphs.h"
#include "tests/unit/numerics.h"

namespace kiln::testing {
namespace {

// Runs `exe` on `inputs` and expects every output to match the reference
// evaluator's for `graph`.
void ExpectOutputsMatchReference(const CpuExecutable& exe, const Graph& graph,
                                 const std::vector<HostTensor>& inputs,
                                 ThreadPool& pool) {
  auto want = EvaluateReference(graph, inputs);
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = exe.Run(inputs, &pool);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t o = 0; o < want->size(); ++o) {
    EXPECT_EQ(Compare((*got)[o], (*want)[o]), "") << "output " << o;
  }
}

class ExampleGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(ExampleGraphs, CompiledMatchesReference) {
  const v1::CompileRequest req = Request(GetParam());
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok());
  std::mt19937_64 rng(42);
  ThreadPool pool(2);
  for (int64_t batch : {2, 5, 33}) {
    std::vector<int64_t> symbols(graph->symbols.size(), batch);
    if (symbols.empty() && batch != 2) break;
    SCOPED_TRACE(absl::StrCat(GetParam(), " batch ", batch));
    ExpectOutputsMatchReference(**exe, *graph,
                                RandomInputs(*graph, symbols, rng), pool);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, ExampleGraphs,
    ::testing::Values("chain10.json", "chain30.json", "chain30_sum.json",
                      "softmax.json", "layer_norm.json", "reduce_two_dims.json",
                      "dynamic_batch.json"),
    [](const auto& info) {
      std::string n = info.param.substr(0, info.param.find('.'));
      return n;
    });

TEST(CpuRuntime, GuardsRejectMismatchedInputs) {
  const v1::CompileRequest req = Request("dynamic_batch.json");
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto graph = ImportGraph(req.graph());
  std::mt19937_64 rng(1);
  auto inputs = RandomInputs(*graph, {4}, rng);
  // A batch of 1 was specialised away (symbols are >= 2).
  std::vector<HostTensor> one = inputs;
  one[0] = HostTensor::Empty(DType::kFloat32, {1, 16});
  auto r = (*exe)->Run(one);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("violates the guard"), std::string::npos)
      << r.status();
  // Wrong dtype.
  std::vector<HostTensor> bad = inputs;
  bad[0] = HostTensor::Empty(DType::kFloat16, {4, 16});
  EXPECT_EQ((*exe)->Run(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A transposed view has other strides than the contiguous ones compiled for.
  HostTensor base = HostTensor::Empty(DType::kFloat32, {16, 4});
  std::vector<HostTensor> strided = inputs;
  strided[0] = HostTensor::View(base, {4, 16}, {1, 4}, 0);
  auto s = (*exe)->Run(strided);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("stride"), std::string::npos)
      << s.status();
}

TEST(CpuRuntime, TamperedBinaryIsNotLoaded) {
  auto artifact = Compile(Request("chain10.json"));
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  std::string so = artifact->cpu().shared_object();
  so[so.size() / 2] ^= 1;
  artifact->mutable_cpu()->set_shared_object(so);
  EXPECT_EQ(CpuExecutable::Load(*artifact).status().code(),
            absl::StatusCode::kDataLoss);
}

// `json` (a Graph) as a request to compile it for this machine.
absl::StatusOr<v1::CompileRequest> HostRequest(const std::string& json) {
  v1::CompileRequest req;
  if (auto s = google::protobuf::util::JsonStringToMessage(json,
                                                           req.mutable_graph());
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(s.message()), ": ", json));
  }
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  return req;
}

// A graph in JSON compiled for this machine and loaded (fast_math as the
// option says).
absl::StatusOr<std::unique_ptr<CpuExecutable>> CompileForHost(
    const std::string& json, bool fast_math = false) {
  absl::StatusOr<v1::CompileRequest> req = HostRequest(json);
  if (!req.ok()) return req.status();
  req->mutable_options()->set_fast_math(fast_math);
  absl::StatusOr<v1::Artifact> artifact = Compile(*req);
  if (!artifact.ok()) return artifact.status();
  return CpuExecutable::Load(*artifact);
}

// `req` compiled with `env` and its kernels' LLVM IR before optimisation
// (the 04-llvm.ll dump, through a temporary dump dir).
struct CompiledWithIr {
  v1::Artifact artifact;
  std::string ir;
};
absl::StatusOr<CompiledWithIr> CompileWithIr(const v1::CompileRequest& req,
                                             CompileEnv env) {
  char dir_template[] = "/tmp/kiln-codegen-XXXXXX";
  if (mkdtemp(dir_template) == nullptr)
    return absl::InternalError("mkdtemp failed");
  const std::filesystem::path dir(dir_template);
  env.dump_dir = dir.string();
  absl::StatusOr<v1::Artifact> artifact = Compile(req, env);
  CompiledWithIr out;
  if (artifact.ok()) {
    out.artifact = *std::move(artifact);
    for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
      if (f.path().filename() != "04-llvm.ll") continue;
      std::ifstream in(f.path());
      out.ir.assign(std::istreambuf_iterator<char>(in), {});
    }
  }
  std::filesystem::remove_all(dir);
  if (!artifact.ok()) return artifact.status();
  return out;
}

// `artifact` (compiled from `req`) run on random inputs from `seed`, as
// `edit` leaves them, against the reference evaluator.
void ExpectArtifactMatchesReference(
    const v1::CompileRequest& req, const v1::Artifact& artifact, uint64_t seed,
    const std::function<void(std::vector<HostTensor>&)>& edit = nullptr) {
  auto exe = CpuExecutable::Load(artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::mt19937_64 rng(seed);
  std::vector<HostTensor> inputs = RandomInputs(*graph, {}, rng);
  if (edit) edit(inputs);
  ThreadPool pool(2);
  ExpectOutputsMatchReference(**exe, *graph, inputs, pool);
}

// How often `what` occurs in `text`.
int Occurrences(absl::string_view text, absl::string_view what) {
  return static_cast<int>(
             std::vector<absl::string_view>(absl::StrSplit(text, what))
                 .size()) -
         1;
}

// Regressions found by tests/unit/random_graph_test.cc: a graph in JSON,
// compiled for this machine and run against the reference evaluator with
// symbols bound to each of `bindings` (one binding for a static graph).
void ExpectMatchesReference(const std::string& json,
                            std::vector<std::vector<int64_t>> bindings = {{}}) {
  absl::StatusOr<v1::CompileRequest> parsed = HostRequest(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::CompileRequest& req = *parsed;
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::mt19937_64 rng(7);
  ThreadPool pool(2);
  for (const std::vector<int64_t>& symbols : bindings) {
    ExpectOutputsMatchReference(**exe, *graph,
                                RandomInputs(*graph, symbols, rng), pool);
  }
}

// Input writes (Graph.input_writes): a mutated input's new value stored
// into the input's memory. Compiles `json`, expects the artifact to take
// exactly the graph outputs `taken` as input writes, runs it once and
// expects every graph output to be the reference's: a taken one in its
// input (the run wrote it), the others among the executable's outputs.
void ExpectInputWrites(const std::string& json, std::vector<int> taken) {
  absl::StatusOr<v1::CompileRequest> parsed = HostRequest(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::CompileRequest& req = *parsed;
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  std::vector<int> got_taken;
  absl::flat_hash_map<int, int> input_of;
  for (const v1::InputWrite& w : artifact->input_writes()) {
    got_taken.push_back(w.output());
    input_of[w.output()] = w.input();
  }
  std::sort(got_taken.begin(), got_taken.end());
  EXPECT_EQ(got_taken, taken);
  EXPECT_EQ(artifact->outputs_size() + artifact->input_writes_size(),
            req.graph().outputs_size());
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::mt19937_64 rng(11);
  std::vector<HostTensor> inputs = RandomInputs(*graph, {}, rng);
  std::vector<HostTensor> before;
  for (const HostTensor& t : inputs) before.push_back(t.Contiguous());
  auto want = EvaluateReference(*graph, before);
  ASSERT_TRUE(want.ok()) << want.status();
  ThreadPool pool(2);
  auto got = (*exe)->Run(inputs, &pool);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), static_cast<size_t>(artifact->outputs_size()));
  size_t next = 0;
  for (size_t o = 0; o < want->size(); ++o) {
    if (auto w = input_of.find(static_cast<int>(o)); w != input_of.end()) {
      EXPECT_EQ(Compare(inputs[w->second], (*want)[o]), "")
          << "output " << o << ", written into input " << w->second;
    } else {
      EXPECT_EQ(Compare((*got)[next++], (*want)[o]), "") << "output " << o;
    }
  }
}

std::string Vector(const std::string& name, int n = 37) {
  return absl::StrCat(R"({"name": ")", name,
                      R"(", "meta": {"dtype": "FLOAT32", "sizes": [{"value": )",
                      n, "}]}}");
}

// An optimizer's step: the momentum and the parameter both written in
// place, the parameter's update reading the momentum's new value and its
// own (the stores are ordered after every read of what they overwrite).
TEST(CpuInputWrites, AnOptimizerStepWritesItsStateInPlace) {
  ExpectInputWrites(absl::StrCat(R"({"inputs": [)", Vector("p"), ", ",
                                 Vector("m"), ", ", Vector("g"), R"(],
    "nodes": [{"op": "aten.mul.Tensor", "args": [{"ref": "m"}, {"f": 0.9}],
               "outputs": ["m1"]},
              {"op": "aten.add.Tensor", "args": [{"ref": "m1"}, {"ref": "g"}],
               "outputs": ["m2"]},
              {"op": "aten.mul.Tensor", "args": [{"ref": "m2"}, {"f": 0.1}],
               "outputs": ["u"]},
              {"op": "aten.mul.Tensor", "args": [{"ref": "p"}, {"ref": "m"}],
               "outputs": ["pm"]},
              {"op": "aten.sub.Tensor", "args": [{"ref": "p"}, {"ref": "u"}],
               "outputs": ["p1"]},
              {"op": "aten.add.Tensor", "args": [{"ref": "p1"}, {"ref": "pm"}],
               "outputs": ["p2"]}],
    "outputs": ["m2", "p2"],
    "input_writes": [{"output": 0, "input": 1}, {"output": 1, "input": 0}]})"),
                    {0, 1});
}

// A matrix product reads the parameter before the kernel that writes it:
// still in place (the product's output stays an output).
TEST(CpuInputWrites, AnEarlierKernelMayReadTheInput) {
  const std::string matrix = R"("meta": {"dtype": "FLOAT32",
      "sizes": [{"value": 9}, {"value": 9}]}})";
  ExpectInputWrites(absl::StrCat(R"({"inputs": [{"name": "p", )", matrix,
                                 R"(, {"name": "w", )", matrix, R"(],
    "nodes": [{"op": "aten.mm.default", "args": [{"ref": "p"}, {"ref": "w"}],
               "outputs": ["y"]},
              {"op": "aten.mul.Tensor", "args": [{"ref": "p"}, {"f": 0.5}],
               "outputs": ["p1"]}],
    "outputs": ["p1", "y"],
    "input_writes": [{"output": 0, "input": 0}]})"),
                    {0});
}

// A kernel that also reduces (here the whole tensor, one row) keeps its
// writes ordinary outputs: a split of its rows (split_reductions) may move
// element stores into the partial kernels, ahead of reads of the input in
// the kernels after them.
TEST(CpuInputWrites, AReductionKernelKeepsAnOutput) {
  ExpectInputWrites(absl::StrCat(R"({"inputs": [)", Vector("p"), R"(],
    "nodes": [{"op": "aten.sum.default", "args": [{"ref": "p"}],
               "outputs": ["s"]},
              {"op": "aten.mul.Tensor", "args": [{"ref": "p"}, {"ref": "s"}],
               "outputs": ["ps"]},
              {"op": "aten.sub.Tensor", "args": [{"ref": "p"}, {"ref": "ps"}],
               "outputs": ["p1"]},
              {"op": "aten.exp.default", "args": [{"ref": "p1"}],
               "outputs": ["e"]}],
    "outputs": ["p1", "e"],
    "input_writes": [{"output": 0, "input": 0}]})"),
                    {});
}

// The writer reads the input at other elements (a flip): other iterations
// would read what this one overwrote. An ordinary output.
TEST(CpuInputWrites, ReadingOtherElementsKeepsAnOutput) {
  ExpectInputWrites(absl::StrCat(R"({"inputs": [)", Vector("p"), R"(],
    "nodes": [{"op": "aten.flip.default",
               "args": [{"ref": "p"}, {"ints": {"values": [0]}}],
               "outputs": ["f"]},
              {"op": "aten.add.Tensor", "args": [{"ref": "p"}, {"ref": "f"}],
               "outputs": ["p1"]}],
    "outputs": ["p1"],
    "input_writes": [{"output": 0, "input": 0}]})"),
                    {});
}

// A kernel after the writer reads the old input: an ordinary output.
TEST(CpuInputWrites, ALaterReaderKeepsAnOutput) {
  ExpectInputWrites(absl::StrCat(R"({"inputs": [)", Vector("p"), R"(],
    "nodes": [{"op": "aten.mul.Tensor", "args": [{"ref": "p"}, {"f": 2}],
               "outputs": ["p1"]},
              {"op": "aten.mul.Tensor", "args": [{"ref": "p"}, {"ref": "p"}],
               "outputs": ["sq"]},
              {"op": "aten.sum.default", "args": [{"ref": "sq"}],
               "outputs": ["s"]}],
    "outputs": ["p1", "s"],
    "input_writes": [{"output": 0, "input": 0}]})"),
                    {});
}

// Two inputs swapped: each store reads what the other overwrites, so no
// order works; both stay outputs.
TEST(CpuInputWrites, ASwapKeepsBothOutputs) {
  ExpectInputWrites(
      absl::StrCat(R"({"inputs": [)", Vector("a"), ", ", Vector("b"), R"(],
    "nodes": [{"op": "aten.mul.Tensor", "args": [{"ref": "b"}, {"f": 1.5}],
               "outputs": ["a1"]},
              {"op": "aten.mul.Tensor", "args": [{"ref": "a"}, {"f": 0.5}],
               "outputs": ["b1"]}],
    "outputs": ["a1", "b1"],
    "input_writes": [{"output": 0, "input": 0}, {"output": 1, "input": 1}]})"),
      {});
}

// Malformed input writes are INVALID_ARGUMENT naming the write.
TEST(CpuInputWrites, MalformedWritesAreRefused) {
  const std::string head = absl::StrCat(
      R"({"inputs": [)", Vector("p"), ", ", Vector("q", 5),
      R"(, {"name": "i", "meta": {"dtype": "INT64", "sizes": [{"value": 37}]}},
      {"name": "t", "meta": {"dtype": "FLOAT32",
       "sizes": [{"value": 6}, {"value": 5}],
       "strides": [{"value": 1}, {"value": 6}]}}],
    "nodes": [{"op": "aten.mul.Tensor", "args": [{"ref": "p"}, {"f": 2}],
               "outputs": ["p1"]},
              {"op": "aten.mul.Tensor", "args": [{"ref": "t"}, {"f": 2}],
               "outputs": ["t1"]}],
    "outputs": ["p1", "t1"], "input_writes": )");
  const std::pair<const char*, const char*> cases[] = {
      {R"([{"output": 2, "input": 0}])", "output 2 is not an output"},
      {R"([{"output": 0, "input": 4}])", "input 4 is not an input"},
      {R"([{"output": 0, "input": 0}, {"output": 0, "input": 1}])",
       "written into two inputs"},
      {R"([{"output": 0, "input": 1}])", "differ in sizes"},
      {R"([{"output": 0, "input": 2}])", "output 0 is float32, input 2 int64"},
      {R"([{"output": 1, "input": 3}])", "input 3 is not contiguous"},
  };
  for (const auto& [writes, why] : cases) {
    v1::Graph g;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                    absl::StrCat(head, writes, "}"), &g)
                    .ok())
        << writes;
    auto graph = ImportGraph(g);
    ASSERT_FALSE(graph.ok()) << writes;
    EXPECT_EQ(graph.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(graph.status().message(), why))
        << graph.status();
    EXPECT_TRUE(absl::StrContains(graph.status().message(), "input write"))
        << graph.status();
  }
}

// fast_math allows reassociation and approximate functions but keeps NaN
// semantics: isnan and NaN-propagating maximum still see NaNs (they were
// folded away when fast_math set LLVM's nnan flag).
// The CPU runtime checks a program with the CUDA runtime's code
// (runtime/program_plan.h) before loading any of its code: each malformed
// program is INVALID_ARGUMENT with the same message CudaExecutable gives.
TEST(CpuRuntime, MalformedProgramIsInvalidArgument) {
  CompileEnv unfused;
  unfused.fuse = false;  // one kernel per op: temps between them
  auto compiled = Compile(Request("chain10.json"), unfused);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ASSERT_TRUE(CpuExecutable::Load(*compiled).ok());
  int input_buffer = -1, first_alloc = -1, first_launch = -1;
  for (int b = 0; b < compiled->program().buffers_size(); ++b) {
    if (compiled->program().buffers(b).kind() == v1::BufferSpec::INPUT)
      input_buffer = b;
  }
  for (int i = 0; i < compiled->program().steps_size(); ++i) {
    const v1::Step& step = compiled->program().steps(i);
    if (step.has_alloc() && first_alloc < 0) first_alloc = i;
    if (step.has_launch() && first_launch < 0) first_launch = i;
  }
  ASSERT_GE(input_buffer, 0);
  ASSERT_GE(first_alloc, 0);
  ASSERT_GE(first_launch, 0);
  struct Case {
    const char* what;
    std::function<void(v1::Artifact*)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"launch of a buffer out of range",
       [&](v1::Artifact* a) {
         a->mutable_program()
             ->mutable_steps(first_launch)
             ->mutable_launch()
             ->set_buffers(0, 99);
       },
       "passes buffer 99 of"},
      {"range over an unknown symbol",
       [&](v1::Artifact* a) {
         v1::SymPoly::Term* t = a->mutable_program()
                                    ->mutable_steps(first_launch)
                                    ->mutable_launch()
                                    ->mutable_range()
                                    ->add_terms();
         t->set_coeff(1);
         t->add_symbols(3);
       },
       "uses symbol #3 of 0"},
      {"free of an input",
       [&](v1::Artifact* a) {
         a->mutable_program()->add_steps()->set_free(input_buffer);
       },
       "which is not a temp"},
      {"output spec pointing at the input",
       [&](v1::Artifact* a) {
         a->mutable_outputs(0)->set_buffer(input_buffer);
       },
       "claims to be output 0"},
      {"input buffer of a missing input",
       [&](v1::Artifact* a) {
         a->mutable_program()->mutable_buffers(input_buffer)->set_index(4);
       },
       "is input 4 of 1"},
      {"a temp used before it is allocated",
       [&](v1::Artifact* a) {
         a->mutable_program()->mutable_steps()->DeleteSubrange(first_alloc, 1);
       },
       "while it is not allocated"},
  };
  for (const Case& c : cases) {
    v1::Artifact a = *compiled;
    c.mutate(&a);
    auto exe = CpuExecutable::Load(a);
    ASSERT_FALSE(exe.ok()) << c.what;
    EXPECT_EQ(exe.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what << ": " << exe.status();
    EXPECT_TRUE(absl::StrContains(exe.status().message(), c.message))
        << c.what << ": " << exe.status();
  }
}

TEST(CpuRegression, FastMathKeepsNaNs) {
  auto exe = CompileForHost(R"({
    "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32",
                "sizes": [{"value": 8}]}}],
    "nodes": [{"op": "aten.isnan.default", "args": [{"ref": "x"}],
               "outputs": ["n"]},
              {"op": "aten.maximum.default", "args": [{"ref": "x"}, {"ref": "x"}],
               "outputs": ["m"]}],
    "outputs": ["n", "m"]})",
                            /*fast_math=*/true);
  ASSERT_TRUE(exe.ok()) << exe.status();
  HostTensor x = HostTensor::Empty(DType::kFloat32, {8});
  for (int i = 0; i < 8; ++i)
    x.SetDoubleAt(i, i % 3 == 0 ? std::nan("") : i * 0.5);
  auto got = (*exe)->Run({x});
  ASSERT_TRUE(got.ok()) << got.status();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ((*got)[0].GetIntAt(i), i % 3 == 0 ? 1 : 0) << i;
    EXPECT_EQ(std::isnan((*got)[1].GetDoubleAt(i)), i % 3 == 0) << i;
  }
}

// Random graph seeds 1, 16, 89, 99: a keepdim reduction over a dim of size
// 1 stored its row result at the reduced var's value after the row loop (1,
// not 0): out of bounds, and softmax's max/sum read garbage.
TEST(CpuRegression, KeepdimReductionOverSizeOneDim) {
  ExpectMatchesReference(R"({
    "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32",
                "sizes": [{"value": 1}, {"value": 7}, {"value": 1}]}}],
    "nodes": [{"op": "aten._softmax.default",
               "args": [{"ref": "x"}, {"i": 0}, {"b": false}],
               "outputs": ["y"]},
              {"op": "aten.sum.dim_IntList",
               "args": [{"ref": "x"}, {"ints": {"values": [2]}}, {"b": true}],
               "outputs": ["s"]}],
    "outputs": ["y", "s"]})");
}

// Random graph seeds 10, 67, 166, 186, 206, 260: integer max/min and
// int32 sums accumulate in a wider type than the node's; readers got the
// accumulator as is (an i64 zext to a bool's i8, smax of i32 with i64,
// 8-byte stores into int32 buffers) instead of converted to the node dtype.
TEST(CpuRegression, NarrowReductionResults) {
  ExpectMatchesReference(R"({
    "inputs": [{"name": "b", "meta": {"dtype": "BOOL",
                "sizes": [{"value": 4}, {"value": 3}]}},
               {"name": "i", "meta": {"dtype": "INT32",
                "sizes": [{"value": 8}]}}],
    "nodes": [{"op": "aten.amax.default",
               "args": [{"ref": "b"}, {"ints": {"values": [-2]}}],
               "outputs": ["bmax"]},
              {"op": "aten.amax.default", "args": [{"ref": "i"}],
               "outputs": ["imax"]},
              {"op": "aten.maximum.default",
               "args": [{"ref": "i"}, {"ref": "imax"}], "outputs": ["m"]},
              {"op": "aten.sum.dim_IntList",
               "args": [{"ref": "i"}, {"ints": {"values": [0]}}, {"b": true},
                        {"name": "dtype", "dtype": "INT32"}],
               "outputs": ["s"]},
              {"op": "aten.add.Tensor", "args": [{"ref": "i"}, {"ref": "s"}],
               "outputs": ["t"]}],
    "outputs": ["bmax", "m", "t"]})");
}

// Random graph seed 465: float16/bfloat16 ops computed in float32 kept
// their unrounded results inside a kernel, so (x + 256) - 256 in bfloat16
// gave x back instead of a multiple of 2, and a bfloat16 -> float16 cast
// fed a remainder a value off by one bfloat16 ulp.
TEST(CpuRegression, HalfPrecisionOpsRoundEachResult) {
  ExpectMatchesReference(R"({
    "inputs": [{"name": "b", "meta": {"dtype": "BFLOAT16",
                "sizes": [{"value": 6}, {"value": 5}]}},
               {"name": "h", "meta": {"dtype": "FLOAT16",
                "sizes": [{"value": 6}, {"value": 5}]}}],
    "nodes": [{"op": "aten.add.Tensor", "args": [{"ref": "b"}, {"f": 256}],
               "outputs": ["b1"]},
              {"op": "aten.sub.Tensor", "args": [{"ref": "b1"}, {"f": 256}],
               "outputs": ["b2"]},
              {"op": "aten.add.Tensor", "args": [{"ref": "h"}, {"f": 2048}],
               "outputs": ["h1"]},
              {"op": "aten.sub.Tensor", "args": [{"ref": "h1"}, {"f": 2048}],
               "outputs": ["h2"]},
              {"op": "aten.abs.default", "args": [{"ref": "b"}],
               "outputs": ["a"]},
              {"op": "aten.add.Scalar", "args": [{"ref": "a"}, {"f": 1}],
               "outputs": ["a1"]},
              {"op": "aten._to_copy.default",
               "args": [{"ref": "a1"}, {"name": "dtype", "dtype": "FLOAT16"}],
               "outputs": ["c"]},
              {"op": "aten.remainder.Tensor", "args": [{"ref": "c"}, {"f": 0.1}],
               "outputs": ["r"]}],
    "outputs": ["b2", "h2", "r"]})");
}

// float16 <-> float32 as compiled for this CPU (F16C's instructions where
// it has them: codegen_cpu.h, CpuCodegenOptions::f16c) gives exactly
// support/half.h's results: every float16 bit pattern widened, and
// float32 values at and around every rounding boundary (each float16, the
// midpoints between neighbours, one float32 ulp either side, the overflow
// edge, subnormals) narrowed. NaNs stay NaNs (their payloads may differ).
TEST(CpuRegression, HalfConversionsAreExact) {
  std::vector<float> narrow;
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    for (float sign : {1.0f, -1.0f}) {
      const float lo = sign * HalfToFloat(static_cast<uint16_t>(h));
      const float hi = sign * HalfToFloat(static_cast<uint16_t>(h + 1));
      const float mid = lo + (hi - lo) / 2;  // exact in float32
      for (float v :
           {lo, mid, std::nextafter(mid, lo), std::nextafter(mid, hi)})
        narrow.push_back(v);
    }
  }
  for (float v : {65504.0f, 65519.0f, 65520.0f, 65536.0f, 1e30f,
                  std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::denorm_min(), 1e-10f}) {
    narrow.push_back(v);
    narrow.push_back(-v);
  }
  const int64_t n = static_cast<int64_t>(narrow.size());
  auto exe = CompileForHost(absl::StrCat(R"({
    "inputs": [{"name": "f", "meta": {"dtype": "FLOAT32",
                "sizes": [{"value": )",
                                         n, R"(}]}},
               {"name": "h", "meta": {"dtype": "FLOAT16",
                "sizes": [{"value": 65536}]}}],
    "nodes": [{"op": "aten._to_copy.default",
               "args": [{"ref": "f"}, {"name": "dtype", "dtype": "FLOAT16"}],
               "outputs": ["fh"]},
              {"op": "aten._to_copy.default",
               "args": [{"ref": "h"}, {"name": "dtype", "dtype": "FLOAT32"}],
               "outputs": ["hf"]}],
    "outputs": ["fh", "hf"]})"));
  ASSERT_TRUE(exe.ok()) << exe.status();
  HostTensor f = HostTensor::Empty(DType::kFloat32, {n});
  std::memcpy(f.data(), narrow.data(), narrow.size() * sizeof(float));
  HostTensor h = HostTensor::Empty(DType::kFloat16, {65536});
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t bits = static_cast<uint16_t>(i);
    std::memcpy(h.data() + 2 * i, &bits, 2);
  }
  auto out = (*exe)->Run({f, h});
  ASSERT_TRUE(out.ok()) << out.status();
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 10; ++i) {
    uint16_t got;
    std::memcpy(&got, (*out)[0].data() + 2 * i, 2);
    const uint16_t want = FloatToHalf(narrow[i]);
    if (got != want) {
      ++bad;
      ADD_FAILURE() << narrow[i] << " -> 0x" << std::hex << got << ", want 0x"
                    << want;
    }
  }
  for (uint32_t i = 0; i < 65536 && bad < 20; ++i) {
    float got;
    std::memcpy(&got, (*out)[1].data() + 4 * i, 4);
    const float want = HalfToFloat(static_cast<uint16_t>(i));
    const bool same = std::isnan(want)
                          ? std::isnan(got)
                          : std::memcmp(&got, &want, sizeof(got)) == 0;
    if (!same) {
      ++bad;
      ADD_FAILURE() << "0x" << std::hex << i << " -> " << got << ", want "
                    << want;
    }
  }
}

// Random graph seed 8637: a bool add converts alpha to bool first
// (PyTorch's alpha_scalar.to<bool>()): x + x * -1 is x, not x - x. The
// reference computed in int64 with alpha -1; the compiled code truncated
// alpha 2 to an i1 0.
// exp as compiled for this CPU (inline, codegen_cpu.cc's Exp) is within
// one float32 ulp of exp in double, rounded, over the whole range: a sweep
// from -110 to 110, the edges of overflow, of subnormal results and of
// zero, and -inf, inf and NaN; with and without fast_math (the range
// reduction keeps its order). sigmoid (libmvec's exp) of large values is
// exactly 0 and 1.
TEST(CpuRegression, ExpIsWithinOneUlp) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> xs;
  for (int i = -220000; i <= 220000; ++i) xs.push_back(i * 5e-4f);
  for (float edge :
       {88.72283f, 88.7228394f, 88.73f, -87.33654f, -87.3366f, -103.972076f,
        -103.97209f, -104.0f, -104.01f, 1e-30f,
        std::numeric_limits<float>::denorm_min(), 0.0f, 1e30f, kInf}) {
    for (float v :
         {edge, std::nextafter(edge, 0.0f), std::nextafter(edge, kInf)}) {
      xs.push_back(v);
      xs.push_back(-v);
    }
  }
  xs.push_back(std::numeric_limits<float>::quiet_NaN());
  const int64_t n = static_cast<int64_t>(xs.size());
  HostTensor x = HostTensor::Empty(DType::kFloat32, {n});
  std::memcpy(x.data(), xs.data(), xs.size() * sizeof(float));
  // Bits as an ordinal: neighbouring floats differ by one.
  auto ordinal = [](float f) {
    int32_t b;
    std::memcpy(&b, &f, sizeof(b));
    return b < 0 ? -(b & 0x7fffffff) : b;
  };
  for (bool fast_math : {false, true}) {
    SCOPED_TRACE(fast_math ? "fast_math" : "exact");
    auto exe = CompileForHost(absl::StrCat(R"({
    "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32",
                "sizes": [{"value": )",
                                           n, R"(}]}}],
    "nodes": [{"op": "aten.exp.default", "args": [{"ref": "x"}],
               "outputs": ["e"]},
              {"op": "aten.sigmoid.default", "args": [{"ref": "x"}],
               "outputs": ["s"]}],
    "outputs": ["e", "s"]})"),
                              fast_math);
    ASSERT_TRUE(exe.ok()) << exe.status();
    auto out = (*exe)->Run({x});
    ASSERT_TRUE(out.ok()) << out.status();
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 10; ++i) {
      float got, sig;
      std::memcpy(&got, (*out)[0].data() + 4 * i, 4);
      std::memcpy(&sig, (*out)[1].data() + 4 * i, 4);
      const float want = static_cast<float>(std::exp(double{xs[i]}));
      const bool ok = std::isnan(want)
                          ? std::isnan(got) && std::isnan(sig)
                          : std::abs(ordinal(got) - ordinal(want)) <= 1;
      if (!ok) {
        ++bad;
        ADD_FAILURE() << "exp(" << xs[i] << ") = " << got << ", want " << want;
      }
      if (std::abs(xs[i]) >= 110 && !std::isnan(xs[i]) &&
          sig != (xs[i] > 0 ? 1.0f : 0.0f)) {
        ++bad;
        ADD_FAILURE() << "sigmoid(" << xs[i] << ") = " << sig;
      }
    }
  }
}

// A softmax computes each exp once (codegen_cpu.cc, KeptSummands): the
// sum's pass stores exp(x - max) in the output, the last pass scales it by
// 1 / sum. One inline exp in the kernel's IR (two before), and the
// result matches the reference, masked rows and a fully masked row (NaN)
// included. A bfloat16 or float16 softmax keeps its summands in a float32
// scratch row (its output would round them first). None divides per
// element: each multiplies by the sum's reciprocal.
TEST(CpuRegression, SoftmaxComputesEachExpOnce) {
  for (const char* dtype : {"FLOAT32", "BFLOAT16", "FLOAT16"}) {
    SCOPED_TRACE(dtype);
    auto parsed = HostRequest(absl::StrCat(R"({
    "inputs": [{"name": "x", "meta": {"dtype": ")",
                                           dtype, R"(",
                "sizes": [{"value": 7}, {"value": 300}]}},
               {"name": "m", "meta": {"dtype": "BOOL",
                "sizes": [{"value": 7}, {"value": 300}]}}],
    "nodes": [{"op": "aten.masked_fill.Scalar",
               "args": [{"ref": "x"}, {"ref": "m"}, {"f": "-Infinity"}],
               "outputs": ["f"]},
              {"op": "aten._softmax.default",
               "args": [{"ref": "f"}, {"i": -1}, {"b": false}],
               "outputs": ["s"]}],
    "outputs": ["s"]})"));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto compiled = CompileWithIr(*parsed, CompileEnv());
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    const std::string& ir = compiled->ir;
    // One roundeven per inline exp, before optimisation.
    EXPECT_EQ(Occurrences(ir, "call float @llvm.roundeven.f32("), 1) << ir;
    // No division per element: the one division is the sum's reciprocal.
    EXPECT_EQ(Occurrences(ir, " = fdiv "), 1) << ir;
    EXPECT_EQ(Occurrences(ir, " = fdiv float 1.000000e+00,"), 1) << ir;
    ExpectArtifactMatchesReference(
        *parsed, compiled->artifact, 36, [](std::vector<HostTensor>& inputs) {
          for (int j = 0; j < 300; ++j)
            inputs[1].SetIntAt(4 * 300 + j, 1);  // row 4
        });
  }
}

TEST(CpuRegression, BoolAddAlphaIsABool) {
  ExpectMatchesReference(R"({
    "inputs": [{"name": "x", "meta": {"dtype": "BOOL",
                "sizes": [{"value": 3}, {"value": 8}]}},
               {"name": "y", "meta": {"dtype": "BOOL",
                "sizes": [{"value": 3}, {"value": 8}]}}],
    "nodes": [{"op": "aten.add.Tensor",
               "args": [{"ref": "x"}, {"ref": "x"},
                        {"name": "alpha", "i": -1}],
               "outputs": ["a"]},
              {"op": "aten.add.Tensor",
               "args": [{"ref": "x"}, {"ref": "y"}, {"name": "alpha", "i": 2}],
               "outputs": ["b"]}],
    "outputs": ["a", "b"]})");
}

// Random graph seed 19692: a float16/bfloat16 op rounds once, not at each
// internal step: add(c, b, alpha=3) is c + 3 * b rounded once, so with
// c = -3 * b rounded it leaves that rounding's residue, not 0.
TEST(CpuRegression, HalfPrecisionOpRoundsOnce) {
  ExpectMatchesReference(R"({
    "inputs": [{"name": "b", "meta": {"dtype": "BFLOAT16",
                "sizes": [{"value": 4}, {"value": 16}]}}],
    "nodes": [{"op": "aten.mul.Tensor", "args": [{"ref": "b"}, {"f": -3}],
               "outputs": ["c"]},
              {"op": "aten.add.Tensor",
               "args": [{"ref": "c"}, {"ref": "b"}, {"name": "alpha", "i": 3}],
               "outputs": ["r"]}],
    "outputs": ["r"]})");
}

// The split of few long rows (compiler/split_reductions.h) run on the CPU
// (CompileEnv::split_reductions_on_cpu): the programs a GPU runs, with
// their partial, combining and pointwise kernels, checked for their values
// on this machine. `json` is compiled with the split, its kernels must be
// `kernels`, and it is run on random inputs, input 0 in [lo, hi] (the
// others in [-2, 2]) plus a ramp from 0 up to `ramp` along its elements in
// memory order (so that chunks of a row differ in mean, which the merge of
// the chunks must account for), against the reference evaluator (in
// double).
void ExpectSplitMatchesReference(
    const std::string& json, const std::vector<std::string>& kernels, double lo,
    double hi, double ramp = 0,
    const std::function<void(HostTensor&)>& edit_input = nullptr) {
  absl::StatusOr<v1::CompileRequest> parsed = HostRequest(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::CompileRequest& req = *parsed;
  CompileEnv env;
  env.split_reductions_on_cpu = true;
  auto artifact = Compile(req, env);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  std::vector<std::string> names;
  for (const v1::Step& step : artifact->program().steps())
    if (step.has_launch()) names.push_back(step.launch().kernel());
  EXPECT_EQ(names, kernels);
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::mt19937_64 rng(17);
  ThreadPool pool(2);
  std::vector<HostTensor> inputs = RandomInputs(*graph, {}, rng);
  FillRandom(inputs[0], rng, lo, hi);
  HostTensor& x = inputs[0];
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.SetDoubleAt(i, x.GetDoubleAt(i) + ramp * static_cast<double>(i) /
                                            static_cast<double>(x.numel()));
  }
  if (edit_input) edit_input(x);
  ExpectOutputsMatchReference(**exe, *graph, inputs, pool);
}

// A node `m` = amax of input x over dim 1, for OneInputGraph's `more`.
constexpr char kRowMaxNode[] = R"(, {"op": "aten.amax.default",
    "args": [{"ref": "x"}, {"ints": {"values": ["1"]}}], "outputs": ["m"]})";

// A graph of one reduction `op` over an input of `sizes` and `dtype`, with
// `args` after the input (JSON, each with its leading comma), and `more`
// nodes after it (each with its leading comma) computing `outputs`.
std::string OneInputGraph(const std::string& dtype,
                          const std::vector<int64_t>& sizes,
                          const std::string& op, const std::string& args,
                          const std::string& more = "",
                          const std::string& outputs = R"("y")") {
  std::vector<std::string> dims;
  for (int64_t s : sizes) dims.push_back(absl::StrCat(R"({"value": )", s, "}"));
  return absl::StrCat(
      R"({"inputs": [{"name": "x", "meta": {"dtype": ")", dtype,
      R"(", "sizes": [)", absl::StrJoin(dims, ", "),
      R"(]}}], "nodes": [{"op": ")", op, R"(", "args": [{"ref": "x"})", args,
      R"(], "outputs": ["y"]})", more, R"(], "outputs": [)", outputs, "]}");
}

// A pointwise output y and a reduction of it over few long rows (group
// norm's y and the loss mean(y^2)) are one kernel on the GPU
// (FuseOptions::stores_into_reductions): its split's partial kernel stores
// the elements of y it reads, the combining kernel stores none. Whole
// tensor, per row, and along the first dim (strided chunks).
TEST(CpuSplitReductions, ElementStoresRideInThePartialKernel) {
  const std::vector<std::string> two = {"kiln_k0_partial", "kiln_k0"};
  auto graph = [](const std::vector<int64_t>& sizes, int dim) {
    return OneInputGraph("FLOAT32", sizes, "aten.tanh.default", "",
                         absl::StrCat(R"(, {"op": "aten.mul.Tensor",
                          "args": [{"ref": "y"}, {"ref": "y"}],
                          "outputs": ["z"]},
                         {"op": "aten.sum.dim_IntList",
                          "args": [{"ref": "z"}, {"ints": {"values": [)",
                                      dim, R"(]}}], "outputs": ["s"]})"),
                         R"("y", "s")");
  };
  ExpectSplitMatchesReference(graph({1 << 20}, 0), two, -2, 2);
  ExpectSplitMatchesReference(graph({8, 1 << 17}, 1), two, -2, 2, 1);
  ExpectSplitMatchesReference(graph({1 << 16, 4}, 0), two, -2, 2, 1);
}

// Column reductions (gpu_launch.h, kColumn; a bias gradient's sum over the
// tokens) with few columns are split with the split first and the partials
// stored [S, rows] (ChooseColumnSplits), so both kernels stay column
// kernels: sums in float32 and bfloat16, over two dims, an argmax, and a
// layer norm weight gradient's sum of products with per-row values.
TEST(CpuSplitReductions, FewColumnsAreSplit) {
  const std::vector<std::string> two = {"kiln_k0_partial", "kiln_k0"};
  ExpectSplitMatchesReference(
      OneInputGraph("FLOAT32", {8192, 96}, "aten.sum.dim_IntList",
                    R"(, {"ints": {"values": [0]}})"),
      two, -2, 2, 1);
  ExpectSplitMatchesReference(
      OneInputGraph("BFLOAT16", {4096, 64}, "aten.sum.dim_IntList",
                    R"(, {"ints": {"values": [0]}}, {"b": true})"),
      two, -2, 2);
  ExpectSplitMatchesReference(
      OneInputGraph("FLOAT32", {4, 2048, 48}, "aten.sum.dim_IntList",
                    R"(, {"ints": {"values": [0, 1]}})"),
      two, -2, 2, 1);
  ExpectSplitMatchesReference(
      OneInputGraph("FLOAT32", {8192, 40}, "aten.argmax.default",
                    R"(, {"i": 0})"),
      two, -2, 2, 1);
  // sum over the rows of x * rowsum(x): the row sums first (their own
  // kernel, rows), then the column kernel reads them per row.
  ExpectSplitMatchesReference(
      OneInputGraph("FLOAT32", {4096, 64}, "aten.sum.dim_IntList",
                    R"(, {"ints": {"values": [1]}}, {"b": true})",
                    R"(, {"op": "aten.mul.Tensor",
                          "args": [{"ref": "x"}, {"ref": "y"}],
                          "outputs": ["z"]},
                         {"op": "aten.sum.dim_IntList",
                          "args": [{"ref": "z"}, {"ints": {"values": [0]}}],
                          "outputs": ["s"]})",
                    R"("s")"),
      {"kiln_k0", "kiln_k1_partial", "kiln_k1"}, -2, 2);
}

// var, std and layer norm over few long rows read each row once for their
// statistics: chunk means and second moments merged with Chan et al.'s
// formula. Inputs around 1000 with a spread of about 1 (variance 4/3):
// E[x^2] - E[x]^2 would lose all of it to cancellation in float32 (see
// below), the merge keeps it. Inputs around 0 too, and both with a ramp
// along the row: without it the chunks' means agree to within 1/C of the
// variance, and a merge that dropped C * sum (m_c - mean)^2 would pass.
TEST(CpuSplitReductions, OnePassMomentsMatchReference) {
  const std::vector<std::string> two = {"kiln_k0_partial", "kiln_k0"};
  for (const auto& [mid, ramp] :
       {std::pair{0.0, 0.0}, std::pair{1000.0, 0.0}, std::pair{0.0, 8.0},
        std::pair{1000.0, 8.0}}) {
    SCOPED_TRACE(absl::StrCat("inputs around ", mid, ", ramp ", ramp));
    const double lo = mid - 2, hi = mid + 2;
    // The whole tensor: one row of 2^20, 256 chunks of 4096.
    ExpectSplitMatchesReference(
        OneInputGraph("FLOAT32", {1 << 20}, "aten.var.correction", ""), two, lo,
        hi);
    // Per row, correction 0, keepdim.
    ExpectSplitMatchesReference(
        OneInputGraph("FLOAT32", {8, 1 << 17}, "aten.var.correction",
                      R"(, {"ints": {"values": ["1"]}},
                         {"name": "correction", "i": 0},
                         {"name": "keepdim", "b": true})"),
        two, lo, hi, ramp);
    // A row along the first dim: its chunks are strided.
    ExpectSplitMatchesReference(
        OneInputGraph("FLOAT32", {1 << 16, 4}, "aten.var.correction",
                      R"(, {"ints": {"values": ["0"]}})"),
        two, lo, hi, ramp);
    // std in float16 (float32 accumulators and temps): a row store of the
    // variance's square root.
    ExpectSplitMatchesReference(
        OneInputGraph("FLOAT16", {4, 1 << 16}, "aten.var.correction",
                      R"(, {"ints": {"values": ["1"]}})",
                      R"(, {"op": "aten.sqrt.default", "args": [{"ref": "y"}],
                           "outputs": ["s"]})",
                      R"("s")"),
        two, lo, hi, ramp);
    // The variance and the maximum of the same rows in one kernel: the
    // maximum's partials combine by max, as in a plain split.
    ExpectSplitMatchesReference(
        OneInputGraph("FLOAT32", {2, 1 << 18}, "aten.var.correction",
                      R"(, {"ints": {"values": ["1"]}})", kRowMaxNode,
                      R"("y", "m")"),
        two, lo, hi, ramp);
    // Layer norm: statistics in one read, then a pointwise kernel for the
    // normalised elements; mean and rstd as outputs.
    ExpectSplitMatchesReference(R"({
      "inputs": [
        {"name": "x", "meta": {"dtype": "FLOAT32",
          "sizes": [{"value": "4"}, {"value": "262144"}]}},
        {"name": "weight", "meta": {"dtype": "FLOAT32",
          "sizes": [{"value": "262144"}]}},
        {"name": "bias", "meta": {"dtype": "FLOAT32",
          "sizes": [{"value": "262144"}]}}],
      "nodes": [{"op": "aten.native_layer_norm.default",
        "args": [{"ref": "x"}, {"ints": {"values": ["262144"]}},
                 {"ref": "weight"}, {"ref": "bias"}, {"f": 1e-05}],
        "outputs": ["y", "mean", "rstd"]}],
      "outputs": ["y", "mean", "rstd"]})",
                                {"kiln_k0_partial", "kiln_k0", "kiln_k0_fp"},
                                lo, hi, ramp);
  }
  // A prologue that depends on the position in the row (a ramp from
  // aten.arange, as tests/gpu/cuda_gpu_test.cc's Shifted builds) fuses into
  // the moments and still takes the one-pass split: the chunk's index
  // mapping reaches it.
  ExpectSplitMatchesReference(R"({
    "inputs": [{"name": "x", "meta": {"dtype": "FLOAT16",
      "sizes": [{"value": "4"}, {"value": "1048576"}]}}],
    "nodes": [
      {"op": "aten.arange.default", "args": [{"f": 1048576}],
       "outputs": ["steps"]},
      {"op": "aten.mul.Scalar", "args": [{"ref": "steps"},
       {"f": 7.62939453125e-06}], "outputs": ["ramp"]},
      {"op": "aten.add.Tensor", "args": [{"ref": "x"}, {"ref": "ramp"}],
       "outputs": ["x_ramp"]},
      {"op": "aten.add.Scalar", "args": [{"ref": "x_ramp"}, {"f": 1000}],
       "outputs": ["x_shifted"]},
      {"op": "aten.var.correction", "args": [{"ref": "x_shifted"},
       {"ints": {"values": ["1"]}}], "outputs": ["y"]}],
    "outputs": ["y"]})",
                              two, -2, 2);

  // The same tolerance rejects E[x^2] - E[x]^2 with the two moments exact
  // but rounded to float32, for inputs around 1000: the check above would
  // catch the naive formula.
  std::mt19937_64 rng(3);
  HostTensor x = HostTensor::Empty(DType::kFloat32, {1 << 20});
  FillRandom(x, rng, 998, 1002);
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    sum += x.GetDoubleAt(i);
    sum_sq += x.GetDoubleAt(i) * x.GetDoubleAt(i);
  }
  const double n = static_cast<double>(x.numel());
  const double mean = sum / n;
  const float naive = static_cast<float>(sum_sq / n) -
                      static_cast<float>(mean) * static_cast<float>(mean);
  const double exact = (sum_sq - n * mean * mean) / (n - 1);
  const Tolerance tol = ToleranceFor(DType::kFloat32);
  EXPECT_GT(std::fabs(naive - exact), tol.atol + tol.rtol * exact)
      << naive << " vs " << exact;
}

// Multi-pass rows that are not centered moments (softmax, log-softmax:
// the sum of exp(x - max)), or moments whose rows do not cut into
// persistent chunks, are fissioned: a split kernel per level and a
// pointwise kernel for the element stores.
// argmax/argmin over few long rows: each chunk's extreme and its position,
// then the first chunk holding the row's extreme. The first extreme of the
// row must win: int32 values in [-3, 3] tie in every chunk; a float row
// whose maximum sits in several chunks; NaN (the extreme for both) in a
// later chunk than a larger value, twice in a row.
TEST(CpuSplitReductions, ArgExtremesMatchReference) {
  const std::vector<std::string> two = {"kiln_k0_partial", "kiln_k0"};
  for (const char* op : {"aten.argmax.default", "aten.argmin.default"}) {
    SCOPED_TRACE(op);
    ExpectSplitMatchesReference(OneInputGraph("INT32", {1 << 20}, op, ""), two,
                                -3, 3);
    ExpectSplitMatchesReference(
        OneInputGraph("FLOAT32", {4, 1 << 18}, op, R"(, {"i": 1})"), two, -2, 2,
        0, [](HostTensor& x) {
          // Row 1: its extremes at 5 positions across chunks; row 2: NaN at
          // two positions after a larger value; row 3: a NaN at the end.
          const int64_t row = 1 << 18;
          for (int64_t at : {int64_t{7000}, int64_t{9000}, int64_t{100000},
                             int64_t{200000}, row - 2}) {
            x.SetDoubleAt(row + at, 50);
            x.SetDoubleAt(row + at + 1, -50);
          }
          x.SetDoubleAt(2 * row + 10, 1e30);
          x.SetDoubleAt(2 * row + 150000, std::nan(""));
          x.SetDoubleAt(2 * row + 250000, std::nan(""));
          x.SetDoubleAt(4 * row - 1, std::nan(""));
        });
    // No dim: the position is row-major over both dims of the tensor.
    ExpectSplitMatchesReference(OneInputGraph("FLOAT32", {64, 16384}, op, ""),
                                two, -2, 2);
    // Next to a max of the same rows, each with its own output: fusion
    // interleaves the reductions and their row stores.
    ExpectSplitMatchesReference(
        OneInputGraph("FLOAT32", {2, 1 << 18}, op, R"(, {"i": 1})", kRowMaxNode,
                      R"("y", "m")"),
        two, -2, 2);
    // int64 values.
    ExpectSplitMatchesReference(
        OneInputGraph("INT64", {3, 1 << 16}, op, R"(, {"i": 1})"), two, -5, 5);
    // Keepdim, and a row along the first dim (strided chunks).
    ExpectSplitMatchesReference(OneInputGraph("FLOAT16", {1 << 16, 4}, op,
                                              R"(, {"i": 0}, {"b": true})"),
                                two, -1, 1);
  }
}

// A sum and a max of the same rows, two outputs: one split, both combined.
TEST(CpuSplitReductions, TwoReductionsOfTheSameRowsMatchReference) {
  ExpectSplitMatchesReference(
      OneInputGraph("FLOAT32", {2, 1 << 18}, "aten.sum.dim_IntList",
                    R"(, {"ints": {"values": ["1"]}})", kRowMaxNode,
                    R"("y", "m")"),
      {"kiln_k0_partial", "kiln_k0"}, -2, 2);
}

TEST(CpuSplitReductions, FissionedRowsMatchReference) {
  // A variance whose rows cut only into chunks over kMaxPersistentRow
  // (2 x 40009, a prime) keeps the two-pass fission.
  ExpectSplitMatchesReference(
      OneInputGraph("FLOAT32", {2 * 40009}, "aten.var.correction", ""),
      {"kiln_k0_f0_partial", "kiln_k0_f0", "kiln_k0_f1_partial", "kiln_k0_f1"},
      998, 1002, 8);
  for (const char* op :
       {"aten._softmax.default", "aten._log_softmax.default"}) {
    ExpectSplitMatchesReference(
        OneInputGraph("FLOAT32", {4, 1 << 16}, op,
                      R"(, {"i": 1}, {"b": false})"),
        {"kiln_k0_f0_partial", "kiln_k0_f0", "kiln_k0_f1_partial", "kiln_k0_f1",
         "kiln_k0_fp"},
        -8, 8);
  }
}

// Issue 17: a Python number as self of a Tensor overload (1 - x, 2 / x,
// 3 < x) and the views, copies and factories AOTAutograd emits, compiled
// and fused with their neighbours, against the reference and by hand.
TEST(CpuIssue17, NumberSelfViewsAndFactoriesMatchReference) {
  absl::StatusOr<v1::CompileRequest> parsed = HostRequest(R"({
    "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32",
                "sizes": [{"value": 2}, {"value": 3}]}},
               {"name": "b", "meta": {"dtype": "INT32",
                "sizes": [{"value": 3}]}}],
    "nodes": [{"op": "aten.sub.Tensor", "args": [{"i": 1}, {"ref": "x"}],
               "outputs": ["s"]},
              {"op": "aten.alias.default", "args": [{"ref": "s"}],
               "outputs": ["a"]},
              {"op": "aten.div.Tensor", "args": [{"f": 2.0}, {"ref": "b"}],
               "outputs": ["d"]},
              {"op": "aten.lt.Tensor", "args": [{"i": 3}, {"ref": "a"}],
               "outputs": ["c"]},
              {"op": "aten.copy.default", "args": [{"ref": "x"}, {"ref": "b"}],
               "outputs": ["k"]},
              {"op": "aten.full_like.default",
               "args": [{"ref": "x"}, {"f": 2.5},
                        {"name": "dtype", "dtype": "INT64"}],
               "outputs": ["f"]},
              {"op": "aten.ones_like.default", "args": [{"ref": "b"}],
               "outputs": ["o"]},
              {"op": "aten.add.Tensor", "args": [{"ref": "k"}, {"ref": "o"}],
               "outputs": ["ko"]},
              {"op": "aten.empty.memory_format", "args": [{"ints": {"values": [2, 3]}}],
               "outputs": ["e"]},
              {"op": "aten.empty_strided.default",
               "args": [{"ints": {"values": [3]}}, {"ints": {"values": [1]}},
                        {"name": "dtype", "dtype": "BFLOAT16"}],
               "outputs": ["es"]},
              {"op": "aten.zeros_like.default", "args": [{"ref": "x"}],
               "outputs": ["z"]},
              {"op": "aten.empty_like.default", "args": [{"ref": "b"}],
               "outputs": ["el"]},
              {"op": "aten.add.Tensor", "args": [{"ref": "e"}, {"ref": "z"}],
               "outputs": ["ez"]}],
    "outputs": ["a", "d", "c", "ko", "f", "es", "el", "ez"]})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::CompileRequest& req = *parsed;
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  HostTensor x = HostTensor::Empty(DType::kFloat32, {2, 3});
  for (int i = 0; i < 6; ++i) x.SetDoubleAt(i, i - 4.5);  // -4.5 .. 0.5
  HostTensor b = HostTensor::Empty(DType::kInt32, {3});
  for (int i = 0; i < 3; ++i) b.SetIntAt(i, i + 1);  // 1, 2, 3
  ThreadPool pool(2);
  ExpectOutputsMatchReference(**exe, *graph, {x, b}, pool);
  auto got = (*exe)->Run({x, b}, &pool);
  ASSERT_TRUE(got.ok()) << got.status();
  const std::vector<HostTensor>& out = *got;
  for (int i = 0; i < 6; ++i) {
    const double s = 1 - (i - 4.5);
    EXPECT_EQ(out[0].GetDoubleAt(i), s) << i;           // a = 1 - x
    EXPECT_EQ(out[2].GetIntAt(i), 3 < s ? 1 : 0) << i;  // 3 < a
    EXPECT_EQ(out[3].GetDoubleAt(i), i % 3 + 2) << i;   // b + 1
    EXPECT_EQ(out[4].GetIntAt(i), 2) << i;              // int64 2.5
    EXPECT_EQ(out[7].GetDoubleAt(i), 0) << i;           // zeros
  }
  EXPECT_EQ(DTypeName(out[1].dtype()), DTypeName(DType::kFloat32));
  EXPECT_EQ(out[1].GetDoubleAt(1), 1.0);  // 2 / 2
  EXPECT_EQ(DTypeName(out[5].dtype()), DTypeName(DType::kBFloat16));
  EXPECT_EQ(DTypeName(out[6].dtype()), DTypeName(DType::kInt32));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out[5].GetDoubleAt(i), 0) << i;
    EXPECT_EQ(out[6].GetIntAt(i), 0) << i;
  }
}

// A CPU code generation option (CpuCodegenOptions) on and off: `json` is
// compiled both ways (`set(env, on)`), its unoptimised IR passed to
// `check_ir(ir, on)`, and both programs must match the reference on random
// inputs for each of `bindings`, input 0 changed by `edit` where given.
void ExpectCodegenVariantsMatchReference(
    const std::string& json, const std::function<void(CompileEnv&, bool)>& set,
    const std::function<void(const std::string&, bool)>& check_ir,
    std::vector<std::vector<int64_t>> bindings = {{}},
    const std::function<void(HostTensor&)>& edit = nullptr) {
  absl::StatusOr<v1::CompileRequest> parsed = HostRequest(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::CompileRequest& req = *parsed;
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "option on" : "option off");
    CompileEnv env;
    set(env, on);
    auto compiled = CompileWithIr(req, env);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    ASSERT_FALSE(compiled->ir.empty()) << "no 04-llvm.ll dumped";
    check_ir(compiled->ir, on);
    auto exe = CpuExecutable::Load(compiled->artifact);
    ASSERT_TRUE(exe.ok()) << exe.status();
    std::mt19937_64 rng(11);
    ThreadPool pool(2);
    for (const std::vector<int64_t>& symbols : bindings) {
      std::vector<HostTensor> inputs = RandomInputs(*graph, symbols, rng);
      if (edit) edit(inputs[0]);
      ExpectOutputsMatchReference(**exe, *graph, inputs, pool);
    }
  }
}

// Column reductions (a bias gradient: each column of a [rows, columns]
// tensor summed over the rows) walk their rows in blocks along the last
// outer dim, the block innermost (CpuCodegenOptions::row_blocks): with the
// option the IR must have blocks (blk.body) exactly when `blocked`.
void ExpectRowBlocksMatchReference(
    const std::string& json, bool blocked,
    std::vector<std::vector<int64_t>> bindings = {{}},
    const std::function<void(HostTensor&)>& edit = nullptr) {
  ExpectCodegenVariantsMatchReference(
      json, [](CompileEnv& env, bool on) { env.cpu_row_blocks = on; },
      [&](const std::string& ir, bool on) {
        EXPECT_EQ(absl::StrContains(ir, "blk.body"), on && blocked);
      },
      std::move(bindings), edit);
}

// Every 7th element NaN.
void SomeNans(HostTensor& x) {
  for (int64_t i = 3; i < x.numel(); i += 7) x.SetDoubleAt(i, std::nan(""));
}

// A graph of input x (`dtype`, `sizes`: numbers or symbol names) and
// `nodes` (JSON, comma-separated) computing `outputs`.
std::string GraphOfX(const std::string& dtype,
                     const std::vector<std::string>& sizes,
                     const std::string& nodes, const std::string& outputs) {
  std::vector<std::string> dims, symbols;
  for (const std::string& s : sizes) {
    if (absl::ascii_isdigit(s[0])) {
      dims.push_back(absl::StrCat(R"({"value": )", s, "}"));
    } else {
      dims.push_back(absl::StrCat(R"({"symbol": ")", s, R"("})"));
      symbols.push_back(absl::StrCat(R"({"name": ")", s, R"("})"));
    }
  }
  return absl::StrCat(R"({"inputs": [{"name": "x", "meta": {"dtype": ")", dtype,
                      R"(", "sizes": [)", absl::StrJoin(dims, ", "),
                      R"(]}}], "symbols": [)", absl::StrJoin(symbols, ", "),
                      R"(], "nodes": [)", nodes, R"(], "outputs": [)", outputs,
                      "]}");
}

// op(x, dims) -> y.
std::string ReduceNode(const std::string& op, const std::string& dims,
                       const std::string& more_args = "") {
  return absl::StrCat(R"({"op": ")", op,
                      R"(", "args": [{"ref": "x"}, {"ints": {"values": [)",
                      dims, "]}}", more_args, R"(], "outputs": ["y"]})");
}

TEST(CpuRowBlocks, ColumnReductionsMatchReference) {
  // Sums over the rows: blocks shorter than, as long as and longer than a
  // block (64), chunks of two threads that split a block, one row.
  for (const auto& [rows, cols] : std::vector<std::pair<int, int>>{
           {33, 64}, {5, 130}, {1, 65}, {40, 9}, {300, 200}}) {
    SCOPED_TRACE(absl::StrCat(rows, "x", cols));
    ExpectRowBlocksMatchReference(
        GraphOfX("FLOAT32", {absl::StrCat(rows), absl::StrCat(cols)},
                 ReduceNode("aten.sum.dim_IntList", "0"), R"("y")"),
        true);
  }
  // Columns too few for a block stay one row at a time.
  ExpectRowBlocksMatchReference(
      GraphOfX("FLOAT32", {"17", "3"}, ReduceNode("aten.sum.dim_IntList", "0"),
               R"("y")"),
      false);
  // A row reduction (contiguous rows) stays one row at a time.
  ExpectRowBlocksMatchReference(
      GraphOfX("FLOAT32", {"40", "70"}, ReduceNode("aten.sum.dim_IntList", "1"),
               R"("y")"),
      false);
  // Max, min and product, NaNs propagating through the blocks.
  ExpectRowBlocksMatchReference(
      GraphOfX("FLOAT32", {"29", "70"},
               absl::StrCat(ReduceNode("aten.amax.default", "0"), R"(,
                 {"op": "aten.amin.default", "args": [{"ref": "x"},
                  {"ints": {"values": [0]}}], "outputs": ["m"]})"),
               R"("y", "m")"),
      true, {{}}, SomeNans);
  ExpectRowBlocksMatchReference(
      GraphOfX("FLOAT32", {"6", "40"}, R"({"op": "aten.prod.dim_int",
                 "args": [{"ref": "x"}, {"i": 0}], "outputs": ["y"]})",
               R"("y")"),
      true);
  // Over two inner dims (a layer norm's bias gradient over batch and
  // sequence), keepdim.
  ExpectRowBlocksMatchReference(
      GraphOfX("FLOAT32", {"4", "9", "72"},
               ReduceNode("aten.sum.dim_IntList", "0, 1", R"(, {"b": true})"),
               R"("y")"),
      true);
  // Integers accumulate in int64; bfloat16 in float32, rounded once.
  ExpectRowBlocksMatchReference(
      GraphOfX("INT32", {"21", "48"}, ReduceNode("aten.sum.dim_IntList", "0"),
               R"("y")"),
      true);
  ExpectRowBlocksMatchReference(
      GraphOfX("BFLOAT16", {"21", "48"},
               ReduceNode("aten.sum.dim_IntList", "0"), R"("y")"),
      true);
}

// Stages that read earlier reductions of the same rows: softmax over the
// columns (max, then a sum of exps after it, then every element stored
// from both) and the variance (a finalized mean read by the second pass).
TEST(CpuRowBlocks, LaterStagesReadTheBlocksAccumulators) {
  ExpectRowBlocksMatchReference(
      GraphOfX("FLOAT32", {"37", "80"}, R"({"op": "aten._softmax.default",
                 "args": [{"ref": "x"}, {"i": 0}, {"b": false}],
                 "outputs": ["y"]})",
               R"("y")"),
      true);
  ExpectRowBlocksMatchReference(
      GraphOfX("FLOAT32", {"50", "66"}, ReduceNode("aten.var.correction", "0"),
               R"("y")"),
      true);
  ExpectRowBlocksMatchReference(GraphOfX("FLOAT32", {"3", "11", "70"},
                                         R"({"op": "aten._log_softmax.default",
                 "args": [{"ref": "x"}, {"i": 1}, {"b": false}],
                 "outputs": ["y"]})",
                                         R"("y")"),
                                true, {{}}, SomeNans);
}

// A float max or min along contiguous rows reduces ordered integer keys
// (codegen_cpu.cc, EmitKeyedReduce): NaN wins wherever it is in the row,
// infinities and signed zeros order as values, an all -inf row is -inf.
TEST(CpuRowKeys, MaxAndMinOverRows) {
  const std::string graph =
      GraphOfX("FLOAT32", {"9", "67"},
               absl::StrCat(ReduceNode("aten.amax.default", "1"), R"(,
        {"op": "aten.amin.default", "args": [{"ref": "x"},
         {"ints": {"values": [1]}}], "outputs": ["m"]})"),
               R"("y", "m")");
  ExpectRowBlocksMatchReference(graph, false, {{}}, SomeNans);
  ExpectRowBlocksMatchReference(graph, false, {{}}, [](HostTensor& x) {
    const double inf = std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < 67; ++c) {
      x.SetDoubleAt(0 * 67 + c, -inf);                          // all -inf
      x.SetDoubleAt(1 * 67 + c, c % 2 ? 0.0 : -0.0);            // signed zeros
      x.SetDoubleAt(2 * 67 + c, c == 66 ? inf : -1.0);          // +inf last
      x.SetDoubleAt(3 * 67 + c, c == 0 ? std::nan("") : 1e30);  // NaN first
      x.SetDoubleAt(4 * 67 + c, c == 66 ? std::nan("") : -1e30);  // last
      x.SetDoubleAt(5 * 67 + c, c == 5 ? -inf : 3.0);             // -inf inside
    }
  });
}

// q, k and v gradients of [batch, heads, tokens, 64] (batch a symbol where
// `dynamic`) into one [batch * tokens, 3 * heads * 64] buffer, as the
// backward of timm's attention (qkv.reshape(B, N, 3, H, D).permute(2, 0,
// 3, 1, 4).unbind(0)) writes them: a pointwise kernel whose innermost var
// is read through floordiv and remainder by 64 and heads * 64.
// Operands of matrix products that the graph also returns, as AOTAutograd
// saves a projection's input for its weight gradient: `v`, the product's
// operand laid out for it (a transposed copy of x * x), returned as
// [24, 8], and `z`, x * x + 1 read by the second product in place and
// returned reshaped. Each is stored once, into its output buffer, which
// the product reads (compiler/lower.cc SameReadNode, compiler/fuse.cc
// FindOutputsWrittenByTheirSource): no temp and no copy kernel. So is `h`,
// a pointwise node of the product's result that relu reads and the graph
// returns reshaped (a pre-activation saved for the backward).
TEST(CpuOutputs, ExternOperandsReturnedAsViewsAreStoredOnce) {
  const std::string json = R"({"inputs": [
      {"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"value": 4},
       {"value": 6}, {"value": 8}]}},
      {"name": "w", "meta": {"dtype": "FLOAT32", "sizes": [{"value": 8},
       {"value": 5}]}}],
    "nodes": [
      {"op": "aten.mul.Tensor", "args": [{"ref": "x"}, {"ref": "x"}],
       "outputs": ["y"]},
      {"op": "aten.transpose.int", "args": [{"ref": "y"}, {"i": 0}, {"i": 1}],
       "outputs": ["t"]},
      {"op": "aten.clone.default", "args": [{"ref": "t"}], "outputs": ["c"]},
      {"op": "aten.view.default", "args": [{"ref": "c"},
       {"ints": {"values": [24, 8]}}], "outputs": ["v"]},
      {"op": "aten.mm.default", "args": [{"ref": "v"}, {"ref": "w"}],
       "outputs": ["m"]},
      {"op": "aten.add.Tensor", "args": [{"ref": "y"}, {"f": 1.0}],
       "outputs": ["z"]},
      {"op": "aten.view.default", "args": [{"ref": "z"},
       {"ints": {"values": [24, 8]}}], "outputs": ["zv"]},
      {"op": "aten.mm.default", "args": [{"ref": "zv"}, {"ref": "w"}],
       "outputs": ["m2"]},
      {"op": "aten.mul.Tensor", "args": [{"ref": "m2"}, {"f": 2.0}],
       "outputs": ["h"]},
      {"op": "aten.relu.default", "args": [{"ref": "h"}], "outputs": ["g"]},
      {"op": "aten.view.default", "args": [{"ref": "h"},
       {"ints": {"values": [4, 6, 5]}}], "outputs": ["hv"]}],
    "outputs": ["m", "v", "m2", "zv", "g", "hv"]})";
  absl::StatusOr<v1::CompileRequest> req = HostRequest(json);
  ASSERT_TRUE(req.ok()) << req.status();
  auto artifact = Compile(*req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  int temps = 0, launches = 0;
  for (const v1::BufferSpec& b : artifact->program().buffers())
    temps += b.kind() == v1::BufferSpec::TEMP;
  for (const v1::Step& step : artifact->program().steps())
    launches += step.has_launch();
  EXPECT_EQ(temps, 0);
  // v's and z's stores, then h's and g's (h is stored once, into hv, and
  // g reads it): no copies into outputs.
  EXPECT_LE(launches, 3);
  ExpectArtifactMatchesReference(*req, *artifact, 5);
}

// A chain of reused pointwise values, as the residual stream's gradient
// through layer-scaled blocks (BEiT, CaiT, ConvNeXt): g_i = g_{i-1} +
// a_i * b_i, each link read by the next, by a column sum (the norm's
// weight gradient) and, times 2 (the layer scale), by a product (the
// projection's weight gradient), which puts the links in kernels of their
// own. Every other g_i is stored once (its inlined form reads more than 4
// buffers and it has more than one reader: compiler/fuse.h), so no kernel
// reads more buffers at 16 links than at 8, and the values match the
// reference. Inlined, link i was summed again from every earlier link, in
// a kernel that read all of them.
std::string ReusedChainGraph(int links) {
  std::string inputs = R"({"name": "g0", "meta": {"dtype": "FLOAT32",
      "sizes": [{"value": 6}, {"value": 40}]}},
      {"name": "w", "meta": {"dtype": "FLOAT32",
      "sizes": [{"value": 40}, {"value": 8}]}})";
  std::string nodes, outputs;
  for (int i = 1; i <= links; ++i) {
    for (const char* x : {"a", "b"}) {
      absl::StrAppend(&inputs, R"(, {"name": ")", x, i,
                      R"(", "meta": {"dtype": "FLOAT32",
          "sizes": [{"value": 6}, {"value": 40}]}})");
    }
    absl::StrAppend(&nodes, i > 1 ? ", " : "",
                    absl::Substitute(
                        R"({"op": "aten.mul.Tensor", "args": [{"ref": "a$0"},
             {"ref": "b$0"}], "outputs": ["ab$0"]},
            {"op": "aten.add.Tensor", "args": [{"ref": "g$1"},
             {"ref": "ab$0"}], "outputs": ["g$0"]},
            {"op": "aten.sum.dim_IntList", "args": [{"ref": "g$0"},
             {"ints": {"values": [0]}}], "outputs": ["s$0"]},
            {"op": "aten.mul.Tensor", "args": [{"ref": "g$0"}, {"f": 2.0}],
             "outputs": ["h$0"]},
            {"op": "aten.mm.default", "args": [{"ref": "h$0"}, {"ref": "w"}],
             "outputs": ["p$0"]})",
                        i, i - 1));
    absl::StrAppend(&outputs, i > 1 ? ", " : "", "\"s", i, "\", \"p", i, "\"");
  }
  return absl::StrCat(R"({"inputs": [)", inputs, R"(], "nodes": [)", nodes,
                      R"(], "outputs": [)", outputs, ", \"g", links, "\"]}");
}

TEST(CpuFusion, ReusedChainsAreStoredOnce) {
  size_t widest[2] = {0, 0};
  for (int links : {8, 16}) {
    SCOPED_TRACE(links);
    absl::StatusOr<v1::CompileRequest> req =
        HostRequest(ReusedChainGraph(links));
    ASSERT_TRUE(req.ok()) << req.status();
    auto graph = ImportGraph(req->graph());
    ASSERT_TRUE(graph.ok()) << graph.status();
    auto loops = Lower(*graph);
    ASSERT_TRUE(loops.ok()) << loops.status();
    auto fused = Fuse(*loops);
    ASSERT_TRUE(fused.ok()) << fused.status();
    for (const Kernel& k : fused->kernels)
      widest[links == 16] = std::max(widest[links == 16], k.buffers.size());
    EXPECT_LE(widest[links == 16], 12u) << fused->ToString();
    auto artifact = Compile(*req);
    ASSERT_TRUE(artifact.ok()) << artifact.status();
    ExpectArtifactMatchesReference(*req, *artifact, 7);
  }
  EXPECT_EQ(widest[0], widest[1]);
}

std::string QkvConcatGraph(int heads, bool dynamic) {
  const std::string batch = dynamic ? R"({"symbol": "b"})" : R"({"value": 8})";
  const std::string b = dynamic ? R"({"symbol": "b"})" : "8";
  std::string inputs;
  for (const char* name : {"q", "k", "v"}) {
    absl::StrAppend(&inputs, inputs.empty() ? "" : ", ", R"({"name": ")", name,
                    R"(", "meta": {"dtype": "FLOAT32", "sizes": [)", batch,
                    ", ", R"({"value": )", heads,
                    R"(}, {"value": 17}, {"value": 64}]}})");
  }
  const std::string dims5 =
      dynamic ? absl::StrCat(R"({"dims": {"values": [{"value": 3}, )", batch,
                             R"(, {"value": )", heads,
                             R"(}, {"value": 17}, {"value": 64}]}})")
              : absl::StrCat(R"({"ints": {"values": [3, 8, )", heads,
                             R"(, 17, 64]}})");
  (void)b;
  return absl::StrCat(R"({"inputs": [)", inputs, R"(], "symbols": [)",
                      dynamic ? R"({"name": "b"})" : "", R"(], "nodes": [
      {"op": "aten.cat.default", "args": [{"refs": {"values": ["q", "k",
       "v"]}}, {"i": 0}], "outputs": ["c"]},
      {"op": "aten.view.default", "args": [{"ref": "c"}, )",
                      dims5,
                      R"(], "outputs": ["c5"]},
      {"op": "aten.permute.default", "args": [{"ref": "c5"},
       {"ints": {"values": [1, 3, 0, 2, 4]}}], "outputs": ["p"]},
      {"op": "aten.clone.default", "args": [{"ref": "p"}], "outputs": ["pc"]},
      {"op": "aten.view.default", "args": [{"ref": "pc"},
       {"ints": {"values": [-1, )",
                      3 * heads * 64,
                      R"(]}}], "outputs": ["y"]}], "outputs": ["y"]})");
}

// Pointwise kernels whose innermost var is read through floordiv and
// remainder by constants run it in segments (CpuCodegenOptions::
// split_innermost_dim, codegen_cpu.cc SplitInnermostDim): the IR differs
// from the unsplit kernel's, and both match the reference, static and
// with a dynamic batch.
TEST(CpuSplitInnermostDim, ConcatenatedHeadsMatchReference) {
  for (const auto& [heads, dynamic] :
       {std::pair{3, false}, std::pair{2, true}, std::pair{1, false}}) {
    SCOPED_TRACE(absl::StrCat(heads, " heads", dynamic ? ", dynamic" : ""));
    std::string split_ir;
    ExpectCodegenVariantsMatchReference(
        QkvConcatGraph(heads, dynamic),
        [](CompileEnv& env, bool on) { env.cpu_split_innermost_dim = on; },
        [&](const std::string& ir, bool on) {
          if (on) {
            split_ir = ir;
          } else {
            EXPECT_NE(ir, split_ir) << "the kernel was not split";
          }
        },
        dynamic ? std::vector<std::vector<int64_t>>{{2}, {5}}
                : std::vector<std::vector<int64_t>>{{}});
  }
}

// nn.MultiheadAttention's packed in-projection gradient: the heads' [N, H,
// L, 64] gradients of q, k and v as [L, N, 3 * 192], a cat of three [L, N,
// 192] views, read through remainder(remainder(l, 192), 64), which the
// index simplifier turns into remainder(l, 64) so that the kernel splits
// into runs of 64 (compiler/loop_ir.cc, Divide). Split and unsplit match
// the reference.
TEST(CpuSplitInnermostDim, PackedProjectionGradientMatchesReference) {
  // AOTAutograd's backward of F._in_projection_packed's chunk: each grad
  // [L, N, E] (from [N, H, L, 64]) select_scatter'ed into zeros [3, L, N,
  // E], summed, then laid out [L, N, 3, E] and flattened.
  std::string inputs, nodes = R"(
      {"op": "aten.full.default", "args": [{"ints": {"values": [3, 7, 4,
       192]}}, {"f": 0}], "outputs": ["z"]},)";
  for (const char* name : {"q", "k", "v"}) {
    absl::StrAppend(&inputs, inputs.empty() ? "" : ", ", R"({"name": ")", name,
                    R"(", "meta": {"dtype": "FLOAT32", "sizes": [
        {"value": 4}, {"value": 3}, {"value": 7}, {"value": 64}]}})");
    const int i = std::string("qkv").find(name[0]);
    absl::StrAppend(&nodes, R"(
      {"op": "aten.permute.default", "args": [{"ref": ")",
                    name,
                    R"("}, {"ints": {"values": [2, 0, 1, 3]}}],
       "outputs": [")",
                    name, R"(p"]},
      {"op": "aten.clone.default", "args": [{"ref": ")",
                    name, R"(p"}], "outputs": [")", name, R"(c"]},
      {"op": "aten.view.default", "args": [{"ref": ")",
                    name,
                    R"(c"}, {"ints": {"values": [7, 4, 192]}}],
       "outputs": [")",
                    name, R"(v"]},
      {"op": "aten.select_scatter.default", "args": [{"ref": "z"},
       {"ref": ")",
                    name, R"(v"}, {"i": 0}, {"i": )", i, R"(}],
       "outputs": [")",
                    name, R"(s"]},)");
  }
  const std::string json =
      absl::StrCat(R"({"inputs": [)", inputs, R"(], "nodes": [)", nodes, R"(
      {"op": "aten.add.Tensor", "args": [{"ref": "qs"}, {"ref": "ks"}],
       "outputs": ["a"]},
      {"op": "aten.add.Tensor", "args": [{"ref": "a"}, {"ref": "vs"}],
       "outputs": ["b"]},
      {"op": "aten.permute.default", "args": [{"ref": "b"},
       {"ints": {"values": [1, 2, 0, 3]}}], "outputs": ["p"]},
      {"op": "aten.clone.default", "args": [{"ref": "p"}], "outputs": ["c"]},
      {"op": "aten.view.default", "args": [{"ref": "c"},
       {"ints": {"values": [28, 576]}}], "outputs": ["y"]}],
    "outputs": ["y"]})");
  std::string split_ir;
  ExpectCodegenVariantsMatchReference(
      json, [](CompileEnv& env, bool on) { env.cpu_split_innermost_dim = on; },
      [&](const std::string& ir, bool on) {
        if (on) {
          split_ir = ir;
        } else {
          EXPECT_NE(ir, split_ir) << "the kernel was not split";
        }
      });
}

// Two 16-bit softmaxes over the same rows, fused in one kernel: each keeps
// its summands in a scratch row of its own (two allocas, two inline exps),
// and both match the reference.
TEST(CpuRegression, TwoHalfSoftmaxesKeepTheirOwnSummands) {
  for (const char* dtype : {"BFLOAT16", "FLOAT16"}) {
    SCOPED_TRACE(dtype);
    auto parsed = HostRequest(GraphOfX(dtype, {"5", "130"}, R"(
      {"op": "aten.mul.Tensor", "args": [{"ref": "x"}, {"f": -3}],
       "outputs": ["y"]},
      {"op": "aten._softmax.default",
       "args": [{"ref": "x"}, {"i": -1}, {"b": false}], "outputs": ["s"]},
      {"op": "aten._softmax.default",
       "args": [{"ref": "y"}, {"i": -1}, {"b": false}], "outputs": ["t"]})",
                                       R"("s", "t")"));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto compiled = CompileWithIr(*parsed, CompileEnv());
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    const std::string& ir = compiled->ir;
    EXPECT_EQ(Occurrences(ir, " = alloca float, i64 130, align 64"), 2) << ir;
    EXPECT_EQ(Occurrences(ir, "call float @llvm.roundeven.f32("), 2) << ir;
    ExpectArtifactMatchesReference(*parsed, compiled->artifact, 37);
  }
}

// bfloat16 values stored as they are (codegen_cpu.cc, IsBfloat16Exact): a
// relu, -|x|, a transposed copy and a clamp to bfloat16 bounds store the
// high half of their float32 values; x * 3 rounds. One rounding (its
// 0x7fff addend) in the IR, and every output matches the reference, with
// NaN, infinities and -0 among the inputs. (A bfloat16 intermediate inside
// an expression still rounds: -|x| is neg of abs rounded.)
TEST(CpuRegression, Bfloat16ValuesStoreWithoutRounding) {
  auto parsed = HostRequest(GraphOfX("BFLOAT16", {"7", "300"}, R"(
      {"op": "aten.relu.default", "args": [{"ref": "x"}], "outputs": ["r"]},
      {"op": "aten.abs.default", "args": [{"ref": "x"}], "outputs": ["a"]},
      {"op": "aten.neg.default", "args": [{"ref": "a"}], "outputs": ["w"]},
      {"op": "aten.transpose.int", "args": [{"ref": "x"}, {"i": 0}, {"i": 1}],
       "outputs": ["t"]},
      {"op": "aten.clone.default", "args": [{"ref": "t"}], "outputs": ["tc"]},
      {"op": "aten.clamp.default", "args": [{"ref": "x"}, {"f": -0.5},
       {"f": 0.75}], "outputs": ["c"]},
      {"op": "aten.mul.Tensor", "args": [{"ref": "x"}, {"f": 3}],
       "outputs": ["y"]})",
                                     R"("r", "w", "tc", "c", "y")"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto compiled = CompileWithIr(*parsed, CompileEnv());
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const std::string& ir = compiled->ir;
  EXPECT_EQ(Occurrences(ir, ", 32767"), 1) << ir;
  ExpectArtifactMatchesReference(
      *parsed, compiled->artifact, 37, [](std::vector<HostTensor>& inputs) {
        const double specials[] = {NAN, INFINITY, -INFINITY, -0.0, 0.25, -0.5};
        for (int i = 0; i < 6; ++i) inputs[0].SetDoubleAt(i * 37, specials[i]);
      });
}

// A feature map's spatial dims (and a pointwise kernel's batch and
// channels) that every access reads as one run as one dim
// (CpuCodegenOptions::coalesce_dims, codegen_cpu.cc CoalesceDims): a
// mean over H and W kept for a broadcast subtraction, a ReLU, and a
// transposed copy whose dims must stay apart. The IR differs from the
// uncoalesced kernels', and both match the reference, static (28 x 28,
// too short a run to vectorise uncoalesced) and with symbolic H and W.
TEST(CpuCoalesceDims, FeatureMapsMatchReference) {
  const std::string nodes = R"(
      {"op": "aten.mean.dim", "args": [{"ref": "x"},
       {"ints": {"values": [2, 3]}}, {"b": true}], "outputs": ["m"]},
      {"op": "aten.sub.Tensor", "args": [{"ref": "x"}, {"ref": "m"}],
       "outputs": ["d"]},
      {"op": "aten.relu.default", "args": [{"ref": "d"}], "outputs": ["r"]},
      {"op": "aten.mul.Tensor", "args": [{"ref": "r"}, {"f": 3}],
       "outputs": ["y"]},
      {"op": "aten.transpose.int", "args": [{"ref": "x"}, {"i": 2}, {"i": 3}],
       "outputs": ["t"]},
      {"op": "aten.clone.default", "args": [{"ref": "t"}],
       "outputs": ["tc"]})";
  for (bool dynamic : {false, true}) {
    SCOPED_TRACE(dynamic ? "symbolic H, W" : "28 x 28");
    std::string coalesced_ir;
    ExpectCodegenVariantsMatchReference(
        GraphOfX("FLOAT32",
                 dynamic ? std::vector<std::string>{"2", "3", "h", "w"}
                         : std::vector<std::string>{"2", "3", "28", "28"},
                 nodes, R"("y", "m", "tc")"),
        [](CompileEnv& env, bool on) { env.cpu_coalesce_dims = on; },
        [&](const std::string& ir, bool on) {
          if (on) {
            coalesced_ir = ir;
          } else {
            EXPECT_NE(ir, coalesced_ir) << "no dims were coalesced";
          }
        },
        dynamic ? std::vector<std::vector<int64_t>>{{5, 7}, {28, 28}, {2, 33}}
                : std::vector<std::vector<int64_t>>{{}});
  }
}

// Dynamic sizes (at least 2, as every symbol): blocks end where the
// columns do, whatever they are.
TEST(CpuRowBlocks, DynamicSizes) {
  ExpectRowBlocksMatchReference(
      GraphOfX("FLOAT32", {"r", "c"}, ReduceNode("aten.sum.dim_IntList", "0"),
               R"("y")"),
      true, {{3, 100}, {64, 17}, {2, 2}, {2, 65}, {130, 129}});
}

}  // namespace
}  // namespace kiln::testing
