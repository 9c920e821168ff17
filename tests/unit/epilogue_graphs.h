// Graphs of a linear layer as AOTAutograd hands them over, for the tests of
// cuBLASLt epilogues (compiler/gemm_epilogue.h): y = act(x @ w.t() + b),
// or x @ w.t() without a bias, in one dtype.
#ifndef KILN_TESTS_UNIT_EPILOGUE_GRAPHS_H_
#define KILN_TESTS_UNIT_EPILOGUE_GRAPHS_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::testing {

struct LinearCase {
  std::string dtype = "FLOAT32";  // the wire name: FLOAT32, FLOAT16, BFLOAT16
  int64_t m = 37, k = 29, n = 45;
  bool bias = true;
  bool bias_row = false;       // the bias as [1, n] instead of [n]
  std::string activation;      // "", "relu", "gelu_tanh", "gelu"
  bool sum_is_output = false;  // the pre-activation is a graph output too
  bool symbolic_m = false;     // m is a symbol (2..m)
  bool symbolic_k = false;     // k is a symbol
};

// x [m, k], w [n, k] (read transposed in place), b [n] or [1, n].
inline v1::Graph LinearGraph(const LinearCase& c) {
  auto size = [](bool symbolic, const char* name, int64_t v) {
    return symbolic ? absl::StrCat(R"({"symbol": ")", name, R"("})")
                    : absl::StrCat(R"({"value": )", v, "}");
  };
  auto meta = [&](const std::string& sizes) {
    return absl::StrCat(R"({"dtype": ")", c.dtype,
                        R"(", "device": "CUDA", "sizes": [)", sizes, "]}");
  };
  const std::string m = size(c.symbolic_m, "sm", c.m);
  const std::string k = size(c.symbolic_k, "sk", c.k);
  const std::string n = size(false, "", c.n);
  std::string symbols;
  if (c.symbolic_m)
    absl::StrAppend(&symbols, R"({"name": "sm", "maxValue": )", c.m, "}");
  if (c.symbolic_k) {
    absl::StrAppend(&symbols, symbols.empty() ? "" : ", ",
                    R"({"name": "sk", "maxValue": )", c.k, "}");
  }
  std::string inputs = absl::StrCat(
      R"({"name": "x", "meta": )", meta(absl::StrCat(m, ", ", k)), "}, ",
      R"({"name": "w", "meta": )", meta(absl::StrCat(n, ", ", k)), "}");
  if (c.bias) {
    absl::StrAppend(&inputs, R"(, {"name": "b", "meta": )",
                    meta(c.bias_row ? absl::StrCat(R"({"value": 1}, )", n) : n),
                    "}");
  }
  std::string nodes =
      R"({"op": "aten.t.default", "args": [{"ref": "w"}], "outputs": ["wt"]})";
  if (c.bias) {
    absl::StrAppend(&nodes, R"(, {"op": "aten.addmm.default", "args": )",
                    R"([{"ref": "b"}, {"ref": "x"}, {"ref": "wt"}], )",
                    R"("outputs": ["s"]})");
  } else {
    absl::StrAppend(&nodes, R"(, {"op": "aten.mm.default", "args": )",
                    R"([{"ref": "x"}, {"ref": "wt"}], "outputs": ["s"]})");
  }
  std::string outputs;
  if (c.activation.empty()) {
    outputs = R"("s")";
  } else {
    if (c.activation == "relu") {
      absl::StrAppend(&nodes, R"(, {"op": "aten.relu.default", )",
                      R"("args": [{"ref": "s"}], "outputs": ["y"]})");
    } else {
      absl::StrAppend(
          &nodes, R"(, {"op": "aten.gelu.default", "args": [{"ref": "s"}, )",
          R"({"name": "approximate", "str": ")",
          c.activation == "gelu_tanh" ? "tanh" : "none",
          R"("}], "outputs": ["y"]})");
    }
    outputs = c.sum_is_output ? R"("y", "s")" : R"("y")";
  }
  const std::string json = absl::StrCat(
      "{", symbols.empty() ? "" : absl::StrCat(R"("symbols": [)", symbols, "], "),
      R"("inputs": [)", inputs, R"(], "nodes": [)", nodes,
      R"(], "outputs": [)", outputs, "]}");
  v1::Graph g;
  if (!google::protobuf::util::JsonStringToMessage(json, &g).ok()) {
    return v1::Graph();  // the test's import then says why
  }
  return g;
}

}  // namespace kiln::testing

#endif  // KILN_TESTS_UNIT_EPILOGUE_GRAPHS_H_
