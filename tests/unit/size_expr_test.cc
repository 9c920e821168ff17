// Compound symbolic sizes (kiln.v1.SizeExpr): polynomials over the graph's
// symbols in input sizes, strides and size-list arguments. Import validates
// them (declared and bound symbols, limits, non-negative sizes), the guard
// key encodes them canonically, and a graph using them compiles and runs
// like the reference evaluator at several symbol values.
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "compiler/reference.h"
#include "google/protobuf/util/json_util.h"
#include "graph/guard_key.h"
#include "graph/import.h"
#include "gtest/gtest.h"
#include "runtime/cpu_executable.h"
#include "tests/unit/numerics.h"

namespace kiln::testing {
namespace {

v1::Graph Parse(const std::string& json) {
  v1::Graph g;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &g);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return g;
}

// {"expr": ...} for `terms`, each "coeff:sym*sym" ("-3:" is a constant).
std::string Expr(const std::vector<std::string>& terms) {
  std::string out = R"({"expr": {"terms": [)";
  for (size_t i = 0; i < terms.size(); ++i) {
    const std::string& t = terms[i];
    const size_t colon = t.find(':');
    std::string syms;
    std::string rest = t.substr(colon + 1);
    while (!rest.empty()) {
      const size_t star = rest.find('*');
      absl::StrAppend(&syms, syms.empty() ? "" : ", ", "\"",
                      rest.substr(0, star), "\"");
      rest = star == std::string::npos ? "" : rest.substr(star + 1);
    }
    absl::StrAppend(&out, i ? ", " : "", R"({"coeff": )", t.substr(0, colon),
                    R"(, "symbols": [)", syms, "]}");
  }
  return out + "]}}";
}

// A graph over x: float32 [s0, s1, 8] (symbols s0, s1 declared), with
// `extra_inputs` after it.
std::string G(const std::string& nodes, const std::string& outputs = "[\"y\"]",
              const std::string& extra_inputs = "") {
  return absl::StrCat(
      R"({"inputs": [{"name": "x", "meta": {"dtype": "FLOAT32", "sizes": )",
      R"([{"symbol": "s0"}, {"symbol": "s1"}, {"value": 8}]}})", extra_inputs,
      R"(], "symbols": [{"name": "s0"}, {"name": "s1"}, {"name": "s2"}],)",
      R"( "nodes": [)", nodes, R"(], "outputs": )", outputs, "}");
}

std::string View(const std::string& dims, const std::string& out = "y",
                 const std::string& self = "x") {
  return absl::StrCat(R"({"op": "aten.view.default", "args": [{"ref": ")", self,
                      R"("}, {"dims": {"values": [)", dims,
                      R"(]}}], "outputs": [")", out, R"("]})");
}

// y = full(dims, 0.5): a size list without an element count to match.
std::string Full(const std::string& dims) {
  return absl::StrCat(R"({"op": "aten.full.default", "args": [{"dims": )",
                      R"({"values": [)", dims,
                      R"(]}}, {"f": 0.5}], "outputs": ["y"]})");
}

std::string Input(const std::string& name, const std::string& sizes,
                  const std::string& strides = "") {
  return absl::StrCat(
      R"(, {"name": ")", name, R"(", "meta": {"dtype": "FLOAT32", "sizes": [)",
      sizes, "]",
      strides.empty() ? "" : absl::StrCat(R"(, "strides": [)", strides, "]"),
      "}}");
}

TEST(SymExprTest, NonNegativeFromTwo) {
  const SymExpr s0 = SymExpr::Symbol(0), s1 = SymExpr::Symbol(1);
  EXPECT_TRUE((s0 - 1).NonNegativeFrom(2));
  EXPECT_TRUE((s0 - 2).NonNegativeFrom(2));
  EXPECT_FALSE((s0 - 3).NonNegativeFrom(2));
  EXPECT_FALSE((SymExpr(3) - s0).NonNegativeFrom(2));
  EXPECT_TRUE((s0 * s1 - s0).NonNegativeFrom(2));
  EXPECT_TRUE((s0 * s1 - s0 - s1).NonNegativeFrom(2));
  EXPECT_FALSE((s0 * s1 - 2 * s0 - s1).NonNegativeFrom(2));
  EXPECT_TRUE((s0 * s0 - 3 * s0 + 2).NonNegativeFrom(2));
  EXPECT_TRUE(SymExpr(0).NonNegativeFrom(2));
  EXPECT_FALSE(SymExpr(-1).NonNegativeFrom(2));
}

struct Bad {
  std::string name;
  std::string json;
  std::vector<std::string> words;
};

TEST(SizeExprImportTest, BadExpressionsAreInvalidArgumentsNamingWhere) {
  const std::vector<Bad> cases = {
      {"undeclared symbol",
       G(View(Expr({"2:s9"}))),
       {"node 0", "aten.view.default", "symbol 's9'", "not declared"}},
      {"size that can be negative",
       G(View(Expr({"1:s0*s1", "-1:s0", "-5:"}))),
       {"node 0", "aten.view.default", "argument 'size' entry 0",
        "can be negative"}},
      {"coefficient out of range",
       G(View(Expr({"2199023255552:s0"}))),
       {"node 0", "argument 'size' entry 0", "coefficient", "out of range"}},
      {"merged coefficient out of range",
       G(View(Expr({"1099511627776:s0", "1099511627776:s0"}))),
       {"node 0", "out of range"}},
      {"too many terms",
       G(View(Expr({"1:s0", "1:s1", "1:", "1:s0*s1", "1:s0*s0", "1:s1*s1",
                    "1:s0*s0*s0", "1:s1*s1*s1", "1:s0*s1*s1", "1:s0*s0*s1",
                    "2:s0", "3:s1", "4:", "5:s0*s1", "6:s0*s0", "7:s1*s1",
                    "8:s0*s0*s0*s0"}))),
       {"node 0", "17 terms", "more than 16"}},
      {"too many symbols in a term",
       G(View(Expr({"1:s0*s0*s0*s0*s0*s0*s0*s0*s0"}))),
       {"node 0", "9 symbols", "more than 8"}},
      {"symbol no input binds",
       G(View(Expr({"8:s0*s1*s2"}))),
       {"node 0", "argument 'size' entry 0", "symbol 's2'",
        "no input has as a dim's size"}},
      {"plain symbol no input binds",
       G(View(R"({"symbol": "s2"}, {"value": -1})")),
       {"node 0", "symbol 's2'", "no input has as a dim's size"}},
      {"compound input size over an unbound symbol",
       G(R"({"op": "aten.sin.default", "args": [{"ref": "z"}], "outputs": ["y"]})",
         "[\"y\"]", Input("z", Expr({"1:s0*s2"}))),
       {"input 1 'z'", "size of dim 0", "symbol 's2'"}},
      {"input size that can be negative",
       G(R"({"op": "aten.sin.default", "args": [{"ref": "z"}], "outputs": ["y"]})",
         "[\"y\"]", Input("z", Expr({"1:s0", "-3:"}))),
       {"input 1 'z'", "size of dim 0", "-3 + s0", "can be negative"}},
      {"stride that can be negative",
       G(R"({"op": "aten.sin.default", "args": [{"ref": "z"}], "outputs": ["y"]})",
         "[\"y\"]",
         Input("z", R"({"symbol": "s0"}, {"value": 2})",
               absl::StrCat(Expr({"1:s1", "-4:"}), R"(, {"value": 1})"))),
       {"input 1 'z'", "stride of dim 0", "can be negative"}},
      {"stride with both forms",
       G(R"({"op": "aten.sin.default", "args": [{"ref": "z"}], "outputs": ["y"]})",
         "[\"y\"]",
         Input("z", R"({"symbol": "s0"})",
               R"({"value": 2, "expr": {"terms": [{"coeff": 1}]}})")),
       {"input 1 'z'", "stride of dim 0", "both"}},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.name);
    auto g = ImportGraph(Parse(c.json));
    ASSERT_FALSE(g.ok()) << c.json;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument)
        << g.status();
    for (const std::string& w : c.words) {
      EXPECT_NE(g.status().message().find(w), std::string::npos)
          << "message lacks \"" << w << "\": " << g.status().message();
    }
  }
}

// An input dim of 384 - s0 is a size only while s0 <= 384: with that
// bound declared (max_value, which the runtime's guards check) it imports;
// without it, it is refused as possibly negative.
TEST(SizeExprImportTest, InputSizesMayUseTheSymbolsMaxValue) {
  auto graph = [](const std::string& s0) {
    return absl::StrCat(
        R"({"inputs": [{"name": "x", "meta": {"dtype": "FLOAT32", "sizes": )",
        R"([{"symbol": "s0"}]}}, {"name": "z", "meta": {"dtype": "FLOAT32", )",
        R"("sizes": [)", Expr({"-1:s0", "384:"}), R"(]}}], "symbols": [)", s0,
        R"(], "nodes": [{"op": "aten.sin.default", "args": [{"ref": "z"}], )",
        R"("outputs": ["y"]}], "outputs": ["y"]})");
  };
  EXPECT_TRUE(
      ImportGraph(Parse(graph(R"({"name": "s0", "max_value": 382})"))).ok());
  EXPECT_TRUE(
      ImportGraph(Parse(graph(R"({"name": "s0", "max_value": 384})"))).ok());
  for (const std::string& s0 :
       {std::string(R"({"name": "s0"})"),
        std::string(R"({"name": "s0", "max_value": 385})")}) {
    auto g = ImportGraph(Parse(graph(s0)));
    ASSERT_FALSE(g.ok()) << s0;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find("can be negative"), std::string::npos)
        << g.status();
  }
}

TEST(SizeExprImportTest, CompoundSizesImportAsPolynomials) {
  auto g = ImportGraph(Parse(
      G(absl::StrCat(
            View(Expr({"1:s1*s0"}) + R"(, {"value": 8})", "flat"), ",",
            View(Expr({"8:s0", "-8:"}) + R"(, {"symbol": "s1"})", "y", "z")),
        R"(["flat", "y"])",
        Input("z",
              absl::StrCat(Expr({"1:s0", "-1:"}), R"(, {"value": 8}, )",
                           R"({"symbol": "s1"})"),
              absl::StrCat(Expr({"8:s1"}), R"(, {"expr": {"terms": []}}, )",
                           R"({"value": 1})")))));
  ASSERT_TRUE(g.ok()) << g.status();
  const auto names = g->SymbolNames();
  EXPECT_EQ(g->type(g->outputs[0]).sizes[0].ToString(names), "s0*s1");
  EXPECT_EQ(g->type(g->inputs[1].value).sizes[0].ToString(names), "-1 + s0");
  EXPECT_EQ(g->inputs[1].strides[0].ToString(names), "8*s1");
  EXPECT_EQ(g->type(g->outputs[1]).sizes[0].ToString(names), "-8 + 8*s0");
}

std::string Key(const std::string& json) {
  auto g = ImportGraph(Parse(json));
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << json;
  if (!g.ok()) return "import failed";
  v1::Target target;
  target.mutable_cpu()->set_triple("x86_64-unknown-linux-gnu");
  return DigestToHex(ComputeGuardKey(*g, target, {}));
}

TEST(SizeExprKeyTest, CanonicalWhateverTheOrderOfFactorsAndTerms) {
  const std::string base =
      Key(G(Full(Expr({"1:s0*s1", "-1:s0"}) + R"(, {"value": 8})")));
  // Factors swapped, terms swapped, a term split in two.
  EXPECT_EQ(Key(G(Full(Expr({"1:s1*s0", "-1:s0"}) + R"(, {"value": 8})"))),
            base);
  EXPECT_EQ(Key(G(Full(Expr({"-1:s0", "1:s0*s1"}) + R"(, {"value": 8})"))),
            base);
  EXPECT_EQ(Key(G(Full(Expr({"3:s1*s0", "-1:s0", "-2:s0*s1"}) +
                       R"(, {"value": 8})"))),
            base);
  // A different polynomial is a different key.
  EXPECT_NE(Key(G(Full(Expr({"1:s0*s1", "-1:s1"}) + R"(, {"value": 8})"))),
            base);
  EXPECT_NE(Key(G(Full(Expr({"1:s0*s0", "-1:s0"}) + R"(, {"value": 8})"))),
            base);
}

TEST(SizeExprKeyTest, TrivialExpressionsAreTheirPlainForms) {
  EXPECT_EQ(Key(G(Full(absl::StrCat(Expr({"1:s0"}), R"(, {"value": 3})")))),
            Key(G(Full(R"({"symbol": "s0"}, {"value": 3})"))));
  EXPECT_EQ(Key(G(Full(absl::StrCat(Expr({"16:"}), R"(, {"value": 3})")))),
            Key(G(Full(R"({"value": 16}, {"value": 3})"))));
  // A product stride said either way.
  const std::string sin =
      R"({"op": "aten.sin.default", "args": [{"ref": "z"}], "outputs": ["y"]})";
  EXPECT_EQ(Key(G(sin, "[\"y\"]",
                  Input("z", R"({"symbol": "s0"}, {"value": 2})",
                        R"({"value": 4, "symbols": ["s1"]}, {"value": 1})"))),
            Key(G(sin, "[\"y\"]",
                  Input("z", R"({"symbol": "s0"}, {"value": 2})",
                        absl::StrCat(Expr({"4:s1"}), R"(, {"value": 1})")))));
}

TEST(SizeExprKeyTest, ExplainShowsThePolynomial) {
  auto g = ImportGraph(
      Parse(G(Full(Expr({"1:s1*s0", "-1:s0"}) + R"(, {"value": 8})"))));
  ASSERT_TRUE(g.ok()) << g.status();
  v1::Target target;
  target.mutable_cpu()->set_triple("x86_64-unknown-linux-gnu");
  std::string graph_text;
  for (const KeyComponent& c : ExplainKey(*g, target, {})) {
    if (c.name == "graph") graph_text = c.canonical;
  }
  EXPECT_NE(graph_text.find("size=ints[-1*s0 + s0*s1, 8]"), std::string::npos)
      << graph_text;
}

// x [s0, s1, 8], y [s0*s1, 8], z [s0, 8] with row stride 8*s1 + 8 (rows of
// a wider buffer), w [8, 8]:
//   a = view(x, [s0*s1, 8]) @ w + y            (a product over s0*s1)
//   b = view(a, [s0, s1, 8])[:, 1:]            ([s0, s1 - 1, 8])
//   r = b + full([s0, s1 - 1, 8], 0.5)
//   q = z * 2
// A graph compiled for this CPU and loaded, with the imported graph the
// reference evaluator runs.
struct CompiledGraph {
  std::unique_ptr<CpuExecutable> exe;
  Graph graph;
};

absl::StatusOr<CompiledGraph> CompileForCpu(const v1::Graph& graph) {
  v1::CompileRequest req;
  *req.mutable_graph() = graph;
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto artifact = Compile(req);
  if (!artifact.ok()) return artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
  if (!exe.ok()) return exe.status();
  auto imported = ImportGraph(graph);
  if (!imported.ok()) return imported.status();
  return CompiledGraph{*std::move(exe), *std::move(imported)};
}

// The executable's outputs for `inputs`, each expected to match the
// reference evaluator's; empty (a failure recorded) when either fails.
std::vector<HostTensor> RunMatchingReference(
    CompiledGraph& c, const std::vector<HostTensor>& inputs, ThreadPool& pool) {
  auto want = EvaluateReference(c.graph, inputs);
  auto got = c.exe->Run(inputs, &pool);
  EXPECT_TRUE(want.ok()) << want.status();
  EXPECT_TRUE(got.ok()) << got.status();
  if (!want.ok() || !got.ok()) return {};
  EXPECT_EQ(got->size(), want->size());
  for (size_t o = 0; o < want->size() && o < got->size(); ++o) {
    EXPECT_EQ(Compare((*got)[o], (*want)[o]), "") << "output " << o;
  }
  return *std::move(got);
}

TEST(SizeExprCompileTest, CompoundSizesMatchReferenceAtSeveralSizes) {
  auto compiled = CompileForCpu(Parse(G(
      absl::StrCat(
          View(Expr({"1:s0*s1"}) + R"(, {"value": 8})", "xf"), ",",
          R"({"op": "aten.mm.default", "args": [{"ref": "xf"}, {"ref": "w"}],)"
          R"( "outputs": ["m"]},)",
          R"({"op": "aten.add.Tensor", "args": [{"ref": "m"}, {"ref": "y"}],)"
          R"( "outputs": ["a"]},)",
          View(R"({"symbol": "s0"}, {"symbol": "s1"}, {"value": 8})", "a3",
               "a"),
          ",",
          R"({"op": "aten.slice.Tensor", "args": [{"ref": "a3"}, {"i": 1},)"
          R"( {"i": 1}], "outputs": ["b"]},)",
          R"({"op": "aten.full.default", "args": [{"dims": {"values": [)"
          R"({"symbol": "s0"}, )",
          Expr({"1:s1", "-1:"}),
          R"(, {"value": 8}]}}, {"f": 0.5}], "outputs": ["f"]},)",
          R"({"op": "aten.add.Tensor", "args": [{"ref": "b"}, {"ref": "f"}],)"
          R"( "outputs": ["r"]},)",
          R"({"op": "aten.mul.Tensor", "args": [{"ref": "z"}, {"f": 2.0}],)"
          R"( "outputs": ["q"]})"),
      R"(["r", "q"])",
      absl::StrCat(
          Input("y", absl::StrCat(Expr({"1:s0*s1"}), R"(, {"value": 8})")),
          Input("z", R"({"symbol": "s0"}, {"value": 8})",
                absl::StrCat(Expr({"8:s1", "8:"}), R"(, {"value": 1})")),
          Input("w", R"({"value": 8}, {"value": 8})")))));
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const Graph& graph = compiled->graph;
  CpuExecutable& exe = *compiled->exe;
  std::mt19937_64 rng(7);
  ThreadPool pool(2);
  for (auto [s0, s1] : {std::pair<int64_t, int64_t>{2, 3}, {5, 7}, {3, 17}}) {
    SCOPED_TRACE(absl::StrCat("s0=", s0, " s1=", s1));
    const std::vector<HostTensor> inputs =
        RandomInputs(graph, {s0, s1, 2}, rng);
    const std::vector<HostTensor> got =
        RunMatchingReference(*compiled, inputs, pool);
    ASSERT_FALSE(got.empty());
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].sizes(), (std::vector<int64_t>{s0, s1 - 1, 8}));
  }
  // A compound input size that disagrees with its symbols is refused.
  std::vector<HostTensor> bad = RandomInputs(graph, {3, 4, 2}, rng);
  bad[1] = RandomInputs(graph, {3, 5, 2}, rng)[1];
  EXPECT_FALSE(exe.Run(bad, &pool).ok());
}

// Slices of a symbolic dim whose bounds are polynomials (x[:, :-1],
// x[:, 1:-1], x[:, -2:], x[:, :2]) and slice_scatter of them (their
// backward), against the reference at several sizes; bounds that would be
// clamped for some size are refused with the reason.
TEST(SizeExprCompileTest, SlicesOfSymbolicDimsMatchReference) {
  auto slice = [](const std::string& out, const std::string& start,
                  const std::string& end) {
    return absl::StrCat(
        R"({"op": "aten.slice.Tensor", "args": [{"ref": "x"}, {"i": 1}, )",
        start, ", ", end, R"(], "outputs": [")", out, R"("]})");
  };
  auto scatter = [](const std::string& out, const std::string& src,
                    const std::string& start, const std::string& end) {
    return absl::StrCat(
        R"({"op": "aten.slice_scatter.default", "args": [{"ref": "x"}, )",
        R"({"ref": ")", src, R"("}, {"i": 1}, )", start, ", ", end,
        R"(], "outputs": [")", out, R"("]})");
  };
  auto compiled = CompileForCpu(Parse(
      G(absl::StrCat(
            slice("a", R"({"i": 0})", R"({"i": -1})"), ",",
            slice("b", R"({"i": 1})", R"({"i": -1})"), ",",
            slice("c", R"({"i": -2})", R"({"none": {}})"), ",",
            slice("d", R"({"none": {}})", R"({"i": 2})"), ",",
            R"({"op": "aten.mul.Tensor", "args": [{"ref": "a"}, {"f": 3.0}],)"
            R"( "outputs": ["a3"]},)",
            scatter("e", "a3", R"({"i": 1})", R"({"none": {}})"), ",",
            scatter("f", "c", R"({"i": -2})", R"({"none": {}})")),
        R"(["a", "b", "c", "d", "e", "f"])")));
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const Graph& graph = compiled->graph;
  const auto names = graph.SymbolNames();
  EXPECT_EQ(graph.type(graph.outputs[0]).sizes[1].ToString(names), "-1 + s1");
  EXPECT_EQ(graph.type(graph.outputs[1]).sizes[1].ToString(names), "-2 + s1");
  EXPECT_EQ(graph.type(graph.outputs[2]).sizes[1].ToString(names), "2");
  std::mt19937_64 rng(11);
  ThreadPool pool(2);
  for (auto [s0, s1] : {std::pair<int64_t, int64_t>{2, 2}, {3, 5}, {4, 19}}) {
    SCOPED_TRACE(absl::StrCat("s0=", s0, " s1=", s1));
    const std::vector<HostTensor> inputs =
        RandomInputs(graph, {s0, s1, 2}, rng);
    const std::vector<HostTensor> got =
        RunMatchingReference(*compiled, inputs, pool);
    ASSERT_FALSE(got.empty());
  }
  // [2:-1] is empty at s1 = 2 where PyTorch clamps; [::2] has a ceiling.
  for (const std::string& bad :
       {slice("y", R"({"i": 2})", R"({"i": -1})"),
        slice("y", R"({"i": 3})", R"({"none": {}})"),
        absl::StrCat(R"({"op": "aten.slice.Tensor", "args": [{"ref": "x"}, )",
                     R"({"i": 1}, {"i": 0}, {"none": {}}, {"i": 2}], )",
                     R"("outputs": ["y"]})")}) {
    auto g = ImportGraph(Parse(G(bad)));
    ASSERT_FALSE(g.ok()) << bad;
    EXPECT_NE(g.status().message().find("slice of symbolic dim 1"),
              std::string::npos)
        << g.status();
  }
}

// arange with a symbolic end (torch.arange(seq_len) under dynamic shapes):
// end - start elements, int64, added to x's rows; refused with the reason
// for a step other than 1 or a length that may be negative.
TEST(SizeExprCompileTest, ArangeToASymbolicEndMatchesReference) {
  auto arange = [](const std::string& op, const std::string& args) {
    return absl::StrCat(R"({"op": "aten.arange.)", op, R"(", "args": [)", args,
                        R"(], "outputs": ["r"]})");
  };
  const std::string end_s1 = R"({"dims": {"values": [{"symbol": "s1"}]}})";
  auto compiled = CompileForCpu(Parse(G(
      absl::StrCat(
          arange("start", absl::StrCat(R"({"i": 1}, )", end_s1)), ",",
          R"({"op": "aten.arange.default", "args": [)", end_s1,
          R"(], "outputs": ["q"]},)",
          R"({"op": "aten.unsqueeze.default", "args": [{"ref": "q"}, {"i": 1}],)"
          R"( "outputs": ["q1"]},)",
          R"({"op": "aten.add.Tensor", "args": [{"ref": "x"}, {"ref": "q1"}],)"
          R"( "outputs": ["y"]})"),
      R"(["r", "y"])")));
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const Graph& graph = compiled->graph;
  const auto names = graph.SymbolNames();
  EXPECT_EQ(graph.type(graph.outputs[0]).sizes[0].ToString(names), "-1 + s1");
  EXPECT_EQ(graph.type(graph.outputs[0]).dtype, DType::kInt64);
  std::mt19937_64 rng(13);
  ThreadPool pool(2);
  for (auto [s0, s1] : {std::pair<int64_t, int64_t>{2, 2}, {3, 9}}) {
    SCOPED_TRACE(absl::StrCat("s0=", s0, " s1=", s1));
    const std::vector<HostTensor> inputs =
        RandomInputs(graph, {s0, s1, 2}, rng);
    const std::vector<HostTensor> got =
        RunMatchingReference(*compiled, inputs, pool);
    ASSERT_FALSE(got.empty());
    ASSERT_EQ(got[0].sizes(), (std::vector<int64_t>{s1 - 1}));
    EXPECT_EQ(got[0].GetDoubleAt(0), 1.0);
    EXPECT_EQ(got[0].GetDoubleAt(s1 - 2), static_cast<double>(s1 - 1));
  }
  for (const auto& [bad, why] :
       std::vector<std::pair<std::string, std::string>>{
           {arange("start_step",
                   absl::StrCat(R"({"i": 0}, )", end_s1, R"(, {"i": 2})")),
            "needs an int start and step 1"},
           {arange("start", absl::StrCat(R"({"i": 3}, )", end_s1)),
            "may be negative"},
           {arange("start", absl::StrCat(R"({"f": 0.5}, )", end_s1)),
            "needs an int start and step 1"},
           {arange("default",
                   R"({"dims": {"values": [{"symbol": "s0"}, {"value": 1}]}})"),
            "a SymInt is a size list of one entry"}}) {
    auto g = ImportGraph(Parse(G(bad, R"(["r"])")));
    ASSERT_FALSE(g.ok()) << bad;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(why), std::string::npos) << g.status();
  }
}

// A static buffer sliced to a symbolic end (BERT's position_ids[:, :seq]):
// compiled when the symbol's max_value keeps the end inside the dim, and
// matching the reference; refused with the reason otherwise.
TEST(SizeExprCompileTest, SliceOfAStaticDimToASymbolicEnd) {
  auto graph_json = [](int64_t max_value, int64_t start) {
    return absl::StrCat(
        R"({"inputs": [{"name": "x", "meta": {"dtype": "FLOAT32", "sizes": )",
        R"([{"symbol": "s0"}, {"symbol": "s1"}]}},)",
        R"( {"name": "t", "meta": {"dtype": "FLOAT32", "sizes": )",
        R"([{"value": 1}, {"value": 64}]}}],)",
        R"( "symbols": [{"name": "s0"}, {"name": "s1", "max_value": )",
        max_value, R"(}], "nodes": [)",
        R"({"op": "aten.slice.Tensor", "args": [{"ref": "t"}, {"i": 1}, )",
        R"({"i": )", start,
        R"(}, {"dims": {"values": [{"symbol": "s1"}]}}], "outputs": ["p"]},)",
        R"({"op": "aten.add.Tensor", "args": [{"ref": "x"}, {"ref": "p"}],)",
        R"( "outputs": ["y"]}], "outputs": ["y"]})");
  };
  auto compiled = CompileForCpu(Parse(graph_json(64, 0)));
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const Graph& graph = compiled->graph;
  CpuExecutable& exe = *compiled->exe;
  std::mt19937_64 rng(17);
  ThreadPool pool(2);
  for (auto [s0, s1] : {std::pair<int64_t, int64_t>{2, 5}, {3, 64}}) {
    SCOPED_TRACE(absl::StrCat("s0=", s0, " s1=", s1));
    const std::vector<HostTensor> inputs = RandomInputs(graph, {s0, s1}, rng);
    const std::vector<HostTensor> got =
        RunMatchingReference(*compiled, inputs, pool);
    ASSERT_FALSE(got.empty());
    // y[i, j] = x[i, j] + t[0, j]: the buffer's first s1 entries.
    EXPECT_FLOAT_EQ(
        got[0].GetDoubleAt(s1 - 1),
        inputs[0].GetDoubleAt(s1 - 1) + inputs[1].GetDoubleAt(s1 - 1));
  }
  // Past the symbol's bound the guard refuses the call.
  std::vector<HostTensor> past = RandomInputs(graph, {2, 65}, rng);
  EXPECT_FALSE(exe.Run(past, &pool).ok());
  for (const auto& [json, why] :
       std::vector<std::pair<std::string, std::string>>{
           {graph_json(0, 0), "may pass the dim's size 64"},
           {graph_json(65, 0), "may pass the dim's size 64"},
           {graph_json(64, 3), "may be below its start"},
           {graph_json(64, -1), "needs a start >= 0 and step 1"}}) {
    auto g = ImportGraph(Parse(json));
    ASSERT_FALSE(g.ok()) << json;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(why), std::string::npos) << g.status();
  }
}

TEST(SymExprTest, NonNegativeWithinUsesTheSymbolsBounds) {
  const SymExpr s0 = SymExpr::Symbol(0), s1 = SymExpr::Symbol(1);
  EXPECT_TRUE((SymExpr(512) - s0).NonNegativeWithin(2, {512, 0}));
  EXPECT_FALSE((SymExpr(512) - s0).NonNegativeWithin(2, {513, 0}));
  EXPECT_FALSE((SymExpr(512) - s0).NonNegativeWithin(2, {0, 0}));
  EXPECT_FALSE((SymExpr(512) - s1).NonNegativeWithin(2, {512}));
  EXPECT_TRUE((SymExpr(100) - s0 * s1).NonNegativeWithin(2, {10, 10}));
  EXPECT_FALSE((SymExpr(99) - s0 * s1).NonNegativeWithin(2, {10, 10}));
  // A factor every term has is divided out: s1 * (384 - s0), s1 unbounded.
  EXPECT_TRUE((384 * s1 - s1 * s0).NonNegativeWithin(2, {384, 0}));
  EXPECT_FALSE((384 * s1 - s1 * s0).NonNegativeWithin(2, {385, 0}));
  EXPECT_FALSE((384 * s1 - s1 * s0).NonNegativeWithin(2, {0, 0}));
  EXPECT_TRUE((s1 * s1 * 8 - s1 * s1 * s0).NonNegativeWithin(2, {8, 0}));
  EXPECT_TRUE((s0 - SymExpr(2)).NonNegativeWithin(2, {}));  // from the min
}

}  // namespace
}  // namespace kiln::testing
