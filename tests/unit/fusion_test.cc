// Structural checks of lowering and fusion on known graphs: kernel counts,
// no buffers for fused intermediates.
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "compiler/fuse.h"
#include "compiler/lower.h"
#include "google/protobuf/util/json_util.h"
#include "graph/import.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

absl::StatusOr<FusedProgram> FuseJson(const std::string& json,
                                      std::string* dump = nullptr,
                                      FuseOptions options = {}) {
  v1::Graph g;
  auto parsed = google::protobuf::util::JsonStringToMessage(json, &g);
  if (!parsed.ok()) return absl::InvalidArgumentError(parsed.ToString());
  auto graph = ImportGraph(g);
  if (!graph.ok()) return graph.status();
  auto loops = Lower(*graph);
  if (!loops.ok()) return loops.status();
  auto fused = Fuse(*loops, options);
  if (fused.ok() && dump)
    *dump = loops->ToString() + "----\n" + fused->ToString();
  return fused;
}

absl::StatusOr<FusedProgram> FuseExample(const std::string& file,
                                         std::string* dump = nullptr,
                                         FuseOptions options = {}) {
  std::ifstream in(std::string(KILN_EXAMPLES_DIR) + "/" + file);
  std::stringstream ss;
  ss << in.rdbuf();
  return FuseJson(ss.str(), dump, options);
}

int Temps(const FusedProgram& p) {
  int n = 0;
  for (const ProgramBuffer& b : p.buffers)
    n += b.kind == ProgramBuffer::Kind::kTemp;
  return n;
}

TEST(Fusion, Chain30IsOneKernelWithNoIntermediates) {
  std::string dump;
  auto p = FuseExample("chain30.json", &dump);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kernels.size(), 1u) << dump;
  EXPECT_EQ(Temps(*p), 0) << dump;
  EXPECT_EQ(p->buffers.size(), 2u) << dump;  // the input and the output
}

TEST(Fusion, Chain30SumIsOneKernel) {
  std::string dump;
  auto p = FuseExample("chain30_sum.json", &dump);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kernels.size(), 1u) << dump;
  EXPECT_EQ(Temps(*p), 0) << dump;
}

TEST(Fusion, SoftmaxIsOneRowKernel) {
  std::string dump;
  auto p = FuseExample("softmax.json", &dump);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_LE(p->kernels.size(), 2u) << dump;
  EXPECT_EQ(p->kernels.size(), 1u) << dump;
  EXPECT_EQ(Temps(*p), 0) << dump;
}

TEST(Fusion, LayerNormIsOneRowKernel) {
  std::string dump;
  auto p = FuseExample("layer_norm.json", &dump);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kernels.size(), 1u) << dump;
  EXPECT_EQ(Temps(*p), 0) << dump;
}

TEST(Fusion, UnfusedIsOneKernelPerOpWithBuffersBetween) {
  std::string dump;
  auto p = FuseExample("chain10.json", &dump, FuseOptions{.fuse = false});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kernels.size(), 11u) << dump;  // exp(x*0.5) is two ops
  EXPECT_EQ(Temps(*p), 10) << dump;
}

// FuseOptions::stores_into_reductions (GPUs): y = tanh(x), an output,
// and sum(y * y) are one kernel (y stored per element inside the
// reduction's rows); without the option two. A pointwise kernel that
// draws random numbers (dropout's mask) keeps its own kernel.
TEST(Fusion, ElementStoresJoinTheReductionThatReadsThem) {
  const std::string x = R"({"name": "x", "meta": {"dtype": "FLOAT32",
      "sizes": [{"value": 64}, {"value": 256}]}})";
  const std::string square = absl::StrCat(R"({"inputs": [)", x, R"(],
      "nodes": [{"op": "aten.tanh.default", "args": [{"ref": "x"}],
                 "outputs": ["y"]},
                {"op": "aten.mul.Tensor", "args": [{"ref": "y"}, {"ref": "y"}],
                 "outputs": ["z"]},
                {"op": "aten.sum.default", "args": [{"ref": "z"}],
                 "outputs": ["s"]}],
      "outputs": ["y", "s"]})");
  const std::string dropout = absl::StrCat(R"({"inputs": [)", x, R"(,
      {"name": "seed", "meta": {"dtype": "INT64", "sizes": [],
                                "device": "CPU"}}],
      "nodes": [{"op": "aten.native_dropout.default",
                 "args": [{"ref": "x"}, {"f": 0.1}, {"b": true},
                          {"ref": "seed", "name": "seed"},
                          {"i": 0, "name": "offset"}],
                 "outputs": ["y", "m"]},
                {"op": "aten.sum.default", "args": [{"ref": "y"}],
                 "outputs": ["s"]}],
      "outputs": ["m", "s"]})");
  FuseOptions gpu;
  gpu.stores_into_reductions = true;
  for (const auto& [json, options, kernels] :
       {std::tuple{square, gpu, 1u}, std::tuple{square, FuseOptions{}, 2u},
        std::tuple{dropout, gpu, 2u}}) {
    std::string dump;
    auto p = FuseJson(json, &dump, options);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->kernels.size(), kernels) << dump;
    EXPECT_EQ(Temps(*p), 0) << dump;
  }
}

TEST(Fusion, DynamicBatchFuses) {
  std::string dump;
  auto p = FuseExample("dynamic_batch.json", &dump);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Temps(*p), 0) << dump;
  std::cout << dump;
}

}  // namespace
}  // namespace kiln
