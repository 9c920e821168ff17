// A table keyed by ATen op name, built once at start-up: the form of the
// signature table (op_signature.h) and of the compiler's reference and
// lowering tables (compiler/op_reference.h, compiler/op_lowering.h).
//
// Thread-safety: Add only while building (before the table is published);
// Find and Names are safe from any thread afterwards. Entries never move.
#ifndef KILN_GRAPH_OP_TABLE_H_
#define KILN_GRAPH_OP_TABLE_H_

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/strings/string_view.h"

namespace kiln {

template <typename T>
class OpTable {
 public:
  // nullptr when `op` is not in the table.
  const T* Find(absl::string_view op) const {
    auto it = ops_.find(op);
    return it == ops_.end() ? nullptr : &it->second;
  }

  // Every op in the table, sorted.
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    names.reserve(ops_.size());
    for (const auto& [name, entry] : ops_) names.push_back(name);
    std::sort(names.begin(), names.end());
    return names;
  }

  // Adds `op`. A name added twice is a programming error: the process
  // aborts naming it.
  void Add(std::string op, T entry) {
    if (!ops_.emplace(op, std::move(entry)).second) {
      std::fprintf(stderr, "kiln: op %s is registered twice\n", op.c_str());
      std::abort();
    }
  }

 private:
  absl::node_hash_map<std::string, T> ops_;
};

}  // namespace kiln

#endif  // KILN_GRAPH_OP_TABLE_H_
