// kilnd's hit socket: Lookup answered outside gRPC (wire format in
// support/hit_wire.h).
//
// Why: a Lookup hit through gRPC's callback server costs ~120 us of daemon
// CPU on the 2-core box, most of it HTTP/2 framing and 5-7 thread hand-offs
// per call (bench/README.md, "Hit path"). Here each connection has one
// thread of its own that blocks in poll, reads a request, asks the handler
// (KilnService::LookupKey: memory or one RocksDB read) and writes the
// response with one sendmsg that points at the cached artifact's bytes.
//
// Connections are few and long-lived (one per client thread that looks
// up), so a thread per connection is the simple and the fast choice. Their
// number is capped, and the slots are defended:
//  - A request must arrive whole within `io_timeout` of its first byte (a
//    connection that sends part of one and stalls is closed then: no
//    slow-loris holding a slot for long).
//  - An idle connection (waiting for its next request) is closed after
//    `idle_timeout`; and when every slot is taken, a new connection first
//    closes the longest-idle one, as long as idle connections hold more than
//    `idle_share` of the slots (so idle clients cannot keep active ones out,
//    while a share of them keeps its connection under churn).
//  - Otherwise a connection past the cap is closed at once and its client
//    falls back to gRPC.
//
// Security is the gRPC port's: it listens on the same host (or a Unix
// socket next to gRPC's), speaks no other request, and bounds every read.
//
// Thread-safety: Start and the destructor from one thread; the handler is
// called from many connection threads at once.
#ifndef KILN_SERVER_HIT_SOCKET_SERVER_H_
#define KILN_SERVER_HIT_SOCKET_SERVER_H_

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "support/hit_wire.h"

namespace kiln {

// What the handler answers: an OK status with the LookupResponse as
// `pieces` (kept valid by `keep_alive` until written), or an error.
struct HitReply {
  absl::Status status;
  std::vector<absl::string_view> pieces;
  std::shared_ptr<const void> keep_alive;
};

struct HitSocketOptions {
  // "HOST:PORT" (port 0: a free one) or "unix:PATH".
  std::string listen;
  int max_connections = 256;
  absl::Duration idle_timeout = absl::Minutes(10);
  // Longest a request may take to arrive once its first byte has, and its
  // response to leave.
  absl::Duration io_timeout = absl::Seconds(10);
  // When all slots are taken, idle connections beyond this share of
  // max_connections (rounded up) are closed, longest idle first, to admit
  // new ones.
  double idle_share = 0.5;
};

class HitSocketServer {
 public:
  // Handles one request: the bytes of a LookupRequest.
  using Handler = std::function<HitReply(absl::string_view request)>;

  // Binds and starts serving. Errors: those of hit_wire::Listen.
  static absl::StatusOr<std::unique_ptr<HitSocketServer>> Start(
      const HitSocketOptions& options, Handler handler);

  // Stops accepting, closes every connection (a request being answered is
  // finished first) and joins the threads.
  ~HitSocketServer();

  // The bound TCP port, or 0 for a Unix socket.
  int port() const { return port_; }
  // The Unix socket path, or empty for TCP.
  const std::string& unix_path() const { return unix_path_; }
  // Connections open now.
  int connections() const { return open_connections_.load(); }
  // Connections closed because a request did not arrive whole in time, and
  // idle ones closed to make room (for tests and logs).
  uint64_t timed_out_requests() const { return timed_out_requests_.load(); }
  uint64_t idle_closed() const { return idle_closed_.load(); }

 private:
  struct Connection {
    // Reset (closed) under mu_, so that the accept thread can shut it down.
    hit_wire::UniqueFd fd;
    std::thread thread;
    bool finished = false;
    // Since when (absl::ToUnixNanos) the connection waits for a request's
    // first byte; 0 while a request is read or answered; kClosing once the
    // accept thread chose to close it. Changed by compare-exchange, so a
    // connection is never closed after its next request began.
    std::atomic<int64_t> idle_since{0};
  };
  static constexpr int64_t kClosing = -1;

  HitSocketServer(const HitSocketOptions& options, Handler handler);
  void AcceptLoop();
  void Serve(Connection* connection);
  // Joins and drops connections whose threads have returned.
  void ReapFinished() ABSL_LOCKS_EXCLUDED(mu_);
  // With every slot taken: closes the longest-idle connection if more than
  // idle_share of the slots are idle. True if it closed one.
  bool CloseAnIdleConnection() ABSL_LOCKS_EXCLUDED(mu_);

  const HitSocketOptions options_;
  const Handler handler_;
  hit_wire::UniqueFd listen_fd_;
  hit_wire::UniqueFd stop_fd_;  // an eventfd, readable once stopping
  int port_ = 0;
  std::string unix_path_;
  std::thread accept_thread_;
  std::atomic<int> open_connections_{0};
  std::atomic<uint64_t> timed_out_requests_{0};
  std::atomic<uint64_t> idle_closed_{0};
  absl::Mutex mu_;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln

#endif  // KILN_SERVER_HIT_SOCKET_SERVER_H_
