// print_guard_key: reads a graph file (kiln.v1.Graph or kiln.v1.CompileRequest
// in the protobuf JSON mapping), imports it and prints its guard key in hex.
// guard_key_test runs it as separate processes to check that the key does
// not depend on anything about the process computing it.
//
//   print_guard_key [--target=cpu:TRIPLE:CPU:FEATURES | --target=cuda:ARCH]
//                   [--fast_math] [--explain] [--write_binary=OUT] FILE
//
// A Graph file gets the target from --target (default
// cpu:x86_64-unknown-linux-gnu:x86-64-v3:); a CompileRequest file carries its
// own target and options unless flags override them. --explain prints every
// key component's canonical text and hash after the key. --write_binary also
// writes the request (with the target and options applied) as a binary
// kiln.v1.CompileRequest, as the fuzzer's binary seeds are made.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "graph/guard_key.h"
#include "graph/import.h"
#include "google/protobuf/util/json_util.h"

namespace {

bool ParseTarget(const std::string& spec, kiln::v1::Target* target) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  if (parts[0] == "cpu" && parts.size() >= 2 && parts.size() <= 4) {
    parts.resize(4);
    target->mutable_cpu()->set_triple(parts[1]);
    target->mutable_cpu()->set_cpu(parts[2]);
    target->mutable_cpu()->set_features(parts[3]);
    return true;
  }
  if (parts[0] == "cuda" && parts.size() == 2) {
    target->mutable_cuda()->set_arch(parts[1]);
    return true;
  }
  return false;
}

int Usage() {
  std::cerr << "usage: print_guard_key [--target=cpu:TRIPLE:CPU:FEATURES|"
               "--target=cuda:ARCH] [--fast_math] [--explain] "
               "[--write_binary=OUT] FILE\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path, target_spec, binary_out;
  bool fast_math = false, explain = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--target=")) {
      target_spec = arg.substr(9);
    } else if (arg == "--fast_math") {
      fast_math = true;
    } else if (absl::StartsWith(arg, "--write_binary=")) {
      binary_out = arg.substr(15);
    } else if (arg == "--explain") {
      explain = true;
    } else if (!absl::StartsWith(arg, "--") && path.empty()) {
      path = arg;
    } else {
      return Usage();
    }
  }
  if (path.empty()) return Usage();

  std::ifstream file(path);
  if (!file) {
    std::cerr << "cannot read " << path << "\n";
    return 1;
  }
  std::stringstream text;
  text << file.rdbuf();

  kiln::v1::CompileRequest request;
  if (!google::protobuf::util::JsonStringToMessage(text.str(),
                                                   request.mutable_graph())
           .ok()) {
    request.Clear();
    const auto status =
        google::protobuf::util::JsonStringToMessage(text.str(), &request);
    if (!status.ok()) {
      std::cerr << path << ": neither a kiln.v1.Graph nor a CompileRequest: "
                << status.ToString() << "\n";
      return 1;
    }
  } else if (target_spec.empty()) {
    target_spec = "cpu:x86_64-unknown-linux-gnu:x86-64-v3:";
  }
  if (!target_spec.empty() &&
      !ParseTarget(target_spec, request.mutable_target())) {
    return Usage();
  }
  if (fast_math) request.mutable_options()->set_fast_math(true);

  if (!binary_out.empty()) {
    std::ofstream out(binary_out, std::ios::binary);
    if (!request.SerializeToOstream(&out)) {
      std::cerr << "cannot write " << binary_out << "\n";
      return 1;
    }
  }

  absl::StatusOr<kiln::Graph> graph = kiln::ImportGraph(request.graph());
  if (!graph.ok()) {
    std::cerr << path << ": " << graph.status().ToString() << "\n";
    return 1;
  }
  const std::vector<kiln::KeyComponent> components =
      kiln::ExplainKey(*graph, request.target(), request.options());
  std::cout << kiln::DigestToHex(kiln::CombineKeyComponents(components))
            << "\n";
  if (explain) {
    for (const kiln::KeyComponent& c : components) {
      std::cout << "== " << c.name << " " << kiln::DigestToHex(c.hash) << "\n"
                << c.canonical
                << (absl::EndsWith(c.canonical, "\n") ? "" : "\n");
    }
  }
  return 0;
}
