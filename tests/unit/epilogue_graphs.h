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
      "{",
      symbols.empty() ? "" : absl::StrCat(R"("symbols": [)", symbols, "], "),
      R"("inputs": [)", inputs, R"(], "nodes": [)", nodes, R"(], "outputs": [)",
      outputs, "]}");
  v1::Graph g;
  if (!google::protobuf::util::JsonStringToMessage(json, &g).ok()) {
    return v1::Graph();  // the test's import then says why
  }
  return g;
}

// The backward of a linear layer with a bias as AOTAutograd hands it over:
// x [tokens, k] (or [batch, tokens, k], read as [batch * tokens, k]), w
// [n, k] and the output gradient gy of x's leading shape and n; outputs
// grad_x = gy @ w, grad_w = (x^T @ gy)^T and grad_b = gy summed over every
// dim but the last. The bias gradient can be the weight gradient's
// epilogue (compiler/gemm_epilogue.h: BGRAD_B).
struct LinearBackwardCase {
  std::string dtype = "FLOAT32";
  int64_t batch = 0;  // > 0: 3-D activations [batch, tokens, k]
  int64_t tokens = 37, k = 29, n = 45;
  bool symbolic_tokens = false;  // tokens is a symbol (2..tokens)
  // grad_w as gy^T @ x (AOTAutograd's form: the bias gradient then sums
  // A's rows) instead of (x^T @ gy)^T.
  bool gy_transposed_product = false;
  // grad_b sums only the first tokens - 1 rows (2-D, static tokens): no
  // operand's sum.
  bool partial_sum = false;
  // The sum before the products, as AOTAutograd orders them.
  bool sum_first = false;
};

inline v1::Graph LinearBackwardGraph(const LinearBackwardCase& c) {
  const std::string t = c.symbolic_tokens
                            ? std::string(R"({"symbol": "st"})")
                            : absl::StrCat(R"({"value": )", c.tokens, "}");
  const std::string lead =
      c.batch > 0 ? absl::StrCat(R"({"value": )", c.batch, "}, ", t) : t;
  auto meta = [&](const std::string& sizes) {
    return absl::StrCat(R"({"dtype": ")", c.dtype,
                        R"(", "device": "CUDA", "sizes": [)", sizes, "]}");
  };
  auto value = [](int64_t v) { return absl::StrCat(R"({"value": )", v, "}"); };
  std::string inputs = absl::StrCat(
      R"({"name": "x", "meta": )", meta(absl::StrCat(lead, ", ", value(c.k))),
      "}, ", R"({"name": "w", "meta": )",
      meta(absl::StrCat(value(c.n), ", ", value(c.k))), "}, ",
      R"({"name": "gy", "meta": )", meta(absl::StrCat(lead, ", ", value(c.n))),
      "}");
  std::string nodes;
  std::string x2 = "x", gy2 = "gy";
  if (c.batch > 0) {
    x2 = "x2";
    gy2 = "gy2";
    absl::StrAppend(&nodes,
                    R"({"op": "aten.view.default", "args": [{"ref": "x"}, )",
                    R"({"dims": {"values": [{"value": -1}, )", value(c.k),
                    R"(]}}], "outputs": ["x2"]}, )",
                    R"({"op": "aten.view.default", "args": [{"ref": "gy"}, )",
                    R"({"dims": {"values": [{"value": -1}, )", value(c.n),
                    R"(]}}], "outputs": ["gy2"]}, )");
  }
  absl::StrAppend(&nodes, R"({"op": "aten.mm.default", "args": [{"ref": ")",
                  gy2, R"("}, {"ref": "w"}], "outputs": ["gx2"]}, )");
  if (c.gy_transposed_product) {
    absl::StrAppend(
        &nodes, R"({"op": "aten.t.default", "args": [{"ref": ")", gy2,
        R"("}], "outputs": ["gyt"]}, )",
        R"({"op": "aten.mm.default", "args": [{"ref": "gyt"}, {"ref": ")", x2,
        R"("}], "outputs": ["gw"]}, )");
  } else {
    absl::StrAppend(
        &nodes, R"({"op": "aten.t.default", "args": [{"ref": ")", x2,
        R"("}], "outputs": ["xt"]}, )",
        R"({"op": "aten.mm.default", "args": [{"ref": "xt"}, {"ref": ")", gy2,
        R"("}], "outputs": ["gwt"]}, )",
        R"({"op": "aten.t.default", "args": [{"ref": "gwt"}], )",
        R"("outputs": ["gw"]}, )");
  }
  std::string sum_nodes;
  std::string summed = "gy";
  if (c.partial_sum) {
    summed = "gys";
    absl::StrAppend(&sum_nodes,
                    R"({"op": "aten.slice.Tensor", "args": [{"ref": "gy"}, )",
                    R"({"i": 0}, {"i": 0}, {"i": )", c.tokens - 1,
                    R"(}, {"i": 1}], "outputs": ["gys"]}, )");
  }
  absl::StrAppend(
      &sum_nodes, R"({"op": "aten.sum.dim_IntList", "args": [{"ref": ")",
      summed, R"("}, )",
      c.batch > 0 ? R"({"ints": {"values": [0, 1]}}, )"
                  : R"({"ints": {"values": [0]}}, )",
      R"({"b": true}], "outputs": ["gb1"]}, )",
      R"({"op": "aten.view.default", "args": [{"ref": "gb1"}, )",
      R"({"dims": {"values": [)", value(c.n), R"(]}}], "outputs": ["gb"]})");
  nodes = c.sum_first
              ? absl::StrCat(sum_nodes, ", ", nodes.substr(0, nodes.size() - 2))
              : absl::StrCat(nodes, sum_nodes);
  std::string outputs = R"("gx2", "gw", "gb")";
  const std::string symbols =
      c.symbolic_tokens
          ? absl::StrCat(R"("symbols": [{"name": "st", "maxValue": )", c.tokens,
                         "}], ")
          : "";
  const std::string json =
      absl::StrCat("{", symbols, R"("inputs": [)", inputs, R"(], "nodes": [)",
                   nodes, R"(], "outputs": [)", outputs, "]}");
  v1::Graph g;
  if (!google::protobuf::util::JsonStringToMessage(json, &g).ok()) {
    return v1::Graph();  // the test's import then says why
  }
  return g;
}

}  // namespace kiln::testing

#endif  // KILN_TESTS_UNIT_EPILOGUE_GRAPHS_H_
