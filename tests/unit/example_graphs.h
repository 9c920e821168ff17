// Requests for the example graphs (examples/graphs/*.json) compiled for this
// machine's CPU. Test targets that include this define KILN_EXAMPLES_DIR.
#ifndef KILN_TESTS_UNIT_EXAMPLE_GRAPHS_H_
#define KILN_TESTS_UNIT_EXAMPLE_GRAPHS_H_

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "compiler/cpu_backend.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::testing {

// $KILN_EXAMPLES_DIR overrides the source tree's directory (for test
// binaries carried to another machine in the relocatable bundle).
inline std::string ExamplesDir() {
  const char* env = std::getenv("KILN_EXAMPLES_DIR");
  return env && *env ? env : KILN_EXAMPLES_DIR;
}

// A kiln.v1.Graph in JSON read from `path` into a request's graph (a
// test failure names the path when it does not parse).
inline v1::CompileRequest RequestFromJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  v1::CompileRequest req;
  EXPECT_TRUE(
      google::protobuf::util::JsonStringToMessage(ss.str(), req.mutable_graph())
          .ok())
      << path;
  return req;
}

inline v1::CompileRequest Request(const std::string& file) {
  v1::CompileRequest req = RequestFromJson(ExamplesDir() + "/" + file);
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  return req;
}

// layer_norm.json with `rows` rows of `row` elements.
inline v1::CompileRequest LayerNormRequest(int64_t rows, int64_t row) {
  v1::CompileRequest ln = Request("layer_norm.json");
  ln.mutable_graph()
      ->mutable_inputs(0)
      ->mutable_meta()
      ->mutable_sizes(0)
      ->set_value(rows);
  for (int i = 0; i < 3; ++i) {
    v1::TensorMeta* meta =
        ln.mutable_graph()->mutable_inputs(i)->mutable_meta();
    meta->mutable_sizes(meta->sizes_size() - 1)->set_value(row);
  }
  ln.mutable_graph()
      ->mutable_nodes(0)
      ->mutable_args(1)
      ->mutable_ints()
      ->set_values(0, row);
  return ln;
}

}  // namespace kiln::testing

#endif  // KILN_TESTS_UNIT_EXAMPLE_GRAPHS_H_
