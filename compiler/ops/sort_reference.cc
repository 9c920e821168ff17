// Reference semantics of the sort family (graph/ops/sort.h): per row along
// the sorted dim, a std::stable_sort of the positions by value (NaN larger
// than every number, equal values in index order), then the first k (topk)
// or all (sort) of them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"
#include "graph/op_signature.h"
#include "graph/ops/sort.h"

namespace kiln {
namespace {

// Strict "a before b" in ascending order: NaN after every number, two
// NaNs equal.
bool LessNanLast(double a, double b) {
  if (std::isnan(a)) return false;
  return std::isnan(b) || a < b;
}

// One row's values, read as double (floating) or int64 (exact).
struct RowValues {
  bool floating;
  std::vector<double> f;
  std::vector<int64_t> i;
  bool Before(int64_t a, int64_t b, bool descending) const {
    if (floating)
      return descending ? LessNanLast(f[b], f[a]) : LessNanLast(f[a], f[b]);
    return descending ? i[b] < i[a] : i[a] < i[b];
  }
};

absl::StatusOr<std::vector<HostTensor>> SortReference(const RefContext& ctx) {
  const HostTensor& self = ctx.tensors[0];
  const ops::SortParams p = ops::SortParamsOf(ctx.node, self.rank());
  HostTensor values = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  HostTensor indices = HostTensor::Empty(DType::kInt64, ctx.out_sizes[1]);
  if (self.rank() == 0) {  // one element, whatever k (PyTorch's 0-d topk)
    if (p.k && *p.k > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          ctx.node.op->name, ": selected index k out of range (k = ", *p.k,
          ", size 1)"));
    }
    if (IsFloating(self.dtype()))
      values.SetDouble({}, self.GetDouble({}));
    else
      values.SetInt({}, self.GetInt({}));
    indices.SetInt({}, 0);
    return std::vector<HostTensor>{std::move(values), std::move(indices)};
  }
  const int64_t n = self.sizes()[p.dim];
  const int64_t k = p.k.value_or(n);
  if (k > n) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx.node.op->name, ": selected index k out of range (k = ", k, ", dim ",
        p.dim, " has size ", n, ")"));
  }
  // Rows: every position of self with the sorted dim at 0.
  std::vector<int64_t> row_sizes = self.sizes();
  row_sizes[p.dim] = 1;
  RowValues row{IsFloating(self.dtype()), {}, {}};
  std::vector<int64_t> order(n);
  ops::ForEachIndex(row_sizes, [&](const std::vector<int64_t>& base) {
    std::vector<int64_t> at = base;
    row.f.assign(n, 0);
    row.i.assign(n, 0);
    for (int64_t j = 0; j < n; ++j) {
      at[p.dim] = j;
      if (row.floating)
        row.f[j] = self.GetDouble(at);
      else
        row.i[j] = self.GetInt(at);
    }
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return row.Before(a, b, p.descending);
    });
    for (int64_t j = 0; j < k; ++j) {
      at[p.dim] = j;
      if (row.floating)
        values.SetDouble(at, row.f[order[j]]);
      else
        values.SetInt(at, row.i[order[j]]);
      indices.SetInt(at, order[j]);
    }
  });
  return std::vector<HostTensor>{std::move(values), std::move(indices)};
}

}  // namespace

void RegisterSortReferences(OpReferences& table) {
  table.Add("aten.sort.default", SortReference);
  table.Add("aten.sort.stable", SortReference);
  table.Add("aten.topk.default", SortReference);
}

}  // namespace kiln
