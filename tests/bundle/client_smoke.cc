// Built by deploy/check-bundle.sh against the bundle's include/ and lib/
// only (pkg-config kiln_client), then run against the bundle's kilnd:
// kiln::Client gets chain10 (compile or Lookup, then the in-process cache)
// and its output is compared with the formula.
//
//   client_smoke GRAPH.json HOST:PORT
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "client/kiln_client.h"
#include "google/protobuf/util/json_util.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: client_smoke GRAPH.json HOST:PORT\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream json;
  json << in.rdbuf();
  kiln::v1::CompileRequest request;
  if (!google::protobuf::util::JsonStringToMessage(json.str(), request.mutable_graph()).ok()) {
    std::fprintf(stderr, "client_smoke: cannot parse %s\n", argv[1]);
    return 1;
  }
  kiln::v1::CpuTarget* cpu = request.mutable_target()->mutable_cpu();
  cpu->set_triple("x86_64-unknown-linux-gnu");
  cpu->set_cpu("x86-64");

  kiln::ClientOptions options;
  options.server = argv[2];
  options.runtime_threads = 1;
  auto client = kiln::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "client_smoke: %s\n", client.status().ToString().c_str());
    return 1;
  }
  for (int round = 0; round < 2; ++round) {
    auto exe = (*client)->GetExecutable(request);
    if (!exe.ok()) {
      std::fprintf(stderr, "client_smoke: %s\n", exe.status().ToString().c_str());
      return 1;
    }
    kiln::HostTensor x = kiln::HostTensor::Empty(kiln::DType::kFloat32, {8, 16});
    for (int64_t i = 0; i < x.numel(); ++i) x.SetDoubleAt(i, 0.01 * i - 0.5);
    auto out = (*exe)->Run({x});
    if (!out.ok() || out->size() != 1) {
      std::fprintf(stderr, "client_smoke: run: %s\n",
                   out.ok() ? "wrong output count" : out.status().ToString().c_str());
      return 1;
    }
    double max_err = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {  // chain10.json, op by op
      double v = std::cos(std::sin(x.GetDoubleAt(i) + 0.1) * 1.1) + 0.2;
      v = std::exp((std::max(v, 0.0) - 0.1) * 0.5) + 0.3;
      v = 1 / (1 + std::exp(-v));
      max_err = std::max(max_err, std::abs(v - (*out)[0].GetDoubleAt(i)));
    }
    if (!(max_err < 1e-5)) {
      std::fprintf(stderr, "client_smoke: max error %g\n", max_err);
      return 1;
    }
  }
  kiln::Client::Counters c = (*client)->counters();
  std::printf("client_smoke: ok (compiles %llu, lookup hits %llu, local hits %llu)\n",
              (unsigned long long)c.compiles, (unsigned long long)c.lookup_hits,
              (unsigned long long)c.local_hits);
  return c.local_hits == 1 ? 0 : 1;
}
