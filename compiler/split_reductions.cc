#include "compiler/split_reductions.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/gpu_launch.h"
#include "compiler/graph.h"

namespace kiln {
namespace {

// Where the partial accumulator of split `split` of the row at `outer_vars`
// (a row-major index over `sizes`) lies in a buffer of rows * splits.
Expr PartialOffset(const std::vector<Expr>& outer_vars,
                   const std::vector<int64_t>& sizes, int64_t splits,
                   const Expr& split) {
  Expr row = ir::IntConst(0);
  for (size_t k = 0; k < outer_vars.size(); ++k)
    row = ir::Add(ir::Mul(row, ir::IntConst(sizes[k])), outer_vars[k]);
  return ir::Add(ir::Mul(row, ir::IntConst(splits)), split);
}

// What a kernel looks like when it can be split.
struct SplitShape {
  std::vector<int> outer, inner;  // dim numbers
  std::vector<int64_t> outer_sizes, inner_sizes;
  int64_t rows = 1, row = 1;
  int reductions = 0;  // leading kReduce stages
};

// The dims, rows and row length of a kernel whose dims are all static
// (`reductions` left 0); nothing for dynamic dims or no inner dim.
std::optional<SplitShape> StaticRows(const Kernel& k) {
  SplitShape s;
  for (size_t d = 0; d < k.dims.size(); ++d) {
    const std::optional<int64_t> size = k.dims[d].AsConstant();
    if (!size) return std::nullopt;
    if (k.inner[d]) {
      s.inner.push_back(static_cast<int>(d));
      s.inner_sizes.push_back(*size);
      s.row *= *size;
    } else {
      s.outer.push_back(static_cast<int>(d));
      s.outer_sizes.push_back(*size);
      s.rows *= *size;
    }
  }
  if (s.inner.empty()) return std::nullopt;
  return s;
}

std::optional<SplitShape> Splittable(const Kernel& k) {
  std::optional<SplitShape> shape = StaticRows(k);
  if (!shape) return std::nullopt;
  SplitShape& s = *shape;
  bool stores = false;
  for (const Stage& st : k.stages) {
    if (st.kind == Stage::Kind::kStoreInner) return std::nullopt;
    if (st.kind == Stage::Kind::kStoreOuter) {
      stores = true;
      continue;
    }
    // A reduction after a store or of another reduction's result: not
    // split.
    if (stores || ir::ContainsOp(st.value, ExprOp::kAcc)) return std::nullopt;
    ++s.reductions;
  }
  if (s.reductions == 0) return std::nullopt;
  return shape;
}

// The stage numbers of the kAcc nodes in `e`.
void CollectAccs(const Expr& e, std::vector<int>& out) {
  if (!e) return;
  if (e->op == ExprOp::kAcc) out.push_back(e->index);
  for (const Expr& a : e->args) CollectAccs(a, out);
}

// A row kernel the split cannot take as it is, with few long rows: a
// reduction of another's result (var's second pass, softmax's sum) or
// element stores of row results (softmax, layer norm). It becomes one
// kernel per level of reductions (a level reduces what earlier levels
// finalized), each storing its finalized results, one per row, to temp
// buffers that later kernels load instead of the accumulator; then a
// pointwise kernel for the element stores. Each reads the row again, but
// each can be split (or is pointwise) and so fills the GPU, where the
// kernel as it was runs one block per row. Returns nothing when `k` is not
// such a kernel.
std::optional<std::vector<Kernel>> Fission(const Kernel& k, FusedProgram& p) {
  const std::optional<SplitShape> shape = StaticRows(k);
  if (!shape || ChooseReductionSplits(shape->rows, shape->row) < 2)
    return std::nullopt;
  const int64_t rows = shape->rows;
  std::vector<Expr> outer_vars;
  for (int d : shape->outer) outer_vars.push_back(ir::Var(d));
  const int n = static_cast<int>(k.stages.size());
  // kAcc(i) names the i-th reduction (its accumulator slot), not stage i.
  std::vector<int> stage_of_slot;
  for (int s = 0; s < n; ++s) {
    if (k.stages[s].kind == Stage::Kind::kReduce) stage_of_slot.push_back(s);
  }
  std::vector<int> level(n, -1);
  int max_level = -1;
  bool needs_fission = false;
  bool inner_stores = false;
  for (int s = 0; s < n; ++s) {
    const Stage& st = k.stages[s];
    if (st.kind == Stage::Kind::kStoreInner) {
      inner_stores = needs_fission = true;
      continue;
    }
    if (st.kind != Stage::Kind::kReduce) continue;
    if (st.reduce == ReduceKind::kArgMax || st.reduce == ReduceKind::kArgMin)
      return std::nullopt;
    std::vector<int> accs;
    CollectAccs(st.value, accs);
    level[s] = 0;
    for (int slot : accs) {
      if (slot >= static_cast<int>(stage_of_slot.size()) ||
          level[stage_of_slot[slot]] < 0)
        return std::nullopt;  // not a reduction before this one
      level[s] = std::max(level[s], level[stage_of_slot[slot]] + 1);
      needs_fission = true;
    }
    max_level = std::max(max_level, level[s]);
  }
  if (!needs_fission || max_level < 0) return std::nullopt;

  // A temp of `rows` finalized values for every reduction a later kernel
  // may read.
  const Expr row_offset =
      PartialOffset(outer_vars, shape->outer_sizes, 1, ir::IntConst(0));
  std::vector<int> temp_slot(n, -1);
  std::vector<DType> finalized(n, DType::kFloat32);
  std::vector<int> buffers = k.buffers;
  for (int s = 0; s < n; ++s) {
    if (level[s] < 0 || (level[s] == max_level && !inner_stores)) continue;
    const Stage& st = k.stages[s];
    finalized[s] = st.finalize ? st.finalize->dtype : st.acc_dtype;
    ProgramBuffer b;
    b.kind = ProgramBuffer::Kind::kTemp;
    b.dtype = finalized[s];
    b.elements = SymExpr(rows);
    b.strides = ContiguousStrides({b.elements});
    temp_slot[s] = static_cast<int>(buffers.size());
    buffers.push_back(static_cast<int>(p.buffers.size()));
    p.buffers.push_back(std::move(b));
  }
  // kAcc of a reduction in an earlier kernel: its temp's value; of one in
  // this kernel: its new slot (renumber is indexed by stage).
  auto loads_before = [&](int kernel_level, std::vector<int> renumber) {
    return ir::Rewriter([&, kernel_level, renumber = std::move(renumber)](
                            const Expr& x) -> std::optional<Expr> {
      if (x->op != ExprOp::kAcc) return std::nullopt;
      const int stage = stage_of_slot[x->index];
      if (level[stage] < kernel_level) {
        return ir::Cast(
            ir::LoadBuffer(temp_slot[stage], row_offset, finalized[stage]),
            x->dtype);
      }
      return ir::Acc(renumber[stage], x->dtype);
    });
  };

  std::vector<Kernel> out;
  for (int l = 0; l <= max_level; ++l) {
    Kernel f;
    f.name = absl::StrCat(k.name, "_f", l);
    f.buffers = buffers;
    f.dims = k.dims;
    f.inner = k.inner;
    // This kernel's reductions, numbered from 0 in their order.
    std::vector<int> renumber(n, -1);
    int next = 0;
    for (int s = 0; s < n; ++s) {
      if (level[s] == l) renumber[s] = next++;
    }
    ir::Rewriter rewrite = loads_before(l, renumber);
    for (int s = 0; s < n; ++s) {
      if (level[s] != l) continue;
      Stage st = k.stages[s];
      st.value = rewrite.Run(st.value);
      // Its own acc, renumbered, by a rewriter of its own: in a finalize
      // kAcc means the raw accumulator, elsewhere the finalized value, and
      // emitters memoise per node, so the two must not share nodes.
      st.finalize = loads_before(l, renumber).Run(st.finalize);
      f.stages.push_back(std::move(st));
    }
    for (int s = 0; s < n; ++s) {
      if (level[s] != l || temp_slot[s] < 0) continue;
      Stage st;
      st.kind = Stage::Kind::kStoreOuter;
      st.value = ir::Acc(renumber[s], finalized[s]);
      st.buffer_slot = temp_slot[s];
      st.offset = row_offset;
      st.store_dtype = finalized[s];
      f.stages.push_back(std::move(st));
    }
    if (l == max_level) {
      for (const Stage& orig : k.stages) {
        if (orig.kind != Stage::Kind::kStoreOuter) continue;
        Stage st = orig;
        st.value = rewrite.Run(st.value);
        f.stages.push_back(std::move(st));
      }
    }
    out.push_back(std::move(f));
  }
  if (inner_stores) {
    Kernel f;
    f.name = absl::StrCat(k.name, "_fp");
    f.buffers = buffers;
    f.dims = k.dims;
    f.inner.assign(k.dims.size(), false);
    ir::Rewriter rewrite = loads_before(max_level + 1, std::vector<int>(n, -1));
    for (const Stage& orig : k.stages) {
      if (orig.kind != Stage::Kind::kStoreInner) continue;
      Stage st = orig;
      st.kind = Stage::Kind::kStoreOuter;  // once per element
      st.value = rewrite.Run(st.value);
      f.stages.push_back(std::move(st));
    }
    out.push_back(std::move(f));
  }
  return out;
}

bool IsArgReduce(ReduceKind r) {
  return r == ReduceKind::kArgMax || r == ReduceKind::kArgMin;
}

// Appends the partial kernel and the combining kernel that replace `k`.
//
// An argmax/argmin's partial result is a pair: the chunk's extreme value (a
// max/min reduction of the same values, added to the partial kernel) and
// its position in the row (the chunk's argmax plus the chunk's start). The
// combining kernel takes the argmax of the S values, which is the first
// chunk holding the row's extreme (max/min propagate NaN as argmax/argmin
// count it extreme, and ties go to the lower chunk), and its finalize loads
// that chunk's position: the first extreme of the row, as unsplit.
void Split(const Kernel& k, const SplitShape& shape, int64_t splits,
           FusedProgram& p) {
  const int64_t chunk = shape.row / splits;
  const int nouter = static_cast<int>(shape.outer.size());
  auto add_partial_buffer = [&](DType dtype) {
    ProgramBuffer b;
    b.kind = ProgramBuffer::Kind::kTemp;
    b.dtype = dtype;
    b.elements = SymExpr(shape.rows * splits);
    b.strides = ContiguousStrides({b.elements});
    p.buffers.push_back(std::move(b));
    return static_cast<int>(p.buffers.size()) - 1;
  };
  // Per reduction: its partial values (the accumulator dtype; an arg
  // reduction's extreme values), then the positions of the arg reductions.
  std::vector<int> partial_buffers;
  for (int r = 0; r < shape.reductions; ++r)
    partial_buffers.push_back(add_partial_buffer(k.stages[r].acc_dtype));
  std::vector<int> arg_reductions;
  for (int r = 0; r < shape.reductions; ++r) {
    if (!IsArgReduce(k.stages[r].reduce)) continue;
    arg_reductions.push_back(r);
    partial_buffers.push_back(add_partial_buffer(DType::kInt64));
  }
  const int first_partial_slot = static_cast<int>(k.buffers.size());
  // The slot of reduction r's positions (r an arg reduction).
  auto position_slot = [&](int r) {
    const int j = static_cast<int>(
        std::find(arg_reductions.begin(), arg_reductions.end(), r) -
        arg_reductions.begin());
    return first_partial_slot + shape.reductions + j;
  };

  // Partial: dims = the outer dims, the split, the chunk (inner).
  Kernel a;
  a.name = absl::StrCat(k.name, "_partial");
  a.buffers = k.buffers;
  a.buffers.insert(a.buffers.end(), partial_buffers.begin(),
                   partial_buffers.end());
  for (int d : shape.outer) a.dims.push_back(k.dims[d]);
  a.dims.push_back(SymExpr(splits));
  a.dims.push_back(SymExpr(chunk));
  a.inner.assign(a.dims.size(), false);
  a.inner.back() = true;
  // The original kernel's vars in terms of the partial kernel's.
  std::vector<Expr> vars(k.dims.size());
  std::vector<Expr> outer_vars;
  for (int o = 0; o < nouter; ++o) {
    vars[shape.outer[o]] = ir::Var(o);
    outer_vars.push_back(ir::Var(o));
  }
  const Expr split_var = ir::Var(nouter);
  const Expr flat =
      ir::Add(ir::Mul(split_var, ir::IntConst(chunk)), ir::Var(nouter + 1));
  int64_t stride = shape.row;
  for (size_t m = 0; m < shape.inner.size(); ++m) {
    stride /= shape.inner_sizes[m];
    Expr v = ir::FloorDiv(flat, ir::IntConst(stride));
    if (m > 0) v = ir::Mod(v, ir::IntConst(shape.inner_sizes[m]));
    vars[shape.inner[m]] = v;
  }
  const Expr partial_offset =
      PartialOffset(outer_vars, shape.outer_sizes, splits, split_var);
  for (int r = 0; r < shape.reductions; ++r) {
    Stage st = k.stages[r];
    st.value = ir::SubstituteVars(st.value, vars);
    st.finalize = nullptr;
    a.stages.push_back(std::move(st));
  }
  // Accumulator slots shape.reductions + j: arg reduction j's extreme.
  for (int r : arg_reductions) {
    Stage st = a.stages[r];
    st.reduce =
        st.reduce == ReduceKind::kArgMax ? ReduceKind::kMax : ReduceKind::kMin;
    a.stages.push_back(std::move(st));
  }
  auto store = [&](Expr value, int slot, DType dtype) {
    Stage st;
    st.kind = Stage::Kind::kStoreOuter;
    st.value = std::move(value);
    st.buffer_slot = slot;
    st.offset = partial_offset;
    st.store_dtype = dtype;
    a.stages.push_back(std::move(st));
  };
  for (int r = 0; r < shape.reductions; ++r) {
    const DType acc = k.stages[r].acc_dtype;
    if (!IsArgReduce(k.stages[r].reduce)) {
      store(ir::Acc(r, acc), first_partial_slot + r, acc);
      continue;
    }
    const int j = position_slot(r) - first_partial_slot - shape.reductions;
    store(ir::Acc(shape.reductions + j, acc), first_partial_slot + r, acc);
    store(ir::Add(ir::Mul(split_var, ir::IntConst(chunk)),
                  ir::Acc(r, DType::kInt64)),
          position_slot(r), DType::kInt64);
  }

  // Combine: the original kernel with its row replaced by the S partials
  // (the first inner dim takes the split, the others size 1).
  Kernel b = k;
  b.buffers = a.buffers;
  for (size_t m = 0; m < shape.inner.size(); ++m)
    b.dims[shape.inner[m]] = SymExpr(m == 0 ? splits : 1);
  std::vector<Expr> b_outer_vars;
  for (int d : shape.outer) b_outer_vars.push_back(ir::Var(d));
  const Expr combine_offset = PartialOffset(b_outer_vars, shape.outer_sizes,
                                            splits, ir::Var(shape.inner[0]));
  for (int r = 0; r < shape.reductions; ++r) {
    Stage& st = b.stages[r];
    st.value =
        ir::LoadBuffer(first_partial_slot + r, combine_offset, st.acc_dtype);
    if (!IsArgReduce(st.reduce)) continue;
    // The winning chunk's position. A fresh kAcc node: the emitters memoise
    // per node, and later stages' kAcc(r) must read the finalized position.
    const Expr position =
        ir::LoadBuffer(position_slot(r),
                       PartialOffset(b_outer_vars, shape.outer_sizes, splits,
                                     ir::Acc(r, DType::kInt64)),
                       DType::kInt64);
    if (!st.finalize) {
      st.finalize = position;
      continue;
    }
    ir::Rewriter to_position([&](const Expr& e) -> std::optional<Expr> {
      if (e->op == ExprOp::kAcc && e->index == r) return position;
      return std::nullopt;
    });
    st.finalize = to_position.Run(st.finalize);
  }
  p.kernels.push_back(std::move(a));
  p.kernels.push_back(std::move(b));
}

}  // namespace

FusedProgram SplitLongReductions(FusedProgram program) {
  std::vector<Kernel> kernels = std::move(program.kernels);
  program.kernels.clear();
  auto split_or_keep = [&program](Kernel k) {
    std::optional<SplitShape> shape = Splittable(k);
    const int64_t splits =
        shape ? ChooseReductionSplits(shape->rows, shape->row) : 1;
    if (splits < 2) {
      program.kernels.push_back(std::move(k));
      return;
    }
    Split(k, *shape, splits, program);
  };
  for (Kernel& k : kernels) {
    if (std::optional<std::vector<Kernel>> parts = Fission(k, program)) {
      for (Kernel& part : *parts) split_or_keep(std::move(part));
    } else {
      split_or_keep(std::move(k));
    }
  }
  return program;
}

}  // namespace kiln
