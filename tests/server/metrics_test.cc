// ServerMetrics through a real prometheus-cpp exposer on an ephemeral
// loopback port, scraped over HTTP as Prometheus would.
#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "prometheus/exposer.h"

namespace kiln {
namespace {

// GET /metrics from 127.0.0.1:port; the whole response (headers + body).
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    (void)!write(fd, req.data(), req.size());
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;)
      out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

TEST(Metrics, ScrapeShowsRequestsLatencyAndCounters) {
  v1::Stats stats;
  stats.set_entries(3);
  stats.set_hits(5);
  stats.set_compiles(2);
  stats.set_joins(4);
  stats.set_compile_seconds_saved(1.5);
  auto metrics = std::make_shared<ServerMetrics>([&stats] { return stats; });
  metrics->RecordRequest("Compile", 0);
  metrics->RecordRequest("Compile", 0);
  metrics->RecordRequest("Compile", 3);
  metrics->ObserveCompileSeconds(0.02);
  metrics->ObserveCompileSeconds(0.3);
  prometheus::Exposer exposer("127.0.0.1:0");
  exposer.RegisterCollectable(metrics);
  ASSERT_FALSE(exposer.GetListeningPorts().empty());
  const std::string body = Scrape(exposer.GetListeningPorts()[0]);
  for (const char* line : {
           "kiln_requests_total{method=\"Compile\",status=\"OK\"} 2",
           "kiln_requests_total{method=\"Compile\",status=\"INVALID_ARGUMENT\"}"
           " 1",
           "kiln_compile_seconds_count 2",
           "kiln_compile_seconds_bucket{le=\"0.025\"} 1",
           "kiln_compile_seconds_bucket{le=\"0.5\"} 2",
           "kiln_cache_entries 3",
           "kiln_cache_hits_total 5",
           "kiln_compiles_total 2",
           "kiln_joins_total 4",
           "kiln_compile_seconds_saved_total 1.5",
       }) {
    EXPECT_NE(body.find(line), std::string::npos) << "missing: " << line << "\n"
                                                  << body;
  }
}

}  // namespace
}  // namespace kiln
