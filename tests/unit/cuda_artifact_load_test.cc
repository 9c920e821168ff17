// The compiler's CUDA artifacts meet the runtime's expectations: every
// example graph and a few hundred random graphs over op set v1, compiled
// for sm_90, pass CudaExecutable::Load's hash, target and program checks.
// Without a driver Load then stops with the driver's own status; on an
// sm_90 GPU it loads; on another GPU it refuses the arch.
//
// Environment: KILN_CUDA_LOAD_RANDOM_GRAPHS=<count> (default 200).
#include <string>

#include "absl/strings/match.h"
#include "runtime/cuda_executable.h"
#include "compiler/compile.h"
#include "gtest/gtest.h"
#include "tests/unit/example_graphs.h"
#include "tests/unit/graph_gen.h"
#include "tests/unit/random_graphs.h"

namespace kiln::testing {
namespace {

// Empty when Load accepted the artifact as far as this machine allows.
std::string LoadProblem(const v1::Artifact& artifact) {
  auto exe = CudaExecutable::Load(artifact);
  if (exe.ok()) return "";
  const absl::Status driver = cuda::Driver::Get().status();
  if (!driver.ok() && exe.status() == driver) return "";
  if (exe.status().code() == absl::StatusCode::kFailedPrecondition &&
      absl::StrContains(exe.status().message(), "built for sm_90, device")) {
    return "";
  }
  return exe.status().ToString();
}

v1::CompileRequest ForSm90(v1::CompileRequest req, int64_t alignment) {
  req.mutable_target()->mutable_cuda()->set_arch("sm_90");
  for (v1::Input& in : *req.mutable_graph()->mutable_inputs())
    in.mutable_meta()->set_alignment(alignment);
  return req;
}

TEST(CudaArtifactLoad, ExampleGraphs) {
  for (const char* file :
       {"chain10.json", "chain30.json", "chain30_sum.json", "softmax.json",
        "layer_norm.json", "reduce_two_dims.json", "dynamic_batch.json"}) {
    auto a = Compile(ForSm90(Request(file), 16));
    ASSERT_TRUE(a.ok()) << file << ": " << a.status();
    EXPECT_EQ(LoadProblem(*a), "") << file;
  }
}

TEST(CudaArtifactLoad, RandomGraphs) {
  const graph_gen::GraphGenOptions o = random_graphs::GpuOptions();
  const int count = random_graphs::EnvInt("KILN_CUDA_LOAD_RANDOM_GRAPHS", 200);
  int failures = 0;
  for (int seed = 0; seed < count && failures < 10; ++seed) {
    v1::CompileRequest req;
    *req.mutable_graph() = graph_gen::RandomGraph(seed, o);
    auto a = Compile(ForSm90(req, seed % 2 ? 16 : 0));
    if (!a.ok()) continue;  // cuda_codegen_test reports compile failures
    const std::string problem = LoadProblem(*a);
    if (!problem.empty()) {
      ADD_FAILURE() << "seed " << seed << ": " << problem;
      ++failures;
    }
  }
}

// Graphs with matrix products (drawn from seed 200 on): their cuBLASLt
// calls pass the runtime's program checks under the CUDA limits.
TEST(CudaArtifactLoad, RandomGraphsWithProducts) {
  const graph_gen::GraphGenOptions o = random_graphs::GpuOptions();
  int products = 0, failures = 0;
  for (int seed = o.first_issue17_seed; seed < o.first_issue17_seed + 400 &&
                                        products < 20 && failures < 10;
       ++seed) {
    v1::CompileRequest req;
    *req.mutable_graph() = graph_gen::RandomGraph(seed, o);
    bool has_product = false;
    for (const v1::Node& n : req.graph().nodes())
      has_product |= absl::StrContains(n.op(), "mm.default");
    if (!has_product) continue;
    ++products;
    auto a = Compile(ForSm90(req, seed % 2 ? 16 : 0));
    ASSERT_TRUE(a.ok()) << "seed " << seed << ": " << a.status();
    const std::string problem = LoadProblem(*a);
    if (!problem.empty()) {
      ADD_FAILURE() << "seed " << seed << ": " << problem;
      ++failures;
    }
  }
  EXPECT_GE(products, 10);
}

}  // namespace
}  // namespace kiln::testing
