#include "server/activity_tracker.h"

#include <algorithm>

namespace kiln {

ActivityTracker::ActivityTracker(Clock::time_point start)
    : last_end_(start.time_since_epoch().count()) {}

ActivityTracker::Busy ActivityTracker::Begin() {
  in_flight_.fetch_add(1);
  return Busy(this);
}

void ActivityTracker::End(Clock::time_point now) {
  // The end time is stored before the count drops, so IdleFor never sees
  // zero in flight with an older end than this RPC's. Concurrent ends keep
  // the latest.
  const Clock::rep t = now.time_since_epoch().count();
  Clock::rep last = last_end_.load();
  while (last < t && !last_end_.compare_exchange_weak(last, t)) {
  }
  in_flight_.fetch_sub(1);
}

ActivityTracker::Clock::duration ActivityTracker::IdleFor(
    Clock::time_point now) const {
  if (in_flight_.load() > 0) return Clock::duration::zero();
  const Clock::duration since =
      now.time_since_epoch() - Clock::duration(last_end_.load());
  return std::max(since, Clock::duration::zero());
}

}  // namespace kiln
