#include "compiler/gemm_epilogue.h"

#include <optional>
#include <vector>

namespace kiln {
namespace {

// Readers per node: nodes whose body, finalize or extern operands read it,
// plus one for a graph output.
std::vector<int> CountReaders(const LoopGraph& g) {
  std::vector<int> readers(g.nodes.size(), 0);
  for (const LoopNode& node : g.nodes) {
    absl::flat_hash_set<int> read = ir::LoadsOf(node.body);
    for (int m : ir::LoadsOf(node.finalize)) read.insert(m);
    for (int m : node.extern_inputs) read.insert(m);
    for (int m : read) ++readers[m];
    if (node.output_index >= 0) ++readers[&node - g.nodes.data()];
  }
  return readers;
}

// The epilogue of a call that already applies `inner` followed by `outer`,
// or kNone when the library has no such epilogue.
GemmEpilogue Combine(GemmEpilogue inner, GemmEpilogue outer) {
  using E = GemmEpilogue;
  if (inner == E::kNone) return outer;
  if (inner == E::kBias && outer == E::kRelu) return E::kReluBias;
  if (inner == E::kBias && outer == E::kGeluTanh) return E::kGeluTanhBias;
  return E::kNone;
}

}  // namespace

LoopGraph FoldGemmEpilogues(LoopGraph graph) {
  std::vector<int> readers = CountReaders(graph);
  for (LoopNode& node : graph.nodes) {
    if (node.kind != LoopNode::Kind::kPointwise ||
        node.epilogue == GemmEpilogue::kNone) {
      continue;
    }
    const int source = node.epilogue_source;
    const LoopNode& product = graph.nodes[source];
    if (product.kind != LoopNode::Kind::kExtern || !product.gemm ||
        product.output_index >= 0 || readers[source] != 1 ||
        product.dtype != node.dtype || product.sizes != node.sizes) {
      continue;
    }
    // Over k = 0 the runtime writes zeros without the library.
    const std::optional<int64_t> k = product.gemm->k.AsConstant();
    if (!k || *k <= 0) continue;
    const GemmEpilogue folded = Combine(product.gemm->epilogue, node.epilogue);
    if (folded == GemmEpilogue::kNone) continue;
    if (node.epilogue == GemmEpilogue::kBias &&
        (graph.nodes[node.epilogue_bias].dtype != node.dtype ||
         product.sizes.size() != 2)) {
      continue;
    }
    GemmCall call = *product.gemm;
    call.epilogue = folded;
    std::vector<int> operands = product.extern_inputs;
    if (node.epilogue == GemmEpilogue::kBias) {
      operands.push_back(node.epilogue_bias);
      call.bias_offset = SymExpr(0);
    }
    node.kind = LoopNode::Kind::kExtern;
    node.gemm = std::move(call);
    node.extern_inputs = std::move(operands);
    node.body = nullptr;
    node.epilogue = GemmEpilogue::kNone;
    node.epilogue_source = -1;
    node.epilogue_bias = -1;
    // The product is no longer read; this node's readers are unchanged.
    readers[source] = 0;
  }
  return graph;
}

}  // namespace kiln
