// What the sort family's signatures (graph/ops/sort.cc) share with their
// reference semantics and lowerings (compiler/ops/sort_*.cc): sort,
// sort.stable and topk, each with (values, indices int64) outputs.
//
// Order (PyTorch's): NaN is larger than every number, so it sorts last
// ascending and first descending; -0.0 and 0.0 are equal; equal elements
// (NaNs included) keep their index order, ascending (a stable sort, in
// both directions). topk(largest) takes the first k of the descending
// order, topk(!largest) of the ascending one, always in that order (its
// `sorted` flag only allows an unsorted result; PyTorch's order of equal
// elements in topk is unspecified).
//
// Thread-safety: pure functions.
#ifndef KILN_GRAPH_OPS_SORT_H_
#define KILN_GRAPH_OPS_SORT_H_

#include <cstdint>
#include <optional>

#include "graph/graph.h"

namespace kiln::ops {

struct SortParams {
  int dim = 0;              // wrapped (0 for a 0-d tensor)
  bool descending = false;  // sort: descending; topk: largest
  // topk's k (validated by the shape rule); nullopt for sort (the whole dim).
  std::optional<int64_t> k;
};

// The parameters of a bound sort/topk node over an input of rank `rank`
// whose dim the shape rule checked.
SortParams SortParamsOf(const Node& node, int rank);

// The largest static size along the sorted dim that Kiln compiles: its
// lowering is quadratic in that size (compiler/ops/sort_lowering.cc).
inline constexpr int64_t kMaxSortSize = 4096;

}  // namespace kiln::ops

#endif  // KILN_GRAPH_OPS_SORT_H_
