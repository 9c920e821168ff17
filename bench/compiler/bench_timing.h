// Timing for the compiler benchmarks: the median wall time of a callable.
//
// Thread-safety: a free function; f decides.
#ifndef KILN_BENCH_COMPILER_BENCH_TIMING_H_
#define KILN_BENCH_COMPILER_BENCH_TIMING_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace kiln {

// Runs f `warmup` times, then `runs` times timed; the median in ms.
template <typename F>
double MedianMs(F&& f, int warmup = 2, int runs = 7) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace kiln

#endif  // KILN_BENCH_COMPILER_BENCH_TIMING_H_
