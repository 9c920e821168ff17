// A bounded pool of compile threads. Compiles are CPU-bound and long next
// to an RPC, so they run here rather than on gRPC's threads; past the queue
// bound, submissions are refused so the daemon sheds load instead of
// queueing without limit.
//
// Fair use (issue 18): each task belongs to an identity (as kilnd names
// the caller in messages: "token 'ci'", "client certificate 'alice'";
// empty for an anonymous caller). Queued tasks are taken round-robin over
// identities, not first-come first-served, so one client's burst does not
// hold the threads while others wait; an identity may be limited to a
// number of queued tasks and of tasks running at once (its queued tasks
// wait while it is at its running limit, others' run). The empty identity
// has no per-identity limits.
//
// Thread-safety: all methods are thread-safe. The destructor finishes the
// queued and running tasks (drain) before returning.
#ifndef KILN_SERVER_COMPILE_POOL_H_
#define KILN_SERVER_COMPILE_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kiln {

// Per-identity limits; 0: none.
struct CompilePoolLimits {
  size_t max_queued_per_identity = 0;
  int max_running_per_identity = 0;
};

class CompilePool {
 public:
  CompilePool(int threads, size_t max_queue, CompilePoolLimits limits = {});
  ~CompilePool();
  CompilePool(const CompilePool&) = delete;
  CompilePool& operator=(const CompilePool&) = delete;

  // False when the queue is full (the task is not run). The empty identity.
  bool Submit(std::function<void()> task);
  // Queues `task` for `identity`. Errors (the task is not run):
  // RESOURCE_EXHAUSTED when the whole queue is full, or when `identity`
  // already has its limit of queued tasks (the message names both);
  // UNAVAILABLE while stopping.
  absl::Status SubmitFor(const std::string& identity,
                         std::function<void()> task);
  size_t queue_depth() const;
  // Tasks of `identity` queued and running now (for tests and stats).
  size_t queued_for(const std::string& identity) const;
  int running_for(const std::string& identity) const;

 private:
  struct PerIdentity {
    std::deque<std::function<void()>> queued;
    int running = 0;
  };
  void Loop();
  // The next task to run (round-robin over identities that may run one
  // now), or false when there is none. Holds mu_.
  bool TakeNext(std::string* identity, std::function<void()>* task);

  const size_t max_queue_;
  const CompilePoolLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  absl::flat_hash_map<std::string, PerIdentity> identities_;
  // Identities with queued tasks, the next to be served first.
  std::deque<std::string> ring_;
  size_t queued_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kiln

#endif  // KILN_SERVER_COMPILE_POOL_H_
