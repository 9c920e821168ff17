#include "server/hot_artifacts.h"

#include <utility>

namespace kiln {

HotArtifacts::HotArtifacts(uint64_t capacity_bytes)
    : capacity_bytes_(capacity_bytes) {}

std::shared_ptr<const HotArtifact> HotArtifacts::Find(const Sha256Digest& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->artifact;
}

void HotArtifacts::Insert(const Sha256Digest& key,
                          std::shared_ptr<const HotArtifact> artifact) {
  const uint64_t charged = ChargedBytes(artifact->artifact_bytes.size());
  if (charged > capacity_bytes_) return;
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) EraseLocked(it->second);
  lru_.push_front(Node{key, std::move(artifact)});
  index_[key] = lru_.begin();
  bytes_ += charged;
  while (bytes_ > capacity_bytes_) EraseLocked(std::prev(lru_.end()));
}

void HotArtifacts::Erase(const Sha256Digest& key) {
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) EraseLocked(it->second);
}

void HotArtifacts::Clear() {
  absl::MutexLock lock(&mu_);
  lru_.clear();
  index_.clear();
  bytes_ = 0;
}

uint64_t HotArtifacts::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

uint64_t HotArtifacts::entries() const {
  absl::MutexLock lock(&mu_);
  return index_.size();
}

void HotArtifacts::EraseLocked(Lru::iterator it) {
  bytes_ -= ChargedBytes(it->artifact->artifact_bytes.size());
  index_.erase(it->key);
  lru_.erase(it);
}

}  // namespace kiln
