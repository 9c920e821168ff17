#include "graph/imported_request.h"

#include "graph/import.h"

namespace kiln {

absl::StatusOr<ImportedRequest> ImportRequest(
    const v1::CompileRequest& request) {
  if (absl::Status s = ValidateTarget(request.target()); !s.ok()) return s;
  absl::StatusOr<Graph> graph = ImportGraph(request.graph());
  if (!graph.ok()) return graph.status();
  ImportedRequest imported;
  imported.target = request.target();
  imported.options =
      NormalizeOptions(request.options(), request.target(), *graph);
  imported.key = ComputeGuardKey(*graph, request.target(), request.options());
  imported.graph = *std::move(graph);
  return imported;
}

}  // namespace kiln
