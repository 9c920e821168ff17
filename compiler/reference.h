// The reference evaluator: a plain CPU interpreter of a Graph over
// HostTensors, the oracle for every numerics test in Kiln. Each op runs its
// registry entry's reference semantics: floating math in double, integer
// math in int64 (wrapping to the value's dtype), every value rounded to its
// dtype when stored, as eager PyTorch stores each op's result.
//
// Thread-safety: pure function; safe to call concurrently.
#ifndef KILN_COMPILER_REFERENCE_H_
#define KILN_COMPILER_REFERENCE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "graph/graph.h"
#include "graph/host_tensor.h"

namespace kiln {

// Binds symbols from the inputs' actual sizes, checks them against the
// graph's inputs (dtype, rank, static sizes, symbol consistency and bounds)
// and evaluates the graph. Errors: INVALID_ARGUMENT when the inputs don't
// match the graph.
absl::StatusOr<std::vector<HostTensor>> EvaluateReference(
    const Graph& graph, absl::Span<const HostTensor> inputs);

// The symbol values implied by `inputs` (symbol i at index i).
absl::StatusOr<std::vector<int64_t>> BindSymbols(
    const Graph& graph, absl::Span<const HostTensor> inputs);

}  // namespace kiln

#endif  // KILN_COMPILER_REFERENCE_H_
