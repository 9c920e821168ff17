// Bad input: a table of malformed graphs, each with the status code and the
// key words its message must contain (node index, op, reason).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "graph/import.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

struct BadCase {
  std::string name;
  std::string graph_json;  // a kiln.v1.Graph in JSON
  absl::StatusCode code;
  std::vector<std::string> words;  // all must appear in the message
};

// A float32 input x of shape [2, 3].
const char* kX = R"({"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"value": 2}, {"value": 3}]}})";

std::string G(const std::string& nodes, const std::string& outputs = R"(["y"])",
              const std::string& inputs = "", const std::string& symbols = "[]") {
  return absl::StrCat(R"({"inputs": [)", inputs.empty() ? kX : inputs, R"(], "symbols": )", symbols,
                      R"(, "nodes": [)", nodes, R"(], "outputs": )", outputs, "}");
}
std::string Node(const std::string& op, const std::string& args, const std::string& outs = R"(["y"])") {
  return absl::StrCat(R"({"op": ")", op, R"(", "args": [)", args, R"(], "outputs": )", outs, "}");
}
std::string Input(const std::string& name, const std::string& meta) {
  return absl::StrCat(R"({"name": ")", name, R"(", "meta": )", meta, "}");
}

std::vector<BadCase> Cases() {
  const auto INV = absl::StatusCode::kInvalidArgument;
  return {
      {"unknown op", G(Node("aten.frobnicate.default", R"({"ref": "x"})")), absl::StatusCode::kUnimplemented,
       {"node 0", "aten.frobnicate.default", "not supported"}},
      {"too many positional args", G(Node("aten.sin.default", R"({"ref": "x"}, {"ref": "x"})")), INV,
       {"node 0", "aten.sin.default", "positional"}},
      {"wrong argument kind", G(Node("aten.sin.default", R"({"f": 1.5})")), INV,
       {"node 0", "aten.sin.default", "'self'", "Tensor", "a float"}},
      {"argument with no value", G(Node("aten.sin.default", R"({})")), INV,
       {"node 0", "'self'", "no value"}},
      {"missing required argument", G(Node("aten.add.Tensor", R"({"ref": "x"})")), INV,
       {"node 0", "aten.add.Tensor", "missing required argument 'other'"}},
      {"unknown keyword", G(Node("aten.add.Tensor", R"({"ref": "x"}, {"ref": "x"}, {"name": "beta", "i": 1})")),
       INV, {"node 0", "aten.add.Tensor", "no argument named 'beta'"}},
      {"keyword given twice",
       G(Node("aten.sum.dim_IntList", R"({"ref": "x"}, {"ints": {"values": [0]}}, {"name": "dim", "i": 1})")),
       INV, {"node 0", "multiple values", "'dim'"}},
      {"positional after keyword",
       G(Node("aten.add.Tensor", R"({"ref": "x"}, {"name": "alpha", "i": 1}, {"ref": "x"})")), INV,
       {"node 0", "positional argument follows a keyword"}},
      {"dtype not allowed", G(Node("aten.bitwise_and.Tensor", R"({"ref": "x"}, {"ref": "x"})")), INV,
       {"node 0", "aten.bitwise_and.Tensor", "float32"}},
      {"mean of ints",
       G(Node("aten.mean.default", R"({"ref": "x"})"), R"(["y"])",
         Input("x", R"({"dtype": "INT32", "sizes": [{"value": 4}]})")),
       INV, {"node 0", "aten.mean.default", "floating point", "int32"}},
      {"shapes do not broadcast",
       G(Node("aten.add.Tensor", R"({"ref": "x"}, {"ref": "z"})"), R"(["y"])",
         absl::StrCat(kX, ",", Input("z", R"({"dtype": "FLOAT32", "sizes": [{"value": 4}]})"))),
       INV, {"node 0", "aten.add.Tensor", "[2, 3]", "[4]", "broadcast"}},
      {"dim out of range", G(Node("aten.sum.dim_IntList", R"({"ref": "x"}, {"ints": {"values": [2]}})")), INV,
       {"node 0", "aten.sum.dim_IntList", "dim 2", "out of range", "rank 2"}},
      {"negative dim out of range", G(Node("aten._softmax.default", R"({"ref": "x"}, {"i": -3}, {"b": false})")),
       INV, {"node 0", "aten._softmax.default", "dim -3", "out of range"}},
      {"repeated reduction dim",
       G(Node("aten.sum.dim_IntList", R"({"ref": "x"}, {"ints": {"values": [1, -1]}})")), INV,
       {"node 0", "appears multiple times"}},
      {"undefined value", G(Node("aten.sin.default", R"({"ref": "nope"})")), INV,
       {"node 0", "aten.sin.default", "undefined value 'nope'"}},
      {"value defined later",
       G(absl::StrCat(Node("aten.cos.default", R"({"ref": "b"})", R"(["a"])"), ",",
                      Node("aten.sin.default", R"({"ref": "x"})", R"(["b"])")),
         R"(["a"])"),
       INV, {"node 0", "aten.cos.default", "'b'", "defined later", "node 1"}},
      {"node refers to itself", G(Node("aten.sin.default", R"({"ref": "y"})")), INV,
       {"node 0", "'y'", "defined later"}},
      {"output refers to nothing", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["ghost"])"), INV,
       {"output 0", "undefined value 'ghost'"}},
      {"no outputs", G(Node("aten.sin.default", R"({"ref": "x"})"), "[]"), INV, {"no outputs"}},
      {"value defined twice",
       G(absl::StrCat(Node("aten.sin.default", R"({"ref": "x"})"), ",", Node("aten.cos.default", R"({"ref": "x"})"))),
       INV, {"node 1", "'y'", "more than once"}},
      {"node output shadows an input", G(Node("aten.sin.default", R"({"ref": "x"})", R"(["x"])"), R"(["x"])"), INV,
       {"input 0", "more than once"}},
      {"wrong number of outputs", G(Node("aten.native_layer_norm.default",
                                         R"({"ref": "x"}, {"ints": {"values": [3]}}, {"none": {}}, {"none": {}}, {"f": 1e-5})")),
       INV, {"node 0", "aten.native_layer_norm.default", "defines 1 outputs", "3"}},
      {"negative size", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["y"])",
                          Input("x", R"({"dtype": "FLOAT32", "sizes": [{"value": -2}]})")),
       INV, {"input 0 'x'", "size -2", "negative"}},
      {"negative stride", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["y"])",
                            Input("x", R"({"dtype": "FLOAT32", "sizes": [{"value": 2}], "strides": [{"value": -1}]})")),
       INV, {"input 0 'x'", "stride -1", "negative"}},
      {"stride count mismatch", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["y"])",
                                  Input("x", R"({"dtype": "FLOAT32", "sizes": [{"value": 2}, {"value": 2}], "strides": [{"value": 1}]})")),
       INV, {"input 0 'x'", "1 strides for 2 sizes"}},
      {"overflowing size", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["y"])",
                             Input("x", R"({"dtype": "FLOAT32", "sizes": [{"value": "9223372036854775807"}]})")),
       INV, {"input 0 'x'", "exceeds 2^40"}},
      {"overflowing stride", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["y"])",
                               Input("x", R"({"dtype": "FLOAT32", "sizes": [{"value": 2}], "strides": [{"value": "4611686018427387904"}]})")),
       INV, {"input 0 'x'", "stride", "exceeds 2^40"}},
      {"element count above 2^40", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["y"])",
                                     Input("x", R"({"dtype": "FLOAT32", "sizes": [{"value": 1048576}, {"value": 2097152}]})")),
       INV, {"input 0 'x'", "element count", "limit"}},
      {"result element count above 2^40",
       G(Node("aten.expand.default", R"({"ref": "x"}, {"ints": {"values": [1048576, 1048576, 2, 3]}})")), INV,
       {"node 0", "aten.expand.default", "element count"}},
      {"rank above 8", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["y"])",
                         Input("x", R"({"dtype": "FLOAT32", "sizes": [{"value": 1}, {"value": 1}, {"value": 1}, {"value": 1}, {"value": 1}, {"value": 1}, {"value": 1}, {"value": 1}, {"value": 1}]})")),
       INV, {"input 0 'x'", "rank 9", "limit of 8"}},
      {"result rank above 8",
       G(Node("aten.view.default", R"({"ref": "x"}, {"ints": {"values": [1, 1, 1, 1, 1, 1, 1, 2, 3]}})")), INV,
       {"node 0", "aten.view.default", "rank 9"}},
      {"unknown dtype", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["y"])",
                          Input("x", R"({"dtype": 42, "sizes": [{"value": 2}]})")),
       INV, {"input 0 'x'", "dtype 42"}},
      {"unknown dtype argument", G(Node("aten._to_copy.default", R"({"ref": "x"}, {"name": "dtype", "dtype": 77})")),
       INV, {"node 0", "aten._to_copy.default", "dtype 77"}},
      {"undeclared symbol", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["y"])",
                              Input("x", R"({"dtype": "FLOAT32", "sizes": [{"symbol": "s9"}]})")),
       INV, {"input 0 'x'", "symbol 's9'", "not declared"}},
      {"symbol bound below 2", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["y"])", "",
                                 R"([{"name": "s0", "max_value": 1}])"),
       INV, {"symbol 0 's0'", "max_value 1"}},
      {"symbol declared twice", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["y"])", "",
                                  R"([{"name": "s0"}, {"name": "s0"}])"),
       INV, {"symbol 1 's0'", "declared twice"}},
      {"symbolic sizes that differ",
       G(Node("aten.add.Tensor", R"({"ref": "a"}, {"ref": "b"})"), R"(["y"])",
         absl::StrCat(Input("a", R"({"dtype": "FLOAT32", "sizes": [{"symbol": "s0"}]})"), ",",
                      Input("b", R"({"dtype": "FLOAT32", "sizes": [{"symbol": "s1"}]})")),
         R"([{"name": "s0"}, {"name": "s1"}])"),
       INV, {"node 0", "[s0]", "[s1]", "broadcast"}},
      {"alignment not a power of two", G(Node("aten.sin.default", R"({"ref": "x"})"), R"(["y"])",
                                         Input("x", R"({"dtype": "FLOAT32", "sizes": [{"value": 2}], "alignment": 12})")),
       INV, {"input 0 'x'", "alignment 12"}},
      {"bad rounding mode",
       G(Node("aten.div.Tensor_mode", R"({"ref": "x"}, {"ref": "x"}, {"name": "rounding_mode", "str": "up"})")), INV,
       {"node 0", "aten.div.Tensor_mode", "rounding_mode", "'up'"}},
      {"view with the wrong element count", G(Node("aten.view.default", R"({"ref": "x"}, {"ints": {"values": [4, 2]}})")),
       INV, {"node 0", "aten.view.default", "8 elements", "6 elements"}},
      {"view with two -1", G(Node("aten.view.default", R"({"ref": "x"}, {"ints": {"values": [-1, -1]}})")), INV,
       {"node 0", "only one dimension can be inferred"}},
      {"expand of a non-1 dim", G(Node("aten.expand.default", R"({"ref": "x"}, {"ints": {"values": [4, 3]}})")), INV,
       {"node 0", "aten.expand.default", "cannot expand dim 0"}},
      {"permute that is no permutation", G(Node("aten.permute.default", R"({"ref": "x"}, {"ints": {"values": [0, 0]}})")),
       INV, {"node 0", "aten.permute.default", "repeats"}},
      {"select index out of range", G(Node("aten.select.int", R"({"ref": "x"}, {"i": 0}, {"i": 5})")), INV,
       {"node 0", "aten.select.int", "index 5", "out of range"}},
      {"slice step zero", G(Node("aten.slice.Tensor", R"({"ref": "x"}, {"i": 0}, {"i": 0}, {"i": 2}, {"i": 0})")), INV,
       {"node 0", "aten.slice.Tensor", "step must be positive"}},
      {"cat of nothing", G(Node("aten.cat.default", R"({"refs": {}})")), INV, {"node 0", "aten.cat.default", "non-empty"}},
      {"cat of mismatched shapes",
       G(Node("aten.cat.default", R"({"refs": {"values": ["x", "z"]}}, {"i": 0})"), R"(["y"])",
         absl::StrCat(kX, ",", Input("z", R"({"dtype": "FLOAT32", "sizes": [{"value": 2}, {"value": 4}]})"))),
       INV, {"node 0", "aten.cat.default", "tensor 1", "dim 1"}},
      {"amax over an empty dim",
       G(Node("aten.amax.default", R"({"ref": "x"}, {"ints": {"values": [0]}})"), R"(["y"])",
         Input("x", R"({"dtype": "FLOAT32", "sizes": [{"value": 0}, {"value": 3}]})")),
       INV, {"node 0", "aten.amax.default", "size 0"}},
      {"clamp without bounds", G(Node("aten.clamp.default", R"({"ref": "x"})")), INV,
       {"node 0", "aten.clamp.default", "at least one of 'min' or 'max'"}},
      {"where with a float condition", G(Node("aten.where.self", R"({"ref": "x"}, {"ref": "x"}, {"ref": "x"})")), INV,
       {"node 0", "aten.where.self", "bool condition"}},
      {"layer norm shape mismatch",
       G(Node("aten.native_layer_norm.default",
              R"({"ref": "x"}, {"ints": {"values": [4]}}, {"none": {}}, {"none": {}}, {"f": 1e-5})",
              R"(["y", "m", "r"])")),
       INV, {"node 0", "aten.native_layer_norm.default", "normalized_shape"}},
      {"arange with zero step", G(Node("aten.arange.start_step", R"({"i": 0}, {"i": 5}, {"i": 0})")), INV,
       {"node 0", "aten.arange.start_step", "nonzero step"}},
      {"gelu with unknown approximation", G(Node("aten.gelu.default", R"({"ref": "x"}, {"name": "approximate", "str": "fast"})")),
       INV, {"node 0", "aten.gelu.default", "'fast'"}},
  };
}

TEST(Validation, EveryBadGraphIsRejectedPrecisely) {
  for (const BadCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    v1::Graph g;
    auto parsed = google::protobuf::util::JsonStringToMessage(c.graph_json, &g);
    ASSERT_TRUE(parsed.ok()) << parsed.ToString() << "\n" << c.graph_json;
    auto imported = ImportGraph(g);
    ASSERT_FALSE(imported.ok()) << c.graph_json;
    EXPECT_EQ(imported.status().code(), c.code) << imported.status();
    for (const std::string& w : c.words) {
      EXPECT_NE(imported.status().message().find(w), std::string::npos)
          << "message lacks \"" << w << "\": " << imported.status().message();
    }
  }
}

TEST(Validation, NodeLimitIsConfigurable) {
  v1::Graph g;
  std::string nodes;
  for (int i = 0; i < 5; ++i) {
    absl::StrAppend(&nodes, i ? "," : "",
                    Node("aten.sin.default", absl::StrCat(R"({"ref": ")", i ? absl::StrCat("v", i - 1) : "x", R"("})"),
                         absl::StrCat(R"(["v)", i, R"("])")));
  }
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(G(nodes, R"(["v4"])"), &g).ok());
  EXPECT_TRUE(ImportGraph(g).ok());
  ImportLimits limits;
  limits.max_nodes = 4;
  auto r = ImportGraph(g, limits);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("5 nodes, more than the limit of 4"), std::string::npos) << r.status();
}

TEST(Validation, TargetsAreChecked) {
  v1::Target t;
  EXPECT_EQ(ValidateTarget(t).code(), absl::StatusCode::kInvalidArgument);
  t.mutable_cuda()->set_arch("sm_x");
  EXPECT_EQ(ValidateTarget(t).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ValidateTarget(t).message().find("'sm_x'"), std::string::npos);
  t.mutable_cuda()->set_arch("sm_90");
  EXPECT_TRUE(ValidateTarget(t).ok());
  t.mutable_cpu()->set_triple("");
  EXPECT_NE(ValidateTarget(t).message().find("triple"), std::string::npos);
  t.mutable_cpu()->set_triple("x86_64-unknown-linux-gnu");
  EXPECT_TRUE(ValidateTarget(t).ok());
}

TEST(Validation, ValidGraphWithDynamicBatchInfersSymbolicShapes) {
  v1::Graph g;
  const std::string json = G(
      absl::StrCat(Node("aten.view.default", R"({"ref": "a"}, {"ints": {"values": [-1]}})", R"(["flat"])"), ",",
                   Node("aten.slice.Tensor", R"({"ref": "a"}, {"i": 0}, {"i": 1})", R"(["tail"])"), ",",
                   Node("aten.sum.dim_IntList", R"({"ref": "a"}, {"ints": {"values": [0]}}, {"b": true})",
                        R"(["s"])")),
      R"(["flat", "tail", "s"])", Input("a", R"({"dtype": "FLOAT16", "sizes": [{"symbol": "n"}, {"value": 16}]})"),
      R"([{"name": "n"}])");
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &g).ok());
  auto r = ImportGraph(g);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto names = r->SymbolNames();
  EXPECT_EQ(r->type(r->outputs[0]).sizes[0].ToString(names), "16*n");
  EXPECT_EQ(r->type(r->outputs[1]).sizes[0].ToString(names), "-1 + n");
  EXPECT_EQ(r->type(r->outputs[2]).sizes[0].ToString(names), "1");
  EXPECT_EQ(r->type(r->outputs[2]).dtype, DType::kFloat16);
}

}  // namespace
}  // namespace kiln
