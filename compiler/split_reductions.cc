#include "compiler/split_reductions.h"

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

std::optional<SplitShape> Splittable(const Kernel& k) {
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
  bool stores = false;
  for (const Stage& st : k.stages) {
    if (st.kind == Stage::Kind::kStoreInner) return std::nullopt;
    if (st.kind == Stage::Kind::kStoreOuter) {
      stores = true;
      continue;
    }
    // A reduction after a store, of another reduction's result, or one
    // whose partial result is a position: not split.
    if (stores || ir::ContainsOp(st.value, ExprOp::kAcc) ||
        st.reduce == ReduceKind::kArgMax || st.reduce == ReduceKind::kArgMin)
      return std::nullopt;
    ++s.reductions;
  }
  if (s.reductions == 0) return std::nullopt;
  return s;
}

// Appends the partial kernel and the combining kernel that replace `k`.
void Split(const Kernel& k, const SplitShape& shape, int64_t splits,
           FusedProgram& p) {
  const int64_t chunk = shape.row / splits;
  const int nouter = static_cast<int>(shape.outer.size());
  std::vector<int> partial_buffers;
  for (int r = 0; r < shape.reductions; ++r) {
    ProgramBuffer b;
    b.kind = ProgramBuffer::Kind::kTemp;
    b.dtype = k.stages[r].acc_dtype;
    b.elements = SymExpr(shape.rows * splits);
    b.strides = ContiguousStrides({b.elements});
    partial_buffers.push_back(static_cast<int>(p.buffers.size()));
    p.buffers.push_back(std::move(b));
  }
  const int first_partial_slot = static_cast<int>(k.buffers.size());

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
  for (int r = 0; r < shape.reductions; ++r) {
    Stage st;
    st.kind = Stage::Kind::kStoreOuter;
    st.value = ir::Acc(r, k.stages[r].acc_dtype);
    st.buffer_slot = first_partial_slot + r;
    st.offset = partial_offset;
    st.store_dtype = k.stages[r].acc_dtype;
    a.stages.push_back(std::move(st));
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
  }
  p.kernels.push_back(std::move(a));
  p.kernels.push_back(std::move(b));
}

}  // namespace

FusedProgram SplitLongReductions(FusedProgram program) {
  std::vector<Kernel> kernels = std::move(program.kernels);
  program.kernels.clear();
  for (Kernel& k : kernels) {
    std::optional<SplitShape> shape = Splittable(k);
    const int64_t splits =
        shape ? ChooseReductionSplits(shape->rows, shape->row) : 1;
    if (splits < 2) {
      program.kernels.push_back(std::move(k));
      continue;
    }
    Split(k, *shape, splits, program);
  }
  return program;
}

}  // namespace kiln
