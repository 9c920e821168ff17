#include "server/inflight_compiles.h"

namespace kiln {
namespace {
std::string KeyString(const Sha256Digest& key) {
  return std::string(reinterpret_cast<const char*>(key.data()), key.size());
}
}  // namespace

InflightCompiles::Ticket InflightCompiles::Join(const Sha256Digest& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = flights_.try_emplace(KeyString(key));
  if (inserted) {
    it->second = std::make_unique<Flight>();
    it->second->future = it->second->promise.get_future().share();
  }
  return Ticket{it->second->future, inserted};
}

void InflightCompiles::Finish(const Sha256Digest& key, CompileResult result) {
  std::unique_ptr<Flight> flight;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = flights_.find(KeyString(key));
    if (it == flights_.end()) return;
    flight = std::move(it->second);
    flights_.erase(it);
  }
  flight->promise.set_value(std::move(result));
}

size_t InflightCompiles::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return flights_.size();
}

}  // namespace kiln
