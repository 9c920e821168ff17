// A bounded pool of compile threads. Compiles are CPU-bound and long next
// to an RPC, so they run here rather than on gRPC's threads; past the queue
// bound, submissions are refused so the daemon sheds load instead of
// queueing without limit.
//
// Thread-safety: all methods are thread-safe. The destructor finishes the
// queued and running tasks (drain) before returning.
#ifndef KILN_SERVER_COMPILE_POOL_H_
#define KILN_SERVER_COMPILE_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class CompilePool {
 public:
  CompilePool(int threads, size_t max_queue);
  ~CompilePool();
  CompilePool(const CompilePool&) = delete;
  CompilePool& operator=(const CompilePool&) = delete;

  // False when the queue is full (the task is not run).
  bool Submit(std::function<void()> task);
  size_t queue_depth() const;

 private:
  void Loop();
  const size_t max_queue_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kiln

#endif  // KILN_SERVER_COMPILE_POOL_H_
