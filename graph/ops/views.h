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

}  // namespace kiln::ops

#endif  // KILN_GRAPH_OPS_VIEWS_H_
