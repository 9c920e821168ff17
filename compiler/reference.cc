#include "compiler/reference.h"

#include "absl/strings/str_cat.h"
#include "compiler/op_reference.h"
#include "graph/op_signature.h"

namespace kiln {

absl::StatusOr<std::vector<int64_t>> BindSymbols(
    const Graph& graph, absl::Span<const HostTensor> inputs) {
  if (inputs.size() != graph.inputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "graph takes ", graph.inputs.size(), " inputs, got ", inputs.size()));
  }
  std::vector<int64_t> values(graph.symbols.size(), -1);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& type = graph.type(graph.inputs[i].value);
    const HostTensor& t = inputs[i];
    const std::string where = absl::StrCat(
        "input ", i, " '", graph.values[graph.inputs[i].value].name, "'");
    if (t.dtype() != type.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": dtype ", DTypeName(t.dtype()), ", expected ",
                       DTypeName(type.dtype)));
    }
    if (t.rank() != type.rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": rank ", t.rank(), ", expected ", type.rank()));
    }
    for (int d = 0; d < type.rank(); ++d) {
      const int64_t actual = t.sizes()[d];
      if (auto c = type.sizes[d].AsConstant()) {
        if (*c != actual) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": size ", actual, " of dim ", d, ", expected ", *c));
        }
        continue;
      }
      // A compound size (s0*s1) is checked once every symbol is bound.
      if (!type.sizes[d].AsSymbol()) continue;
      const int sym = *type.sizes[d].AsSymbol();
      const SymbolInfo& info = graph.symbols[sym];
      if (values[sym] >= 0 && values[sym] != actual) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": dim ", d, " is ", actual, " but symbol ",
                         info.name, " is already ", values[sym]));
      }
      if (actual < kMinSymbolValue ||
          (info.max_value > 0 && actual > info.max_value) ||
          actual % info.multiple_of != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": size ", actual, " of dim ", d,
                         " violates the guards of symbol ", info.name));
      }
      values[sym] = actual;
    }
  }
  for (size_t s = 0; s < values.size(); ++s) {
    if (values[s] < 0) values[s] = kMinSymbolValue;  // unused by the inputs
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& type = graph.type(graph.inputs[i].value);
    for (int d = 0; d < type.rank(); ++d) {
      const SymExpr& e = type.sizes[d];
      if (e.IsConstant() || e.AsSymbol()) continue;
      const int64_t want = e.Evaluate(values);
      if (inputs[i].sizes()[d] != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input ", i, " '", graph.values[graph.inputs[i].value].name,
            "': size ", inputs[i].sizes()[d], " of dim ", d, ", expected ",
            e.ToString(graph.SymbolNames()), " = ", want));
      }
    }
  }
  return values;
}

absl::StatusOr<std::vector<HostTensor>> EvaluateReference(
    const Graph& graph, absl::Span<const HostTensor> inputs) {
  auto symbols = BindSymbols(graph, inputs);
  if (!symbols.ok()) return symbols.status();
  std::vector<HostTensor> env(graph.values.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    env[graph.inputs[i].value] = inputs[i];

  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    RefContext ctx{node, {}, {}, {}, {}};
    ctx.tensors.resize(node.args.size());
    ctx.tensor_lists.resize(node.args.size());
    for (size_t a = 0; a < node.args.size(); ++a) {
      if (node.args[a].kind == Attr::Kind::kTensor)
        ctx.tensors[a] = env[node.args[a].tensor];
      if (node.args[a].kind == Attr::Kind::kTensors) {
        for (ValueId v : node.args[a].tensors)
          ctx.tensor_lists[a].push_back(env[v]);
      }
    }
    for (ValueId v : node.outputs) {
      const TensorType& type = graph.type(v);
      ctx.out_dtypes.push_back(type.dtype);
      std::vector<int64_t> sizes;
      for (const SymExpr& s : type.sizes) sizes.push_back(s.Evaluate(*symbols));
      ctx.out_sizes.push_back(std::move(sizes));
    }
    const ReferenceFn* reference = OpReferences::Get().Find(node.op->name);
    if (reference == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("node ", n, " (", node.op->name,
                       "): no reference semantics for this op"));
    }
    auto outs = (*reference)(ctx);
    if (!outs.ok()) return outs.status();
    if (outs->size() != node.outputs.size()) {
      return absl::InternalError(
          absl::StrCat("node ", n, " (", node.op->name,
                       "): reference returned the wrong number of outputs"));
    }
    for (size_t o = 0; o < outs->size(); ++o) {
      HostTensor& t = (*outs)[o];
      if (t.dtype() != ctx.out_dtypes[o] || t.sizes() != ctx.out_sizes[o]) {
        return absl::InternalError(absl::StrCat(
            "node ", n, " (", node.op->name, "): reference result ",
            t.ToString(0), " disagrees with the inferred type"));
      }
      env[node.outputs[o]] = std::move(t);
    }
  }
  std::vector<HostTensor> outputs;
  for (ValueId v : graph.outputs) outputs.push_back(env[v].Contiguous());
  return outputs;
}

}  // namespace kiln
