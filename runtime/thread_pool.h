// Worker threads for running a kernel's chunks in parallel.
//
// A pool runs its regions on one of two sets of threads:
//  - the host process's OpenMP threads, when the process has an OpenMP
//    runtime loaded (PyTorch's libgomp, in a training process) and the pool
//    was built with the default thread count: Kiln's kernels then run on the
//    same threads as PyTorch's own ops, as many as torch.get_num_threads()
//    says, instead of a second set of threads competing with PyTorch's for
//    the cores (bench/README.md, "One set of threads"). The runtime is found
//    with dlopen(RTLD_NOLOAD), never loaded or linked by Kiln, so Kiln adds
//    no OpenMP dependency and cannot load a second copy.
//    KILN_CPU_THREADS=kiln turns this off;
//  - otherwise its own workers (std::thread), `threads` of them with the
//    caller.
//
// A pool used in a child process forked after the pool was built runs its
// regions on the calling thread: the parent's workers, Kiln's or OpenMP's,
// do not exist in the child (libgomp would wait for them forever).
//
// Thread-safety: ParallelFor may be called from several threads at once;
// on Kiln's own workers, calls are serialised (one parallel region at a
// time, which is what a runtime that saturates the cores wants anyway); on
// OpenMP each calling thread gets its own team, as OpenMP gives any thread
// that starts a parallel region.
#ifndef KILN_RUNTIME_THREAD_POOL_H_
#define KILN_RUNTIME_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

struct OpenMpRuntime;  // thread_pool.cc

class ThreadPool {
 public:
  // `threads` workers including the caller. 0: the host's OpenMP threads
  // when an OpenMP runtime is loaded by the time the pool is built or first
  // used (and KILN_CPU_THREADS is not `kiln`), else hardware concurrency.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The threads a region runs on, the caller included (on OpenMP, the
  // team size a region started now would get).
  int size() const;

  // Whether regions run on the host process's OpenMP threads.
  bool uses_openmp() const;

  // Runs fn(i) for i in [0, n), spread over the threads and the caller;
  // returns when all are done. fn must not throw.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  // A worker: runs the tasks of each region after generation `seen`.
  void WorkerLoop(uint64_t seen);
  // Runs tasks of the current region until none is left; `lock` holds mu_.
  void RunTasks(std::unique_lock<std::mutex>& lock);
  // The OpenMP runtime regions run on, or null (found on first use when
  // threads was 0).
  const OpenMpRuntime* OpenMp() const;

  const bool may_use_openmp_;
  const int owner_pid_;        // the process that built the pool
  int own_threads_ = 1;        // Kiln's workers + the caller
  std::once_flag start_once_;  // the workers start with the first region
  mutable std::once_flag openmp_once_;
  mutable const OpenMpRuntime* openmp_ = nullptr;
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
