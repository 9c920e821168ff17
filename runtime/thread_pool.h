// A fixed pool of worker threads for running a kernel's chunks in parallel.
//
// Thread-safety: ParallelFor may be called from several threads at once;
// calls are serialised (one parallel region at a time), which is what a
// runtime that saturates the cores wants anyway.
#ifndef KILN_RUNTIME_THREAD_POOL_H_
#define KILN_RUNTIME_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  // `threads` workers including the caller (0: hardware concurrency).
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for i in [0, n), spread over the workers and the caller;
  // returns when all are done.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();
  // Runs tasks of the current region until none is left; `lock` holds mu_.
  void RunTasks(std::unique_lock<std::mutex>& lock);

  std::vector<std::thread> workers_;
  std::mutex region_mu_;  // one parallel region at a time
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, next_ = 0, finished_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_THREAD_POOL_H_
