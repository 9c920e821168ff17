// The example graphs compiled for this machine, loaded from memory and run,
// against the reference evaluator.
#include <cmath>
#include <fstream>
#include <sstream>

#include "client/cpu_executable.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "compiler/import.h"
#include "compiler/reference.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/unit/example_graphs.h"
#include "tests/unit/numerics.h"

namespace kiln::testing {
namespace {

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
    auto inputs = RandomInputs(*graph, symbols, rng);
    auto want = EvaluateReference(*graph, inputs);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*exe)->Run(inputs, &pool);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want->size());
    for (size_t o = 0; o < want->size(); ++o) {
      EXPECT_EQ(Compare((*got)[o], (*want)[o]), "")
          << GetParam() << " output " << o << " batch " << batch;
    }
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

// Regressions found by tests/unit/random_graph_test.cc: a graph in JSON,
// compiled for this machine and run against the reference evaluator with
// symbols bound to each of `bindings` (one binding for a static graph).
void ExpectMatchesReference(const std::string& json,
                            std::vector<std::vector<int64_t>> bindings = {{}}) {
  v1::CompileRequest req;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(json, req.mutable_graph())
          .ok())
      << json;
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::mt19937_64 rng(7);
  ThreadPool pool(2);
  for (const std::vector<int64_t>& symbols : bindings) {
    auto inputs = RandomInputs(*graph, symbols, rng);
    auto want = EvaluateReference(*graph, inputs);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*exe)->Run(inputs, &pool);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want->size());
    for (size_t o = 0; o < want->size(); ++o) {
      EXPECT_EQ(Compare((*got)[o], (*want)[o]), "") << "output " << o;
    }
  }
}

// fast_math allows reassociation and approximate functions but keeps NaN
// semantics: isnan and NaN-propagating maximum still see NaNs (they were
// folded away when fast_math set LLVM's nnan flag).
TEST(CpuRegression, FastMathKeepsNaNs) {
  v1::CompileRequest req;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(R"({
    "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32",
                "sizes": [{"value": 8}]}}],
    "nodes": [{"op": "aten.isnan.default", "args": [{"ref": "x"}],
               "outputs": ["n"]},
              {"op": "aten.maximum.default", "args": [{"ref": "x"}, {"ref": "x"}],
               "outputs": ["m"]}],
    "outputs": ["n", "m"]})",
                                                          req.mutable_graph())
                  .ok());
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  req.mutable_options()->set_fast_math(true);
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
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

// Random graph seed 8637: a bool add converts alpha to bool first
// (PyTorch's alpha_scalar.to<bool>()): x + x * -1 is x, not x - x. The
// reference computed in int64 with alpha -1; the compiled code truncated
// alpha 2 to an i1 0.
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

}  // namespace
}  // namespace kiln::testing
