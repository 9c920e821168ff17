#include "compiler/gpu_launch.h"

#include <algorithm>
#include <functional>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

int64_t NextPow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Distinct nodes of `kernel`'s stage values that become calls of a math
// library routine (libdevice, or a polynomial of a dozen instructions or
// more under fast-math): the part of a pointwise body that makes ptxas slow
// and each element costly.
int64_t MathCalls(const Kernel& kernel) {
  absl::flat_hash_set<const ExprNode*> seen;
  int64_t calls = 0;
  std::function<void(const Expr&)> visit = [&](const Expr& e) {
    if (!e || !seen.insert(e.get()).second) return;
    switch (e->op) {
      case ExprOp::kExp:
      case ExprOp::kExp2:
      case ExprOp::kExpm1:
      case ExprOp::kLog:
      case ExprOp::kLog2:
      case ExprOp::kLog1p:
      case ExprOp::kSin:
      case ExprOp::kCos:
      case ExprOp::kTan:
      case ExprOp::kTanh:
      case ExprOp::kSigmoid:
      case ExprOp::kErf:
      case ExprOp::kPow:
      case ExprOp::kAtan2:
      case ExprOp::kPhilox:
        ++calls;
        break;
      default:
        break;
    }
    for (const Expr& a : e->args) visit(a);
  };
  for (const Stage& st : kernel.stages) visit(st.value);
  return calls;
}

// Distinct loads of `kernel` (buffer slot and offset) whose offset moves
// along an inner dim: what a persistent row keeps in registers per group.
// With `passes`, also the number of reducing or inner-storing stages that
// read such a load: the passes over the row a looped row makes.
int64_t RowLoads(const Kernel& kernel, int64_t* passes = nullptr) {
  auto moves = [&](const Expr& offset) {
    bool found = false;
    std::function<void(const Expr&)> visit = [&](const Expr& e) {
      if (!e || found) return;
      if (e->op == ExprOp::kVar && e->index >= 0 &&
          static_cast<size_t>(e->index) < kernel.inner.size() &&
          kernel.inner[e->index]) {
        found = true;
        return;
      }
      for (const Expr& a : e->args) visit(a);
    };
    visit(offset);
    return found;
  };
  absl::flat_hash_set<std::string> loads;
  for (const Stage& st : kernel.stages) {
    absl::flat_hash_set<const ExprNode*> seen;
    bool reads_row = false;
    std::function<void(const Expr&)> visit = [&](const Expr& e) {
      if (!e || !seen.insert(e.get()).second) return;
      if (e->op == ExprOp::kLoadBuffer && !e->args.empty() &&
          moves(e->args[0])) {
        loads.insert(absl::StrCat(e->index, ":", ir::ToString(e->args[0])));
        reads_row = true;
      }
      for (const Expr& a : e->args) visit(a);
    };
    visit(st.value);
    if (passes != nullptr && reads_row && st.kind != Stage::Kind::kStoreOuter) {
      ++*passes;
    }
  }
  return static_cast<int64_t>(loads.size());
}

}  // namespace

bool IsColumnKernel(const Kernel& kernel) {
  int last_outer = -1, last_inner = -1;
  for (size_t d = 0; d < kernel.dims.size(); ++d)
    (kernel.inner[d] ? last_inner : last_outer) = static_cast<int>(d);
  if (last_outer < 0 || last_inner < 0) return false;
  for (const Stage& st : kernel.stages) {
    if (st.kind != Stage::Kind::kReduce && st.kind != Stage::Kind::kStoreOuter)
      return false;
  }
  const int vars = static_cast<int>(kernel.dims.size());
  bool columns = false, ok = true;
  absl::flat_hash_set<const ExprNode*> seen;
  std::function<void(const Expr&)> visit = [&](const Expr& e) {
    if (!e || !ok || !seen.insert(e.get()).second) return;
    if (e->op == ExprOp::kLoadBuffer && !e->args.empty()) {
      const std::optional<ir::AffineForm> f = ir::Affine(e->args[0], vars);
      bool moves = false;
      for (int d = 0; d < vars; ++d) {
        if (kernel.inner[d] && (!f || !(f->coeffs[d] == SymExpr(0))))
          moves = true;
      }
      if (moves) {
        if (!f) {
          ok = false;
        } else if (f->coeffs[last_outer] == SymExpr(1)) {
          if (f->coeffs[last_inner] == SymExpr(1)) ok = false;
          columns = true;
        } else if (!(f->coeffs[last_outer] == SymExpr(0))) {
          ok = false;
        }
      }
    }
    for (const Expr& a : e->args) visit(a);
  };
  for (const Stage& st : kernel.stages) {
    if (st.kind == Stage::Kind::kReduce) visit(st.value);
  }
  return ok && columns;
}

GpuKernelPlan PlanGpuKernel(const Kernel& kernel,
                            const GpuPlanOptions& options) {
  const int groups_per_thread = options.groups_per_thread;
  GpuKernelPlan plan;
  bool has_inner = false;
  int64_t row = 1;
  bool static_row = true;
  std::optional<int64_t> last_inner;
  for (size_t d = 0; d < kernel.dims.size(); ++d) {
    if (!kernel.inner[d]) continue;
    has_inner = true;
    const std::optional<int64_t> size = kernel.dims[d].AsConstant();
    if (!size) {
      static_row = false;
      continue;
    }
    row *= *size;
    last_inner = size;
  }
  if (!has_inner) {
    plan.form = GpuKernelPlan::Form::kPointwise;
    plan.block_threads = 256;
    const std::optional<int64_t> range = kernel.OuterRange().AsConstant();
    plan.vector_width = options.pointwise_vector_width;
    if (plan.vector_width <= 0) {
      // A small static range is one partial wave whatever the width: one
      // element per thread emits the body once instead of four times.
      plan.vector_width =
          range && *range <= options.one_element_per_thread_max ? 1 : 4;
    }
    plan.groups_per_thread = options.pointwise_groups_per_thread;
    if (plan.groups_per_thread <= 0) {
      // Two groups where nearly every tile is whole and grouped (a static
      // range of kMinPointwiseGroupsRange or more, the last dim a multiple
      // of the group) and the body has some math-library calls (without
      // any it is bound by memory alone, and a second group only costs)
      // but few enough that emitting it twice more costs little compile
      // time.
      const std::optional<int64_t> last =
          kernel.dims.empty() ? std::nullopt : kernel.dims.back().AsConstant();
      const bool whole_tiles = last && *last % plan.vector_width == 0 &&
                               range && *range >= kMinPointwiseGroupsRange;
      const int64_t calls = MathCalls(kernel);
      plan.groups_per_thread =
          whole_tiles && calls >= 1 && calls <= kMaxMathCallsForPointwiseGroups
              ? 2
              : 1;
    }
    plan.items_per_block =
        plan.block_threads * plan.vector_width * plan.groups_per_thread;
    plan.lane_loop = options.lane_loop;
    return plan;
  }
  // Columns: a warp's lanes take adjacent rows, where a row's own threads
  // would read it with a stride. Rows of a few elements, or few rows, keep
  // the row forms.
  const std::optional<int64_t> outer_rows = kernel.OuterRange().AsConstant();
  if ((!static_row || row >= kColumnThreads * kColumnUnroll) &&
      (!outer_rows || *outer_rows >= kColumnRows / 2) &&
      IsColumnKernel(kernel)) {
    plan.form = GpuKernelPlan::Form::kColumn;
    plan.vector_width = 1;
    plan.threads_per_row = kColumnThreads;
    plan.block_threads = kColumnRows * kColumnThreads;
    plan.items_per_block = kColumnRows;
    plan.groups_per_thread = kColumnUnroll;
    return plan;
  }
  // Rows past kMaxPersistentRow up to kMaxPersistentRowOneLoad stay
  // persistent when the kernel reads one row tensor in three passes or
  // more (a log-softmax's max, sum of exps and store over its logits).
  int64_t passes = 0;
  const bool persistent =
      static_row && (row <= options.max_persistent_row ||
                     (options.max_persistent_row == kMaxPersistentRow &&
                      row <= kMaxPersistentRowOneLoad &&
                      RowLoads(kernel, &passes) == 1 && passes >= 3));
  if (persistent) {
    plan.form = GpuKernelPlan::Form::kPersistentRow;
    plan.row_size = row;
    // A kernel of at most options.one_element_per_thread_max
    // (kMaxOneElementPerThread) elements in all, of rows a block can take
    // one element per thread, takes groups of one, one per thread (the body
    // emitted once). Otherwise groups of 4 where the last inner dim (and so
    // the row) splits evenly.
    const std::optional<int64_t> rows = kernel.OuterRange().AsConstant();
    const bool small = row <= 1024 && rows &&
                       *rows * row <= options.one_element_per_thread_max;
    plan.vector_width = !small && last_inner && *last_inner % 4 == 0 ? 4 : 1;
    const int64_t groups = (row + plan.vector_width - 1) / plan.vector_width;
    const int64_t aim = small ? 1 : groups_per_thread;
    int64_t threads = NextPow2((groups + aim - 1) / aim);
    if (row <= kMaxRowPerThread) {
      // Tiny rows (a pooling window, a 2x2 gradient gather): a thread each,
      // no shuffles.
      plan.threads_per_row = 1;
      plan.block_threads = 128;
      plan.items_per_block = 128;
    } else if (threads <= 32) {
      plan.threads_per_row = 32;
      plan.block_threads = 128;
      plan.items_per_block = 4;  // rows: one per warp
    } else {
      threads = std::clamp<int64_t>(threads, 128, 1024);
      plan.threads_per_row = static_cast<int>(threads);
      plan.block_threads = plan.threads_per_row;
      plan.items_per_block = 1;
    }
    plan.groups_per_thread = static_cast<int>(
        (groups + plan.threads_per_row - 1) / plan.threads_per_row);
    // GpuPlanOptions::max_persistent_row_values (off by default).
    if (options.max_persistent_row_values <= 0 || plan.threads_per_row < 1024 ||
        static_cast<int64_t>(plan.groups_per_thread) * plan.vector_width *
                RowLoads(kernel) <=
            options.max_persistent_row_values) {
      return plan;
    }
    plan = GpuKernelPlan{};
  }
  plan.form = GpuKernelPlan::Form::kLoopedRow;
  plan.vector_width = 1;
  // Long static rows take a wider block (kLoopedLongRowThreads); dynamic
  // rows, possibly short, keep options.looped_row_threads.
  const int threads = static_row && options.looped_row_threads == 512
                          ? kLoopedLongRowThreads
                          : options.looped_row_threads;
  plan.threads_per_row = threads;
  plan.block_threads = threads;
  plan.items_per_block = 1;
  return plan;
}

int64_t ChooseReductionSplits(int64_t rows, int64_t row) {
  if (rows <= 0 || rows >= kSplitMaxRows || row <= kMaxPersistentRow) return 1;
  // Enough blocks, and chunks that fit the persistent (vectorised) form.
  const int64_t wanted =
      std::max((kSplitTargetBlocks + rows - 1) / rows,
               (row + kMaxPersistentRow - 1) / kMaxPersistentRow);
  const int64_t most = std::min(wanted, row / kSplitMinChunk);
  for (bool want_vec : {true, false}) {
    for (int64_t s = most; s >= 2; --s) {
      if (row % s == 0 && (!want_vec || (row / s) % 4 == 0)) return s;
    }
  }
  return 1;
}

int64_t ChooseColumnSplits(int64_t rows, int64_t row) {
  const int64_t blocks = (rows + kColumnRows - 1) / kColumnRows;
  if (rows <= 0 || blocks >= kColumnTargetBlocks) return 1;
  const int64_t wanted = (kColumnTargetBlocks + blocks - 1) / blocks;
  for (int64_t s = std::min(wanted, row / kColumnMinChunk); s >= 2; --s) {
    if (row % s == 0) return s;
  }
  return 1;
}

std::string GpuKernelPlan::ToString() const {
  const char* f = form == Form::kPointwise       ? "pointwise"
                  : form == Form::kPersistentRow ? "persistent-row"
                  : form == Form::kLoopedRow     ? "looped-row"
                                                 : "column";
  return absl::StrCat(f, " block=", block_threads,
                      " items/block=", items_per_block, " vec=", vector_width,
                      " threads/row=", threads_per_row,
                      " groups/thread=", groups_per_thread, " row=", row_size,
                      lane_loop ? " lane-loop" : "");
}

std::vector<GpuKernelPlan> PlanGpuLaunches(const FusedProgram& program,
                                           const GpuPlanOptions& options) {
  std::vector<GpuKernelPlan> plans;
  plans.reserve(program.kernels.size());
  for (const Kernel& kernel : program.kernels) {
    // An extern call is the library's launch, not ours.
    plans.push_back(kernel.is_extern() ? GpuKernelPlan{}
                                       : PlanGpuKernel(kernel, options));
  }
  return plans;
}

std::string GpuPlansToString(const FusedProgram& program,
                             const std::vector<GpuKernelPlan>& plans) {
  std::string text;
  for (size_t k = 0; k < program.kernels.size() && k < plans.size(); ++k)
    absl::StrAppend(&text, program.kernels[k].name, ": ", plans[k].ToString(),
                    "\n");
  return text;
}

}  // namespace kiln
