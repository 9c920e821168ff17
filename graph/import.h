// The compiler's first stage: kiln.v1.CompileRequest -> validated, typed
// Graph. Binds every node's arguments to its op's schema, infers the dtype
// and sizes of every value (PyTorch broadcasting and type promotion), and
// rejects anything the later stages could not compile.
//
// Errors: INVALID_ARGUMENT for a malformed graph, UNIMPLEMENTED for an op
// Kiln does not support; the message names the node index, the op and the
// reason ("node 4 (aten.add.Tensor): shapes [3, 4] and [5] do not broadcast").
//
// Thread-safety: pure function; safe to call concurrently.
#ifndef KILN_GRAPH_IMPORT_H_
#define KILN_GRAPH_IMPORT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "kiln/v1/graph.pb.h"

namespace kiln {

struct ImportLimits {
  int max_nodes = 100000;
  int max_inputs = 16384;
  int max_rank = 8;
  // Largest element count of any value (static part; dims of size 0 are
  // ignored so that strides stay representable).
  int64_t max_elements = int64_t{1} << 40;
};

absl::StatusOr<Graph> ImportGraph(const v1::Graph& proto,
                                  const ImportLimits& limits = {});

// Checks the target and options of a request (the graph is checked by
// ImportGraph): a CPU target needs a triple, a CUDA target an sm_XX arch.
absl::Status ValidateTarget(const v1::Target& target);

}  // namespace kiln

#endif  // KILN_GRAPH_IMPORT_H_
