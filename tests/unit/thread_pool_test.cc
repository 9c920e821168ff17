// ThreadPool on Kiln's own workers and on a loaded OpenMP runtime
// (runtime/thread_pool.h): every index runs exactly once, on more than one
// thread where the pool has several, and the OpenMP path is taken only
// when a runtime is loaded and the pool's thread count is the default.
// And CpuBlas::Gemm over a pool against a plain triple loop (a second
// ctest entry runs it on OpenBLAS: tests/unit/CMakeLists.txt).
#include "runtime/thread_pool.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "runtime/cpu_blas.h"

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

// A child forked after the pool ran regions (on OpenMP's threads and on
// Kiln's) runs its regions on its calling thread instead of waiting for
// the parent's threads, which do not exist in it.
TEST(ThreadPool, AForkedChildRunsRegionsOnItsOwnThread) {
  if (dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL) == nullptr)
    GTEST_SKIP() << "no libgomp.so.1";
  ThreadPool openmp;
  ThreadPool own(2);
  RunEachOnce(openmp, 20);
  RunEachOnce(own, 20);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(20);  // a hang fails the child
    std::atomic<int64_t> sum{0};
    auto add = [&](int64_t i) { sum += i; };
    openmp.ParallelFor(100, add);
    own.ParallelFor(100, add);
    _exit(sum.load() == 2 * 4950 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child hung or crashed: " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// C = alpha * op(A) @ op(B) + beta * C over a pool, for products longer in
// rows and longer in columns, transposed operands, batches, offsets and
// leading dimensions past the matrix, against a plain loop.
TEST(ThreadPool, GemmBlocksOverAPool) {
  auto blas = CpuBlas::Get();
  if (!blas.ok()) GTEST_SKIP() << blas.status();
  std::cout << "BLAS: " << (*blas)->library() << "\n";
  // Kiln's own threads, and the process's OpenMP threads as in a PyTorch
  // process (oneDNN splits its calls differently on each).
  ThreadPool own(3);
  std::vector<ThreadPool*> pools = {&own};
  std::unique_ptr<ThreadPool> openmp;
  if (dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL) != nullptr) {
    openmp = std::make_unique<ThreadPool>();
    EXPECT_TRUE(openmp->uses_openmp());
    pools.push_back(openmp.get());
  }
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  struct Case {
    int64_t batch, m, n, k;
    bool ta, tb;
  };
  // Each large enough for several blocks (at least 2^21 multiply-adds a
  // block, RowsPerBlock in cpu_blas.cc).
  for (const Case& t :
       {Case{1, 40, 3000, 200, false, false},
        Case{2, 30, 2500, 300, true, true}, Case{1, 2600, 9, 300, false, true},
        Case{2, 2100, 12, 250, true, false},
        Case{1, 300, 280, 64, false, false},
        // Many small products, and a product over k = 0 (C scaled by beta).
        Case{8, 3, 4, 5, true, false}, Case{3, 17, 5, 0, false, true}}) {
    SCOPED_TRACE(testing::Message()
                 << t.batch << "x" << t.m << "x" << t.n << "x" << t.k
                 << " ta=" << t.ta << " tb=" << t.tb);
    GemmDims d;
    d.batch = t.batch, d.m = t.m, d.n = t.n, d.k = t.k;
    // Stored shapes: A [m, k] or [k, m], B [k, n] or [n, k], row-major
    // with one column of padding, after an offset of 3 elements.
    const int64_t a_rows = t.ta ? t.k : t.m, a_cols = t.ta ? t.m : t.k;
    const int64_t b_rows = t.tb ? t.n : t.k, b_cols = t.tb ? t.k : t.n;
    d.a = {3, a_rows * (a_cols + 1), a_cols + 1, t.ta};
    d.b = {3, b_rows * (b_cols + 1), b_cols + 1, t.tb};
    d.c = {3, t.m * (t.n + 1), t.n + 1, false};
    std::vector<float> a(3 + t.batch * d.a.batch_stride),
        b(3 + t.batch * d.b.batch_stride), c(3 + t.batch * d.c.batch_stride);
    for (float& x : a) x = u(rng);
    for (float& x : b) x = u(rng);
    for (float& x : c) x = u(rng);
    std::vector<float> want = c;
    for (int64_t i = 0; i < t.batch; ++i) {
      for (int64_t r = 0; r < t.m; ++r) {
        for (int64_t j = 0; j < t.n; ++j) {
          double sum = 0;
          for (int64_t q = 0; q < t.k; ++q) {
            const float av = a[3 + i * d.a.batch_stride +
                               (t.ta ? q * d.a.ld + r : r * d.a.ld + q)];
            const float bv = b[3 + i * d.b.batch_stride +
                               (t.tb ? j * d.b.ld + q : q * d.b.ld + j)];
            sum += static_cast<double>(av) * bv;
          }
          float& w = want[3 + i * d.c.batch_stride + r * d.c.ld + j];
          w = static_cast<float>(0.5 * sum + 0.25 * w);
        }
      }
    }
    for (ThreadPool* pool : pools) {
      SCOPED_TRACE(pool->uses_openmp() ? "OpenMP pool" : "own pool");
      std::vector<float> out = c;
      ASSERT_TRUE((*blas)
                      ->Gemm(DType::kFloat32, d, 0.5, 0.25, a.data(), b.data(),
                             out.data(), pool)
                      .ok());
      double worst = 0;
      for (size_t e = 0; e < out.size(); ++e)
        worst = std::max<double>(worst, std::abs(out[e] - want[e]));
      EXPECT_LT(worst, 1e-4);
    }
  }
}

}  // namespace
}  // namespace kiln
