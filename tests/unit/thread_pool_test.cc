// ThreadPool on Kiln's own workers and on a loaded OpenMP runtime
// (runtime/thread_pool.h): every index runs exactly once, on more than one
// thread where the pool has several, and the OpenMP path is taken only
// when a runtime is loaded and the pool's thread count is the default.
#include "runtime/thread_pool.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace kiln {
namespace {

// Runs ParallelFor(n) on `pool`; expects each index once and returns the
// number of distinct threads that ran tasks.
size_t RunEachOnce(ThreadPool& pool, int64_t n) {
  std::vector<std::atomic<int>> hits(n);
  std::mutex mu;
  std::set<std::thread::id> threads;
  pool.ParallelFor(n, [&](int64_t i) {
    hits[i].fetch_add(1);
    // Long enough that a second thread gets a task.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::lock_guard<std::mutex> lock(mu);
    threads.insert(std::this_thread::get_id());
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "index " << i;
  return threads.size();
}

TEST(ThreadPool, OwnWorkersRunEachIndexOnce) {
  ThreadPool pool(3);
  EXPECT_FALSE(pool.uses_openmp());
  EXPECT_EQ(pool.size(), 3);
  EXPECT_GT(RunEachOnce(pool, 200), 1u);
  EXPECT_EQ(RunEachOnce(pool, 1), 1u);
  pool.ParallelFor(0, [](int64_t) { ADD_FAILURE() << "ran a task of 0"; });
}

TEST(ThreadPool, OneThreadRunsOnTheCaller) {
  ThreadPool pool(1);
  const auto caller = std::this_thread::get_id();
  pool.ParallelFor(
      5, [&](int64_t) { EXPECT_EQ(std::this_thread::get_id(), caller); });
}

TEST(ThreadPool, RunsOnALoadedOpenMpRuntime) {
  // What PyTorch's import does: load libgomp into the process.
  void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (gomp == nullptr) GTEST_SKIP() << "no libgomp.so.1: " << dlerror();
  auto set_threads =
      reinterpret_cast<void (*)(int)>(dlsym(gomp, "omp_set_num_threads"));
  ASSERT_NE(set_threads, nullptr);
  set_threads(3);  // as torch.set_num_threads(3)

  ThreadPool explicit_count(2);  // a count given: Kiln's own workers
  EXPECT_FALSE(explicit_count.uses_openmp());

  setenv("KILN_CPU_THREADS", "kiln", 1);
  ThreadPool opted_out;
  EXPECT_FALSE(opted_out.uses_openmp());
  unsetenv("KILN_CPU_THREADS");

  ThreadPool pool;
  ASSERT_TRUE(pool.uses_openmp());
  EXPECT_EQ(pool.size(), 3);  // the runtime's thread count, not the cores
  EXPECT_GT(RunEachOnce(pool, 300), 1u);
  // Regions from several threads at once each get a team.
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t)
    callers.emplace_back([&] { RunEachOnce(pool, 50); });
  for (std::thread& t : callers) t.join();
  set_threads(1);
  EXPECT_EQ(pool.size(), 1);
  EXPECT_EQ(RunEachOnce(pool, 20), 1u);
}

}  // namespace
}  // namespace kiln
