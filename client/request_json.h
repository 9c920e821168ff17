// Compile requests from a graph in JSON (the protobuf JSON mapping of
// kiln.v1.Graph, as examples/graphs/*.json) and a target name: what kilnctl
// sends for `compile GRAPH.json --target=...` and what the C API
// (kiln_c.h) and the Python binding send, so all of them compute the same
// guard key for a graph.
//
//   auto target = kiln::TargetFromName("sm_90");
//   auto req = kiln::RequestFromGraphJson(json_text, *target, /*fast_math=*/0);
//
// Thread-safety: pure functions.
#ifndef KILN_CLIENT_REQUEST_JSON_H_
#define KILN_CLIENT_REQUEST_JSON_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kiln/v1/graph.pb.h"

namespace kiln {

// "cpu": this host's x86-64 level (HostCpuTargetFromCpuinfo(), which is
// kiln::Client::DefaultTarget()), with `cpu` and `features` overriding the
// LLVM CPU name and feature string when not empty; "sm_XX" (e.g. "sm_90"):
// that CUDA arch. Errors: INVALID_ARGUMENT for any other name.
absl::StatusOr<v1::Target> TargetFromName(absl::string_view name,
                                          absl::string_view cpu = "",
                                          absl::string_view features = "");

// A request for the graph in `graph_json` with `target` and
// CompileOptions.fast_math. The graph is only parsed, not validated (the
// client's key computation and the daemon do that). Errors:
// INVALID_ARGUMENT "not a kiln.v1.Graph in JSON: <parser's message>".
absl::StatusOr<v1::CompileRequest> RequestFromGraphJson(
    absl::string_view graph_json, const v1::Target& target, bool fast_math);
// The same with every CompileOption.
absl::StatusOr<v1::CompileRequest> RequestFromGraphJson(
    absl::string_view graph_json, const v1::Target& target,
    const v1::CompileOptions& options);

}  // namespace kiln

#endif  // KILN_CLIENT_REQUEST_JSON_H_
