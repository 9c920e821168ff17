// Structural checks of lowering and fusion on known graphs: kernel counts,
// no buffers for fused intermediates.
#include <fstream>
#include <sstream>

#include "compiler/fuse.h"
#include "graph/import.h"
#include "compiler/lower.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

absl::StatusOr<FusedProgram> FuseExample(const std::string& file,
                                         std::string* dump = nullptr,
                                         FuseOptions options = {}) {
  std::ifstream in(std::string(KILN_EXAMPLES_DIR) + "/" + file);
  std::stringstream ss;
  ss << in.rdbuf();
  v1::Graph g;
  auto parsed = google::protobuf::util::JsonStringToMessage(ss.str(), &g);
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

TEST(Fusion, DynamicBatchFuses) {
  std::string dump;
  auto p = FuseExample("dynamic_batch.json", &dump);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Temps(*p), 0) << dump;
  std::cout << dump;
}

}  // namespace
}  // namespace kiln
