#include "graph/guard_key.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "graph/op_signature.h"

namespace kiln {
namespace {

// Bumped whenever the canonical encoding below changes meaning, so keys of
// an older encoding can never collide with keys of a newer one.
constexpr absl::string_view kFormat = "kiln-request-key-v1";

// Symbols whose canonical number is not known yet.
constexpr int kUnnumbered = -1;

// Canonical symbol numbering: first appearance in a canonical walk of the
// graph. Renaming symbols or reordering their declarations never changes it.
class SymbolNumbering {
 public:
  explicit SymbolNumbering(int num_symbols)
      : canonical_(num_symbols, kUnnumbered) {}

  void Visit(const SymExpr& e) {
    for (const SymExpr::Term& t : e.terms()) {
      for (int s : t.symbols) {
        if (s < 0 || s >= static_cast<int>(canonical_.size())) continue;
        if (canonical_[s] == kUnnumbered) {
          canonical_[s] = static_cast<int>(order_.size());
          order_.push_back(s);
        }
      }
    }
  }

  // Canonical number of graph symbol `s`, or kUnnumbered.
  int Number(int s) const {
    if (s < 0 || s >= static_cast<int>(canonical_.size())) return kUnnumbered;
    return canonical_[s];
  }
  // Graph symbol ids in canonical order.
  const std::vector<int>& order() const { return order_; }

 private:
  std::vector<int> canonical_;
  std::vector<int> order_;
};

// `e` with its symbols renamed to canonical numbers. SymExpr's arithmetic
// re-sorts the terms, so the result (and its ToString) depends only on the
// canonical numbering, not on the graph's declaration order.
SymExpr Renumber(const SymExpr& e, const SymbolNumbering& numbering) {
  // Fast path (the common case: static sizes, symbols already in canonical
  // order): nothing to rename, and SymExpr arithmetic allocates.
  bool unchanged = true;
  for (const SymExpr::Term& t : e.terms()) {
    for (int s : t.symbols) unchanged = unchanged && numbering.Number(s) == s;
  }
  if (unchanged) return e;
  SymExpr result;
  for (const SymExpr::Term& t : e.terms()) {
    SymExpr term(t.coeff);
    for (int s : t.symbols) {
      const int n = numbering.Number(s);
      // Every symbol of a validated graph is numbered before the final
      // encoding; a stray one maps far away rather than onto a real one.
      term = term * SymExpr::Symbol(n == kUnnumbered ? 1000000 + s : n);
    }
    result = result + term;
  }
  return result;
}

std::string ExprText(const SymExpr& e, const SymbolNumbering& numbering) {
  // Fast paths for what nearly every size is (SymExpr::ToString builds a
  // vector of strings); they print exactly as ToString would.
  if (std::optional<int64_t> c = e.AsConstant()) return absl::StrCat(*c);
  if (std::optional<int> s = e.AsSymbol()) {
    const int n = numbering.Number(*s);
    if (n != kUnnumbered) return absl::StrCat("s", n);
  }
  return Renumber(e, numbering).ToString();
}

std::string ExprListText(const std::vector<SymExpr>& list,
                         const SymbolNumbering& numbering) {
  return absl::StrCat("[",
                      absl::StrJoin(list, ", ",
                                    [&](std::string* out, const SymExpr& e) {
                                      out->append(ExprText(e, numbering));
                                    }),
                      "]");
}

// The structural-hash form of an expression, before all symbols have
// canonical numbers: unnumbered symbols print as their declared facts
// (the only thing about them that does not depend on names or declaration
// order), and terms are sorted as text so their order does not depend on
// symbol ids either.
std::string PartialExprText(const SymExpr& e, const SymbolNumbering& numbering,
                            const std::vector<SymbolInfo>& symbols) {
  std::vector<std::string> terms;
  for (const SymExpr::Term& t : e.terms()) {
    std::vector<std::string> factors;
    for (int s : t.symbols) {
      const int n = numbering.Number(s);
      if (n != kUnnumbered) {
        factors.push_back(absl::StrCat("s", n));
      } else if (s >= 0 && s < static_cast<int>(symbols.size())) {
        factors.push_back(absl::StrCat("u(", symbols[s].max_value, ",",
                                       symbols[s].multiple_of, ")"));
      } else {
        factors.push_back("u(?)");
      }
    }
    std::sort(factors.begin(), factors.end());
    terms.push_back(absl::StrCat(t.coeff, "*", absl::StrJoin(factors, "*")));
  }
  std::sort(terms.begin(), terms.end());
  return absl::StrCat("(", absl::StrJoin(terms, "+"), ")");
}

// Doubles are encoded by their bits: the key must tell 0.1 from the next
// double and -0.0 from 0.0, which no decimal rendering guarantees. The
// decimal part is only for people reading `kilnctl explain`.
std::string FloatText(double f) {
  uint64_t bits = 0;
  static_assert(sizeof(bits) == sizeof(f));
  std::memcpy(&bits, &f, sizeof(bits));
  return absl::StrCat("f:", f, "/0x", absl::Hex(bits, absl::kZeroPad16));
}

// One argument. `ref` renders a tensor reference; the rest is the same for
// the structural hash and the final encoding except for symbol text.
std::string AttrText(const Attr& a,
                     const std::function<std::string(ValueId)>& ref,
                     const std::function<std::string(const SymExpr&)>& expr) {
  switch (a.kind) {
    case Attr::Kind::kNone:
      return "none";
    case Attr::Kind::kTensor:
      return ref(a.tensor);
    case Attr::Kind::kInt:
      return absl::StrCat("i:", a.i);
    case Attr::Kind::kFloat:
      return FloatText(a.f);
    case Attr::Kind::kBool:
      return a.b ? "b:true" : "b:false";
    case Attr::Kind::kInts:
      return absl::StrCat(
          "ints[",
          absl::StrJoin(a.ints, ", ",
                        [&](std::string* out, const SymExpr& e) {
                          out->append(expr(e));
                        }),
          "]");
    case Attr::Kind::kTensors:
      return absl::StrCat("tensors[",
                          absl::StrJoin(a.tensors, ", ",
                                        [&](std::string* out, ValueId v) {
                                          out->append(ref(v));
                                        }),
                          "]");
    case Attr::Kind::kDType:
      return absl::StrCat("dtype:", DTypeName(a.dtype));
    case Attr::Kind::kString:
      // Escaped and quoted so no string can imitate the surrounding syntax.
      return absl::StrCat("s:\"", absl::CEscape(a.str), "\"");
  }
  return "?";
}

// A node's arguments, named by the op's schema for people reading `kilnctl
// explain` (the op name already fixes the schema, so names add no meaning).
std::string ArgsText(const Node& node,
                     const std::function<std::string(ValueId)>& ref,
                     const std::function<std::string(const SymExpr&)>& expr) {
  std::string out;
  for (size_t i = 0; i < node.args.size(); ++i) {
    if (i > 0) out.append(", ");
    if (node.op != nullptr && i < node.op->schema.size()) {
      absl::StrAppend(&out, node.op->schema[i].name, "=");
    }
    out.append(AttrText(node.args[i], ref, expr));
  }
  return out;
}

std::string OpName(const Node& node) {
  return node.op != nullptr ? node.op->name : "<no op>";
}

// Calls f(value) for every tensor a node reads, in argument order, with the
// argument position and the position inside a Tensor[] (0 for a Tensor).
template <typename F>
void ForEachTensorArg(const Node& node, F f) {
  for (int i = 0; i < static_cast<int>(node.args.size()); ++i) {
    const Attr& a = node.args[i];
    if (a.kind == Attr::Kind::kTensor) f(a.tensor, i, 0);
    if (a.kind == Attr::Kind::kTensors) {
      for (int j = 0; j < static_cast<int>(a.tensors.size()); ++j) {
        f(a.tensors[j], i, j);
      }
    }
  }
}

// A digest inside text that is only hashed, never shown: its raw 32 bytes
// (fixed length, so it cannot run into what follows).
absl::string_view DigestBytes(const Sha256Digest& d) {
  return absl::string_view(reinterpret_cast<const char*>(d.data()), d.size());
}

// Everything the canonical graph needs, computed once for ExplainKey.
class Canonicalizer {
 public:
  explicit Canonicalizer(const Graph& graph)
      : graph_(graph),
        numbering_(static_cast<int>(graph.symbols.size())),
        input_position_(graph.values.size(), -1) {
    for (int i = 0; i < static_cast<int>(graph.inputs.size()); ++i) {
      const ValueId v = graph.inputs[i].value;
      if (ValidValue(v) && input_position_[v] < 0) input_position_[v] = i;
    }
  }

  void Run() {
    NumberInputSymbols();
    const std::vector<int> topo = TopologicalOrder();
    ComputeForwardHashes(topo);
    ComputeBackwardHashes(topo);
    ComputeCanonicalOrder();
    NumberRemainingSymbols();
  }

  const SymbolNumbering& numbering() const { return numbering_; }

  std::string InputText(int i) const {
    const GraphInput& in = graph_.inputs[i];
    if (!ValidValue(in.value)) return absl::StrCat("input ", i, ": invalid");
    const TensorType& t = graph_.type(in.value);
    std::vector<SymExpr> strides = in.strides;
    if (strides.size() != t.sizes.size()) strides = ContiguousStrides(t.sizes);
    // Strides that never move to another element do not change the code:
    // a dim of static size 1 is only ever indexed at 0, and a tensor with a
    // static 0 size is never read at all.
    bool empty = false;
    for (const SymExpr& s : t.sizes) {
      if (s.AsConstant() == 0) empty = true;
    }
    for (size_t d = 0; d < strides.size(); ++d) {
      if (empty || t.sizes[d].AsConstant() == 1) strides[d] = SymExpr(0);
    }
    return absl::StrCat("input ", i, ": ", DTypeName(t.dtype), " rank ",
                        t.rank(), " sizes ", ExprListText(t.sizes, numbering_),
                        " strides ", ExprListText(strides, numbering_), " ",
                        in.alignment >= 16 ? "align16" : "align<16");
  }

  std::string SymbolsText() const {
    std::string out = absl::StrCat("symbols ", numbering_.order().size(), "\n");
    for (size_t n = 0; n < numbering_.order().size(); ++n) {
      const SymbolInfo& s = graph_.symbols[numbering_.order()[n]];
      // 0 and 1 both mean "nothing known" on the wire.
      const int64_t multiple = s.multiple_of <= 1 ? 1 : s.multiple_of;
      absl::StrAppend(
          &out, "s", n, ": min ", kMinSymbolValue, " max ",
          s.max_value <= 0 ? std::string("inf") : absl::StrCat(s.max_value),
          " multiple_of ", multiple, "\n");
    }
    return out;
  }

  std::string GraphText() const {
    auto ref = [&](ValueId v) -> std::string {
      if (!ValidValue(v) || canonical_value_[v] < 0) return "%?";
      return absl::StrCat("%", canonical_value_[v]);
    };
    auto expr = [&](const SymExpr& e) { return ExprText(e, numbering_); };
    auto type = [&](ValueId v) -> std::string {
      if (!ValidValue(v)) return "?";
      const TensorType& t = graph_.type(v);
      return absl::StrCat(DTypeName(t.dtype),
                          ExprListText(t.sizes, numbering_));
    };

    std::string out = absl::StrCat("inputs ", graph_.inputs.size(), "\n");
    for (size_t i = 0; i < graph_.inputs.size(); ++i) {
      absl::StrAppend(&out, "%", i, " = input ", i, "\n");
    }
    for (int n : order_) {
      const Node& node = graph_.nodes[n];
      absl::StrAppend(
          &out,
          absl::StrJoin(node.outputs, ", ",
                        [&](std::string* o, ValueId v) { o->append(ref(v)); }),
          " = ", OpName(node), "(", ArgsText(node, ref, expr), ") : ",
          absl::StrJoin(node.outputs, ", ",
                        [&](std::string* o, ValueId v) { o->append(type(v)); }),
          "\n");
    }
    absl::StrAppend(
        &out, "outputs ",
        absl::StrJoin(graph_.outputs, ", ",
                      [&](std::string* o, ValueId v) { o->append(ref(v)); }),
        "\n");
    // Only when there are any: keys of graphs without stay as they were.
    if (!graph_.input_writes.empty()) {
      absl::StrAppend(&out, "input writes ",
                      absl::StrJoin(graph_.input_writes, ", ",
                                    [](std::string* o, const InputWrite& w) {
                                      absl::StrAppend(o, "output ", w.output,
                                                      " -> input ", w.input);
                                    }),
                      "\n");
    }
    return out;
  }

 private:
  bool ValidValue(ValueId v) const {
    return v >= 0 && v < static_cast<ValueId>(graph_.values.size());
  }
  int Producer(ValueId v) const {
    if (!ValidValue(v)) return -1;
    const int p = graph_.values[v].producer;
    return p >= 0 && p < static_cast<int>(graph_.nodes.size()) ? p : -1;
  }

  // Inputs are positional, so the symbols of their sizes (then strides) are
  // numbered first; node arguments can then be hashed with those numbers.
  void NumberInputSymbols() {
    for (const GraphInput& in : graph_.inputs) {
      if (!ValidValue(in.value)) continue;
      for (const SymExpr& s : graph_.type(in.value).sizes) numbering_.Visit(s);
    }
    for (const GraphInput& in : graph_.inputs) {
      for (const SymExpr& s : in.strides) numbering_.Visit(s);
    }
  }

  // Producer nodes of the tensors `node` reads (with repeats).
  std::vector<int> Dependencies(const Node& node) const {
    std::vector<int> deps;
    ForEachTensorArg(node, [&](ValueId v, int, int) {
      const int p = Producer(v);
      if (p >= 0) deps.push_back(p);
    });
    return deps;
  }

  // Kahn's algorithm over the node graph, taking the ready node with the
  // smallest `key_of(node)` (computed when the node becomes ready, after all
  // its producers were placed) and calling `place(node)` in order. A
  // validated graph is acyclic; were it not, the nodes left over are placed
  // in their original order so the encoding still covers them.
  template <typename KeyOf, typename Place>
  std::vector<int> Kahn(KeyOf key_of, Place place) const {
    const int n = static_cast<int>(graph_.nodes.size());
    std::vector<int> indegree(n, 0);
    std::vector<std::vector<int>> users(n);
    for (int i = 0; i < n; ++i) {
      for (int p : Dependencies(graph_.nodes[i])) {
        ++indegree[i];
        users[p].push_back(i);
      }
    }
    using Entry = std::pair<decltype(key_of(0)), int>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> ready;
    for (int i = 0; i < n; ++i) {
      if (indegree[i] == 0) ready.emplace(key_of(i), i);
    }
    std::vector<int> order;
    std::vector<bool> placed(n, false);
    while (!ready.empty()) {
      const int i = ready.top().second;
      ready.pop();
      order.push_back(i);
      placed[i] = true;
      place(i);
      for (int u : users[i]) {
        if (--indegree[u] == 0) ready.emplace(key_of(u), u);
      }
    }
    for (int i = 0; i < n; ++i) {
      if (!placed[i]) {
        order.push_back(i);
        place(i);
      }
    }
    return order;
  }

  std::vector<int> TopologicalOrder() const {
    return Kahn([](int i) { return i; }, [](int) {});
  }

  // Merkle hash of each node's computation: its op and arguments, with each
  // tensor replaced by the input position or by its producer's hash and
  // output index. Equal hashes mean equal computations whatever the names
  // and node order.
  void ComputeForwardHashes(const std::vector<int>& topo) {
    forward_.assign(graph_.nodes.size(), Sha256Digest{});
    auto ref = [&](ValueId v) -> std::string {
      if (!ValidValue(v)) return "?";
      if (input_position_[v] >= 0) {
        return absl::StrCat("input ", input_position_[v]);
      }
      const int p = Producer(v);
      if (p < 0) return "?";
      return absl::StrCat("(", DigestBytes(forward_[p]), ":",
                          graph_.values[v].output_index, ")");
    };
    auto expr = [&](const SymExpr& e) {
      return PartialExprText(e, numbering_, graph_.symbols);
    };
    for (int n : topo) {
      const Node& node = graph_.nodes[n];
      std::string text = absl::StrCat(OpName(node), "(");
      for (const Attr& a : node.args) {
        absl::StrAppend(&text, AttrText(a, ref, expr), ";");
      }
      absl::StrAppend(&text, ")");
      forward_[n] = Sha256(text);
    }
  }

  // A hash of how each node's outputs are used (by which consumers, at which
  // argument, and as which graph outputs), so that two nodes computing the
  // same thing are still told apart by their roles: without it, swapping two
  // duplicate nodes in the request would swap their canonical numbers and
  // the consumers' references with them.
  void ComputeBackwardHashes(const std::vector<int>& topo) {
    const int n = static_cast<int>(graph_.nodes.size());
    // uses[v]: consumers of value v as (node, arg, list position).
    std::vector<std::vector<std::tuple<int, int, int>>> uses(
        graph_.values.size());
    for (int i = 0; i < n; ++i) {
      ForEachTensorArg(graph_.nodes[i], [&](ValueId v, int arg, int pos) {
        if (ValidValue(v)) uses[v].emplace_back(i, arg, pos);
      });
    }
    std::vector<std::vector<int>> output_positions(graph_.values.size());
    for (int j = 0; j < static_cast<int>(graph_.outputs.size()); ++j) {
      const ValueId v = graph_.outputs[j];
      if (ValidValue(v)) output_positions[v].push_back(j);
    }
    backward_.assign(n, Sha256Digest{});
    for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
      const Node& node = graph_.nodes[*it];
      std::string text = absl::StrCat(DigestBytes(forward_[*it]), "\n");
      for (size_t k = 0; k < node.outputs.size(); ++k) {
        const ValueId v = node.outputs[k];
        std::vector<std::string> roles;
        if (ValidValue(v)) {
          for (const auto& [user, arg, pos] : uses[v]) {
            roles.push_back(
                absl::StrCat(DigestBytes(backward_[user]), ":", arg, ".", pos));
          }
          for (int j : output_positions[v]) {
            roles.push_back(absl::StrCat("graph output ", j));
          }
        }
        std::sort(roles.begin(), roles.end());
        absl::StrAppend(&text, "output ", k, ": ", absl::StrJoin(roles, ","),
                        "\n");
      }
      backward_[*it] = Sha256(text);
    }
  }

  // Kahn's algorithm taking the ready node with the smallest (forward hash,
  // use hash, canonical numbers of the values it reads). The last part
  // separates equal computations on different duplicates (sub(a, 1) and
  // sub(b, 1) where a and b are both exp(x)): the hashes cannot tell a from
  // b, their canonical numbers can. Ties left are nodes reading the same
  // values in the same way, whose order does not change the encoding; the
  // original index only makes the choice deterministic. Values are numbered
  // as nodes are placed: inputs by position, then node outputs.
  void ComputeCanonicalOrder() {
    canonical_value_.assign(graph_.values.size(), -1);
    int next = 0;
    for (const GraphInput& in : graph_.inputs) {
      if (ValidValue(in.value) && canonical_value_[in.value] < 0) {
        canonical_value_[in.value] = next;
      }
      ++next;  // positional, even for a repeated or invalid input
    }
    auto key_of = [&](int i) {
      std::vector<int> reads;
      ForEachTensorArg(graph_.nodes[i], [&](ValueId v, int, int) {
        reads.push_back(ValidValue(v) ? canonical_value_[v] : -1);
      });
      return std::make_tuple(forward_[i], backward_[i], std::move(reads));
    };
    auto place = [&](int i) {
      for (ValueId v : graph_.nodes[i].outputs) {
        if (ValidValue(v)) canonical_value_[v] = next;
        ++next;
      }
    };
    order_ = Kahn(key_of, place);
  }

  // Symbols first seen in node arguments or value types (not in any input),
  // numbered by first use in canonical order.
  void NumberRemainingSymbols() {
    for (int n : order_) {
      const Node& node = graph_.nodes[n];
      for (const Attr& a : node.args) {
        for (const SymExpr& e : a.ints) numbering_.Visit(e);
      }
      for (ValueId v : node.outputs) {
        if (!ValidValue(v)) continue;
        for (const SymExpr& e : graph_.type(v).sizes) numbering_.Visit(e);
      }
    }
  }

  const Graph& graph_;
  SymbolNumbering numbering_;
  std::vector<int> input_position_;  // value -> first input position, or -1
  std::vector<Sha256Digest> forward_, backward_;
  std::vector<int> order_;            // nodes in canonical order
  std::vector<int> canonical_value_;  // value -> canonical number, or -1
};

std::string TargetText(const v1::Target& target) {
  switch (target.kind_case()) {
    case v1::Target::kCpu: {
      // A feature string is a set: "+fma,+avx2" and "+avx2,+fma,+avx2" ask
      // for the same code.
      std::vector<std::string> features;
      for (absl::string_view f :
           absl::StrSplit(target.cpu().features(), ',', absl::SkipEmpty())) {
        features.emplace_back(f);
      }
      std::sort(features.begin(), features.end());
      features.erase(std::unique(features.begin(), features.end()),
                     features.end());
      return absl::StrCat("cpu triple=\"", absl::CEscape(target.cpu().triple()),
                          "\" cpu=\"", absl::CEscape(target.cpu().cpu()),
                          "\" features=\"",
                          absl::CEscape(absl::StrJoin(features, ",")), "\"");
    }
    case v1::Target::kCuda:
      return absl::StrCat("cuda arch=\"", absl::CEscape(target.cuda().arch()),
                          "\"");
    case v1::Target::KIND_NOT_SET:
      break;
  }
  return "none";
}

// fast_math always; the later flags only when set (earlier keys unchanged).
std::string OptionsText(const v1::CompileOptions& options) {
  std::string text =
      absl::StrCat("fast_math=", options.fast_math() ? "true" : "false");
  if (options.allow_tf32()) absl::StrAppend(&text, " allow_tf32=true");
  if (options.strict_fp16_reduction())
    absl::StrAppend(&text, " strict_fp16_reduction=true");
  if (options.strict_bf16_reduction())
    absl::StrAppend(&text, " strict_bf16_reduction=true");
  if (options.unfused_gemm_epilogues())
    absl::StrAppend(&text, " unfused_gemm_epilogues=true");
  if (options.allow_tf32_convolution())
    absl::StrAppend(&text, " allow_tf32_convolution=true");
  if (options.deterministic_convolutions())
    absl::StrAppend(&text, " deterministic_convolutions=true");
  if (options.deterministic_algorithms())
    absl::StrAppend(&text, " deterministic_algorithms=true");
  if (options.cpu_library_convolutions())
    absl::StrAppend(&text, " cpu_library_convolutions=true");
  if (options.cudnn_benchmark())
    absl::StrAppend(&text, " cudnn_benchmark=true");
  return text;
}

KeyComponent MakeComponent(std::string name, std::string canonical) {
  KeyComponent c;
  c.name = std::move(name);
  c.hash = Sha256(canonical);
  c.canonical = std::move(canonical);
  return c;
}

}  // namespace

v1::CompileOptions NormalizeOptions(const v1::CompileOptions& options,
                                    const v1::Target& target,
                                    const Graph& graph) {
  v1::CompileOptions normalized = options;
  if (!target.has_cuda()) {
    normalized.clear_allow_tf32();
    normalized.clear_strict_fp16_reduction();
    normalized.clear_strict_bf16_reduction();
    normalized.clear_unfused_gemm_epilogues();
  }
  bool convolutions = false, scatters = false, products = false;
  for (const Node& n : graph.nodes) {
    if (n.op == nullptr) continue;
    convolutions |= n.op->name == "aten.convolution.default" ||
                    n.op->name == "aten.convolution_backward.default";
    scatters |= n.op->name == "aten.embedding_dense_backward.default" ||
                n.op->name == "aten.scatter_add.default" ||
                n.op->name == "aten.index_put.default";
    products |= n.op->name == "aten.mm.default" ||
                n.op->name == "aten.addmm.default" ||
                n.op->name == "aten.bmm.default" ||
                n.op->name == "aten.baddbmm.default" ||
                n.op->name == "kiln.attention.default" ||
                n.op->name == "kiln.attention_backward.default" ||
                n.op->name == "kiln.attention_dropout.default" ||
                n.op->name == "kiln.attention_dropout_backward.default";
  }
  // On CUDA: accumulating scatters run eagerly, cuBLASLt calls take the
  // heuristic's algorithm rather than a timed one, and attention's backward
  // is GEMMs rather than cuDNN's fused (atomically summed) kernel (with
  // dropout its forward too, which must draw the backward's mask).
  if (!target.has_cuda() || !(scatters || products))
    normalized.clear_deterministic_algorithms();
  if (!target.has_cuda() || !convolutions) {
    normalized.clear_allow_tf32_convolution();
    normalized.clear_deterministic_convolutions();
    normalized.clear_cudnn_benchmark();
  }
  if (target.has_cuda() || !convolutions)
    normalized.clear_cpu_library_convolutions();
  return normalized;
}

std::vector<KeyComponent> ExplainKey(const Graph& graph,
                                     const v1::Target& target,
                                     const v1::CompileOptions& options) {
  Canonicalizer canon(graph);
  canon.Run();
  std::vector<KeyComponent> components;
  components.push_back(MakeComponent("format", std::string(kFormat)));
  components.push_back(MakeComponent("graph", canon.GraphText()));
  for (int i = 0; i < static_cast<int>(graph.inputs.size()); ++i) {
    components.push_back(
        MakeComponent(absl::StrCat("input.", i), canon.InputText(i)));
  }
  components.push_back(MakeComponent("symbols", canon.SymbolsText()));
  components.push_back(MakeComponent("target", TargetText(target)));
  components.push_back(MakeComponent(
      "options", OptionsText(NormalizeOptions(options, target, graph))));
  return components;
}

GuardKey CombineKeyComponents(const std::vector<KeyComponent>& components) {
  Sha256Hasher hasher;
  for (const KeyComponent& c : components) {
    // Length-prefixed names and fixed-size hashes: no two component lists
    // share an encoding.
    hasher.Update(absl::StrCat(c.name.size(), ":", c.name));
    hasher.Update(absl::string_view(
        reinterpret_cast<const char*>(c.hash.data()), c.hash.size()));
  }
  return hasher.Finish();
}

GuardKey ComputeGuardKey(const Graph& graph, const v1::Target& target,
                         const v1::CompileOptions& options) {
  return CombineKeyComponents(ExplainKey(graph, target, options));
}

}  // namespace kiln
