// One storm client process: gets an executable for GRAPH.json from kilnd
// through kiln::Client, runs it on seeded inputs and compares with the
// reference evaluator. Prints "OK <outcome counters>" and exits 0 when the
// results are right; any error exits non-zero with the message.
//
//   storm_client SERVER GRAPH.json SEED [MAX_RETRIES]
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "client/kiln_client.h"
#include "compiler/cpu_backend.h"
#include "graph/import.h"
#include "compiler/reference.h"
#include "google/protobuf/util/json_util.h"
#include "tests/unit/numerics.h"

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr,
                 "usage: storm_client SERVER GRAPH.json SEED [MAX_RETRIES]\n");
    return 2;
  }
  std::ifstream in(argv[2]);
  std::stringstream ss;
  ss << in.rdbuf();
  kiln::v1::CompileRequest req;
  if (!google::protobuf::util::JsonStringToMessage(ss.str(),
                                                   req.mutable_graph())
           .ok())
    return 2;
  *req.mutable_target()->mutable_cpu() = kiln::HostCpuTarget();
  kiln::ClientOptions options;
  options.server = argv[1];
  options.runtime_threads = 1;
  options.max_retries = argc == 5 ? std::atoi(argv[4]) : 5;
  auto client = kiln::Client::Connect(options);
  if (!client.ok()) return 3;
  auto exe = (*client)->GetExecutable(req);
  if (!exe.ok()) {
    std::fprintf(stderr, "%s\n", exe.status().ToString().c_str());
    return 4;
  }
  auto graph = kiln::ImportGraph(req.graph());
  std::mt19937_64 rng(std::stoull(argv[3]));
  auto inputs = kiln::testing::RandomInputs(
      *graph, std::vector<int64_t>(graph->symbols.size(), 5), rng);
  auto got = (*exe)->Run(inputs);
  auto want = kiln::EvaluateReference(*graph, inputs);
  if (!got.ok() || !want.ok()) return 5;
  for (size_t o = 0; o < want->size(); ++o) {
    const std::string diff = kiln::testing::Compare((*got)[o], (*want)[o]);
    if (!diff.empty()) {
      std::fprintf(stderr, "output %zu: %s\n", o, diff.c_str());
      return 6;
    }
  }
  const auto c = (*client)->counters();
  std::printf("OK lookups=%llu compiles=%llu\n",
              static_cast<unsigned long long>(c.lookup_hits),
              static_cast<unsigned long long>(c.compiles));
  return 0;
}
