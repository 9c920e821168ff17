// Properties of the guard key (DESIGN.md, decision 2): stable under every
// rewrite that keeps the meaning of a request (renaming values or symbols,
// reordering independent nodes, storage offsets, devices), different for
// every change of a guarded property, and the same in every process.
#include "graph/guard_key.h"

#include <dirent.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/compiler_identity.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"
#include "graph/import.h"
#include "gtest/gtest.h"
#include "tests/unit/graph_gen.h"

namespace kiln {
namespace {

using graph_gen::GraphGenOptions;
using graph_gen::RandomGraph;

constexpr int kSeeds = 300;

v1::Target CpuTarget() {
  v1::Target t;
  t.mutable_cpu()->set_triple("x86_64-unknown-linux-gnu");
  t.mutable_cpu()->set_cpu("x86-64-v3");
  t.mutable_cpu()->set_features("+avx2,+fma");
  return t;
}

v1::Graph ParseGraph(const std::string& json) {
  v1::Graph g;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &g);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return g;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The key of a graph that must import; failures name the graph.
std::string Key(const v1::Graph& proto, const v1::Target& target = CpuTarget(),
                const v1::CompileOptions& options = {}) {
  absl::StatusOr<Graph> graph = ImportGraph(proto);
  EXPECT_TRUE(graph.ok()) << graph.status().ToString() << "\n"
                          << proto.DebugString();
  if (!graph.ok()) return "import failed";
  return DigestToHex(ComputeGuardKey(*graph, target, options));
}

// Every component's canonical text, for messages when keys differ.
std::string Explain(const v1::Graph& proto) {
  absl::StatusOr<Graph> graph = ImportGraph(proto);
  if (!graph.ok()) return graph.status().ToString();
  std::string out;
  for (const KeyComponent& c : ExplainKey(*graph, CpuTarget(), {})) {
    absl::StrAppend(&out, "== ", c.name, "\n", c.canonical, "\n");
  }
  return out;
}

// y = x0 * x1 over two float32 [8, 16] inputs, edited by the tests.
constexpr char kBinary[] = R"json({
  "inputs": [
    {"name": "a", "meta": {"dtype": "FLOAT32", "sizes": [{"value": "8"}, {"value": "16"}]}},
    {"name": "b", "meta": {"dtype": "FLOAT32", "sizes": [{"value": "8"}, {"value": "16"}]}}
  ],
  "nodes": [{"op": "aten.mul.Tensor", "args": [{"ref": "a"}, {"ref": "b"}], "outputs": ["y"]}],
  "outputs": ["y"]
})json";

// sin(x + 0.5) over a float32 [s0, 16] input.
constexpr char kDynamic[] = R"json({
  "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"symbol": "s0"}, {"value": "16"}]}}],
  "symbols": [{"name": "s0"}],
  "nodes": [
    {"op": "aten.add.Tensor", "args": [{"ref": "x"}, {"f": 0.5}], "outputs": ["t"]},
    {"op": "aten.sin.default", "args": [{"ref": "t"}], "outputs": ["y"]}
  ],
  "outputs": ["y"]
})json";

// ----------------------------------------------------------------------------
// The generator itself: every generated graph must be valid, or the property
// tests below would test nothing.

TEST(GraphGenTest, GeneratedGraphsImport) {
  GraphGenOptions all_dtypes;
  all_dtypes.dtypes = {v1::FLOAT32, v1::FLOAT16, v1::BFLOAT16,
                       v1::INT32,   v1::INT64,   v1::BOOL};
  std::vector<std::string> failures;
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    for (const GraphGenOptions& options : {GraphGenOptions{}, all_dtypes}) {
      const v1::Graph g = RandomGraph(seed, options);
      for (const v1::Graph& variant : {g, graph_gen::ShuffleNodes(g, seed),
                                       graph_gen::RenameValues(g, seed),
                                       graph_gen::RenameSymbols(g, seed)}) {
        absl::StatusOr<Graph> graph = ImportGraph(variant);
        if (!graph.ok()) {
          failures.push_back(absl::StrCat("seed ", seed, ": ",
                                          graph.status().ToString(), "\n",
                                          variant.DebugString()));
        }
      }
    }
  }
  EXPECT_TRUE(failures.empty())
      << failures.size() << " generated graphs do not import; the first:\n"
      << failures[0];
}

TEST(GraphGenTest, SameSeedSameGraph) {
  EXPECT_EQ(RandomGraph(7).SerializeAsString(),
            RandomGraph(7).SerializeAsString());
}

// ----------------------------------------------------------------------------
// Stability.

TEST(GuardKeyTest, StableUnderRenamingValues) {
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    const v1::Graph g = RandomGraph(seed);
    EXPECT_EQ(Key(g), Key(graph_gen::RenameValues(g, seed + 1)))
        << "seed " << seed;
  }
}

TEST(GuardKeyTest, StableUnderRenamingAndReorderingSymbols) {
  GraphGenOptions options;
  options.max_symbols = 3;
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    const v1::Graph g = RandomGraph(seed, options);
    const v1::Graph renamed = graph_gen::RenameSymbols(g, seed + 1);
    EXPECT_EQ(Key(g), Key(renamed)) << "seed " << seed << "\n"
                                    << Explain(g) << "\nvs\n"
                                    << Explain(renamed);
  }
}

TEST(GuardKeyTest, StableUnderReorderingIndependentNodes) {
  GraphGenOptions options;
  options.max_nodes = 40;
  options.max_inputs = 4;
  options.dtypes = {v1::FLOAT32, v1::INT64, v1::BOOL};
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    const v1::Graph g = RandomGraph(seed, options);
    for (uint64_t k = 1; k <= 3; ++k) {
      const v1::Graph shuffled = graph_gen::ShuffleNodes(g, seed * 31 + k);
      EXPECT_EQ(Key(g), Key(shuffled)) << "seed " << seed << "\n"
                                       << Explain(g) << "\nvs\n"
                                       << Explain(shuffled);
    }
  }
}

TEST(GuardKeyTest, StableUnderAllRewritesTogether) {
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    const v1::Graph g = RandomGraph(seed);
    const v1::Graph rewritten = graph_gen::RenameSymbols(
        graph_gen::RenameValues(graph_gen::ShuffleNodes(g, seed), seed), seed);
    EXPECT_EQ(Key(g), Key(rewritten)) << "seed " << seed;
  }
}

// Duplicate computations with different uses: swapping them in the request
// must not swap which one the consumers see in the canonical form.
TEST(GuardKeyTest, StableUnderSwappingDuplicateNodes) {
  const v1::Graph g = ParseGraph(R"json({
    "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"value": "4"}]}}],
    "nodes": [
      {"op": "aten.sin.default", "args": [{"ref": "x"}], "outputs": ["a"]},
      {"op": "aten.sin.default", "args": [{"ref": "x"}], "outputs": ["b"]},
      {"op": "aten.cos.default", "args": [{"ref": "a"}], "outputs": ["c"]}
    ],
    "outputs": ["c", "b"]
  })json");
  v1::Graph swapped = g;
  swapped.mutable_nodes()->SwapElements(0, 1);
  EXPECT_EQ(Key(g), Key(swapped)) << Explain(g) << "\nvs\n" << Explain(swapped);
}

// Equal computations on two duplicates (c = a - 0.1, d = b - 0.1 with a and
// b both exp(x)) where only a is used: every node order must give one key.
// Structural hashes alone cannot order c and d.
TEST(GuardKeyTest, StableUnderReorderingDuplicateChains) {
  const v1::Graph g = ParseGraph(R"json({
    "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"value": "4"}, {"value": "2"}]}}],
    "nodes": [
      {"op": "aten.exp.default", "args": [{"ref": "x"}], "outputs": ["a"]},
      {"op": "aten.exp.default", "args": [{"ref": "x"}], "outputs": ["b"]},
      {"op": "aten.sub.Tensor", "args": [{"ref": "a"}, {"f": 0.1}], "outputs": ["c"]},
      {"op": "aten.sub.Tensor", "args": [{"ref": "b"}, {"f": 0.1}], "outputs": ["d"]},
      {"op": "aten.amax.default", "args": [{"ref": "a"}, {"ints": {"values": ["1"]}}], "outputs": ["e"]}
    ],
    "outputs": ["e"]
  })json");
  const std::string key = Key(g);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const v1::Graph shuffled = graph_gen::ShuffleNodes(g, seed);
    EXPECT_EQ(key, Key(shuffled)) << Explain(g) << "\nvs\n"
                                  << Explain(shuffled);
  }
}

TEST(GuardKeyTest, StableUnderStorageOffsetDeviceAndAlignmentWithinClass) {
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    const v1::Graph g = RandomGraph(seed);
    v1::Graph other = g;
    for (v1::Input& in : *other.mutable_inputs()) {
      v1::TensorMeta* meta = in.mutable_meta();
      meta->set_storage_offset(meta->storage_offset() + 1000 + seed);
      meta->set_device(v1::DEVICE_UNSPECIFIED);
      // Same class: >= 16 stays >= 16, < 16 stays < 16.
      meta->set_alignment(meta->alignment() >= 16 ? 256 : 8);
    }
    EXPECT_EQ(Key(g), Key(other)) << "seed " << seed;
  }
}

// Ignored schema options (device, layout, memory_format ...) never reach
// the key: a device ordinal there would split the cache per rank.
TEST(GuardKeyTest, StableUnderIgnoredDeviceArguments) {
  auto with_device = [](const char* device) {
    v1::Graph g = ParseGraph(R"json({
      "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"value": "4"}]}}],
      "nodes": [{"op": "aten._to_copy.default",
                 "args": [{"ref": "x"}, {"name": "dtype", "dtype": "FLOAT16"}],
                 "outputs": ["y"]}],
      "outputs": ["y"]
    })json");
    if (device != nullptr) {
      v1::Argument* a = g.mutable_nodes(0)->add_args();
      a->set_name("device");
      a->set_str(device);
    }
    return g;
  };
  EXPECT_EQ(Key(with_device(nullptr)), Key(with_device("cuda:0")));
  EXPECT_EQ(Key(with_device("cuda:0")), Key(with_device("cuda:7")));
}

TEST(GuardKeyTest, ExplicitContiguousStridesEqualEmptyStrides) {
  const v1::Graph g = ParseGraph(kBinary);
  v1::Graph explicit_strides = g;
  for (v1::Input& in : *explicit_strides.mutable_inputs()) {
    in.mutable_meta()->add_strides()->set_value(16);
    in.mutable_meta()->add_strides()->set_value(1);
  }
  EXPECT_EQ(Key(g), Key(explicit_strides));
}

TEST(GuardKeyTest, StridesOfSizeOneDimsDoNotCount) {
  auto with_strides = [](int64_t s0, int64_t s1) {
    v1::Graph g = ParseGraph(R"json({
      "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"value": "8"}, {"value": "1"}]}}],
      "nodes": [{"op": "aten.neg.default", "args": [{"ref": "x"}], "outputs": ["y"]}],
      "outputs": ["y"]
    })json");
    g.mutable_inputs(0)->mutable_meta()->add_strides()->set_value(s0);
    g.mutable_inputs(0)->mutable_meta()->add_strides()->set_value(s1);
    return g;
  };
  EXPECT_EQ(Key(with_strides(1, 1)), Key(with_strides(1, 8)));
  EXPECT_EQ(Key(with_strides(1, 1)), Key(with_strides(1, 0)));
  EXPECT_NE(Key(with_strides(1, 1)), Key(with_strides(2, 1)));
}

TEST(GuardKeyTest, StridesOfEmptyTensorsDoNotCount) {
  auto with_strides = [](int64_t s0, int64_t s1) {
    v1::Graph g = ParseGraph(R"json({
      "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"value": "0"}, {"value": "4"}]}}],
      "nodes": [{"op": "aten.neg.default", "args": [{"ref": "x"}], "outputs": ["y"]}],
      "outputs": ["y"]
    })json");
    g.mutable_inputs(0)->mutable_meta()->add_strides()->set_value(s0);
    g.mutable_inputs(0)->mutable_meta()->add_strides()->set_value(s1);
    return g;
  };
  EXPECT_EQ(Key(with_strides(4, 1)), Key(with_strides(1, 0)));
}

// ----------------------------------------------------------------------------
// Sensitivity: each guarded property changes the key.

TEST(GuardKeyTest, SensitiveToEachDType) {
  std::set<std::string> keys;
  for (v1::DType d : {v1::FLOAT32, v1::FLOAT16, v1::BFLOAT16, v1::INT32,
                      v1::INT64, v1::BOOL}) {
    v1::Graph g = ParseGraph(kBinary);
    g.mutable_inputs(0)->mutable_meta()->set_dtype(d);
    g.mutable_inputs(1)->mutable_meta()->set_dtype(d);
    keys.insert(Key(g));
  }
  EXPECT_EQ(keys.size(), 6u);
  // One input's dtype alone matters too.
  v1::Graph g = ParseGraph(kBinary);
  g.mutable_inputs(1)->mutable_meta()->set_dtype(v1::FLOAT16);
  EXPECT_NE(Key(g), Key(ParseGraph(kBinary)));
}

// Input writes (Graph.input_writes) change the program, so the key: which
// input, and whether any. A graph without keeps its earlier key (no text).
TEST(GuardKeyTest, SensitiveToInputWrites) {
  const v1::Graph plain = ParseGraph(kBinary);
  std::set<std::string> keys = {Key(plain)};
  for (int input : {0, 1}) {
    v1::Graph g = plain;
    v1::InputWrite* w = g.add_input_writes();
    w->set_output(0);
    w->set_input(input);
    keys.insert(Key(g));
  }
  EXPECT_EQ(keys.size(), 3u);
  absl::StatusOr<Graph> graph = ImportGraph(plain);
  ASSERT_TRUE(graph.ok());
  for (const KeyComponent& c : ExplainKey(*graph, CpuTarget(), {}))
    EXPECT_FALSE(absl::StrContains(c.canonical, "input writes"));
}

TEST(GuardKeyTest, SensitiveToEachStaticSize) {
  int checked = 0;
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    const v1::Graph g = RandomGraph(seed);
    const std::string key = Key(g);
    std::set<int64_t> sizes;
    for (const v1::Input& in : g.inputs()) {
      for (const v1::Dim& d : in.meta().sizes()) {
        if (d.kind_case() == v1::Dim::kValue) sizes.insert(d.value());
      }
    }
    // Generated static sizes other than 1 are distinct per dim, so changing
    // one value everywhere keeps the graph valid.
    for (int64_t size : sizes) {
      if (size == 1) continue;
      v1::Graph changed = g;
      for (v1::Input& in : *changed.mutable_inputs()) {
        for (v1::Dim& d : *in.mutable_meta()->mutable_sizes()) {
          if (d.kind_case() == v1::Dim::kValue && d.value() == size) {
            d.set_value(size + 100);
          }
        }
        in.mutable_meta()->clear_strides();  // explicit strides would not fit
      }
      v1::Graph same = g;
      for (v1::Input& in : *same.mutable_inputs()) {
        in.mutable_meta()->clear_strides();
      }
      EXPECT_NE(Key(same), Key(changed)) << "seed " << seed << " size " << size;
      ++checked;
    }
    (void)key;
  }
  EXPECT_GT(checked, kSeeds);
}

TEST(GuardKeyTest, SensitiveToRank) {
  v1::Graph g = ParseGraph(kBinary);
  v1::Graph lower = g;
  lower.mutable_inputs(1)->mutable_meta()->mutable_sizes()->RemoveLast();
  lower.mutable_inputs(1)->mutable_meta()->mutable_sizes(0)->set_value(16);
  EXPECT_NE(Key(g), Key(lower));  // [8, 16] * [16] broadcasts
}

TEST(GuardKeyTest, SensitiveToStridePattern) {
  const v1::Graph g = ParseGraph(kBinary);
  v1::Graph column_major = g;
  column_major.mutable_inputs(0)->mutable_meta()->add_strides()->set_value(1);
  column_major.mutable_inputs(0)->mutable_meta()->add_strides()->set_value(8);
  v1::Graph padded = g;
  padded.mutable_inputs(0)->mutable_meta()->add_strides()->set_value(32);
  padded.mutable_inputs(0)->mutable_meta()->add_strides()->set_value(1);
  std::set<std::string> keys = {Key(g), Key(column_major), Key(padded)};
  EXPECT_EQ(keys.size(), 3u);
}

TEST(GuardKeyTest, SensitiveToSymbolicStridePattern) {
  // [s0, 16] contiguous vs. transposed storage (strides [1, s0]).
  const v1::Graph g = ParseGraph(kDynamic);
  v1::Graph transposed = g;
  v1::TensorMeta* meta = transposed.mutable_inputs(0)->mutable_meta();
  meta->add_strides()->set_value(1);
  v1::Stride* s = meta->add_strides();
  s->set_value(1);
  s->add_symbols("s0");
  EXPECT_NE(Key(g), Key(transposed));
}

TEST(GuardKeyTest, SensitiveToAlignmentClass) {
  v1::Graph aligned = ParseGraph(kBinary);
  aligned.mutable_inputs(0)->mutable_meta()->set_alignment(16);
  v1::Graph unaligned = ParseGraph(kBinary);
  unaligned.mutable_inputs(0)->mutable_meta()->set_alignment(8);
  v1::Graph unknown = ParseGraph(kBinary);
  EXPECT_NE(Key(aligned), Key(unaligned));
  EXPECT_EQ(Key(unaligned), Key(unknown));
}

TEST(GuardKeyTest, SensitiveToSymbolSpecialisation) {
  // A symbolic size stands for >= 2; a client with size 1 sends a static 1
  // (or 2), which must be a different key.
  const v1::Graph g = ParseGraph(kDynamic);
  std::set<std::string> keys = {Key(g)};
  for (int64_t size : {0, 1, 2}) {
    v1::Graph fixed = g;
    fixed.clear_symbols();
    fixed.mutable_inputs(0)->mutable_meta()->mutable_sizes(0)->set_value(size);
    keys.insert(Key(fixed));
  }
  EXPECT_EQ(keys.size(), 4u);
}

TEST(GuardKeyTest, SensitiveToSymbolFacts) {
  const v1::Graph g = ParseGraph(kDynamic);
  std::set<std::string> keys = {Key(g)};
  v1::Graph multiple = g;
  multiple.mutable_symbols(0)->set_multiple_of(4);
  keys.insert(Key(multiple));
  v1::Graph multiple8 = g;
  multiple8.mutable_symbols(0)->set_multiple_of(8);
  keys.insert(Key(multiple8));
  v1::Graph bounded = g;
  bounded.mutable_symbols(0)->set_max_value(1024);
  keys.insert(Key(bounded));
  EXPECT_EQ(keys.size(), 4u);
  // multiple_of 0 and 1 both mean "nothing known".
  v1::Graph one = g;
  one.mutable_symbols(0)->set_multiple_of(1);
  EXPECT_EQ(Key(g), Key(one));
}

TEST(GuardKeyTest, SharedSymbolDiffersFromTwoSymbols) {
  // x[s0] + y[s0] vs. x[s0] + y[s1] cannot share code: the second would
  // need a broadcast check.
  const v1::Graph shared = ParseGraph(R"json({
    "inputs": [
      {"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"symbol": "a"}]}},
      {"name": "y", "meta": {"dtype": "FLOAT32", "sizes": [{"symbol": "a"}]}}],
    "symbols": [{"name": "a"}, {"name": "b"}],
    "nodes": [{"op": "aten.neg.default", "args": [{"ref": "x"}], "outputs": ["n"]},
              {"op": "aten.neg.default", "args": [{"ref": "y"}], "outputs": ["m"]}],
    "outputs": ["n", "m"]
  })json");
  v1::Graph separate = shared;
  separate.mutable_inputs(1)->mutable_meta()->mutable_sizes(0)->set_symbol("b");
  EXPECT_NE(Key(shared), Key(separate));
}

TEST(GuardKeyTest, SensitiveToTarget) {
  const v1::Graph g = ParseGraph(kBinary);
  std::set<std::string> keys;
  v1::Target base = CpuTarget();
  keys.insert(Key(g, base));
  v1::Target triple = base;
  triple.mutable_cpu()->set_triple("aarch64-unknown-linux-gnu");
  keys.insert(Key(g, triple));
  v1::Target cpu = base;
  cpu.mutable_cpu()->set_cpu("skylake-avx512");
  keys.insert(Key(g, cpu));
  v1::Target features = base;
  features.mutable_cpu()->set_features("+avx2,+fma,+avx512f");
  keys.insert(Key(g, features));
  v1::Target sm80, sm90;
  sm80.mutable_cuda()->set_arch("sm_80");
  sm90.mutable_cuda()->set_arch("sm_90");
  keys.insert(Key(g, sm80));
  keys.insert(Key(g, sm90));
  keys.insert(Key(g, v1::Target()));
  EXPECT_EQ(keys.size(), 7u);
}

TEST(GuardKeyTest, CpuFeaturesAreASet) {
  const v1::Graph g = ParseGraph(kBinary);
  v1::Target a = CpuTarget(), b = CpuTarget();
  a.mutable_cpu()->set_features("+avx2,+fma");
  b.mutable_cpu()->set_features("+fma,,+avx2,+fma");
  EXPECT_EQ(Key(g, a), Key(g, b));
}

TEST(GuardKeyTest, SensitiveToFastMath) {
  const v1::Graph g = ParseGraph(kBinary);
  v1::CompileOptions fast;
  fast.set_fast_math(true);
  EXPECT_NE(Key(g, CpuTarget(), {}), Key(g, CpuTarget(), fast));
}

// Options of kiln.v1.CompileOptions that are deliberately not part of the
// request key: path (as OptionChange::path) -> why the generated code does
// not depend on it. None today: every option decides the generated code. A
// new option either changes the key or is listed here with its reason.
// Options that cannot change the code generated for `target`, with why.
// (The graph of EveryCompileOptionChangesTheKey has no convolution:
// CudaConvolutionFlagsChangeKeysOfConvolutionsOnly covers the cuDNN flags
// where they count.)
std::map<std::string, std::string> OptionsNotInKey(const v1::Target& target) {
  const char* kConv =
      "a cuDNN flag: CPU targets and graphs without a convolution ignore it "
      "(NormalizeOptions)";
  const char* kScatter =
      "deterministic scatters and GEMM algorithms: CPU targets and graphs "
      "without an accumulating scatter or a matrix product ignore it "
      "(NormalizeOptions)";
  const char* kCpuConv =
      "oneDNN convolutions: CUDA targets and graphs without a convolution "
      "ignore it (NormalizeOptions)";
  if (target.has_cuda()) {
    return {{"allow_tf32_convolution", kConv},
            {"deterministic_convolutions", kConv},
            {"cudnn_benchmark", kConv},
            {"deterministic_algorithms", kScatter},
            {"cpu_library_convolutions", kCpuConv}};
  }
  const char* kMatmul =
      "a cuBLASLt flag: CPU targets ignore it (NormalizeOptions)";
  return {
      {"allow_tf32", kMatmul},
      {"strict_fp16_reduction", kMatmul},
      {"strict_bf16_reduction", kMatmul},
      {"unfused_gemm_epilogues", kMatmul},
      {"allow_tf32_convolution", kConv},
      {"deterministic_convolutions", kConv},
      {"cudnn_benchmark", kConv},
      {"deterministic_algorithms", kScatter},
      {"cpu_library_convolutions", kCpuConv},
  };
}

// One change of CompileOptions away from its defaults: the field at `path`
// (nested messages joined by '.') given a value other than its default, or
// one element for a repeated field.
struct OptionChange {
  std::string path;
  std::function<void(google::protobuf::Message*)> apply;
};

// Sets non-message `field` of `m` to a value other than its default; for a
// repeated field, adds one element. False when no such value exists (an
// enum of one value).
bool SetNonDefault(google::protobuf::Message* m,
                   const google::protobuf::FieldDescriptor* field) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m->GetReflection();
  const bool rep = field->is_repeated();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL:
      rep ? r->AddBool(m, field, true)
          : r->SetBool(m, field, !field->default_value_bool());
      return true;
    case FieldDescriptor::CPPTYPE_INT32:
      rep ? r->AddInt32(m, field, 1)
          : r->SetInt32(m, field, field->default_value_int32() + 1);
      return true;
    case FieldDescriptor::CPPTYPE_INT64:
      rep ? r->AddInt64(m, field, 1)
          : r->SetInt64(m, field, field->default_value_int64() + 1);
      return true;
    case FieldDescriptor::CPPTYPE_UINT32:
      rep ? r->AddUInt32(m, field, 1)
          : r->SetUInt32(m, field, field->default_value_uint32() + 1);
      return true;
    case FieldDescriptor::CPPTYPE_UINT64:
      rep ? r->AddUInt64(m, field, 1)
          : r->SetUInt64(m, field, field->default_value_uint64() + 1);
      return true;
    case FieldDescriptor::CPPTYPE_FLOAT:
      rep ? r->AddFloat(m, field, 1.5f)
          : r->SetFloat(m, field, field->default_value_float() + 1.5f);
      return true;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      rep ? r->AddDouble(m, field, 1.5)
          : r->SetDouble(m, field, field->default_value_double() + 1.5);
      return true;
    case FieldDescriptor::CPPTYPE_STRING:
      rep ? r->AddString(m, field, "x")
          : r->SetString(m, field, field->default_value_string() + "x");
      return true;
    case FieldDescriptor::CPPTYPE_ENUM: {
      const google::protobuf::EnumDescriptor* e = field->enum_type();
      for (int i = 0; i < e->value_count(); ++i) {
        const google::protobuf::EnumValueDescriptor* v = e->value(i);
        if (v->number() == field->default_value_enum()->number()) continue;
        rep ? r->AddEnum(m, field, v) : r->SetEnum(m, field, v);
        return true;
      }
      return false;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return false;
}

// Every change of a message of type `type` reached through `prefix`:
// scalars set (SetNonDefault), repeated messages given one empty element,
// and singular messages walked field by field (an empty one: present).
void CollectOptionChanges(
    const google::protobuf::Descriptor* type, const std::string& prefix,
    const std::function<google::protobuf::Message*(google::protobuf::Message*)>&
        reach,
    int depth, std::vector<OptionChange>* changes) {
  using google::protobuf::FieldDescriptor;
  using google::protobuf::Message;
  ASSERT_LT(depth, 8) << "CompileOptions nests too deeply at " << prefix;
  for (int i = 0; i < type->field_count(); ++i) {
    const FieldDescriptor* field = type->field(i);
    const std::string path = absl::StrCat(prefix, field->name());
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
      changes->push_back({path, [reach, field](Message* m) {
                            ASSERT_TRUE(SetNonDefault(reach(m), field))
                                << field->full_name()
                                << ": no value other than the default";
                          }});
    } else if (field->is_repeated()) {
      changes->push_back({path, [reach, field](Message* m) {
                            Message* sub = reach(m);
                            sub->GetReflection()->AddMessage(sub, field);
                          }});
    } else if (field->message_type()->field_count() == 0) {
      changes->push_back({path, [reach, field](Message* m) {
                            Message* sub = reach(m);
                            sub->GetReflection()->MutableMessage(sub, field);
                          }});
    } else {
      CollectOptionChanges(
          field->message_type(), absl::StrCat(path, "."),
          [reach, field](Message* m) {
            Message* sub = reach(m);
            return sub->GetReflection()->MutableMessage(sub, field);
          },
          depth + 1, changes);
    }
  }
}

// Walks CompileOptions' descriptor, so no option can be left out of the key:
// each field, set away from its default, changes the request key (on a CPU
// and a CUDA target) unless OptionsNotInKey lists it, and then it must not.
TEST(GuardKeyTest, EveryCompileOptionChangesTheKey) {
  std::vector<OptionChange> changes;
  CollectOptionChanges(
      v1::CompileOptions::descriptor(), "",
      [](google::protobuf::Message* m) { return m; }, 0, &changes);
  ASSERT_GE(
      changes.size(),
      static_cast<size_t>(v1::CompileOptions::descriptor()->field_count()));
  std::set<std::string> paths;
  for (const OptionChange& c : changes) paths.insert(c.path);
  v1::Target sm90;
  sm90.mutable_cuda()->set_arch("sm_90");
  const v1::Graph g = ParseGraph(kBinary);
  for (const v1::Target& target : {CpuTarget(), sm90}) {
    const std::map<std::string, std::string> not_in_key =
        OptionsNotInKey(target);
    for (const auto& [path, reason] : not_in_key) {
      EXPECT_TRUE(paths.count(path)) << "OptionsNotInKey lists " << path
                                     << ", which CompileOptions does not have";
      EXPECT_FALSE(reason.empty()) << path << " needs a reason";
    }
    const std::string base = Key(g, target, {});
    for (const OptionChange& c : changes) {
      v1::CompileOptions options;
      c.apply(&options);
      ASSERT_NE(options.SerializeAsString(), "") << c.path << " set nothing";
      const std::string key = Key(g, target, options);
      auto it = not_in_key.find(c.path);
      if (it == not_in_key.end()) {
        EXPECT_NE(key, base)
            << "CompileOptions." << c.path << " = {"
            << options.ShortDebugString()
            << "} does not change the request key: add it to OptionsText "
               "(compiler/guard_key.cc), or to OptionsNotInKey with the "
               "reason it cannot change the generated code";
      } else {
        EXPECT_EQ(key, base) << "CompileOptions." << c.path
                             << " changes the request key, yet "
                                "OptionsNotInKey lists it: "
                             << it->second;
      }
    }
  }
}

// examples/graphs/`file`, parsed.
v1::Graph ExampleGraph(const std::string& file) {
  std::ifstream in(std::string(KILN_EXAMPLES_DIR) + "/" + file);
  std::stringstream json;
  json << in.rdbuf();
  return ParseGraph(json.str());
}

// The cuDNN flags are part of a CUDA key where the graph convolves, and of
// no other key: CPU keys never have them, and a client that sends PyTorch's
// flags with every CUDA graph keeps the keys of graphs without one.
TEST(GuardKeyTest, CudaConvolutionFlagsChangeKeysOfConvolutionsOnly) {
  v1::Target sm90;
  sm90.mutable_cuda()->set_arch("sm_90");
  const v1::Graph conv = ExampleGraph("conv1d_broadcast.json");
  ASSERT_GT(conv.nodes_size(), 0);
  const v1::Graph plain = ParseGraph(kBinary);
  v1::CompileOptions tf32, deterministic;
  tf32.set_allow_tf32_convolution(true);
  deterministic.set_deterministic_convolutions(true);
  const std::set<std::string> conv_keys = {Key(conv, sm90, {}),
                                           Key(conv, sm90, tf32),
                                           Key(conv, sm90, deterministic)};
  EXPECT_EQ(conv_keys.size(), 3u);
  for (const v1::CompileOptions& o : {tf32, deterministic}) {
    EXPECT_EQ(Key(plain, sm90, o), Key(plain, sm90, {})) << o.DebugString();
    EXPECT_EQ(Key(conv, CpuTarget(), o), Key(conv, CpuTarget(), {}))
        << o.DebugString();
  }
}

// cpu_library_convolutions (oneDNN calls) is part of a CPU key where the
// graph convolves, and of no other key.
TEST(GuardKeyTest, CpuLibraryConvolutionsChangeKeysOfCpuConvolutionsOnly) {
  v1::Target sm90;
  sm90.mutable_cuda()->set_arch("sm_90");
  const v1::Graph conv = ExampleGraph("conv1d_broadcast.json");
  ASSERT_GT(conv.nodes_size(), 0);
  const v1::Graph plain = ParseGraph(kBinary);
  v1::CompileOptions library;
  library.set_cpu_library_convolutions(true);
  EXPECT_NE(Key(conv, CpuTarget(), library), Key(conv, CpuTarget(), {}));
  EXPECT_EQ(Key(plain, CpuTarget(), library), Key(plain, CpuTarget(), {}));
  EXPECT_EQ(Key(conv, sm90, library), Key(conv, sm90, {}));
}

// deterministic_algorithms changes the CUDA key of a graph with an
// accumulating scatter (embedding_cross_entropy.json's embedding backward)
// or a matrix product (its algorithm is then never a timed one), and no
// other key.
TEST(GuardKeyTest,
     DeterministicAlgorithmsChangeKeysOfCudaScattersAndProductsOnly) {
  v1::Target sm90;
  sm90.mutable_cuda()->set_arch("sm_90");
  const v1::Graph scatter = ExampleGraph("embedding_cross_entropy.json");
  ASSERT_GT(scatter.nodes_size(), 0);
  const v1::Graph plain = ParseGraph(kBinary);
  v1::CompileOptions deterministic;
  deterministic.set_deterministic_algorithms(true);
  EXPECT_NE(Key(scatter, sm90, deterministic), Key(scatter, sm90, {}));
  EXPECT_EQ(Key(plain, sm90, deterministic), Key(plain, sm90, {}));
  EXPECT_EQ(Key(scatter, CpuTarget(), deterministic),
            Key(scatter, CpuTarget(), {}));
}

TEST(GuardKeyTest, SensitiveToOpName) {
  const v1::Graph g = ParseGraph(kDynamic);
  v1::Graph cos = g;
  cos.mutable_nodes(1)->set_op("aten.cos.default");
  v1::Graph sub = g;
  sub.mutable_nodes(0)->set_op("aten.sub.Tensor");
  std::set<std::string> keys = {Key(g), Key(cos), Key(sub)};
  EXPECT_EQ(keys.size(), 3u);
}

TEST(GuardKeyTest, SensitiveToOpNameInRandomGraphs) {
  // Swapping sin and cos anywhere changes the key.
  int checked = 0;
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    const v1::Graph g = RandomGraph(seed);
    for (int i = 0; i < g.nodes_size(); ++i) {
      const std::string& op = g.nodes(i).op();
      if (op != "aten.sin.default" && op != "aten.cos.default") continue;
      v1::Graph changed = g;
      changed.mutable_nodes(i)->set_op(
          op == "aten.sin.default" ? "aten.cos.default" : "aten.sin.default");
      EXPECT_NE(Key(g), Key(changed)) << "seed " << seed << " node " << i;
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
}

TEST(GuardKeyTest, SensitiveToScalarArgumentsBitExactly) {
  auto with_scalar = [](const std::function<void(v1::Argument*)>& set) {
    v1::Graph g = ParseGraph(kDynamic);
    set(g.mutable_nodes(0)->mutable_args(1));
    return g;
  };
  std::set<std::string> keys;
  keys.insert(Key(with_scalar([](v1::Argument* a) { a->set_f(0.5); })));
  keys.insert(Key(with_scalar(
      [](v1::Argument* a) { a->set_f(std::nextafter(0.5, 1.0)); })));
  keys.insert(Key(with_scalar([](v1::Argument* a) { a->set_f(0.0); })));
  keys.insert(Key(with_scalar([](v1::Argument* a) { a->set_f(-0.0); })));
  keys.insert(Key(with_scalar([](v1::Argument* a) { a->set_f(1.0); })));
  // An int scalar promotes differently from a float one.
  keys.insert(Key(with_scalar([](v1::Argument* a) { a->set_i(1); })));
  EXPECT_EQ(keys.size(), 6u);
}

TEST(GuardKeyTest, SensitiveToReductionDimsAndKeepdim) {
  const v1::Graph g = ParseGraph(
      ReadFile(std::string(KILN_EXAMPLES_DIR) + "/reduce_two_dims.json"));
  v1::Graph dims = g;
  dims.mutable_nodes(0)->mutable_args(1)->mutable_ints()->set_values(1, 1);
  v1::Graph keepdim = g;
  keepdim.mutable_nodes(0)->mutable_args(2)->set_b(false);
  std::set<std::string> keys = {Key(g), Key(dims), Key(keepdim)};
  EXPECT_EQ(keys.size(), 3u);
}

TEST(GuardKeyTest, SensitiveToOutputOrder) {
  const v1::Graph g =
      ParseGraph(ReadFile(std::string(KILN_EXAMPLES_DIR) + "/layer_norm.json"));
  v1::Graph swapped = g;
  swapped.mutable_outputs()->SwapElements(1, 2);
  v1::Graph fewer = g;
  fewer.mutable_outputs()->RemoveLast();
  std::set<std::string> keys = {Key(g), Key(swapped), Key(fewer)};
  EXPECT_EQ(keys.size(), 3u);
}

TEST(GuardKeyTest, SensitiveToInputOrder) {
  // Inputs are positional: a - b with a and b swapped is another program.
  v1::Graph g = ParseGraph(kBinary);
  g.mutable_nodes(0)->set_op("aten.sub.Tensor");
  v1::Graph swapped = g;
  swapped.mutable_inputs()->SwapElements(0, 1);
  EXPECT_NE(Key(g), Key(swapped));
}

TEST(GuardKeyTest, SensitiveToArgumentOrder) {
  v1::Graph g = ParseGraph(kBinary);
  g.mutable_nodes(0)->set_op("aten.sub.Tensor");
  v1::Graph swapped = g;
  swapped.mutable_nodes(0)->mutable_args()->SwapElements(0, 1);
  EXPECT_NE(Key(g), Key(swapped));
}

// ----------------------------------------------------------------------------
// Explanation and identity.

TEST(GuardKeyTest, ExplainMatchesKey) {
  const v1::Graph g = ParseGraph(kDynamic);
  absl::StatusOr<Graph> graph = ImportGraph(g);
  ASSERT_TRUE(graph.ok());
  const std::vector<KeyComponent> components =
      ExplainKey(*graph, CpuTarget(), {});
  std::vector<std::string> names;
  for (const KeyComponent& c : components) {
    names.push_back(c.name);
    EXPECT_EQ(c.hash, Sha256(c.canonical)) << c.name;
  }
  // No "compiler" component: the request key does not depend on the build
  // that computes it (kilnd adds its identity in the store key).
  EXPECT_EQ(names, (std::vector<std::string>{"format", "graph", "input.0",
                                             "symbols", "target", "options"}));
  EXPECT_EQ(CombineKeyComponents(components),
            ComputeGuardKey(*graph, CpuTarget(), {}));
  EXPECT_EQ(components[2].canonical,
            "input 0: float32 rank 2 sizes [s0, 16] strides [16, 1] align<16");
  EXPECT_TRUE(absl::StrContains(
      components[1].canonical, "= aten.sin.default(self=%1) : float32[s0, 16]"))
      << components[1].canonical;
  EXPECT_EQ(components[3].canonical,
            "symbols 1\ns0: min 2 max inf multiple_of 1\n");
  EXPECT_EQ(components[4].canonical,
            "cpu triple=\"x86_64-unknown-linux-gnu\" cpu=\"x86-64-v3\" "
            "features=\"+avx2,+fma\"");
}

TEST(GuardKeyTest, CompilerIdentityIsAHash) {
  Sha256Digest d;
  EXPECT_TRUE(HexToDigest(CompilerIdentity(), &d)) << CompilerIdentity();
}

// The store key covers the request key and the compiler identity, each of
// which changes it; the request key itself has no identity in it.
TEST(GuardKeyTest, StoreKeyCoversRequestKeyAndIdentity) {
  absl::StatusOr<Graph> graph = ImportGraph(ParseGraph(kDynamic));
  ASSERT_TRUE(graph.ok());
  const GuardKey key = ComputeGuardKey(*graph, CpuTarget(), {});
  GuardKey other = key;
  other[0] ^= 1;
  EXPECT_EQ(StoreKey(key, CompilerIdentity()),
            StoreKey(key, CompilerIdentity()));
  EXPECT_NE(StoreKey(key, CompilerIdentity()), StoreKey(key, "another build"));
  EXPECT_NE(StoreKey(key, CompilerIdentity()),
            StoreKey(other, CompilerIdentity()));
  EXPECT_NE(StoreKey(key, CompilerIdentity()), key);
  for (const KeyComponent& c : ExplainKey(*graph, CpuTarget(), {}))
    EXPECT_FALSE(absl::StrContains(c.canonical, CompilerIdentity())) << c.name;
}

TEST(GuardKeyTest, DifferentGraphsDifferentKeys) {
  std::set<std::string> graphs, keys;
  for (uint64_t seed = 0; seed < kSeeds; ++seed) {
    const v1::Graph g = RandomGraph(seed);
    // Distinct canonical graphs only (tiny random graphs can coincide).
    absl::StatusOr<Graph> graph = ImportGraph(g);
    ASSERT_TRUE(graph.ok());
    std::string canonical;
    for (const KeyComponent& c : ExplainKey(*graph, CpuTarget(), {})) {
      absl::StrAppend(&canonical, c.canonical, "\n");
    }
    if (graphs.insert(canonical).second) keys.insert(Key(g));
  }
  EXPECT_EQ(keys.size(), graphs.size());
}

// ----------------------------------------------------------------------------
// Across processes, and the example graphs.

std::string RunPrintGuardKey(const std::string& args) {
  const std::string command =
      absl::StrCat(KILN_PRINT_GUARD_KEY, " ", args, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  std::string out;
  char buffer[256];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  const int status = pclose(pipe);
  EXPECT_EQ(status, 0) << command << "\n" << out;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

TEST(GuardKeyTest, SameKeyInSeparateProcesses) {
  for (const char* name : {"chain30.json", "dynamic_batch.json"}) {
    const std::string path = absl::StrCat(KILN_EXAMPLES_DIR, "/", name);
    const std::string args = absl::StrCat(
        "--target=cpu:x86_64-unknown-linux-gnu:x86-64-v3:+avx2,+fma ", path);
    const std::string first = RunPrintGuardKey(args);
    const std::string second = RunPrintGuardKey(args);
    EXPECT_EQ(first.size(), 64u) << first;
    EXPECT_EQ(first, second);
    EXPECT_EQ(first, Key(ParseGraph(ReadFile(path)))) << name;
    // A different target in another process gives another key.
    EXPECT_NE(first,
              RunPrintGuardKey(absl::StrCat("--target=cuda:sm_90 ", path)));
  }
}

std::vector<std::string> ExampleGraphs() {
  std::vector<std::string> files;
  if (DIR* dir = opendir(KILN_EXAMPLES_DIR)) {
    while (dirent* e = readdir(dir)) {
      const std::string name = e->d_name;
      if (absl::EndsWith(name, ".json")) files.push_back(name);
    }
    closedir(dir);
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(ExampleGraphsTest, EveryExampleImports) {
  const std::vector<std::string> files = ExampleGraphs();
  EXPECT_GE(files.size(), 7u);
  std::set<std::string> keys;
  for (const std::string& name : files) {
    const std::string path = absl::StrCat(KILN_EXAMPLES_DIR, "/", name);
    v1::Graph proto;
    const auto parsed =
        google::protobuf::util::JsonStringToMessage(ReadFile(path), &proto);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.ToString();
    absl::StatusOr<Graph> graph = ImportGraph(proto);
    ASSERT_TRUE(graph.ok()) << name << ": " << graph.status().ToString();
    EXPECT_EQ(graph->outputs.size(), static_cast<size_t>(proto.outputs_size()))
        << name;
    keys.insert(DigestToHex(ComputeGuardKey(*graph, CpuTarget(), {})));
  }
  EXPECT_EQ(keys.size(), files.size());
}

TEST(ExampleGraphsTest, ChainGraphsHaveTheirStatementCount) {
  // chain-N has N statements; exp(x*c) is two nodes, one per 10 statements.
  for (const auto& [name, nodes] :
       std::vector<std::pair<std::string, int>>{{"chain10.json", 11},
                                                {"chain30.json", 33},
                                                {"chain30_sum.json", 34}}) {
    const v1::Graph g =
        ParseGraph(ReadFile(absl::StrCat(KILN_EXAMPLES_DIR, "/", name)));
    EXPECT_EQ(g.nodes_size(), nodes) << name;
  }
}

}  // namespace
}  // namespace kiln
