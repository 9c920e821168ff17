// Single-flight per guard key: the first request for a key leads (starts
// the compile), later ones join it and all receive the same result.
//
// Thread-safety: all methods are thread-safe.
#ifndef KILN_SERVER_INFLIGHT_COMPILES_H_
#define KILN_SERVER_INFLIGHT_COMPILES_H_

#include <future>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kiln/v1/artifact.pb.h"
#include "support/sha256.h"

namespace kiln {

using CompileResult = absl::StatusOr<std::shared_ptr<const v1::Artifact>>;

class InflightCompiles {
 public:
  struct Ticket {
    std::shared_future<CompileResult> result;
    bool leader = false;  // the caller must start the compile and Finish()
  };

  // Joins the compile of `key`, or registers a new one led by the caller.
  Ticket Join(const Sha256Digest& key);

  // Publishes the leader's result to every joiner and forgets the key.
  void Finish(const Sha256Digest& key, CompileResult result);

  size_t size() const;

 private:
  struct Flight {
    std::promise<CompileResult> promise;
    std::shared_future<CompileResult> future;
  };
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Flight>> flights_;
};

}  // namespace kiln

#endif  // KILN_SERVER_INFLIGHT_COMPILES_H_
