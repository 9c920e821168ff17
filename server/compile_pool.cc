#include "server/compile_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kiln {

CompilePool::CompilePool(int threads, size_t max_queue,
                         CompilePoolLimits limits)
    : max_queue_(max_queue), limits_(limits) {
  for (int i = 0; i < std::max(threads, 1); ++i)
    threads_.emplace_back([this] { Loop(); });
}

CompilePool::~CompilePool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

bool CompilePool::Submit(std::function<void()> task) {
  return SubmitFor("", std::move(task)).ok();
}

absl::Status CompilePool::SubmitFor(const std::string& identity,
                                    std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::UnavailableError("kilnd is stopping");
    if (queued_ >= max_queue_) {
      return absl::ResourceExhaustedError(
          "the compile queue is full; retry with backoff (a few seconds)");
    }
    PerIdentity& mine = identities_[identity];
    if (!identity.empty() && limits_.max_queued_per_identity > 0 &&
        mine.queued.size() >= limits_.max_queued_per_identity) {
      return absl::ResourceExhaustedError(absl::StrCat(
          identity, " already has ", mine.queued.size(),
          " compiles queued, its limit (kilnd --max_queued_compiles_per_token)"
          "; retry with backoff when some of them finish"));
    }
    if (mine.queued.empty()) ring_.push_back(identity);
    mine.queued.push_back(std::move(task));
    ++queued_;
  }
  cv_.notify_one();
  return absl::OkStatus();
}

size_t CompilePool::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
}

size_t CompilePool::queued_for(const std::string& identity) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = identities_.find(identity);
  return it == identities_.end() ? 0 : it->second.queued.size();
}

int CompilePool::running_for(const std::string& identity) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = identities_.find(identity);
  return it == identities_.end() ? 0 : it->second.running;
}

bool CompilePool::TakeNext(std::string* identity, std::function<void()>* task) {
  for (auto it = ring_.begin(); it != ring_.end(); ++it) {
    PerIdentity& candidate = identities_[*it];
    if (!it->empty() && limits_.max_running_per_identity > 0 &&
        candidate.running >= limits_.max_running_per_identity)
      continue;  // at its limit: the others' tasks go first
    *identity = *it;
    *task = std::move(candidate.queued.front());
    candidate.queued.pop_front();
    ++candidate.running;
    --queued_;
    ring_.erase(it);
    // Round-robin: an identity with more queued goes to the back.
    if (!candidate.queued.empty()) ring_.push_back(*identity);
    return true;
  }
  return false;
}

void CompilePool::Loop() {
  while (true) {
    std::string identity;
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return TakeNext(&identity, &task) || (stop_ && queued_ == 0);
      });
      if (!task) return;  // stopping and drained
    }
    task();
    {
      std::lock_guard<std::mutex> lock(mu_);
      PerIdentity& mine = identities_[identity];
      --mine.running;
      if (mine.running == 0 && mine.queued.empty()) identities_.erase(identity);
    }
    // A task of an identity that was at its running limit may run now.
    cv_.notify_all();
  }
}

}  // namespace kiln
