// A compile request validated, imported and keyed once (issue 14): kilnd
// does this when a request arrives, and the cache lookup, the single-flight
// table and the compile pool all take the result, so nothing imports or
// keys a request twice.
//
// Thread-safety: ImportRequest is a pure function; an ImportedRequest is
// immutable once built and may be shared between threads.
#ifndef KILN_GRAPH_IMPORTED_REQUEST_H_
#define KILN_GRAPH_IMPORTED_REQUEST_H_

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/guard_key.h"
#include "kiln/v1/graph.pb.h"

namespace kiln {

struct ImportedRequest {
  v1::Target target;
  v1::CompileOptions options;
  Graph graph;  // validated, typed (import.h)
  GuardKey key;  // the request key (guard_key.h)
};

// ValidateTarget, ImportGraph and ComputeGuardKey of `request`.
// Errors: those of ValidateTarget (INVALID_ARGUMENT) and ImportGraph
// (INVALID_ARGUMENT / UNIMPLEMENTED naming node, op and reason).
absl::StatusOr<ImportedRequest> ImportRequest(
    const v1::CompileRequest& request);

}  // namespace kiln

#endif  // KILN_GRAPH_IMPORTED_REQUEST_H_
