// Choosing among a library's candidate algorithms by timing them on the
// caller's stream: cuBLASLt's heuristic results (runtime/cuda_blaslt.cc)
// and cuDNN's engine configurations under cudnn.benchmark
// (runtime/cuda_cudnn.cc). Internal to the CUDA runtime.
//
// Thread-safety: FastestCandidate enqueues on `stream` and waits for its
// own events; callers serialize what `run` shares.
#ifndef KILN_RUNTIME_GPU_TIMING_H_
#define KILN_RUNTIME_GPU_TIMING_H_

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/cuda_driver.h"

namespace kiln {

// RAII for a timing event.
class TimingEvent {
 public:
  explicit TimingEvent(const cuda::Driver& driver) : driver_(driver) {}
  ~TimingEvent() {
    if (event_ != nullptr) driver_.api().cuEventDestroy_v2(event_);
  }
  TimingEvent(const TimingEvent&) = delete;
  TimingEvent& operator=(const TimingEvent&) = delete;
  absl::Status Create() {
    return driver_.Check(driver_.api().cuEventCreate(&event_, 0),
                         "cuEventCreate");
  }
  cuda::Event get() const { return event_; }

 private:
  const cuda::Driver& driver_;
  cuda::Event event_ = nullptr;
};

// Index of the fastest of `count` candidates (a heuristic's, best first),
// candidate i run by `run(i)` on `stream` (false: the call failed):
//  1. each once untimed (a first call may load its kernel), then once timed;
//  2. the first and those within 25% of the fastest, in turn, three times
//     more: as many calls as fill about 1 ms (at most 64), the best average
//     kept. The second round takes them in the reverse order, so that a
//     GPU whose clocks still rise while they run does not favour the
//     candidates timed last (an H200 picked a bfloat16 4096^3 GEMM 7%
//     slower than the heuristic's first when each finalist was timed on
//     one call, twice, in one order: bench/README.md, session 41).
// Another algorithm replaces the first only when at least 3% faster, so
// that noise does not trade the heuristic's choice for an equal one. An
// candidate whose call fails is passed over. While `stream` is being
// captured into a CUDA graph nothing runs (no synchronisation is allowed
// there) and the first is kept. Errors: the driver's.
template <typename Run>
absl::StatusOr<size_t> FastestCandidate(size_t count, cuda::Stream stream,
                                        Run run) {
  absl::StatusOr<const cuda::Driver*> driver = cuda::Driver::Get();
  if (!driver.ok()) return driver.status();
  const cuda::Driver& drv = **driver;
  int capturing = 0;
  if (absl::Status s =
          drv.Check(drv.api().cuStreamIsCapturing(stream, &capturing),
                    "cuStreamIsCapturing");
      !s.ok()) {
    return s;
  }
  if (capturing != 0) return 0;
  TimingEvent start(drv), end(drv);
  if (absl::Status s = start.Create(); !s.ok()) return s;
  if (absl::Status s = end.Create(); !s.ok()) return s;
  constexpr float kFailed = std::numeric_limits<float>::infinity();
  // Milliseconds per call of `calls` calls of candidate i; kFailed when one
  // fails.
  auto time = [&](size_t i, int calls) -> absl::StatusOr<float> {
    if (absl::Status s = drv.Check(drv.api().cuEventRecord(start.get(), stream),
                                   "cuEventRecord");
        !s.ok()) {
      return s;
    }
    bool ran = true;
    for (int c = 0; c < calls && ran; ++c)
      ran = run(i);
    if (absl::Status s = drv.Check(drv.api().cuEventRecord(end.get(), stream),
                                   "cuEventRecord");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = drv.Check(drv.api().cuEventSynchronize(end.get()),
                                   "cuEventSynchronize");
        !s.ok()) {
      return s;
    }
    float ms = 0;
    if (absl::Status s = drv.Check(
            drv.api().cuEventElapsedTime_v2(&ms, start.get(), end.get()),
            "cuEventElapsedTime");
        !s.ok()) {
      return s;
    }
    return ran ? ms / calls : kFailed;
  };
  std::vector<float> ms(count, kFailed);
  for (size_t i = 0; i < count; ++i) {
    if (!run(i)) continue;
    absl::StatusOr<float> t = time(i, 1);
    if (!t.ok()) return t.status();
    ms[i] = *t;
  }
  const float first_pass_best = *std::min_element(ms.begin(), ms.end());
  if (first_pass_best == kFailed) return 0;
  const int calls = std::clamp(static_cast<int>(1.0f / first_pass_best), 1, 64);
  std::vector<size_t> finalists;
  for (size_t i = 0; i < count; ++i) {
    if (i == 0 || ms[i] <= 1.25f * first_pass_best) finalists.push_back(i);
  }
  std::vector<float> best(count, kFailed);
  for (int pass = 0; pass < 3; ++pass) {
    for (size_t n = 0; n < finalists.size(); ++n) {
      const size_t i = finalists[pass == 1 ? finalists.size() - 1 - n : n];
      if (ms[i] == kFailed) continue;
      absl::StatusOr<float> t = time(i, calls);
      if (!t.ok()) return t.status();
      best[i] = std::min(best[i], *t);
    }
  }
  const size_t fastest = static_cast<size_t>(
      std::min_element(best.begin(), best.end()) - best.begin());
  if (best[fastest] == kFailed) return 0;
  return best[fastest] < 0.97f * best[0] ? fastest : 0;
}

}  // namespace kiln

#endif  // KILN_RUNTIME_GPU_TIMING_H_
