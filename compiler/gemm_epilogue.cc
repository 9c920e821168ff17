#include "compiler/gemm_epilogue.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "graph/graph.h"

namespace kiln {
namespace {

// The nodes `node` reads: in its body, finalize, scatter expressions and
// extern operands.
absl::flat_hash_set<int> ReadsOf(const LoopNode& node) {
  absl::flat_hash_set<int> read = ir::LoadsOf(node.body);
  for (int m : ir::LoadsOf(node.finalize)) read.insert(m);
  for (int m : ir::LoadsOf(node.scatter_value)) read.insert(m);
  for (const Expr& e : node.scatter_index) {
    for (int m : ir::LoadsOf(e)) read.insert(m);
  }
  for (int m : node.extern_inputs) read.insert(m);
  return read;
}

// Readers per node (ReadsOf), plus one for a graph output.
std::vector<int> CountReaders(const LoopGraph& g) {
  std::vector<int> readers(g.nodes.size(), 0);
  for (const LoopNode& node : g.nodes) {
    for (int m : ReadsOf(node)) ++readers[m];
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

// Whether reduction node `r` sums operand `operand` (0: A, 1: B) of gemm
// node `product` over k, one element per row of A (m) or column of B (n),
// in order, the operand being read with a unit stride along that row or
// column (A column-major, B row-major): a linear layer's bias gradient,
// summed over the same rows of the output gradient as the weight
// gradient's product reads.
bool SumsOperand(const LoopGraph& g, const LoopNode& r, const LoopNode& product,
                 int operand) {
  if (r.kind != LoopNode::Kind::kReduction || r.reduce != ReduceKind::kSum ||
      r.finalize || r.acc_dtype != DType::kFloat32 ||
      r.dtype != product.dtype) {
    return false;
  }
  const GemmCall& call = *product.gemm;
  const int node = product.extern_inputs[operand];
  const LoopNode& x = g.nodes[node];
  const MatrixLayout& layout = operand == 0 ? call.a : call.b;
  // The summed dim's stride, the kept dim's (1) and extent.
  const SymExpr& summed = operand == 0 ? layout.col_stride : layout.row_stride;
  const SymExpr& kept = operand == 0 ? layout.row_stride : layout.col_stride;
  const SymExpr& extent = operand == 0 ? call.m : call.n;
  if (x.dtype != product.dtype || !(kept == SymExpr(1))) return false;
  Expr load = r.body;
  if (load && load->op == ExprOp::kCast && load->dtype == DType::kFloat32)
    load = load->args[0];
  if (!load || load->op != ExprOp::kLoad || load->index != node) return false;
  // The element read, as an affine form over the reduction's vars.
  const std::vector<SymExpr> strides =
      x.kind == LoopNode::Kind::kInput ? x.strides : ContiguousStrides(x.sizes);
  if (load->args.size() != strides.size()) return false;
  Expr flat = ir::IntConst(0);
  for (size_t d = 0; d < strides.size(); ++d)
    flat = ir::Add(flat, ir::Mul(load->args[d], ir::FromSym(strides[d])));
  const int vars = static_cast<int>(r.reduce_sizes.size());
  const std::optional<ir::AffineForm> affine = ir::Affine(flat, vars);
  if (!affine || !(affine->constant == layout.offset)) return false;
  // One kept var walks the m rows (n columns); the reduced vars walk k as
  // one run from the summed stride (a [batch, tokens, n] gradient summed
  // over both, read as [batch * tokens, n] by the product).
  int walks = 0;
  std::vector<int> rows;
  for (int v = 0; v < vars; ++v) {
    if (r.reduce_sizes[v] == SymExpr(1)) continue;
    if (!r.reduced[v]) {
      if (!(affine->coeffs[v] == SymExpr(1)) ||
          !(r.reduce_sizes[v] == extent)) {
        return false;
      }
      ++walks;
    } else {
      rows.push_back(v);
    }
  }
  if (walks != 1) return false;
  SymExpr stride = summed, covered(1);
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

// A weight gradient's product whose output gradient (an operand) is also
// summed over the same rows (the bias gradient) writes that sum too: the
// sum's node becomes the call's second result (GemmEpilogue::kBiasGradB or
// kBiasGradA).
// `readers`: CountReaders's, 0 for products an epilogue fold left unread.
void FoldBiasGradients(LoopGraph& graph, const std::vector<int>& readers) {
  // Per node, the first node that reads it (nodes.size(): none).
  std::vector<int> first_reader(graph.nodes.size(),
                                static_cast<int>(graph.nodes.size()));
  for (size_t n = graph.nodes.size(); n-- > 0;) {
    for (int m : ReadsOf(graph.nodes[n])) first_reader[m] = static_cast<int>(n);
  }
  for (size_t p = 0; p < graph.nodes.size(); ++p) {
    LoopNode& product = graph.nodes[p];
    if (product.kind != LoopNode::Kind::kExtern || !product.gemm ||
        readers[p] == 0 || product.extern_owner >= 0 ||
        !product.extern_outputs.empty()) {
      continue;
    }
    // A symbolic k may be 0: the runtime then writes zeros to both results.
    // An empty C (m = 0 or n = 0) makes no call, so both must be static and
    // positive.
    const GemmCall& call = *product.gemm;
    const std::optional<int64_t> k = call.k.AsConstant();
    const std::optional<int64_t> m = call.m.AsConstant();
    const std::optional<int64_t> n = call.n.AsConstant();
    if (call.epilogue != GemmEpilogue::kNone || !(call.batch == SymExpr(1)) ||
        call.alpha != 1 || (k && *k <= 0) || !m || *m <= 0 || !n || *n <= 0) {
      continue;
    }
    // Every reader of the sum follows the call (AOTAutograd puts the sum
    // before the product; its readers come later).
    for (size_t r = 0; r < graph.nodes.size(); ++r) {
      if (r == p || first_reader[r] <= static_cast<int>(p)) continue;
      GemmEpilogue kind = GemmEpilogue::kNone;
      if (SumsOperand(graph, graph.nodes[r], product, 1)) {
        kind = GemmEpilogue::kBiasGradB;
      } else if (SumsOperand(graph, graph.nodes[r], product, 0)) {
        kind = GemmEpilogue::kBiasGradA;
      } else {
        continue;
      }
      product.gemm->epilogue = kind;
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
