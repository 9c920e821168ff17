#include "client/request_json.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/host_target.h"
#include "google/protobuf/util/json_util.h"

namespace kiln {

absl::StatusOr<v1::Target> TargetFromName(absl::string_view name,
                                          absl::string_view cpu,
                                          absl::string_view features) {
  v1::Target target;
  if (name == "cpu") {
    v1::CpuTarget host = HostCpuTargetFromCpuinfo();
    if (!cpu.empty()) host.set_cpu(std::string(cpu));
    if (!features.empty()) host.set_features(std::string(features));
    *target.mutable_cpu() = std::move(host);
    return target;
  }
  int arch = 0;
  if (absl::StartsWith(name, "sm_") && name.size() > 3 &&
      absl::SimpleAtoi(name.substr(3), &arch) && arch > 0) {
    target.mutable_cuda()->set_arch(std::string(name));
    return target;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("target=", name, ": expected cpu or sm_XX (e.g. sm_90)"));
}

absl::StatusOr<v1::CompileRequest> RequestFromGraphJson(
    absl::string_view graph_json, const v1::Target& target, bool fast_math) {
  v1::CompileOptions options;
  options.set_fast_math(fast_math);
  return RequestFromGraphJson(graph_json, target, options);
}

absl::StatusOr<v1::CompileRequest> RequestFromGraphJson(
    absl::string_view graph_json, const v1::Target& target,
    const v1::CompileOptions& options) {
  v1::CompileRequest req;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(graph_json.data(), graph_json.size()),
      req.mutable_graph());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a kiln.v1.Graph in JSON: ", std::string(parsed.message())));
  }
  *req.mutable_target() = target;
  *req.mutable_options() = options;
  return req;
}

}  // namespace kiln
