// Prometheus metrics of kilnd, served as text on --metrics_listen /metrics:
// requests by method and status, compile latency histogram, and at scrape
// time the cache and service counters (hits, misses, joins, compiles,
// entries, bytes, evictions, corrupt, compile seconds saved, queue depth,
// store recoveries; with a shared tier kiln_shared_cache_up and its
// kiln_shared_cache_*).
//
// Thread-safety: all methods are thread-safe.
#ifndef KILN_SERVER_METRICS_H_
#define KILN_SERVER_METRICS_H_

#include <array>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/v1/service.pb.h"
#include "prometheus/collectable.h"

namespace kiln {

class ServerMetrics : public prometheus::Collectable {
 public:
  // `stats` is called at each scrape for the counters kept elsewhere.
  explicit ServerMetrics(std::function<v1::Stats()> stats)
      : stats_(std::move(stats)) {}

  void RecordRequest(const std::string& method, int grpc_code);
  void ObserveCompileSeconds(double seconds);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  static constexpr std::array<double, 10> kBuckets = {
      0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
  std::function<v1::Stats()> stats_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::array<uint64_t, kBuckets.size()> bucket_counts_{};
  uint64_t compile_count_ = 0;
  double compile_sum_ = 0;
};

}  // namespace kiln

#endif  // KILN_SERVER_METRICS_H_
