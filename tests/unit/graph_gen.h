// Seeded generators of random *valid* kiln.v1.Graphs (pointwise chains and
// DAGs with broadcasting, scalar operands and reductions over random dims),
// and of request rewrites that must not change meaning: renaming values,
// renaming and reordering symbols, and reordering independent nodes.
//
// Property tests (the guard key's, and later the compiler's against the
// reference evaluator) draw many graphs from here; a failing seed reproduces
// the graph exactly. Randomness uses std::mt19937_64 and plain modulo rather
// than std::*_distribution, whose output differs between standard libraries.
//
// Header-only so any test target can include it without a library.
#ifndef KILN_TESTS_UNIT_GRAPH_GEN_H_
#define KILN_TESTS_UNIT_GRAPH_GEN_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::graph_gen {

struct GraphGenOptions {
  int max_inputs = 3;
  int max_nodes = 12;
  int max_rank = 3;
  int max_symbols = 2;     // dynamic dims drawn at most this many times
  bool reductions = true;  // sum.dim_IntList / mean.dim / amax
  // Input dtypes are drawn from these. Ops are chosen so that any mix
  // (bool and integer included) stays valid under PyTorch's rules.
  std::vector<v1::DType> dtypes = {v1::FLOAT32};
};

namespace internal {

// One size of a generated shape: a symbol name, or a static value.
struct GenDim {
  std::string symbol;
  int64_t value = 0;
  bool operator==(const GenDim& o) const {
    return symbol == o.symbol && value == o.value;
  }
  bool IsOne() const { return symbol.empty() && value == 1; }
};
using GenShape = std::vector<GenDim>;

// What ops a value can feed, by dtype category.
enum class Category { kBool, kInt, kFloat };

inline Category CategoryOf(v1::DType d) {
  switch (d) {
    case v1::BOOL:
      return Category::kBool;
    case v1::INT32:
    case v1::INT64:
      return Category::kInt;
    default:
      return Category::kFloat;
  }
}

struct GenValue {
  std::string name;
  GenShape shape;
  Category category;
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  // Uniform in [0, n) for n > 0.
  int Below(int n) {
    return static_cast<int>(engine_() % static_cast<uint64_t>(n));
  }
  bool Chance(int percent) { return Below(100) < percent; }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[Below(static_cast<int>(v.size()))];
  }
  uint64_t Next() { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

// PyTorch broadcasting: right-aligned, each pair equal or one a static 1.
inline bool Broadcast(const GenShape& a, const GenShape& b, GenShape* out) {
  const size_t rank = std::max(a.size(), b.size());
  GenShape r(rank);
  for (size_t i = 0; i < rank; ++i) {
    const GenDim* x = i < a.size() ? &a[a.size() - 1 - i] : nullptr;
    const GenDim* y = i < b.size() ? &b[b.size() - 1 - i] : nullptr;
    if (x == nullptr || x->IsOne()) {
      r[rank - 1 - i] = y != nullptr ? *y : *x;
    } else if (y == nullptr || y->IsOne() || *x == *y) {
      r[rank - 1 - i] = *x;
    } else {
      return false;
    }
  }
  *out = std::move(r);
  return true;
}

inline void AddDims(v1::TensorMeta* meta, const GenShape& shape) {
  for (const GenDim& d : shape) {
    v1::Dim* dim = meta->add_sizes();
    if (d.symbol.empty()) {
      dim->set_value(d.value);
    } else {
      dim->set_symbol(d.symbol);
    }
  }
}

// Row-major strides in the wire form (value times symbols).
inline void AddContiguousStrides(v1::TensorMeta* meta, const GenShape& shape) {
  std::vector<v1::Stride> strides(shape.size());
  int64_t value = 1;
  std::vector<std::string> symbols;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    strides[d].set_value(value);
    for (const std::string& s : symbols) strides[d].add_symbols(s);
    if (shape[d].symbol.empty()) {
      value *= shape[d].value;
    } else {
      symbols.push_back(shape[d].symbol);
    }
  }
  for (v1::Stride& s : strides) *meta->add_strides() = std::move(s);
}

inline v1::Node* AddNode(v1::Graph* g, const std::string& op,
                         const std::string& out) {
  v1::Node* n = g->add_nodes();
  n->set_op(op);
  n->add_outputs(out);
  return n;
}

inline void AddRef(v1::Node* n, const std::string& name) {
  n->add_args()->set_ref(name);
}

}  // namespace internal

// A random valid graph. The same seed and options give the same graph.
inline v1::Graph RandomGraph(uint64_t seed,
                             const GraphGenOptions& options = {}) {
  using internal::Category;
  using internal::GenDim;
  using internal::GenShape;
  using internal::GenValue;
  internal::Rng rng(seed);
  v1::Graph g;

  // The full shape every input broadcasts to. Static sizes are distinct so a
  // test can change one size everywhere by value.
  const int rank = 1 + rng.Below(std::max(1, options.max_rank));
  std::vector<int64_t> statics = {2, 3, 4, 5, 6, 7, 8, 16};
  GenShape base;
  int symbols = 0;
  for (int d = 0; d < rank; ++d) {
    GenDim dim;
    if (symbols < options.max_symbols && rng.Chance(35)) {
      dim.symbol = absl::StrCat("s", symbols++);
      v1::Symbol* s = g.add_symbols();
      s->set_name(dim.symbol);
      if (rng.Chance(25)) s->set_max_value(64 + rng.Below(1000));
      if (rng.Chance(25))
        s->set_multiple_of(rng.Pick(std::vector<int64_t>{2, 4, 8}));
    } else {
      const int i = rng.Below(static_cast<int>(statics.size()));
      dim.value = statics[i];
      statics.erase(statics.begin() + i);
    }
    base.push_back(dim);
  }

  std::vector<GenValue> values;
  const int num_inputs = 1 + rng.Below(std::max(1, options.max_inputs));
  for (int i = 0; i < num_inputs; ++i) {
    GenShape shape = base;
    // Broadcasting inputs: leading dims dropped, some dims of size 1.
    if (rng.Chance(20))
      shape.erase(shape.begin(), shape.begin() + rng.Below(rank));
    for (GenDim& d : shape) {
      if (rng.Chance(15)) d = GenDim{"", 1};
    }
    const v1::DType dtype = rng.Pick(options.dtypes);
    v1::Input* in = g.add_inputs();
    in->set_name(absl::StrCat("x", i));
    v1::TensorMeta* meta = in->mutable_meta();
    meta->set_dtype(dtype);
    internal::AddDims(meta, shape);
    if (rng.Chance(30)) internal::AddContiguousStrides(meta, shape);
    meta->set_alignment(rng.Pick(std::vector<int64_t>{0, 4, 16, 64}));
    meta->set_storage_offset(rng.Below(4));
    meta->set_device(v1::CPU);
    values.push_back({in->name(), shape, internal::CategoryOf(dtype)});
  }

  // Ops valid for every dtype category (bool and ints promote to float).
  const std::vector<std::string> floating_unary = {
      "aten.sin.default", "aten.cos.default", "aten.exp.default",
      "aten.sigmoid.default", "aten.tanh.default"};
  // Ops valid for ints and floats, keeping the dtype.
  const std::vector<std::string> numeric_unary = {
      "aten.relu.default", "aten.neg.default", "aten.abs.default"};
  const std::vector<double> scalars = {0.5, 2.0, -1.25, 0.1, 3.0, 1e-3};

  const int num_nodes = 1 + rng.Below(std::max(1, options.max_nodes));
  for (int k = 0; k < num_nodes; ++k) {
    const std::string out = absl::StrCat("v", k);
    const GenValue& a = rng.Pick(values);
    const int kind = rng.Below(100);
    GenValue result{out, a.shape, a.category};
    if (kind < 40) {
      const bool numeric = a.category != Category::kBool && rng.Chance(40);
      v1::Node* n = internal::AddNode(
          &g, numeric ? rng.Pick(numeric_unary) : rng.Pick(floating_unary),
          out);
      internal::AddRef(n, a.name);
      if (!numeric) result.category = Category::kFloat;
    } else if (kind < 65) {
      // A tensor operand that broadcasts with `a`, if there is one.
      std::vector<int> partners;
      GenShape shape;
      for (int j = 0; j < static_cast<int>(values.size()); ++j) {
        if (internal::Broadcast(a.shape, values[j].shape, &shape)) {
          partners.push_back(j);
        }
      }
      const GenValue& b = values[rng.Pick(partners)];  // `a` itself qualifies
      internal::Broadcast(a.shape, b.shape, &result.shape);
      result.category = std::max(a.category, b.category);
      // sub is not defined for bool.
      std::vector<std::string> ops = {"aten.add.Tensor", "aten.mul.Tensor"};
      if (a.category != Category::kBool && b.category != Category::kBool) {
        ops.push_back("aten.sub.Tensor");
      }
      v1::Node* n = internal::AddNode(&g, rng.Pick(ops), out);
      internal::AddRef(n, a.name);
      internal::AddRef(n, b.name);
    } else if (kind < 85 || !options.reductions || a.shape.empty()) {
      std::vector<std::string> ops = {"aten.add.Tensor", "aten.mul.Tensor"};
      if (a.category != Category::kBool) ops.push_back("aten.sub.Tensor");
      v1::Node* n = internal::AddNode(&g, rng.Pick(ops), out);
      internal::AddRef(n, a.name);
      n->add_args()->set_f(rng.Pick(scalars));
      result.category = Category::kFloat;
    } else {
      const int r = static_cast<int>(a.shape.size());
      std::vector<int64_t> dims;
      for (int d = 0; d < r; ++d) {
        if (rng.Chance(50)) dims.push_back(d);
      }
      if (dims.empty()) dims.push_back(rng.Below(r));
      const bool keepdim = rng.Chance(50);
      std::vector<std::string> ops = {"aten.sum.dim_IntList"};
      if (a.category == Category::kFloat) ops.push_back("aten.mean.dim");
      if (a.category != Category::kBool) ops.push_back("aten.amax.default");
      const std::string op = rng.Pick(ops);
      v1::Node* n = internal::AddNode(&g, op, out);
      internal::AddRef(n, a.name);
      v1::IntList* list = n->add_args()->mutable_ints();
      // Dims are spelled negative half the time, as FX graphs often do.
      for (int64_t d : dims) list->add_values(rng.Chance(50) ? d - r : d);
      if (keepdim || rng.Chance(50)) {
        v1::Argument* kd = n->add_args();
        kd->set_name("keepdim");
        kd->set_b(keepdim);
      }
      GenShape shape;
      for (int d = 0; d < r; ++d) {
        const bool reduced =
            std::find(dims.begin(), dims.end(), d) != dims.end();
        if (!reduced) {
          shape.push_back(a.shape[d]);
        } else if (keepdim) {
          shape.push_back(GenDim{"", 1});
        }
      }
      result.shape = shape;
      if (op == "aten.sum.dim_IntList" && a.category == Category::kBool) {
        result.category = Category::kInt;
      }
    }
    values.push_back(std::move(result));
  }

  // The last value, and sometimes one or two other node outputs.
  g.add_outputs(values.back().name);
  for (int extra = rng.Below(3); extra > 0; --extra) {
    const std::string& name = values[num_inputs + rng.Below(num_nodes)].name;
    if (std::find(g.outputs().begin(), g.outputs().end(), name) ==
        g.outputs().end()) {
      g.add_outputs(name);
    }
  }
  return g;
}

// Visits every value name a node reads.
template <typename F>
void ForEachRef(v1::Node* node, F f) {
  for (v1::Argument& a : *node->mutable_args()) {
    if (a.kind_case() == v1::Argument::kRef) f(a.mutable_ref());
    if (a.kind_case() == v1::Argument::kRefs) {
      for (std::string& r : *a.mutable_refs()->mutable_values()) f(&r);
    }
  }
}

// The same graph with its nodes in a random topological order.
inline v1::Graph ShuffleNodes(const v1::Graph& graph, uint64_t seed) {
  internal::Rng rng(seed);
  const int n = graph.nodes_size();
  absl::flat_hash_map<std::string, int> producer;
  for (int i = 0; i < n; ++i) {
    for (const std::string& o : graph.nodes(i).outputs()) producer[o] = i;
  }
  std::vector<int> indegree(n, 0);
  std::vector<std::vector<int>> users(n);
  for (int i = 0; i < n; ++i) {
    v1::Node copy = graph.nodes(i);
    ForEachRef(&copy, [&](std::string* r) {
      auto it = producer.find(*r);
      if (it != producer.end()) {
        ++indegree[i];
        users[it->second].push_back(i);
      }
    });
  }
  std::vector<int> ready;
  for (int i = 0; i < n; ++i) {
    if (indegree[i] == 0) ready.push_back(i);
  }
  v1::Graph out = graph;
  out.clear_nodes();
  while (!ready.empty()) {
    const int k = rng.Below(static_cast<int>(ready.size()));
    const int i = ready[k];
    ready.erase(ready.begin() + k);
    *out.add_nodes() = graph.nodes(i);
    for (int u : users[i]) {
      if (--indegree[u] == 0) ready.push_back(u);
    }
  }
  return out;
}

// `name` after renaming; names the rename does not know (an invalid graph,
// as a fuzzer makes) stay as they are.
inline std::string Renamed(
    const absl::flat_hash_map<std::string, std::string>& rename,
    const std::string& name) {
  auto it = rename.find(name);
  return it == rename.end() ? name : it->second;
}

// The same graph with every value (inputs and node outputs) renamed.
inline v1::Graph RenameValues(const v1::Graph& graph, uint64_t seed) {
  internal::Rng rng(seed);
  absl::flat_hash_map<std::string, std::string> rename;
  auto fresh = [&](const std::string& old) {
    std::string name =
        absl::StrCat("val_", rng.Next() % 1000000, "_", rename.size());
    rename[old] = name;
    return name;
  };
  v1::Graph out = graph;
  for (v1::Input& in : *out.mutable_inputs()) in.set_name(fresh(in.name()));
  for (v1::Node& node : *out.mutable_nodes()) {
    ForEachRef(&node, [&](std::string* r) { *r = Renamed(rename, *r); });
    for (std::string& o : *node.mutable_outputs()) o = fresh(o);
  }
  for (std::string& o : *out.mutable_outputs()) o = Renamed(rename, o);
  return out;
}

// The same graph with every symbol renamed and the declarations shuffled (so
// symbol ids after import change too).
inline v1::Graph RenameSymbols(const v1::Graph& graph, uint64_t seed) {
  internal::Rng rng(seed);
  absl::flat_hash_map<std::string, std::string> rename;
  v1::Graph out = graph;
  for (v1::Symbol& s : *out.mutable_symbols()) {
    const std::string name =
        absl::StrCat("dyn", rng.Next() % 1000, "_", rename.size());
    rename[s.name()] = name;
    s.set_name(name);
  }
  auto* symbols = out.mutable_symbols();
  for (int i = symbols->size() - 1; i > 0; --i) {
    symbols->SwapElements(i, rng.Below(i + 1));
  }
  auto dim = [&](v1::Dim* d) {
    if (d->kind_case() == v1::Dim::kSymbol)
      d->set_symbol(Renamed(rename, d->symbol()));
  };
  for (v1::Input& in : *out.mutable_inputs()) {
    for (v1::Dim& d : *in.mutable_meta()->mutable_sizes()) dim(&d);
    for (v1::Stride& s : *in.mutable_meta()->mutable_strides()) {
      for (std::string& name : *s.mutable_symbols()) {
        name = Renamed(rename, name);
      }
    }
  }
  for (v1::Node& node : *out.mutable_nodes()) {
    for (v1::Argument& a : *node.mutable_args()) {
      if (a.kind_case() == v1::Argument::kDims) {
        for (v1::Dim& d : *a.mutable_dims()->mutable_values()) dim(&d);
      }
    }
  }
  return out;
}

}  // namespace kiln::graph_gen

#endif  // KILN_TESTS_UNIT_GRAPH_GEN_H_
