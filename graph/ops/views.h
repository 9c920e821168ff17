// What the view ops' signatures (graph/ops/views.cc) share with their
// reference semantics and lowerings (compiler/ops/views_*.cc), and with the
// indexing ops (slice, select, cat): dims already checked by a shape rule,
// the transposition permutation, squeeze's dims, the same-dtype rule.
// Defined in graph/ops/views.cc.
#ifndef KILN_GRAPH_OPS_VIEWS_H_
#define KILN_GRAPH_OPS_VIEWS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/op_signature.h"

namespace kiln::ops {

// The dtype rule of an op whose output has its first argument's dtype.
absl::StatusOr<std::vector<DType>> SameDTypeAsSelf(const OpContext& ctx);

// `dim` normalised against `rank` without checks: for dims the shape rule
// already checked with OpContext::WrapDim (rank 0 accepts -1 and 0).
int WrapCheckedDim(int64_t dim, int rank);

// The transposition of dims a and b (identity for rank 0).
std::vector<int> TransposePermutation(int rank, int a, int b);

// The dims squeeze.default/.dim/.dims selects of a tensor of `rank`: every
// dim when `node` has no dim argument, else the dims it names. With `ctx`
// the dims are checked (range, and no repeats as PyTorch's
// dim_list_to_bitset); without, they are the ones a shape rule checked.
// Only the selected dims of static size 1 go (a symbolic size is >= 2).
absl::StatusOr<std::vector<bool>> SqueezedDims(const Node& node, int rank,
                                               const OpContext* ctx);

// The position of the dim argument of split.Tensor, split_with_sizes (2)
// and unbind.int (1).
int SplitDimArg(const Node& node);

// The view as_strided and as_strided_scatter take of self: self's elements
// in row-major order (a Kiln value is dense; the client first permutes a
// tensor whose memory is in another dim order into that order) at
// `offset + sum(i[d] * strides[d])` for each index i over `sizes`.
struct StridedView {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;
};

// The view of node's size, stride and storage_offset arguments (positions
// `first` to first + 2) over a self of `self_numel` elements. With `ctx`
// it is checked: static non-negative sizes, strides and offset, one stride
// per size, and every element of a non-empty view inside self; with
// `scatter` also that no two elements of the view share a position, with
// each dim's stride above the span of the dims of smaller stride (the
// layouts views, slices and permutes make), so that a position's index is
// found by division. Without `ctx` the node is one a shape rule checked.
absl::StatusOr<StridedView> StridedViewOf(const Node& node, int first,
                                          int64_t self_numel, bool scatter,
                                          const OpContext* ctx);

// For as_strided_scatter: the dims of `view` with size > 1, largest stride
// first (the order in which a position is divided into an index).
std::vector<int> ScatterDimOrder(const StridedView& view);

}  // namespace kiln::ops

#endif  // KILN_GRAPH_OPS_VIEWS_H_
