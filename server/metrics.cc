#include "server/metrics.h"

#include "prometheus/metric_family.h"

namespace kiln {
namespace {

const char* CodeName(int code) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
}

prometheus::MetricFamily Family(const std::string& name,
                                const std::string& help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

prometheus::MetricFamily Scalar(const std::string& name,
                                const std::string& help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily f = Family(name, help, type);
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(m);
  return f;
}

}  // namespace

void ServerMetrics::RecordRequest(const std::string& method, int grpc_code) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{method, grpc_code}];
}

void ServerMetrics::ObserveCompileSeconds(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++compile_count_;
  compile_sum_ += seconds;
  for (size_t b = 0; b < kBuckets.size(); ++b) {
    if (seconds <= kBuckets[b]) ++bucket_counts_[b];
  }
}

std::vector<prometheus::MetricFamily> ServerMetrics::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    prometheus::MetricFamily req =
        Family("kiln_requests_total", "RPCs by method and status",
               MetricType::Counter);
    for (const auto& [k, n] : requests_) {
      prometheus::ClientMetric m;
      m.label = {{"method", k.first}, {"status", CodeName(k.second)}};
      m.counter.value = static_cast<double>(n);
      req.metric.push_back(m);
    }
    out.push_back(std::move(req));
    prometheus::MetricFamily hist =
        Family("kiln_compile_seconds", "Server-side compile latency",
               MetricType::Histogram);
    prometheus::ClientMetric m;
    m.histogram.sample_count = compile_count_;
    m.histogram.sample_sum = compile_sum_;
    for (size_t b = 0; b < kBuckets.size(); ++b) {
      prometheus::ClientMetric::Bucket bucket;
      bucket.upper_bound = kBuckets[b];
      bucket.cumulative_count = bucket_counts_[b];
      m.histogram.bucket.push_back(bucket);
    }
    prometheus::ClientMetric::Bucket inf;
    inf.upper_bound = std::numeric_limits<double>::infinity();
    inf.cumulative_count = compile_count_;
    m.histogram.bucket.push_back(inf);
    hist.metric.push_back(m);
    out.push_back(std::move(hist));
  }
  const v1::Stats s = stats_();
  out.push_back(Scalar("kiln_cache_hits_total",
                       "Requests served from the cache", MetricType::Counter,
                       s.hits()));
  out.push_back(Scalar("kiln_cache_misses_total",
                       "Requests that found no entry", MetricType::Counter,
                       s.misses()));
  out.push_back(Scalar("kiln_compiles_total", "Compiles run",
                       MetricType::Counter, s.compiles()));
  out.push_back(Scalar("kiln_joins_total",
                       "Requests that joined a compile in flight",
                       MetricType::Counter, s.joins()));
  out.push_back(Scalar("kiln_compile_errors_total", "Compiles that failed",
                       MetricType::Counter, s.compile_errors()));
  out.push_back(Scalar("kiln_cache_entries", "Artifacts in the cache",
                       MetricType::Gauge, s.entries()));
  out.push_back(Scalar("kiln_cache_bytes", "Bytes of artifacts in the cache",
                       MetricType::Gauge, s.bytes()));
  out.push_back(Scalar("kiln_cache_capacity_bytes", "Cache budget",
                       MetricType::Gauge, s.capacity_bytes()));
  out.push_back(Scalar("kiln_cache_evictions_total", "Entries evicted",
                       MetricType::Counter, s.evictions()));
  out.push_back(Scalar("kiln_cache_corrupt_total", "Corrupt entries dropped",
                       MetricType::Counter, s.corrupt()));
  out.push_back(Scalar("kiln_compile_seconds_saved_total",
                       "Compile time saved by cache hits", MetricType::Counter,
                       s.compile_seconds_saved()));
  out.push_back(Scalar("kiln_compile_queue_depth",
                       "Compiles waiting for a thread", MetricType::Gauge,
                       s.queue_depth()));
  out.push_back(Scalar("kiln_hot_cache_hits_total",
                       "Hits served from kilnd's in-memory copy",
                       MetricType::Counter, s.hot_hits()));
  out.push_back(Scalar("kiln_hot_cache_entries",
                       "Artifacts in kilnd's in-memory copy", MetricType::Gauge,
                       s.hot_entries()));
  out.push_back(Scalar("kiln_hot_cache_bytes",
                       "Bytes charged to kilnd's in-memory copy",
                       MetricType::Gauge, s.hot_bytes()));
  if (s.shared_cache_configured()) {
    out.push_back(Scalar("kiln_shared_cache_up",
                         "1 while the fleet's shared tier (Redis) answers",
                         MetricType::Gauge, s.shared_cache_up() ? 1 : 0));
    out.push_back(Scalar("kiln_shared_cache_hits_total",
                         "Artifacts fetched from the shared tier",
                         MetricType::Counter, s.shared_hits()));
    out.push_back(Scalar("kiln_shared_cache_misses_total",
                         "Shared-tier looks that found no artifact",
                         MetricType::Counter, s.shared_misses()));
    out.push_back(Scalar("kiln_shared_cache_lease_waits_total",
                         "Compiles left to the replica holding the lease",
                         MetricType::Counter, s.shared_lease_waits()));
    out.push_back(Scalar("kiln_shared_cache_takeovers_total",
                         "Leases taken over after their holder vanished",
                         MetricType::Counter, s.shared_takeovers()));
    out.push_back(Scalar("kiln_shared_cache_read_bytes_total",
                         "Artifact bytes read from the shared tier",
                         MetricType::Counter, s.shared_bytes_read()));
    out.push_back(Scalar("kiln_shared_cache_written_bytes_total",
                         "Artifact bytes written to the shared tier",
                         MetricType::Counter, s.shared_bytes_written()));
    out.push_back(Scalar("kiln_shared_cache_corrupt_total",
                         "Shared-tier values that failed verification",
                         MetricType::Counter, s.shared_corrupt()));
    out.push_back(Scalar("kiln_shared_cache_error_hits_total",
                         "Compile errors served from the shared tier",
                         MetricType::Counter, s.shared_error_hits()));
    out.push_back(Scalar("kiln_shared_cache_failures_total",
                         "Shared-tier calls failed or skipped while down",
                         MetricType::Counter, s.shared_failures()));
  }
  out.push_back(Scalar("kiln_store_recoveries_total",
                       "Times the artifact store was found damaged at open "
                       "and repaired or moved aside (see the log)",
                       MetricType::Counter, s.store_recoveries()));
  out.push_back(Scalar("kiln_store_recovery_dropped_total",
                       "Entries dropped by the repair of a damaged store",
                       MetricType::Counter, s.store_recovery_dropped()));
  out.push_back(Scalar("kiln_reload_failures_total",
                       "Re-reads of the token or TLS files that failed (the "
                       "previous ones stayed in force; see the log)",
                       MetricType::Counter, s.reload_failures()));
  return out;
}

}  // namespace kiln
