#include "runtime/thread_pool.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <string_view>

namespace kiln {

// The entry points of a loaded OpenMP runtime that a region needs: GCC's
// ABI for `#pragma omp parallel` (GOMP_parallel, which libgomp and LLVM's
// and Intel's runtimes all export) and the team size a region would get.
struct OpenMpRuntime {
  void (*parallel)(void (*fn)(void*), void* data, unsigned num_threads,
                   unsigned flags);
  int (*max_threads)();
};

namespace {

// The OpenMP runtime already loaded into this process, or null. Looked up,
// never loaded (RTLD_NOLOAD): a handle to a library that is not there is
// null, and the reference a found one takes is kept for the process's life
// (the runtime's threads outlive any pool).
const OpenMpRuntime* LoadedOpenMp() {
  static const std::optional<OpenMpRuntime> runtime =
      []() -> std::optional<OpenMpRuntime> {
    for (const char* name : {"libgomp.so.1", "libomp.so", "libiomp5.so"}) {
      void* handle = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
      if (handle == nullptr) continue;
      OpenMpRuntime r;
      r.parallel = reinterpret_cast<decltype(r.parallel)>(
          dlsym(handle, "GOMP_parallel"));
      r.max_threads = reinterpret_cast<decltype(r.max_threads)>(
          dlsym(handle, "omp_get_max_threads"));
      if (r.parallel && r.max_threads) return r;
      dlclose(handle);
    }
    return std::nullopt;
  }();
  return runtime ? &*runtime : nullptr;
}

bool OpenMpAllowed() {
  const char* env = std::getenv("KILN_CPU_THREADS");
  return env == nullptr || std::string_view(env) != "kiln";
}

// One OpenMP region's shared state: tasks handed out in order, one at a
// time, to whichever thread of the team asks next.
struct OpenMpRegion {
  const std::function<void(int64_t)>* fn;
  int64_t n;
  std::atomic<int64_t> next{0};
};

void RunOpenMpTasks(void* data) {
  auto* region = static_cast<OpenMpRegion*>(data);
  for (int64_t i = region->next.fetch_add(1, std::memory_order_relaxed);
       i < region->n;
       i = region->next.fetch_add(1, std::memory_order_relaxed)) {
    (*region->fn)(i);
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads)
    : may_use_openmp_(threads <= 0), owner_pid_(static_cast<int>(getpid())) {
  if (threads <= 0)
    threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  own_threads_ = threads;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

const OpenMpRuntime* ThreadPool::OpenMp() const {
  if (!may_use_openmp_) return nullptr;
  std::call_once(openmp_once_, [this] {
    if (OpenMpAllowed()) openmp_ = LoadedOpenMp();
  });
  return openmp_;
}

bool ThreadPool::uses_openmp() const { return OpenMp() != nullptr; }

int ThreadPool::size() const {
  if (const OpenMpRuntime* omp = OpenMp())
    return std::max(1, omp->max_threads());
  return own_threads_;
}

void ThreadPool::RunTasks(std::unique_lock<std::mutex>& lock) {
  while (fn_ != nullptr && next_ < n_) {
    const int64_t i = next_++;
    const auto* fn = fn_;
    lock.unlock();
    (*fn)(i);
    lock.lock();
    if (++finished_ == n_) done_.notify_all();
  }
}

void ThreadPool::WorkerLoop(uint64_t seen) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    RunTasks(lock);
  }
}

void ThreadPool::ParallelFor(int64_t n,
                             const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || static_cast<int>(getpid()) != owner_pid_) {
    for (int64_t i = 0; i < n; ++i) fn(i);  // one task, or a forked child
    return;
  }
  if (const OpenMpRuntime* omp = OpenMp()) {
    OpenMpRegion region{&fn, n};
    const int team = std::max(1, omp->max_threads());
    omp->parallel(&RunOpenMpTasks, &region,
                  static_cast<unsigned>(std::min<int64_t>(n, team)), 0);
    return;
  }
  if (own_threads_ <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::call_once(start_once_, [this] {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 1; i < own_threads_; ++i)
      workers_.emplace_back([this, seen = generation_] { WorkerLoop(seen); });
  });
  std::lock_guard<std::mutex> region(region_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  fn_ = &fn;
  n_ = n;
  next_ = 0;
  finished_ = 0;
  ++generation_;
  wake_.notify_all();
  RunTasks(lock);
  done_.wait(lock, [&] { return finished_ == n_; });
  fn_ = nullptr;
}

}  // namespace kiln
