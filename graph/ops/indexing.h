// What the indexing ops' signatures (graph/ops/indexing.cc) share with their
// reference semantics and lowerings (compiler/ops/indexing_*.cc): slice
// bounds, optional int arguments, the inputs cat skips. Defined in
// graph/ops/indexing.cc.
#ifndef KILN_GRAPH_OPS_INDEXING_H_
#define KILN_GRAPH_OPS_INDEXING_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "graph/graph.h"

namespace kiln::ops {

// PyTorch's slice bounds on a dim of concrete size n: the first index and
// the number of elements taken.
struct SliceBounds {
  int64_t start, length;
};
SliceBounds ClampSlice(int64_t n, std::optional<int64_t> start,
                       std::optional<int64_t> end, int64_t step);

// PyTorch's slice bounds on a symbolic dim of size n (a polynomial in
// symbols >= 2) as polynomials, where they are polynomials for every value
// of the symbols: step 1, a start in [0, 2] or [-2, -1] (n + start), an end
// absent, in [0, 2] or in [-2, -1] (n + end), none of them ever clamped
// (0 <= bound <= n) and a length end - start never negative.
// nullopt otherwise (then the op needs a static dim).
struct SymSliceBounds {
  SymExpr start, length;
};
std::optional<SymSliceBounds> SymbolicSlice(const SymExpr& n,
                                            std::optional<int64_t> start,
                                            std::optional<int64_t> end,
                                            int64_t step);

// An int? argument: none, or its value.
std::optional<int64_t> OptionalInt(const Attr& a);

// Whether cat skips an input of these sizes: PyTorch skips legacy empty 1-D
// tensors (shape [0]).
bool SkippedByCat(const std::vector<SymExpr>& sizes);

}  // namespace kiln::ops

#endif  // KILN_GRAPH_OPS_INDEXING_H_
