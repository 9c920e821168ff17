#include "compiler/lower.h"

#include "absl/strings/str_cat.h"
#include "compiler/op_lowering.h"
#include "graph/host_tensor.h"
#include "graph/op_signature.h"

namespace kiln {

std::vector<Expr> IdentityIndex(int n) {
  std::vector<Expr> idx;
  for (int i = 0; i < n; ++i) idx.push_back(ir::Var(i));
  return idx;
}

Expr LowerContext::Read(const LoweredValue& v, const std::vector<Expr>& index) {
  std::vector<Expr> node_index;
  for (const Expr& e : v.index)
    node_index.push_back(ir::SubstituteVars(e, index));
  return ir::Load(v.node, std::move(node_index), v.dtype);
}

Expr LowerContext::ReadBroadcast(const LoweredValue& v,
                                 const std::vector<SymExpr>& sizes) {
  const int lead =
      static_cast<int>(sizes.size()) - static_cast<int>(v.sizes.size());
  std::vector<Expr> idx;
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    const bool broadcast =
        v.sizes[d] == SymExpr(1) && sizes[lead + d] != SymExpr(1);
    idx.push_back(broadcast ? ir::IntConst(0)
                            : ir::Var(lead + static_cast<int>(d)));
  }
  return Read(v, idx);
}

Expr LowerContext::Operand(int i, const std::vector<SymExpr>& sizes,
                           DType dtype) const {
  const Attr& a = node_.args[i];
  if (a.kind == Attr::Kind::kTensor)
    return ir::Cast(ReadBroadcast(value(i), sizes), dtype);
  // Scalars of float16/bfloat16 ops stay float32 (opmath), as in the
  // reference (ops_common.cc, Elementwise).
  if (IsFloating(dtype)) return ir::Const(a.ScalarAsDouble(), DType::kFloat32);
  const int64_t v = a.kind == Attr::Kind::kBool ? a.b : a.i;
  return ir::IntConst(WrapInt(v, dtype), dtype);
}

LoweredValue LowerContext::AddNode(LoopNode node) {
  LoweredValue v;
  v.node = static_cast<int>(loops_.nodes.size());
  v.index = IdentityIndex(static_cast<int>(node.sizes.size()));
  v.dtype = node.dtype;
  v.sizes = node.sizes;
  loops_.nodes.push_back(std::move(node));
  return v;
}

LoweredValue LowerContext::Remap(const LoweredValue& v,
                                 const std::vector<Expr>& v_index,
                                 std::vector<SymExpr> sizes) {
  LoweredValue w;
  w.node = v.node;
  w.dtype = v.dtype;
  w.sizes = std::move(sizes);
  for (const Expr& e : v.index)
    w.index.push_back(ir::SubstituteVars(e, v_index));
  return w;
}

int LowerContext::AddIndexCheck(IndexCheck::Kind kind, int dim,
                                const SymExpr& size) {
  std::vector<IndexCheck>& checks = loops_.index_checks;
  for (size_t c = 0; c < checks.size(); ++c) {
    const IndexCheck& k = checks[c];
    if (k.node == node_index_ && k.kind == kind && k.dim == dim &&
        k.size == size) {
      return static_cast<int>(c);
    }
  }
  IndexCheck check;
  check.kind = kind;
  check.node = node_index_;
  check.op = node_.op->name;
  check.dim = dim;
  check.size = size;
  checks.push_back(std::move(check));
  return static_cast<int>(checks.size()) - 1;
}

namespace {

// Whether `v` reads its node in place: the identity map over its sizes.
bool ReadsInPlace(const LoweredValue& v) {
  if (v.node < 0 || v.index.size() != v.sizes.size()) return false;
  for (size_t d = 0; d < v.index.size(); ++d) {
    if (!ir::Equal(v.index[d], ir::Var(static_cast<int>(d)))) return false;
  }
  return true;
}

}  // namespace

void LowerContext::MarkEpilogue(const LoweredValue& result, GemmEpilogue kind,
                                const LoweredValue& source,
                                const LoweredValue* bias) {
  if (!ReadsInPlace(result) || !ReadsInPlace(source) ||
      source.sizes != result.sizes || result.sizes.empty()) {
    return;
  }
  if ((kind == GemmEpilogue::kBias) != (bias != nullptr)) return;
  if (bias != nullptr) {
    const std::vector<SymExpr>& s = bias->sizes;
    const bool vector = (s.size() == 1 || (s.size() == 2 && s[0] == SymExpr(1))) &&
                        s.back() == result.sizes.back();
    if (!vector || !ReadsInPlace(*bias)) return;
    const LoopNode& b = loops_.nodes[bias->node];
    if (b.kind == LoopNode::Kind::kInput && s.back() != SymExpr(1) &&
        b.strides.back() != SymExpr(1)) {
      return;
    }
  }
  LoopNode& node = loops_.nodes[result.node];
  node.epilogue = kind;
  node.epilogue_source = source.node;
  node.epilogue_bias = bias != nullptr ? bias->node : -1;
}

absl::Status LowerContext::Unimplemented(absl::string_view what) const {
  return absl::UnimplementedError(
      absl::StrCat("node ", node_index_, " (", node_.op->name, "): ", what));
}

namespace {

// A pointwise node among the first `lowered` of `loops`, not an output,
// whose value is exactly `body` (a read of another node) over the sizes and
// dtype of `v`: the output `body` computes can be that node. -1 if none.
int SameReadNode(const LoopGraph& loops, size_t lowered, const Expr& body,
                 const LoweredValue& v) {
  if (body->op != ExprOp::kLoad) return -1;
  for (size_t n = 0; n < lowered; ++n) {
    const LoopNode& node = loops.nodes[n];
    if (node.kind == LoopNode::Kind::kPointwise && node.output_index < 0 &&
        node.body && node.body->op == ExprOp::kLoad &&
        node.body->index == body->index && node.dtype == v.dtype &&
        node.sizes == v.sizes && ir::Equal(node.body, body))
      return static_cast<int>(n);
  }
  return -1;
}

}  // namespace

absl::StatusOr<LoopGraph> Lower(const Graph& graph,
                                 const LowerOptions& options) {
  LoopGraph loops;
  loops.symbol_names = graph.SymbolNames();
  loops.num_inputs = static_cast<int>(graph.inputs.size());
  std::vector<LoweredValue> values(graph.values.size());
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const GraphInput& in = graph.inputs[i];
    LoopNode node;
    node.kind = LoopNode::Kind::kInput;
    node.name = graph.values[in.value].name;
    node.dtype = graph.type(in.value).dtype;
    node.sizes = graph.type(in.value).sizes;
    node.input_index = static_cast<int>(i);
    node.strides = in.strides;
    LoweredValue v;
    v.node = static_cast<int>(loops.nodes.size());
    v.index = IdentityIndex(static_cast<int>(node.sizes.size()));
    v.dtype = node.dtype;
    v.sizes = node.sizes;
    loops.nodes.push_back(std::move(node));
    values[in.value] = std::move(v);
  }
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    LowerContext ctx(graph, node, static_cast<int>(n), loops, values,
                     options);
    const LowerFn* lower = OpLowerings::Get().Find(node.op->name);
    if (lower == nullptr) {
      return ctx.Unimplemented("no loop-IR lowering for this op yet");
    }
    auto outs = (*lower)(ctx);
    if (!outs.ok()) return outs.status();
    if (outs->size() != node.outputs.size()) {
      return absl::InternalError(
          absl::StrCat("node ", n, " (", node.op->name,
                       "): lowering returned the wrong number of values"));
    }
    for (size_t o = 0; o < outs->size(); ++o) {
      LoweredValue& v = (*outs)[o];
      // Nodes made for this op are named after the value they compute.
      if (v.node >= 0 && loops.nodes[v.node].name.empty()) {
        loops.nodes[v.node].name = graph.values[node.outputs[o]].name;
      }
      values[node.outputs[o]] = std::move(v);
    }
  }
  // One node per output position: a node whose identity read is the output
  // becomes the output; so does a node that reads the same elements of the
  // same node in the same order (SameReadNode: an extern call's operand
  // laid out for it, returned as a view, as AOTAutograd saves a
  // projection's input for its weight gradient), which the call then
  // reads from the output buffer; anything else (a view, an input, a node
  // already returned) gets a copy node.
  std::vector<bool> writes_input(graph.outputs.size(), false);
  for (const InputWrite& w : graph.input_writes) writes_input[w.output] = true;
  const size_t lowered = loops.nodes.size();
  for (size_t o = 0; o < graph.outputs.size(); ++o) {
    const LoweredValue& v = values[graph.outputs[o]];
    const LoopNode& target = loops.nodes[v.node];
    bool identity = target.kind != LoopNode::Kind::kInput &&
                    target.output_index < 0 && v.sizes == target.sizes;
    for (size_t d = 0; identity && d < v.index.size(); ++d) {
      identity = v.index[d]->op == ExprOp::kVar &&
                 v.index[d]->index == static_cast<int>(d);
    }
    if (identity) {
      loops.nodes[v.node].output_index = static_cast<int>(o);
      loops.outputs.push_back(v.node);
      continue;
    }
    Expr body =
        LowerContext::Read(v, IdentityIndex(static_cast<int>(v.sizes.size())));
    if (!writes_input[o]) {
      if (const int same = SameReadNode(loops, lowered, body, v); same >= 0) {
        loops.nodes[same].output_index = static_cast<int>(o);
        loops.outputs.push_back(same);
        continue;
      }
    }
    LoopNode copy;
    copy.kind = LoopNode::Kind::kPointwise;
    copy.name = absl::StrCat(graph.values[graph.outputs[o]].name, ".out", o);
    copy.dtype = v.dtype;
    copy.sizes = v.sizes;
    copy.body = std::move(body);
    copy.output_index = static_cast<int>(o);
    loops.outputs.push_back(static_cast<int>(loops.nodes.size()));
    loops.nodes.push_back(std::move(copy));
  }
  if (!graph.input_writes.empty()) {
    loops.output_input.assign(graph.outputs.size(), -1);
    for (const InputWrite& w : graph.input_writes)
      loops.output_input[w.output] = w.input;
  }
  return loops;
}

}  // namespace kiln
