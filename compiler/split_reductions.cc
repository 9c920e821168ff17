#include "compiler/split_reductions.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/gpu_launch.h"
#include "graph/graph.h"

namespace kiln {
namespace {

// Where the partial accumulator of split `split` of the row at `outer_vars`
// (a row-major index over `sizes`) lies in a buffer of rows * splits: at
// row * splits + split, or with `columns` (split column reductions, whose
// kernels read the partials of adjacent rows together) at
// split * rows + row.
Expr PartialOffset(const std::vector<Expr>& outer_vars,
                   const std::vector<int64_t>& sizes, int64_t splits,
                   const Expr& split, bool columns = false) {
  Expr row = ir::IntConst(0);
  int64_t rows = 1;
  for (size_t k = 0; k < outer_vars.size(); ++k) {
    row = ir::Add(ir::Mul(row, ir::IntConst(sizes[k])), outer_vars[k]);
    rows *= sizes[k];
  }
  if (columns) return ir::Add(ir::Mul(split, ir::IntConst(rows)), row);
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

// Whether an element store (kStoreInner) reads no row result: an element
// of a pointwise value fused into the reduction's kernel
// (FuseOptions::stores_into_reductions), which any split of the row can
// store where it reads the element.
bool ElementOnly(const Stage& st) {
  return st.kind == Stage::Kind::kStoreInner &&
         !ir::ContainsOp(st.value, ExprOp::kAcc);
}

// `k` with its reductions ahead of its row stores, when those are its only
// stages: fusion interleaves them (sum, store, amax, store for two outputs
// of the same rows), and Splittable wants the reductions first. A row store
// reads finalized results only and no reduction reads what a store of the
// same kernel writes, so the order does not matter; kAcc names a reduction
// by its rank among the reductions, which is kept.
Kernel ReductionsFirst(const Kernel& k) {
  Kernel out = k;
  for (const Stage& st : k.stages) {
    if (st.kind == Stage::Kind::kStoreInner && !ElementOnly(st)) return out;
  }
  std::stable_partition(
      out.stages.begin(), out.stages.end(),
      [](const Stage& st) { return st.kind == Stage::Kind::kReduce; });
  return out;
}

std::optional<SplitShape> Splittable(const Kernel& k) {
  std::optional<SplitShape> shape = StaticRows(k);
  if (!shape) return std::nullopt;
  SplitShape& s = *shape;
  bool stores = false;
  for (const Stage& st : k.stages) {
    if (st.kind == Stage::Kind::kStoreInner && !ElementOnly(st))
      return std::nullopt;
    if (st.kind != Stage::Kind::kReduce) {
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

// A temp buffer of `elements` values of `dtype`, appended to the program;
// returns its program buffer number.
int AddTemp(FusedProgram& p, DType dtype, int64_t elements) {
  ProgramBuffer b;
  b.kind = ProgramBuffer::Kind::kTemp;
  b.dtype = dtype;
  b.elements = SymExpr(elements);
  b.strides = ContiguousStrides({b.elements});
  p.buffers.push_back(std::move(b));
  return static_cast<int>(p.buffers.size()) - 1;
}

// A stage storing `value` (of `dtype`) once per row, at `offset` of the
// buffer in `slot`.
Stage RowStore(Expr value, int slot, Expr offset, DType dtype) {
  Stage st;
  st.kind = Stage::Kind::kStoreOuter;
  st.value = std::move(value);
  st.buffer_slot = slot;
  st.offset = std::move(offset);
  st.store_dtype = dtype;
  return st;
}

// The element stores (kStoreInner) of `k` as the pointwise kernel
// `<name>_fp` over `buffers`, each once per element, `acc_to_row_temp`
// turning each kAcc into a load of its row's finalized value.
Kernel ElementStoresKernel(const Kernel& k, std::vector<int> buffers,
                           ir::Rewriter& acc_to_row_temp) {
  Kernel f;
  f.name = absl::StrCat(k.name, "_fp");
  f.buffers = std::move(buffers);
  f.dims = k.dims;
  f.inner.assign(k.dims.size(), false);
  for (const Stage& orig : k.stages) {
    if (orig.kind != Stage::Kind::kStoreInner) continue;
    Stage st = orig;
    st.kind = Stage::Kind::kStoreOuter;  // once per element
    st.value = acc_to_row_temp.Run(st.value);
    f.stages.push_back(std::move(st));
  }
  return f;
}

// A row kernel the split cannot take as it is, with few long rows, and
// that OnePassMoments did not take: a reduction of another's result
// (softmax's sum; var's second pass where no chunk fits a persistent row)
// or element stores of row results (softmax). It becomes one
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
      // Element-only stores ride along in a split (Split's partial kernel).
      inner_stores = true;
      needs_fission |= !ElementOnly(st);
      continue;
    }
    if (st.kind != Stage::Kind::kReduce) continue;
    if (IsArgReduce(st.reduce)) return std::nullopt;
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
    temp_slot[s] = static_cast<int>(buffers.size());
    buffers.push_back(AddTemp(p, finalized[s], rows));
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
      f.stages.push_back(RowStore(ir::Acc(renumber[s], finalized[s]),
                                  temp_slot[s], row_offset, finalized[s]));
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
    ir::Rewriter rewrite = loads_before(max_level + 1, std::vector<int>(n, -1));
    out.push_back(ElementStoresKernel(k, buffers, rewrite));
  }
  return out;
}

// The rows of a kernel cut in chunks: the partial kernel's dims (the outer
// dims, the split, the chunk: inner; with `columns` the split first, so that
// the last outer dim stays the one adjacent rows step along) and the
// original kernel's vars in its terms.
struct ChunkedRows {
  std::vector<SymExpr> dims;
  std::vector<bool> inner;
  std::vector<Expr> vars;        // the original kernel's var d
  std::vector<Expr> outer_vars;  // the partial kernel's outer vars
  Expr split_var;
};

ChunkedRows ChunkRows(const Kernel& k, const SplitShape& shape, int64_t splits,
                      bool columns) {
  const int64_t chunk = shape.row / splits;
  const int nouter = static_cast<int>(shape.outer.size());
  const int first_outer = columns ? 1 : 0;
  ChunkedRows c;
  if (columns) c.dims.push_back(SymExpr(splits));
  for (int d : shape.outer) c.dims.push_back(k.dims[d]);
  if (!columns) c.dims.push_back(SymExpr(splits));
  c.dims.push_back(SymExpr(chunk));
  c.inner.assign(c.dims.size(), false);
  c.inner.back() = true;
  c.vars.resize(k.dims.size());
  for (int o = 0; o < nouter; ++o) {
    c.vars[shape.outer[o]] = ir::Var(first_outer + o);
    c.outer_vars.push_back(ir::Var(first_outer + o));
  }
  c.split_var = ir::Var(columns ? 0 : nouter);
  const Expr flat =
      ir::Add(ir::Mul(c.split_var, ir::IntConst(chunk)), ir::Var(nouter + 1));
  int64_t stride = shape.row;
  for (size_t m = 0; m < shape.inner.size(); ++m) {
    stride /= shape.inner_sizes[m];
    Expr v = ir::FloorDiv(flat, ir::IntConst(stride));
    if (m > 0) v = ir::Mod(v, ir::IntConst(shape.inner_sizes[m]));
    c.vars[shape.inner[m]] = v;
  }
  return c;
}

// The combining kernel's start: `k` with its row replaced by the S partials
// (the first inner dim takes the split, the others size 1), and the offset
// of its element in a buffer of rows * S partials.
Kernel CombineKernel(const Kernel& k, const SplitShape& shape, int64_t splits,
                     Expr* combine_offset, bool columns = false) {
  Kernel b = k;
  for (size_t m = 0; m < shape.inner.size(); ++m)
    b.dims[shape.inner[m]] = SymExpr(m == 0 ? splits : 1);
  std::vector<Expr> outer_vars;
  for (int d : shape.outer) outer_vars.push_back(ir::Var(d));
  *combine_offset = PartialOffset(outer_vars, shape.outer_sizes, splits,
                                  ir::Var(shape.inner[0]), columns);
  return b;
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
// `columns`: a column kernel (gpu_launch.h, IsColumnKernel), whose partial
// and combining kernels stay column kernels (ChunkRows, PartialOffset).
void Split(const Kernel& k, const SplitShape& shape, int64_t splits,
           FusedProgram& p, bool columns = false) {
  const int64_t chunk = shape.row / splits;
  // Per reduction: its partial values (the accumulator dtype; an arg
  // reduction's extreme values), then the positions of the arg reductions.
  std::vector<int> partial_buffers;
  for (int r = 0; r < shape.reductions; ++r) {
    partial_buffers.push_back(
        AddTemp(p, k.stages[r].acc_dtype, shape.rows * splits));
  }
  std::vector<int> arg_reductions;
  for (int r = 0; r < shape.reductions; ++r) {
    if (!IsArgReduce(k.stages[r].reduce)) continue;
    arg_reductions.push_back(r);
    partial_buffers.push_back(AddTemp(p, DType::kInt64, shape.rows * splits));
  }
  const int first_partial_slot = static_cast<int>(k.buffers.size());
  // Arg reduction r's number among the arg reductions: its extreme is the
  // partial kernel's accumulator shape.reductions + j, its positions are
  // in slot first_partial_slot + shape.reductions + j.
  auto arg_number = [&](int r) {
    return static_cast<int>(
        std::find(arg_reductions.begin(), arg_reductions.end(), r) -
        arg_reductions.begin());
  };

  // Partial: dims = the outer dims, the split, the chunk (inner).
  const ChunkedRows c = ChunkRows(k, shape, splits, columns);
  Kernel a;
  a.name = absl::StrCat(k.name, "_partial");
  a.buffers = k.buffers;
  a.buffers.insert(a.buffers.end(), partial_buffers.begin(),
                   partial_buffers.end());
  a.dims = c.dims;
  a.inner = c.inner;
  const Expr partial_offset = PartialOffset(c.outer_vars, shape.outer_sizes,
                                            splits, c.split_var, columns);
  for (int r = 0; r < shape.reductions; ++r) {
    Stage st = k.stages[r];
    st.value = ir::SubstituteVars(st.value, c.vars);
    st.finalize = nullptr;
    a.stages.push_back(std::move(st));
  }
  for (int r : arg_reductions) {
    Stage st = a.stages[r];
    st.reduce =
        st.reduce == ReduceKind::kArgMax ? ReduceKind::kMax : ReduceKind::kMin;
    a.stages.push_back(std::move(st));
  }
  // Element stores: each chunk stores the elements it reads.
  for (const Stage& orig : k.stages) {
    if (orig.kind != Stage::Kind::kStoreInner) continue;
    Stage st = orig;
    st.value = ir::SubstituteVars(st.value, c.vars);
    st.offset = ir::SubstituteVars(st.offset, c.vars);
    a.stages.push_back(std::move(st));
  }
  auto store = [&](Expr value, int slot, DType dtype) {
    a.stages.push_back(RowStore(std::move(value), slot, partial_offset, dtype));
  };
  for (int r = 0; r < shape.reductions; ++r) {
    const DType acc = k.stages[r].acc_dtype;
    if (!IsArgReduce(k.stages[r].reduce)) {
      store(ir::Acc(r, acc), first_partial_slot + r, acc);
      continue;
    }
    const int j = arg_number(r);
    store(ir::Acc(shape.reductions + j, acc), first_partial_slot + r, acc);
    store(ir::Add(ir::Mul(c.split_var, ir::IntConst(chunk)),
                  ir::Acc(r, DType::kInt64)),
          first_partial_slot + shape.reductions + j, DType::kInt64);
  }

  // Combine: the original kernel reducing the S partials of each row.
  Expr combine_offset;
  Kernel b = CombineKernel(k, shape, splits, &combine_offset, columns);
  b.buffers = a.buffers;
  std::vector<Expr> outer_vars;
  for (int d : shape.outer) outer_vars.push_back(ir::Var(d));
  for (int r = 0; r < shape.reductions; ++r) {
    Stage& st = b.stages[r];
    st.value =
        ir::LoadBuffer(first_partial_slot + r, combine_offset, st.acc_dtype);
    if (!IsArgReduce(st.reduce)) continue;
    // The winning chunk's position. A fresh kAcc node: the emitters memoise
    // per node, and later stages' kAcc(r) must read the finalized position.
    const Expr position =
        ir::LoadBuffer(first_partial_slot + shape.reductions + arg_number(r),
                       PartialOffset(outer_vars, shape.outer_sizes, splits,
                                     ir::Acc(r, DType::kInt64), columns),
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
  // The element stores were the partial kernel's.
  b.stages.erase(std::remove_if(b.stages.begin(), b.stages.end(),
                                [](const Stage& st) {
                                  return st.kind == Stage::Kind::kStoreInner;
                                }),
                 b.stages.end());
  p.kernels.push_back(std::move(a));
  p.kernels.push_back(std::move(b));
}

// The value of a constant, or of a cast of one (a reduction's count is an
// int64 constant cast to the accumulator's dtype).
std::optional<double> ConstantValue(const Expr& e) {
  const Expr& c = e->op == ExprOp::kCast ? e->args[0] : e;
  if (c->op != ExprOp::kConst) return std::nullopt;
  return IsFloating(c->dtype) ? c->f : static_cast<double>(c->i);
}

// Whether `finalize` of reduction slot `slot` is acc / n: a mean over a row
// of n elements.
bool IsMeanOver(const Expr& finalize, int slot, int64_t n) {
  if (!finalize || finalize->op != ExprOp::kDiv) return false;
  const Expr& acc = finalize->args[0];
  const std::optional<double> count = ConstantValue(finalize->args[1]);
  return acc->op == ExprOp::kAcc && acc->index == slot && count &&
         *count == static_cast<double>(n);
}

// If `value` is (e - A)^2, as (e - A) * (e - A) or pow(e - A, 2), with A a
// kAcc: the deviation e - A.
Expr SquaredDeviation(const Expr& value) {
  Expr d;
  if (value->op == ExprOp::kMul && ir::Equal(value->args[0], value->args[1])) {
    d = value->args[0];
  } else if (value->op == ExprOp::kPow) {
    const std::optional<double> p = ConstantValue(value->args[1]);
    if (p && *p == 2) d = value->args[0];
  }
  if (!d || d->op != ExprOp::kSub || d->args[1]->op != ExprOp::kAcc)
    return nullptr;
  return d;
}

// A row kernel whose only multi-pass reductions are centered second moments
// (var, std, layer norm's variance): sum((e - mean)^2) where mean is an
// earlier kSum of the same e finalized as sum / row length. Per reduction
// slot: the slot of the mean of each second moment, and which slots are
// such means. Nothing when `k` has other multi-pass reductions (softmax's
// sum of exp(x - max)), argmax/argmin, or no second moment.
struct Moments {
  std::vector<int> mean_of;   // per slot: the mean's slot for a moment, or -1
  std::vector<bool> is_mean;  // per slot
};

std::optional<Moments> CenteredMoments(const Kernel& k, int64_t row) {
  std::vector<const Stage*> reductions;
  for (const Stage& st : k.stages) {
    if (st.kind == Stage::Kind::kReduce) reductions.push_back(&st);
  }
  const int n = static_cast<int>(reductions.size());
  Moments m;
  m.mean_of.assign(n, -1);
  m.is_mean.assign(n, false);
  bool any = false;
  for (int r = 0; r < n; ++r) {
    const Stage& st = *reductions[r];
    if (IsArgReduce(st.reduce)) return std::nullopt;
    if (!ir::ContainsOp(st.value, ExprOp::kAcc)) continue;
    // The combine below is float32 algebra, as the accumulators are.
    const Expr d = SquaredDeviation(st.value);
    if (!d || st.reduce != ReduceKind::kSum || st.acc_dtype != DType::kFloat32)
      return std::nullopt;
    const int j = d->args[1]->index;
    if (j >= r) return std::nullopt;
    const Stage& mean = *reductions[j];
    if (mean.reduce != ReduceKind::kSum || mean.acc_dtype != DType::kFloat32 ||
        ir::ContainsOp(mean.value, ExprOp::kAcc) ||
        !ir::Equal(mean.value, d->args[0]) ||
        !IsMeanOver(mean.finalize, j, row) ||
        mean.finalize->dtype != DType::kFloat32 ||
        d->args[1]->dtype != DType::kFloat32)
      return std::nullopt;
    m.mean_of[r] = j;
    m.is_mean[j] = true;
    any = true;
  }
  if (!any) return std::nullopt;
  return m;
}

// The centered second moments of few long rows in one read of the row
// (header: "One-pass moments"): a partial kernel runs the kernel's
// reductions, two-level as they are, over each chunk of C elements kept in
// registers, storing per (row, chunk) the chunk's mean m_c = sum_c / C and
// its M2_c = sum over the chunk of (e - m_c)^2 (and the raw partial
// accumulator of any other reduction); a combining kernel per row merges
// the S chunks with Chan et al.'s formula for equal counts,
//   mean = (sum_c m_c) / S,   M2 = sum_c (M2_c + C * (m_c - mean)^2),
// which is exact algebra: no E[x^2] - E[x]^2 cancellation. It then runs the
// original finalizes (var's M2 / max(0, n - correction), ...) and row
// stores; element stores (layer norm's output) become a pointwise kernel
// reading the finalized row results from temps, as in Fission. Nothing when
// `k` is not such a kernel, or its rows do not cut into chunks that fit a
// persistent row (then it is fissioned, reading the row once per level).
std::optional<std::vector<Kernel>> OnePassMoments(const Kernel& k,
                                                  FusedProgram& p) {
  const std::optional<SplitShape> shape = StaticRows(k);
  if (!shape) return std::nullopt;
  const int64_t splits = ChooseReductionSplits(shape->rows, shape->row);
  if (splits < 2 || shape->row / splits > kMaxPersistentRow)
    return std::nullopt;
  const std::optional<Moments> moments = CenteredMoments(k, shape->row);
  if (!moments) return std::nullopt;
  const int64_t chunk = shape->row / splits;
  std::vector<const Stage*> reductions;
  bool inner_stores = false;
  for (const Stage& st : k.stages) {
    if (st.kind == Stage::Kind::kReduce) reductions.push_back(&st);
    inner_stores |= st.kind == Stage::Kind::kStoreInner;
  }
  const int n = static_cast<int>(reductions.size());
  const DType f32 = DType::kFloat32;

  // Per reduction, a temp of rows * S partials: m_c for a mean, M2_c for a
  // moment, the raw accumulator for any other.
  std::vector<int> buffers = k.buffers;
  std::vector<int> partial_slot(n);
  for (int r = 0; r < n; ++r) {
    partial_slot[r] = static_cast<int>(buffers.size());
    buffers.push_back(
        AddTemp(p, reductions[r]->acc_dtype, shape->rows * splits));
  }
  // With element stores: a temp of `rows` finalized values per reduction,
  // for the pointwise kernel.
  std::vector<int> row_slot(n, -1);
  std::vector<DType> finalized(n);
  for (int r = 0; r < n; ++r) {
    finalized[r] = reductions[r]->finalize ? reductions[r]->finalize->dtype
                                           : reductions[r]->acc_dtype;
    if (!inner_stores) continue;
    row_slot[r] = static_cast<int>(buffers.size());
    buffers.push_back(AddTemp(p, finalized[r], shape->rows));
  }

  // Partial: each chunk a row of the original reductions, the mean's
  // finalize dividing by the chunk's length, so that the moment's value
  // (e - A)^2 reads the chunk's mean from the accumulator.
  const ChunkedRows c = ChunkRows(k, *shape, splits, /*columns=*/false);
  Kernel a;
  a.name = absl::StrCat(k.name, "_partial");
  a.buffers = buffers;
  a.dims = c.dims;
  a.inner = c.inner;
  const Expr partial_offset =
      PartialOffset(c.outer_vars, shape->outer_sizes, splits, c.split_var);
  for (int r = 0; r < n; ++r) {
    Stage st = *reductions[r];
    st.value = ir::SubstituteVars(st.value, c.vars);
    st.finalize =
        moments->is_mean[r]
            ? ir::Binary(ExprOp::kDiv, ir::Acc(r, f32),
                         ir::Const(static_cast<double>(chunk), f32), f32)
            : nullptr;
    a.stages.push_back(std::move(st));
  }
  for (int r = 0; r < n; ++r) {
    const DType acc = reductions[r]->acc_dtype;
    a.stages.push_back(
        RowStore(ir::Acc(r, acc), partial_slot[r], partial_offset, acc));
  }

  // Combine: the original kernel over the S partials of each row, less its
  // element stores.
  Expr combine_offset;
  Kernel b = CombineKernel(k, *shape, splits, &combine_offset);
  b.buffers = buffers;
  b.stages.clear();
  const Expr s_f = ir::Const(static_cast<double>(splits), f32);
  const Expr c_f = ir::Const(static_cast<double>(chunk), f32);
  int r = 0;
  for (const Stage& orig : k.stages) {
    if (orig.kind == Stage::Kind::kStoreInner) continue;
    Stage st = orig;
    if (st.kind == Stage::Kind::kReduce) {
      const Expr partial = ir::LoadBuffer(partial_slot[r], combine_offset,
                                          reductions[r]->acc_dtype);
      if (moments->is_mean[r]) {
        // The mean of the chunk means: the row's mean, the chunks being of
        // equal length (the original finalize divided the sum by S * C).
        st.value = partial;
        st.finalize = ir::Binary(ExprOp::kDiv, ir::Acc(r, f32), s_f, f32);
      } else if (const int j = moments->mean_of[r]; j >= 0) {
        // Fresh nodes: the mean's finalize holds its raw kAcc, this value
        // its finalized one (emitters memoise per node).
        const Expr m_c = ir::LoadBuffer(partial_slot[j], combine_offset, f32);
        const Expr dev = ir::Binary(ExprOp::kSub, m_c, ir::Acc(j, f32), f32);
        st.value =
            ir::Binary(ExprOp::kAdd, partial,
                       ir::Binary(ExprOp::kMul, c_f,
                                  ir::Binary(ExprOp::kMul, dev, dev, f32), f32),
                       f32);
      } else {
        st.value = partial;  // combined by the same reduction, as in Split
      }
      ++r;
    }
    b.stages.push_back(std::move(st));
  }
  std::vector<Kernel> out;
  out.push_back(std::move(a));
  if (!inner_stores) {
    out.push_back(std::move(b));
    return out;
  }
  std::vector<Expr> outer_vars;
  for (int d : shape->outer) outer_vars.push_back(ir::Var(d));
  const Expr row_offset =
      PartialOffset(outer_vars, shape->outer_sizes, 1, ir::IntConst(0));
  for (int q = 0; q < n; ++q) {
    b.stages.push_back(RowStore(ir::Acc(q, finalized[q]), row_slot[q],
                                row_offset, finalized[q]));
  }
  out.push_back(std::move(b));
  // The element stores, once per element, reading the row results.
  ir::Rewriter loads([&](const Expr& x) -> std::optional<Expr> {
    if (x->op != ExprOp::kAcc) return std::nullopt;
    return ir::Cast(
        ir::LoadBuffer(row_slot[x->index], row_offset, finalized[x->index]),
        x->dtype);
  });
  out.push_back(ElementStoresKernel(k, buffers, loads));
  return out;
}

}  // namespace

FusedProgram SplitLongReductions(FusedProgram program) {
  std::vector<Kernel> kernels = std::move(program.kernels);
  program.kernels.clear();
  auto split_or_keep = [&program](Kernel k) {
    const Kernel ordered = ReductionsFirst(k);
    std::optional<SplitShape> shape = Splittable(ordered);
    const bool columns = shape && IsColumnKernel(ordered);
    const int64_t splits = !shape ? 1
                           : columns
                               ? ChooseColumnSplits(shape->rows, shape->row)
                               : ChooseReductionSplits(shape->rows, shape->row);
    if (splits < 2) {
      program.kernels.push_back(std::move(k));
      return;
    }
    Split(ordered, *shape, splits, program, columns);
  };
  for (Kernel& k : kernels) {
    if (k.is_extern() || k.is_scatter()) {
      program.kernels.push_back(std::move(k));
      continue;
    }
    if (std::optional<std::vector<Kernel>> parts = OnePassMoments(k, program)) {
      for (Kernel& part : *parts) program.kernels.push_back(std::move(part));
    } else if (std::optional<std::vector<Kernel>> parts = Fission(k, program)) {
      for (Kernel& part : *parts) split_or_keep(std::move(part));
    } else {
      split_or_keep(std::move(k));
    }
  }
  return program;
}

}  // namespace kiln
