#include "graph/graph.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/op_signature.h"

namespace kiln {

std::vector<std::string> Graph::SymbolNames() const {
  std::vector<std::string> names;
  names.reserve(symbols.size());
  for (const SymbolInfo& s : symbols) names.push_back(s.name);
  return names;
}

std::vector<int64_t> Graph::SymbolMaxValues() const {
  std::vector<int64_t> max_values;
  max_values.reserve(symbols.size());
  for (const SymbolInfo& s : symbols) max_values.push_back(s.max_value);
  return max_values;
}

namespace {
std::string SizesToString(const std::vector<SymExpr>& sizes,
                          const std::vector<std::string>& names) {
  std::vector<std::string> parts;
  for (const SymExpr& s : sizes) parts.push_back(s.ToString(names));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

std::string AttrToString(const Attr& a, const Graph& g,
                         const std::vector<std::string>& names) {
  switch (a.kind) {
    case Attr::Kind::kNone:
      return "None";
    case Attr::Kind::kTensor:
      return absl::StrCat("%", g.values[a.tensor].name);
    case Attr::Kind::kInt:
      return absl::StrCat(a.i);
    case Attr::Kind::kFloat:
      return absl::StrCat(a.f);
    case Attr::Kind::kBool:
      return a.b ? "True" : "False";
    case Attr::Kind::kInts:
      return SizesToString(a.ints, names);
    case Attr::Kind::kTensors: {
      std::vector<std::string> parts;
      for (ValueId v : a.tensors)
        parts.push_back(absl::StrCat("%", g.values[v].name));
      return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
    }
    case Attr::Kind::kDType:
      return std::string(DTypeName(a.dtype));
    case Attr::Kind::kString:
      return absl::StrCat("\"", a.str, "\"");
  }
  return "?";
}
}  // namespace

std::string Graph::ToString() const {
  const std::vector<std::string> names = SymbolNames();
  std::string out;
  for (const SymbolInfo& s : symbols) {
    absl::StrAppend(&out, "symbol ", s.name, " >= ", kMinSymbolValue);
    if (s.max_value > 0) absl::StrAppend(&out, " <= ", s.max_value);
    if (s.multiple_of > 1)
      absl::StrAppend(&out, " multiple_of ", s.multiple_of);
    absl::StrAppend(&out, "\n");
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const GraphInput& in = inputs[i];
    const Value& v = values[in.value];
    absl::StrAppend(&out, "input ", i, " %", v.name, ": ",
                    DTypeName(v.type.dtype), SizesToString(v.type.sizes, names),
                    " strides ", SizesToString(in.strides, names), "\n");
  }
  for (size_t n = 0; n < nodes.size(); ++n) {
    const Node& node = nodes[n];
    std::vector<std::string> outs, args;
    for (ValueId v : node.outputs) {
      outs.push_back(absl::StrCat("%", values[v].name, ": ",
                                  DTypeName(values[v].type.dtype),
                                  SizesToString(values[v].type.sizes, names)));
    }
    for (size_t a = 0; a < node.args.size(); ++a) {
      args.push_back(absl::StrCat(node.op->schema[a].name, "=",
                                  AttrToString(node.args[a], *this, names)));
    }
    absl::StrAppend(&out, "node ", n, " ", absl::StrJoin(outs, ", "), " = ",
                    node.op->name, "(", absl::StrJoin(args, ", "), ")\n");
  }
  std::vector<std::string> outs;
  for (ValueId v : outputs) outs.push_back(absl::StrCat("%", values[v].name));
  absl::StrAppend(&out, "return ", absl::StrJoin(outs, ", "), "\n");
  for (const InputWrite& w : input_writes) {
    absl::StrAppend(&out, "input write: output ", w.output, " -> input ",
                    w.input, "\n");
  }
  return out;
}

std::vector<SymExpr> ContiguousStrides(const std::vector<SymExpr>& sizes) {
  std::vector<SymExpr> strides(sizes.size());
  SymExpr acc(1);
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    strides[i] = acc;
    acc = acc * sizes[i];
  }
  return strides;
}

SymExpr NumElements(const std::vector<SymExpr>& sizes) {
  SymExpr acc(1);
  for (const SymExpr& s : sizes) acc = acc * s;
  return acc;
}

}  // namespace kiln
