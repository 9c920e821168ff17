#include "compiler/fuse.h"

#include <functional>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/lower.h"
#include "graph/graph.h"

namespace kiln {
namespace {

// Whether `e` (null: no) holds an ExprOp::kCheck; `seen` spares shared
// subexpressions a second walk.
bool HasCheck(const Expr& e, absl::flat_hash_set<const ExprNode*>& seen) {
  if (!e || !seen.insert(e.get()).second) return false;
  if (e->op == ExprOp::kCheck) return true;
  for (const Expr& a : e->args) {
    if (HasCheck(a, seen)) return true;
  }
  return false;
}

// Where a node stored in (or accumulated by) a kernel can be read without
// memory: its value as an expression over the kernel's vars, valid when a
// load's index equals `index` (over the kernel's vars).
struct InKernelValue {
  Expr value;
  std::vector<Expr> index;
};

struct KernelBuild {
  Kernel kernel;
  absl::flat_hash_map<int, InKernelValue> values;  // node -> in-register value
  absl::flat_hash_map<int, int> acc_stage;         // reduction node -> stage
  int num_acc = 0;
  bool has_inner() const {
    for (bool b : kernel.inner) {
      if (b) return true;
    }
    return false;
  }
};

class Fuser {
 public:
  Fuser(const LoopGraph& g, const FuseOptions& options)
      : g_(g), options_(options) {}

  absl::StatusOr<FusedProgram> Run() {
    MarkRealized();
    FindOutputsWrittenByTheirSource();
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      const LoopNode& node = g_.nodes[n];
      if (!realized_[n] || node.kind == LoopNode::Kind::kInput) continue;
      if (written_by_.contains(static_cast<int>(n))) continue;
      if (node.kind == LoopNode::Kind::kReduction) {
        AddReduction(static_cast<int>(n));
      } else if (node.kind == LoopNode::Kind::kExtern) {
        // A result another node's call writes is no call of its own.
        if (node.extern_owner < 0) AddExtern(static_cast<int>(n));
      } else if (node.kind == LoopNode::Kind::kScatter) {
        AddScatter(static_cast<int>(n));
      } else {
        AddPointwise(static_cast<int>(n));
      }
    }
    return Finish();
  }

 private:
  void MarkRealized() {
    realized_.assign(g_.nodes.size(), false);
    std::vector<bool> reachable(g_.nodes.size(), false);
    std::vector<int> stack(g_.outputs.begin(), g_.outputs.end());
    while (!stack.empty()) {
      const int n = stack.back();
      stack.pop_back();
      if (reachable[n]) continue;
      reachable[n] = true;
      for (int m : ir::LoadsOf(g_.nodes[n].body)) stack.push_back(m);
      for (int m : ir::LoadsOf(g_.nodes[n].finalize)) stack.push_back(m);
      for (int m : ir::LoadsOf(g_.nodes[n].scatter_value)) stack.push_back(m);
      for (const Expr& e : g_.nodes[n].scatter_index) {
        for (int m : ir::LoadsOf(e)) stack.push_back(m);
      }
      for (int m : g_.nodes[n].extern_inputs) stack.push_back(m);
      // A call writes all of its results, and runs for any one of them.
      for (int m : g_.nodes[n].extern_outputs) stack.push_back(m);
      if (g_.nodes[n].extern_owner >= 0)
        stack.push_back(g_.nodes[n].extern_owner);
    }
    extern_input_.assign(g_.nodes.size(), false);
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      if (!reachable[n]) continue;
      for (int m : g_.nodes[n].extern_inputs) extern_input_[m] = true;
    }
    // Extern calls read their operands from memory: those are realized.
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      const LoopNode& node = g_.nodes[n];
      realized_[n] = reachable[n] && (node.kind != LoopNode::Kind::kPointwise ||
                                      node.output_index >= 0 || node.realize ||
                                      extern_input_[n] || !options_.fuse);
    }
    // A pointwise node an output reads whole in its own memory order (a
    // projection's pre-activation x @ w + b [B*L, F], inlined into its
    // activation, saved for the backward as [B, L, F]) is stored once,
    // into that output (FindOutputsWrittenByTheirSource), instead of
    // being computed again by a copy kernel; its readers load it.
    for (int o : g_.outputs) {
      const int x = WholeReadSource(o);
      if (x >= 0 && g_.nodes[x].kind == LoopNode::Kind::kPointwise &&
          g_.nodes[x].output_index < 0 && reachable[x])
        realized_[x] = true;
    }
    if (options_.fuse) RealizeReusedWork(reachable);
  }

  // Inductor's rule for reused values (StorageBox.should_realize_on_reuse):
  // a pointwise node read by several nodes is computed again by each that
  // inlines it; where that repeats much work (it reads more than
  // kReuseReads buffers, or takes more than kReuseOps operations, counting
  // the nodes it inlines itself) it is stored once and its readers load
  // it. Without the rule a chain of such nodes grows with each link: the
  // residual stream's gradient through layer-scaled blocks (BEiT, CaiT,
  // ConvNeXt: g_i = g_{i+1} + the block's part, read by the block's
  // reductions and by the product that takes g_i * gamma) was summed again
  // from every later block's part in every block, quadratic in the depth
  // (BEiT-base's backward: 4.2 s, 24 of its kernels 27-232 ms each).
  static constexpr size_t kReuseReads = 4;
  static constexpr int64_t kReuseOps = 30;

  void RealizeReusedWork(const std::vector<bool>& reachable) {
    const size_t count = g_.nodes.size();
    std::vector<int> readers(count, 0);
    for (size_t n = 0; n < count; ++n) {
      if (!reachable[n]) continue;
      const LoopNode& node = g_.nodes[n];
      absl::flat_hash_set<int> loads = ir::LoadsOf(node.body);
      loads.merge(ir::LoadsOf(node.finalize));
      loads.merge(ir::LoadsOf(node.scatter_value));
      for (const Expr& e : node.scatter_index) loads.merge(ir::LoadsOf(e));
      for (int m : loads) ++readers[m];
    }
    // What a read of each node costs a reader that inlines it: the
    // buffers it reads (at most kReuseReads + 1 of them kept) and its
    // operations.
    std::vector<std::vector<int>> reads(count);
    std::vector<int64_t> ops(count, 0);
    for (size_t n = 0; n < count; ++n) {
      if (!reachable[n]) continue;
      const LoopNode& node = g_.nodes[n];
      if (realized_[n] || node.kind != LoopNode::Kind::kPointwise) {
        reads[n] = {static_cast<int>(n)};
        continue;
      }
      CountWork(node.body, reads, ops, reads[n], ops[n]);
      if (readers[n] >= 2 &&
          (reads[n].size() > kReuseReads || ops[n] > kReuseOps)) {
        realized_[n] = true;
        reads[n] = {static_cast<int>(n)};
        ops[n] = 0;
      }
    }
  }

  // Adds to `buffers` and `work` what evaluating `e` reads and computes,
  // the nodes it loads counted as `reads` and `ops` say.
  static void CountWork(const Expr& e,
                        const std::vector<std::vector<int>>& reads,
                        const std::vector<int64_t>& ops,
                        std::vector<int>& buffers, int64_t& work) {
    if (!e) return;
    if (e->op == ExprOp::kLoad) {
      for (int b : reads[e->index]) {
        if (buffers.size() > kReuseReads) break;
        if (absl::c_find(buffers, b) == buffers.end()) buffers.push_back(b);
      }
      work += ops[e->index];
    } else if (!e->args.empty() && e->dtype != DType::kInt64) {
      ++work;  // a value's operation (index arithmetic is not counted)
    }
    for (const Expr& a : e->args) CountWork(a, reads, ops, buffers, work);
  }

  // The node output `out` reads whole in that node's memory order (a
  // reshape of it), with its dtype; -1 if `out` is anything else.
  int WholeReadSource(int out) const {
    const LoopNode& node = g_.nodes[out];
    if (node.kind != LoopNode::Kind::kPointwise || !node.body ||
        node.body->op != ExprOp::kLoad)
      return -1;
    const int e = static_cast<int>(node.body->index);
    const LoopNode& src = g_.nodes[e];
    if (src.dtype != node.dtype ||
        !(NumElements(src.sizes) == NumElements(node.sizes)))
      return -1;
    const int rank = static_cast<int>(node.sizes.size());
    const auto form = ir::Affine(
        FlatOffset(node.body->args, ContiguousStrides(src.sizes)), rank);
    if (!form || !(form->constant == SymExpr(0))) return -1;
    const std::vector<SymExpr> strides = ContiguousStrides(node.sizes);
    for (int d = 0; d < rank; ++d) {
      if (!(node.sizes[d] == SymExpr(1) || form->coeffs[d] == strides[d]))
        return -1;
    }
    return e;
  }

  // Outputs that read an extern call's result, or a pointwise node stored
  // anyway (an extern call's operand), in its own memory order (a reshape
  // of it: a convolution's weight gradient [O, C*K] returned as [O, C, kh,
  // kw]; a projection's input [B, L, E] saved for the backward as
  // [B*L, E]): the call or the node's kernel writes the output buffer
  // itself and no kernel copies it there. written_by_[output node] = that
  // node.
  void FindOutputsWrittenByTheirSource() {
    absl::flat_hash_set<int> outputs(g_.outputs.begin(), g_.outputs.end());
    absl::flat_hash_set<int> taken;
    for (int n : g_.outputs) {
      const int e = WholeReadSource(n);
      if (e < 0 || outputs.contains(e) || taken.contains(e)) continue;
      const LoopNode& src = g_.nodes[e];
      const bool stored_pointwise = src.kind == LoopNode::Kind::kPointwise &&
                                    realized_[e] && src.output_index < 0;
      if (src.kind != LoopNode::Kind::kExtern && !stored_pointwise) continue;
      written_by_[n] = e;
      taken.insert(e);
    }
  }

  // Whether new work may join the last kernel (not an extern call or a
  // scatter).
  bool CanJoinLast() const {
    return !kernels_.empty() && options_.fuse &&
           !kernels_.back().kernel.is_extern() &&
           !kernels_.back().kernel.is_scatter();
  }

  // An extern call is a kernel of its own; its buffers are set by Finish.
  void AddExtern(int n) {
    KernelBuild k;
    k.kernel.name = absl::StrCat("kiln_k", kernels_.size());
    k.kernel.gemm = g_.nodes[n].gemm;
    k.kernel.conv = g_.nodes[n].conv;
    k.kernel.attention = g_.nodes[n].attention;
    extern_nodes_.push_back({static_cast<int>(kernels_.size()), n});
    kernels_.push_back(std::move(k));
  }

  Expr Inline(const Expr& e) { return inliner_.Run(e); }

  ir::Rewriter inliner_{[this](const Expr& x) -> std::optional<Expr> {
    if (x->op != ExprOp::kLoad || realized_[x->index]) return std::nullopt;
    const LoopNode& node = g_.nodes[x->index];
    return Inline(ir::SubstituteVars(node.body, x->args));
  }};

  // Replaces reads of values the kernel holds in registers; returns the
  // rewritten expression, or nullopt when a read of the kernel's own
  // results remains (then the node cannot join this kernel).
  std::optional<Expr> ResolveInKernel(const Expr& e, const KernelBuild& k) {
    ir::Rewriter rw([&k](const Expr& x) -> std::optional<Expr> {
      if (x->op != ExprOp::kLoad) return std::nullopt;
      auto it = k.values.find(x->index);
      if (it == k.values.end() || it->second.index.size() != x->args.size())
        return std::nullopt;
      for (size_t d = 0; d < x->args.size(); ++d) {
        if (!ir::Equal(x->args[d], it->second.index[d])) return std::nullopt;
      }
      return it->second.value;
    });
    Expr r = rw.Run(e);
    for (int n : ir::LoadsOf(r)) {
      if (k.values.contains(n)) return std::nullopt;
    }
    return r;
  }

  // The index, over a kernel's vars, at which a node of shape `sizes` that
  // the kernel computes is read "for this row / element": nullopt if the
  // shape is not the kernel's full space, row space or keepdim row space.
  static std::optional<std::vector<Expr>> IdentityIn(
      const Kernel& k, const std::vector<SymExpr>& sizes, bool* inner_store) {
    const int rank = static_cast<int>(k.dims.size());
    if (sizes == k.dims) {
      *inner_store = true;
      for (bool b : k.inner) {
        if (b) return IdentityIndex(rank);
      }
      *inner_store = false;  // a kernel without inner dims: per element
      return IdentityIndex(rank);
    }
    *inner_store = false;
    std::vector<SymExpr> kept, keep1;
    std::vector<Expr> kept_idx, keep1_idx;
    for (int d = 0; d < rank; ++d) {
      if (k.inner[d]) {
        keep1.push_back(SymExpr(1));
        keep1_idx.push_back(ir::IntConst(0));
      } else {
        kept.push_back(k.dims[d]);
        keep1.push_back(k.dims[d]);
        kept_idx.push_back(ir::Var(d));
        keep1_idx.push_back(ir::Var(d));
      }
    }
    if (sizes == kept) return kept_idx;
    if (sizes == keep1) return keep1_idx;
    return std::nullopt;
  }

  void AddReduction(int n) {
    const LoopNode& node = g_.nodes[n];
    const Expr body = Inline(node.body);
    if (CanJoinLast()) {
      KernelBuild& k = kernels_.back();
      if (k.kernel.dims == node.reduce_sizes &&
          k.kernel.inner == node.reduced && k.has_inner()) {
        if (auto resolved = ResolveInKernel(body, k)) {
          AppendReduce(k, n, *resolved);
          return;
        }
      }
      if (options_.stores_into_reductions &&
          k.kernel.dims == node.reduce_sizes && OnlyElementStores(k)) {
        if (auto resolved = ResolveInKernel(body, k)) {
          k.kernel.inner = node.reduced;  // its stores now run per element
          for (Stage& st : k.kernel.stages) st.kind = Stage::Kind::kStoreInner;
          AppendReduce(k, n, *resolved);
          return;
        }
      }
    }
    KernelBuild k;
    k.kernel.name = absl::StrCat("kiln_k", kernels_.size());
    k.kernel.dims = node.reduce_sizes;
    k.kernel.inner = node.reduced;
    AppendReduce(k, n, body);
    kernels_.push_back(std::move(k));
  }

  // Whether `k` is a pointwise kernel: no inner dims, only stores, each
  // once per element of its dims (IdentityIn's full-space index), and no
  // random draws: a pointwise kernel draws one Philox call per vector
  // group of 4 elements, which a split reduction's rows do not keep
  // (dropout's mask then cost more than reading it back: H100, 280 us
  // for the fused forward against 195 us apart).
  static bool OnlyElementStores(const KernelBuild& k) {
    if (k.has_inner() || k.kernel.stages.empty()) return false;
    for (const Stage& st : k.kernel.stages) {
      if (st.kind != Stage::Kind::kStoreOuter ||
          ir::ContainsOp(st.value, ExprOp::kPhilox))
        return false;
    }
    return true;
  }

  void AppendReduce(KernelBuild& k, int n, Expr value) {
    const LoopNode& node = g_.nodes[n];
    Stage st;
    st.kind = Stage::Kind::kReduce;
    st.value = std::move(value);
    st.reduce = node.reduce;
    st.acc_dtype = node.acc_dtype;
    const int slot = k.num_acc++;
    if (node.finalize) {
      st.finalize = ir::Rewriter([slot](const Expr& x) -> std::optional<Expr> {
                      if (x->op == ExprOp::kAcc) return ir::Acc(slot, x->dtype);
                      return std::nullopt;
                    }).Run(node.finalize);
    }
    k.kernel.stages.push_back(std::move(st));
    k.acc_stage[n] = static_cast<int>(k.kernel.stages.size()) - 1;
    // The result's index over the kernel's vars: reduced dims are 0 (kept)
    // or gone. Not IdentityIn, which cannot tell a kept size-1 reduced dim
    // from a full one: after the row's loop its var is 1, not 0.
    std::vector<Expr> index;
    for (size_t d = 0; d < k.kernel.dims.size(); ++d) {
      if (!k.kernel.inner[d]) {
        index.push_back(ir::Var(static_cast<int>(d)));
      } else if (node.keepdim) {
        index.push_back(ir::IntConst(0));
      }
    }
    k.values[n] = InKernelValue{ir::Acc(slot, node.dtype), std::move(index)};
  }

  // A scatter is two kernels: its initial value stored like a pointwise
  // node's (joining the last kernel where it can), then a kernel of its
  // own over the source space that adds into the buffer.
  void AddScatter(int n) {
    const LoopNode& node = g_.nodes[n];
    AddPointwise(n);
    kernels_.back().values.erase(n);  // memory from now on
    KernelBuild k;
    k.kernel.name = absl::StrCat("kiln_k", kernels_.size());
    k.kernel.dims = node.scatter_sizes;
    k.kernel.inner = node.scatter_inner;
    Stage st;
    st.kind = node.scatter_replace ? Stage::Kind::kScatterStore
                                   : Stage::Kind::kScatterAdd;
    st.value = Inline(node.scatter_value);
    st.store_dtype = node.dtype;
    k.kernel.stages.push_back(std::move(st));
    std::vector<Expr> index;
    for (const Expr& e : node.scatter_index) index.push_back(Inline(e));
    pending_stores_.push_back(
        {static_cast<int>(kernels_.size()), 0, n, std::move(index)});
    kernels_.push_back(std::move(k));
  }

  void AddPointwise(int n) {
    const LoopNode& node = g_.nodes[n];
    const Expr body = Inline(node.body);
    if (CanJoinLast()) {
      KernelBuild& k = kernels_.back();
      bool inner_store = false;
      if (auto idx = IdentityIn(k.kernel, node.sizes, &inner_store)) {
        if (auto resolved =
                ResolveInKernel(ir::SubstituteVars(body, *idx), k)) {
          AppendStore(k, static_cast<int>(kernels_.size()) - 1, n, *resolved,
                      *idx, inner_store);
          return;
        }
      }
    }
    KernelBuild k;
    k.kernel.name = absl::StrCat("kiln_k", kernels_.size());
    k.kernel.dims = node.sizes;
    k.kernel.inner.assign(node.sizes.size(), false);
    AppendStore(k, static_cast<int>(kernels_.size()), n, body,
                IdentityIndex(static_cast<int>(node.sizes.size())), false);
    kernels_.push_back(std::move(k));
  }

  // Records a store of node n (value over kernel vars) at index `idx`; the
  // buffer slot and offset are filled in by Finish().
  void AppendStore(KernelBuild& k, int kernel_index, int n, Expr value,
                   const std::vector<Expr>& idx, bool inner_store) {
    Stage st;
    st.kind = inner_store ? Stage::Kind::kStoreInner : Stage::Kind::kStoreOuter;
    st.value = value;
    st.store_dtype = g_.nodes[n].dtype;
    k.kernel.stages.push_back(std::move(st));
    pending_stores_.push_back(
        {kernel_index, static_cast<int>(k.kernel.stages.size()) - 1, n, idx});
    k.values[n] = InKernelValue{std::move(value), idx};
  }

  // Loads of node `x` in `e`: calls fn(load) for each (null: none).
  static void ForEachLoadOf(const Expr& e, int x,
                            const std::function<void(const Expr&)>& fn,
                            absl::flat_hash_set<const ExprNode*>& seen) {
    if (!e || !seen.insert(e.get()).second) return;
    if (e->op == ExprOp::kLoad && e->index == x) fn(e);
    for (const Expr& a : e->args) ForEachLoadOf(a, x, fn, seen);
  }
  static bool StageLoads(const Stage& st, int x) {
    for (const Expr* e : {&st.value, &st.finalize, &st.offset}) {
      if (*e && ir::LoadsOf(*e).contains(x)) return true;
    }
    return false;
  }

  // The graph's input writes (LoopGraph::output_input) that can be stored
  // into the input's memory: output node -> input node. One is taken when
  //  - the output is stored by one pointwise kernel (no reduction, no
  //    scatter, not an extern call: one element per iteration; a
  //    reduction's rows may later be split, and split_reductions moves
  //    element stores into the partial kernels, ahead of the kernels after
  //    them);
  //  - that kernel reads the input only at the element it writes (so no
  //    other iteration reads an element this one overwrote);
  //  - no later kernel or extern call reads the input;
  // and the kernel's stages can be ordered so that each such store comes
  // after every stage that reads its input (they are reordered so: stages
  // of a pointwise kernel are independent stores of inline values). A
  // kernel whose writes cannot all be ordered so keeps them all ordinary
  // outputs.
  absl::flat_hash_map<int, int> InPlaceOutputs() {
    absl::flat_hash_map<int, int> in_place;
    if (g_.output_input.empty()) return in_place;
    absl::flat_hash_map<int, int> input_node;  // input number -> node
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      if (g_.nodes[n].kind == LoopNode::Kind::kInput)
        input_node[g_.nodes[n].input_index] = static_cast<int>(n);
    }
    // The nodes each kernel loads (any stage).
    std::vector<absl::flat_hash_set<int>> kernel_loads(kernels_.size());
    for (size_t k = 0; k < kernels_.size(); ++k) {
      for (const Stage& st : kernels_[k].kernel.stages) {
        for (const Expr* e : {&st.value, &st.finalize, &st.offset}) {
          if (*e) kernel_loads[k].merge(ir::LoadsOf(*e));
        }
      }
    }
    // Per kernel: (input node, store stage) of the writes it could take.
    absl::flat_hash_map<int, std::vector<std::pair<int, int>>> by_kernel;
    absl::flat_hash_map<int, int> write_of;  // input node -> output node
    for (size_t o = 0; o < g_.outputs.size(); ++o) {
      const int in = g_.output_input[o];
      if (in < 0 || !input_node.contains(in)) continue;
      const int x = input_node[in], n = g_.outputs[o];
      const PendingStore* store = nullptr;
      int stores = 0;
      for (const PendingStore& ps : pending_stores_) {
        if (ps.node == n) {
          store = &ps;
          ++stores;
        }
      }
      if (stores != 1) continue;
      const Kernel& k = kernels_[store->kernel].kernel;
      bool ok = !k.is_extern() && !k.is_scatter();
      for (bool inner : k.inner) ok = ok && !inner;
      for (const Stage& st : k.stages) {
        ok = ok && st.kind != Stage::Kind::kReduce;
        absl::flat_hash_set<const ExprNode*> seen;
        for (const Expr* e : {&st.value, &st.finalize, &st.offset}) {
          ForEachLoadOf(
              *e, x,
              [&](const Expr& load) {
                ok = ok && load->args.size() == store->index.size();
                for (size_t d = 0; ok && d < load->args.size(); ++d)
                  ok = ir::Equal(load->args[d], store->index[d]);
              },
              seen);
        }
      }
      for (size_t later = store->kernel + 1; ok && later < kernels_.size();
           ++later)
        ok = !kernel_loads[later].contains(x);
      for (const auto& [kernel, node] : extern_nodes_) {
        if (kernel <= store->kernel) continue;
        for (int operand : g_.nodes[node].extern_inputs)
          ok = ok && operand != x;
      }
      if (!ok) continue;
      by_kernel[store->kernel].push_back({x, store->stage});
      write_of[x] = n;
    }
    for (auto& [kernel, writes] : by_kernel) {
      std::vector<Stage>& stages = kernels_[kernel].kernel.stages;
      const int count = static_cast<int>(stages.size());
      // before[s]: stages that must precede stage s.
      std::vector<std::vector<int>> before(count);
      for (const auto& [x, store_stage] : writes) {
        for (int s = 0; s < count; ++s) {
          if (s != store_stage && StageLoads(stages[s], x))
            before[store_stage].push_back(s);
        }
      }
      std::vector<int> order;  // Kahn's, lowest stage first
      std::vector<bool> placed(count, false);
      while (static_cast<int>(order.size()) < count) {
        int next = -1;
        for (int s = 0; s < count && next < 0; ++s) {
          if (placed[s]) continue;
          bool ready = true;
          for (int b : before[s]) ready = ready && placed[b];
          if (ready) next = s;
        }
        if (next < 0) break;  // a cycle: x's store reads y and y's reads x
        placed[next] = true;
        order.push_back(next);
      }
      if (static_cast<int>(order.size()) < count) continue;
      std::vector<int> position(count);
      std::vector<Stage> reordered;
      for (int i = 0; i < count; ++i) {
        position[order[i]] = i;
        reordered.push_back(std::move(stages[order[i]]));
      }
      stages = std::move(reordered);
      for (PendingStore& ps : pending_stores_) {
        if (ps.kernel == kernel) ps.stage = position[ps.stage];
      }
      for (const auto& [x, store_stage] : writes) in_place[write_of[x]] = x;
    }
    return in_place;
  }

  absl::StatusOr<FusedProgram> Finish() {
    FusedProgram p;
    p.symbol_names = g_.symbol_names;
    p.index_checks = g_.index_checks;
    const absl::flat_hash_map<int, int> in_place = InPlaceOutputs();
    // Program buffers: inputs, then outputs, then temps as needed.
    absl::flat_hash_map<int, int> buffer_of;  // node -> program buffer
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      const LoopNode& node = g_.nodes[n];
      if (node.kind != LoopNode::Kind::kInput) continue;
      ProgramBuffer b;
      b.kind = ProgramBuffer::Kind::kInput;
      b.index = node.input_index;
      b.dtype = node.dtype;
      b.strides = node.strides;
      // Extent of the strided storage the kernels may touch.
      SymExpr extent(1);
      bool empty = false;
      for (size_t d = 0; d < node.sizes.size(); ++d) {
        if (node.sizes[d] == SymExpr(0)) empty = true;
        extent = extent + (node.sizes[d] - SymExpr(1)) * node.strides[d];
      }
      b.elements = empty ? SymExpr(0) : extent;
      buffer_of[static_cast<int>(n)] = static_cast<int>(p.buffers.size());
      p.buffers.push_back(std::move(b));
    }
    int outputs = 0;  // the program's outputs: not the input writes
    for (size_t o = 0; o < g_.outputs.size(); ++o) {
      const LoopNode& node = g_.nodes[g_.outputs[o]];
      if (auto w = in_place.find(g_.outputs[o]); w != in_place.end()) {
        buffer_of[g_.outputs[o]] = buffer_of.at(w->second);
        p.input_writes.emplace_back(static_cast<int>(o),
                                    g_.nodes[w->second].input_index);
        continue;
      }
      ProgramBuffer b;
      b.kind = ProgramBuffer::Kind::kOutput;
      b.index = outputs++;
      b.dtype = node.dtype;
      b.elements = NumElements(node.sizes);
      b.strides = ContiguousStrides(node.sizes);
      buffer_of[g_.outputs[o]] = static_cast<int>(p.buffers.size());
      if (auto e = written_by_.find(g_.outputs[o]); e != written_by_.end())
        buffer_of[e->second] = static_cast<int>(p.buffers.size());
      p.buffers.push_back(std::move(b));
    }
    // Which kernel-local results are still read from memory afterwards.
    std::vector<absl::flat_hash_set<int>> loads(kernels_.size());
    for (size_t k = 0; k < kernels_.size(); ++k) {
      for (const Stage& st : kernels_[k].kernel.stages) {
        for (int m : ir::LoadsOf(st.value)) loads[k].insert(m);
        for (int m : ir::LoadsOf(st.finalize)) loads[k].insert(m);
      }
    }
    for (const PendingStore& ps : pending_stores_) {  // a scatter's targets
      for (const Expr& e : ps.index) {
        for (int m : ir::LoadsOf(e)) loads[ps.kernel].insert(m);
      }
    }
    auto needs_buffer = [&](int n) {
      if (g_.nodes[n].output_index >= 0 || extern_input_[n]) return true;
      for (const auto& l : loads) {
        if (l.contains(n)) return true;
      }
      return false;
    };
    // Reductions that need memory get a store right after their stage.
    for (size_t k = 0; k < kernels_.size(); ++k) {
      KernelBuild& kb = kernels_[k];
      std::vector<std::pair<int, int>> order;  // (stage, node)
      for (const auto& [node, stage] : kb.acc_stage)
        order.push_back({stage, node});
      std::sort(order.begin(), order.end(), std::greater<>());
      for (const auto& [stage, n] : order) {
        if (!needs_buffer(n)) continue;
        const LoopNode& node = g_.nodes[n];
        if (!buffer_of.contains(n)) {
          ProgramBuffer b;
          b.kind = ProgramBuffer::Kind::kTemp;
          b.dtype = node.dtype;
          b.elements = NumElements(node.sizes);
          b.strides = ContiguousStrides(node.sizes);
          buffer_of[n] = static_cast<int>(p.buffers.size());
          p.buffers.push_back(std::move(b));
        }
        Stage st;
        st.kind = Stage::Kind::kStoreOuter;
        st.value = kb.values[n].value;
        st.store_dtype = node.dtype;
        st.buffer_slot = -1 - n;  // resolved below
        st.offset =
            FlatOffset(kb.values[n].index, ContiguousStrides(node.sizes));
        kb.kernel.stages.insert(kb.kernel.stages.begin() + stage + 1,
                                std::move(st));
        // Pending stores recorded after this stage shift by one.
        for (PendingStore& ps : pending_stores_) {
          if (ps.kernel == static_cast<int>(k) && ps.stage > stage) ++ps.stage;
        }
      }
    }
    // Realized pointwise nodes that are not outputs (extern operands, and
    // every one without fusion) and extern results live in temps.
    std::vector<int> temp_nodes;
    for (const PendingStore& ps : pending_stores_)
      temp_nodes.push_back(ps.node);
    for (const auto& [kernel, node] : extern_nodes_) {
      temp_nodes.push_back(node);
      for (int m : g_.nodes[node].extern_outputs) temp_nodes.push_back(m);
    }
    for (int n : temp_nodes) {
      if (buffer_of.contains(n)) continue;
      const LoopNode& node = g_.nodes[n];
      ProgramBuffer b;
      b.kind = ProgramBuffer::Kind::kTemp;
      b.dtype = node.dtype;
      b.elements = NumElements(node.sizes);
      b.strides = ContiguousStrides(node.sizes);
      buffer_of[n] = static_cast<int>(p.buffers.size());
      p.buffers.push_back(std::move(b));
    }
    for (const auto& [kernel, n] : extern_nodes_) {
      const LoopNode& node = g_.nodes[n];
      std::vector<int>& buffers = kernels_[kernel].kernel.buffers;
      if (node.attention) {
        buffers.clear();
        for (int m : node.extern_inputs) buffers.push_back(buffer_of.at(m));
        buffers.push_back(buffer_of.at(n));
        for (int m : node.extern_outputs) buffers.push_back(buffer_of.at(m));
        continue;
      }
      buffers = {buffer_of.at(node.extern_inputs[0]),
                 buffer_of.at(node.extern_inputs[1]), buffer_of.at(n)};
      if (node.gemm && EpilogueHasBias(node.gemm->epilogue))
        buffers.push_back(buffer_of.at(node.extern_inputs[2]));
      if (node.gemm && EpilogueWritesBias(node.gemm->epilogue))
        buffers.push_back(buffer_of.at(node.extern_outputs[0]));
    }
    for (const PendingStore& ps : pending_stores_) {
      Stage& st = kernels_[ps.kernel].kernel.stages[ps.stage];
      st.buffer_slot = -1 - ps.node;
      st.offset =
          FlatOffset(ps.index, ContiguousStrides(g_.nodes[ps.node].sizes));
    }
    // The error word of the index checks, added (last) only when a kernel
    // checks an index, so programs without checks are unchanged.
    int error_buffer = -1;
    auto error_word = [&] {
      if (error_buffer < 0) {
        ProgramBuffer b;
        b.kind = ProgramBuffer::Kind::kError;
        b.dtype = DType::kInt64;
        b.elements = SymExpr(3);
        b.strides = {SymExpr(1)};
        error_buffer = static_cast<int>(p.buffers.size());
        p.buffers.push_back(std::move(b));
      }
      return error_buffer;
    };
    // Slots: each kernel's buffers in first-use order, the error word
    // after all others; loads become flat offsets into them.
    for (KernelBuild& kb : kernels_) {
      Kernel& kernel = kb.kernel;
      absl::flat_hash_map<int, int> slot_of;  // program buffer -> slot
      auto slot = [&](int program_buffer) {
        auto [it, inserted] = slot_of.emplace(
            program_buffer, static_cast<int>(kernel.buffers.size()));
        if (inserted) kernel.buffers.push_back(program_buffer);
        return it->second;
      };
      for (Stage& st : kernel.stages) {
        ir::Rewriter to_buffers([&](const Expr& x) -> std::optional<Expr> {
          if (x->op != ExprOp::kLoad) return std::nullopt;
          const int b = buffer_of.at(x->index);
          // A node in memory is contiguous in its own shape, except an
          // input (its strides) and an extern result that is an output of
          // another shape (the buffer's strides are the output's).
          const LoopNode& read = g_.nodes[x->index];
          return ir::LoadBuffer(
              slot(b),
              FlatOffset(x->args, read.kind == LoopNode::Kind::kInput
                                      ? p.buffers[b].strides
                                      : ContiguousStrides(read.sizes)),
              x->dtype);
        });
        st.value = to_buffers.Run(st.value);
        if (st.finalize) st.finalize = to_buffers.Run(st.finalize);
        // Only a scatter's offsets read data (its target indices).
        if (st.kind == Stage::Kind::kScatterAdd ||
            st.kind == Stage::Kind::kScatterStore)
          st.offset = to_buffers.Run(st.offset);
        if (st.kind != Stage::Kind::kReduce)
          st.buffer_slot = slot(buffer_of.at(-1 - st.buffer_slot));
      }
      // Only kernels that check an index are rewritten (a Rewriter merges
      // structurally equal subexpressions, which would change the code of
      // the others).
      absl::flat_hash_set<const ExprNode*> seen;
      bool checks = false;
      for (const Stage& st : kernel.stages) {
        checks = checks || HasCheck(st.value, seen) ||
                 HasCheck(st.finalize, seen) || HasCheck(st.offset, seen);
      }
      if (checks) {
        const int error_slot = slot(error_word());
        ir::Rewriter to_error_slot([&](const Expr& x) -> std::optional<Expr> {
          if (x->op != ExprOp::kCheck) return std::nullopt;
          return ir::Check(x->args[0], x->args[1], x->args[2],
                           static_cast<int>(x->i), error_slot);
        });
        for (Stage& st : kernel.stages) {
          st.value = to_error_slot.Run(st.value);
          st.finalize = to_error_slot.Run(st.finalize);
          st.offset = to_error_slot.Run(st.offset);
        }
      }
      p.kernels.push_back(std::move(kernel));
    }
    return p;
  }

  static Expr FlatOffset(const std::vector<Expr>& index,
                         const std::vector<SymExpr>& strides) {
    Expr off = ir::IntConst(0);
    for (size_t d = 0; d < index.size(); ++d)
      off = ir::Add(off, ir::Mul(index[d], ir::FromSym(strides[d])));
    return off;
  }

  struct PendingStore {
    int kernel, stage, node;
    std::vector<Expr> index;
  };

  const LoopGraph& g_;
  const FuseOptions options_;
  std::vector<bool> realized_;
  std::vector<bool> extern_input_;  // per node: read by an extern call
  std::vector<std::pair<int, int>> extern_nodes_;   // (kernel, node)
  absl::flat_hash_map<int, int> written_by_;        // output -> its source
  std::vector<KernelBuild> kernels_;
  std::vector<PendingStore> pending_stores_;
};

}  // namespace

absl::StatusOr<FusedProgram> Fuse(const LoopGraph& graph,
                                  const FuseOptions& options) {
  return Fuser(graph, options).Run();
}

}  // namespace kiln
