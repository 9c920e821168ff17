// Artifacts do not change by accident: the example graphs and 200 random
// graphs over all of op set v1, compiled for a fixed x86-64 target (and for
// sm_90 where this build has the CUDA back end), must give artifacts whose
// SHA-256 matches tests/unit/testdata/artifact_digests.txt, recorded before
// the redesign of issue 14. A refactor that is meant to keep behaviour keeps
// every digest; a change that is meant to change generated code re-records
// them and says so in its commit:
//
//   KILN_RECORD_DIGESTS=$PWD/tests/unit/testdata/artifact_digests.txt
//   build/tests/unit/artifact_digest_test
//
// The digest covers the serialized artifact (deterministic serialization)
// without the fields that legitimately vary: guard_key (it hashed the
// compiler's own sources before issue 14), compile_seconds (wall time) and
// CUDA's jit_log (it reports ptxas's time).
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "compiler/compile.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gtest/gtest.h"
#include "support/sha256.h"
#include "tests/unit/example_graphs.h"
#include "tests/unit/graph_gen.h"
#include "tests/unit/random_graphs.h"

namespace kiln::testing {
namespace {

constexpr int kRandomGraphs = 200;

// A fixed CPU target, so the digests do not depend on the machine that runs
// the test (the code is compiled, never run, here).
v1::Target FixedCpuTarget() {
  v1::Target t;
  t.mutable_cpu()->set_triple("x86_64-unknown-linux-gnu");
  t.mutable_cpu()->set_cpu("x86-64-v3");
  return t;
}

v1::Target Sm90Target() {
  v1::Target t;
  t.mutable_cuda()->set_arch("sm_90");
  return t;
}

// The artifact's digest, or "error: <status>" when it does not compile (an
// error is recorded too, so a graph that starts or stops compiling shows).
std::string ArtifactDigest(v1::CompileRequest request) {
  auto artifact = Compile(request);
  if (!artifact.ok())
    return absl::StrCat("error:", static_cast<int>(artifact.status().code()));
  artifact->clear_guard_key();
  artifact->clear_compile_seconds();
  // nvJitLink's info log reports its own compile time.
  if (artifact->has_cuda()) artifact->mutable_cuda()->clear_jit_log();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    artifact->SerializeToCodedStream(&out);
  }
  return DigestToHex(Sha256(bytes));
}

// name -> digest for every case this build can compile.
std::map<std::string, std::string> ComputeDigests() {
  std::vector<std::pair<std::string, v1::Target>> targets = {
      {"x86-64-v3", FixedCpuTarget()}};
#ifdef KILN_HAVE_CUDA_BACKEND
  targets.push_back({"sm_90", Sm90Target()});
#endif
  std::map<std::string, std::string> digests;
  for (const char* file : {"chain10.json", "chain30.json", "chain30_sum.json",
                           "dynamic_batch.json", "layer_norm.json",
                           "reduce_two_dims.json", "softmax.json"}) {
    for (const auto& [target_name, target] : targets) {
      v1::CompileRequest req = Request(file);
      *req.mutable_target() = target;
      if (target.has_cuda()) {
        for (v1::Input& in : *req.mutable_graph()->mutable_inputs())
          in.mutable_meta()->set_alignment(16);
      }
      digests[absl::StrCat(file, "/", target_name)] = ArtifactDigest(req);
    }
  }
  const graph_gen::GraphGenOptions options = random_graphs::Options();
  for (int seed = 0; seed < kRandomGraphs; ++seed) {
    v1::CompileRequest req;
    *req.mutable_graph() = graph_gen::RandomGraph(seed, options);
    for (const auto& [target_name, target] : targets) {
      *req.mutable_target() = target;
      digests[absl::StrCat("random", seed, "/", target_name)] =
          ArtifactDigest(req);
    }
  }
  return digests;
}

std::string RecordedFile() {
  const char* env = std::getenv("KILN_DIGESTS_FILE");
  return env && *env ? env : KILN_DIGESTS_FILE;
}

TEST(ArtifactDigests, MatchTheRecordedOnes) {
  const std::map<std::string, std::string> digests = ComputeDigests();
  if (const char* record = std::getenv("KILN_RECORD_DIGESTS");
      record && *record) {
    std::ofstream out(record);
    for (const auto& [name, digest] : digests)
      out << name << " " << digest << "\n";
    GTEST_SKIP() << "recorded " << digests.size() << " digests in " << record;
  }
  std::ifstream in(RecordedFile());
  ASSERT_TRUE(in.good()) << "cannot read " << RecordedFile();
  std::map<std::string, std::string> recorded;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() == 2) recorded[parts[0]] = parts[1];
  }
  int compared = 0, changed = 0;
  for (const auto& [name, digest] : digests) {
    auto it = recorded.find(name);
    // A build without the CUDA back end compares the CPU cases only.
    ASSERT_NE(it, recorded.end()) << name << " has no recorded digest";
    ++compared;
    if (it->second != digest) {
      ++changed;
      ADD_FAILURE() << name << ": artifact changed (recorded " << it->second
                    << ", now " << digest << ")";
    }
  }
  std::printf("%d artifacts compared with %s, %d changed\n", compared,
              RecordedFile().c_str(), changed);
  EXPECT_GE(compared, 7 + kRandomGraphs);
}

}  // namespace
}  // namespace kiln::testing
