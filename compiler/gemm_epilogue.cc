#include "compiler/gemm_epilogue.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "graph/graph.h"

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

// Whether reduction node `r` is exactly the column sums of the B operand
// of gemm node `product` (the sum over k of B[p][j], one element per j < n
// in order), B being row-major: a linear layer's bias gradient, summed
// over the same rows of the output gradient as the weight gradient's
// product reads.
bool SumsColumnsOfB(const LoopGraph& g, const LoopNode& r,
                    const LoopNode& product) {
  if (r.kind != LoopNode::Kind::kReduction || r.reduce != ReduceKind::kSum ||
      r.finalize || r.acc_dtype != DType::kFloat32 ||
      r.dtype != product.dtype) {
    return false;
  }
  const GemmCall& call = *product.gemm;
  const int b_node = product.extern_inputs[1];
  const LoopNode& b = g.nodes[b_node];
  if (b.dtype != product.dtype || !(call.b.col_stride == SymExpr(1))) {
    return false;
  }
  Expr load = r.body;
  if (load && load->op == ExprOp::kCast && load->dtype == DType::kFloat32)
    load = load->args[0];
  if (!load || load->op != ExprOp::kLoad || load->index != b_node) return false;
  // The element read, as an affine form over the reduction's vars.
  const std::vector<SymExpr> strides = b.kind == LoopNode::Kind::kInput
                                           ? b.strides
                                           : ContiguousStrides(b.sizes);
  if (load->args.size() != strides.size()) return false;
  Expr flat = ir::IntConst(0);
  for (size_t d = 0; d < strides.size(); ++d)
    flat = ir::Add(flat, ir::Mul(load->args[d], ir::FromSym(strides[d])));
  const int vars = static_cast<int>(r.reduce_sizes.size());
  const std::optional<ir::AffineForm> affine = ir::Affine(flat, vars);
  if (!affine || !(affine->constant == call.b.offset)) return false;
  // One kept var walks B's n columns; the reduced vars walk its k rows as
  // one row-major run from the row stride (a [batch, tokens, n] gradient
  // summed over both, read as [batch * tokens, n] by the product).
  int columns = 0;
  std::vector<int> rows;
  for (int v = 0; v < vars; ++v) {
    if (r.reduce_sizes[v] == SymExpr(1)) continue;
    if (!r.reduced[v]) {
      if (!(affine->coeffs[v] == SymExpr(1)) ||
          !(r.reduce_sizes[v] == call.n)) {
        return false;
      }
      ++columns;
    } else {
      rows.push_back(v);
    }
  }
  if (columns != 1) return false;
  SymExpr stride = call.b.row_stride, covered(1);
  while (!rows.empty()) {
    auto next = std::find_if(rows.begin(), rows.end(), [&](int v) {
      return affine->coeffs[v] == stride;
    });
    if (next == rows.end()) return false;
    covered = covered * r.reduce_sizes[*next];
    stride = stride * r.reduce_sizes[*next];
    rows.erase(next);
  }
  return covered == call.k;
}

// A weight gradient's product whose output gradient (B) is also summed
// over the same rows (the bias gradient) writes that sum too: the sum's
// node becomes the call's second result (GemmEpilogue::kBiasGradB).
// `readers`: CountReaders's, 0 for products an epilogue fold left unread.
void FoldBiasGradients(LoopGraph& graph, const std::vector<int>& readers) {
  for (size_t p = 0; p < graph.nodes.size(); ++p) {
    LoopNode& product = graph.nodes[p];
    if (product.kind != LoopNode::Kind::kExtern || !product.gemm ||
        readers[p] == 0 ||
        product.extern_owner >= 0 || !product.extern_outputs.empty()) {
      continue;
    }
    // A symbolic k may be 0: the runtime then writes zeros to both results.
    const GemmCall& call = *product.gemm;
    // An empty C (m = 0) makes no call, so m must be static and positive.
    const std::optional<int64_t> k = call.k.AsConstant();
    const std::optional<int64_t> m = call.m.AsConstant();
    if (call.epilogue != GemmEpilogue::kNone || !(call.batch == SymExpr(1)) ||
        call.alpha != 1 || (k && *k <= 0) || !m || *m <= 0) {
      continue;
    }
    // The sum follows the call, so that its readers follow the call too.
    for (size_t r = p + 1; r < graph.nodes.size(); ++r) {
      if (!SumsColumnsOfB(graph, graph.nodes[r], product)) continue;
      product.gemm->epilogue = GemmEpilogue::kBiasGradB;
      product.gemm->bias_offset = SymExpr(0);
      product.extern_outputs.push_back(static_cast<int>(r));
      LoopNode& sum = graph.nodes[r];
      sum.kind = LoopNode::Kind::kExtern;
      sum.extern_owner = static_cast<int>(p);
      sum.body = nullptr;
      sum.reduce_sizes.clear();
      sum.reduced.clear();
      sum.keepdim = false;
      break;
    }
  }
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
  FoldBiasGradients(graph, readers);
  return graph;
}

}  // namespace kiln
