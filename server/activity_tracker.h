// When kilnd last served a request, for --idle_exit_seconds (kilnd_main.cc):
// the daemon is idle while no RPC is in flight, for as long as none has
// ended. The per-user kilnd that the Python backend starts on first use
// (python/kiln/autostart.py) exits after a while of that, as sccache's
// server does.
//
// Every RPC of KilnService (gRPC methods and hit-socket Lookups) holds a
// Busy for its duration; IdleFor reads the state without a lock.
//
// Thread-safety: Begin, Busy's destructor and IdleFor may run concurrently.
#ifndef KILN_SERVER_ACTIVITY_TRACKER_H_
#define KILN_SERVER_ACTIVITY_TRACKER_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace kiln {

class ActivityTracker {
 public:
  using Clock = std::chrono::steady_clock;

  // Idle from `start` on (kilnd: when it starts serving).
  explicit ActivityTracker(Clock::time_point start = Clock::now());
  ActivityTracker(const ActivityTracker&) = delete;
  ActivityTracker& operator=(const ActivityTracker&) = delete;

  // An RPC in flight, from Begin() until destroyed (then its end is the
  // last activity).
  class [[nodiscard]] Busy {
   public:
    explicit Busy(ActivityTracker* tracker) : tracker_(tracker) {}
    Busy(Busy&& other) noexcept : tracker_(other.tracker_) {
      other.tracker_ = nullptr;
    }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;
    Busy& operator=(Busy&&) = delete;
    ~Busy() {
      if (tracker_) tracker_->End(Clock::now());
    }

   private:
    ActivityTracker* tracker_;
  };

  Busy Begin();

  // How long the tracker has been idle at `now`: zero while an RPC is in
  // flight, else the time since the last one ended (or since `start`).
  Clock::duration IdleFor(Clock::time_point now = Clock::now()) const;

  int64_t in_flight() const { return in_flight_.load(); }

 private:
  void End(Clock::time_point now);

  std::atomic<int64_t> in_flight_{0};
  // Clock::time_point::time_since_epoch().count() of the last End.
  std::atomic<Clock::rep> last_end_;
};

}  // namespace kiln

#endif  // KILN_SERVER_ACTIVITY_TRACKER_H_
